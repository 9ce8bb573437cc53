// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"encoding/xml"
	"fmt"
	"maps"
	"slices"
	"strings"
)

type tagItem struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

func tagItems(tags map[string]string) []tagItem {
	var out []tagItem
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		out = append(out, tagItem{Key: k, Value: tags[k]})
	}
	return out
}

// matchTags reports whether tags pass the tag:KEY and tag-key filters of
// fs, their values read as EC2 reads them: with wildcards.
func matchTags(fs map[string][]string, tags map[string]string) bool {
	for name, values := range fs {
		if key, ok := strings.CutPrefix(name, "tag:"); ok {
			if v, has := tags[key]; !has || !anyWildcard(values, v) {
				return false
			}
		}
		if name == "tag-key" && !slices.ContainsFunc(values, func(pattern string) bool {
			for k := range tags {
				if wildcard(pattern, k) {
					return true
				}
			}
			return false
		}) {
			return false
		}
	}
	return true
}

// anyWildcard reports whether s matches one of patterns.
func anyWildcard(patterns []string, s string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return wildcard(p, s) })
}

// wildcard reports whether s matches pattern as EC2 matches a filter
// value: * is any run of characters (none included), ? any one
// character, and a backslash makes the next character (*, ? or \)
// literal. EC2 applies this to every filter value, so a tag value holding
// * or ? selects more than the resources carrying it.
func wildcard(pattern, s string) bool {
	p, v := []rune(pattern), []rune(s)
	// Iterative matching with one backtrack point, the last *.
	pi, vi, star, mark := 0, 0, -1, 0
	for vi < len(v) {
		switch {
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, vi
			pi++
		case pi < len(p) && p[pi] == '?':
			pi++
			vi++
		case pi+1 < len(p) && p[pi] == '\\' && p[pi+1] == v[vi]:
			pi += 2
			vi++
		case pi < len(p) && p[pi] != '\\' && p[pi] == v[vi]:
			pi++
			vi++
		case star >= 0:
			pi, mark = star+1, mark+1
			vi = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// checkFilters refuses a filter the action does not know.
func checkFilters(fs map[string][]string, known ...string) *APIError {
	for name := range fs {
		if !slices.Contains(known, name) && !strings.HasPrefix(name, "tag:") && name != "tag-key" {
			return &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("The filter '%s' is invalid", name)}
		}
	}
	return nil
}

func matches(fs map[string][]string, name, value string) bool {
	v, ok := fs[name]
	return !ok || anyWildcard(v, value)
}

// instanceItem is an instance as EC2 describes it.
type instanceItem struct {
	InstanceID   string `xml:"instanceId"`
	InstanceType string `xml:"instanceType"`
	SubnetID     string `xml:"subnetId,omitempty"`
	VPC          string `xml:"vpcId,omitempty"`
	Zone         string `xml:"placement>availabilityZone"`
	State        string `xml:"instanceState>name"`
}

func (s *Server) instanceItemLocked(in *instance) instanceItem {
	sn := s.subnets[in.subnet]
	it := instanceItem{InstanceID: in.id, InstanceType: in.typ, SubnetID: in.subnet, VPC: sn.VPC, Zone: sn.Zone, State: "running"}
	if in.terminated {
		it.State, it.SubnetID, it.VPC = "terminated", "", ""
	}
	return it
}

func (s *Server) describeInstancesLocked(form map[string][]string) (any, *APIError) {
	type reservation struct {
		Instances []instanceItem `xml:"instancesSet>item"`
	}
	type response struct {
		XMLName      xml.Name      `xml:"DescribeInstancesResponse"`
		Xmlns        string        `xml:"xmlns,attr"`
		RequestID    string        `xml:"requestId"`
		Reservations []reservation `xml:"reservationSet>item"`
		NextToken    string        `xml:"nextToken,omitempty"`
	}
	var all []instanceItem
	if t, ok := s.staleLocked(); ok {
		all = s.stale.instances.at(t)
	} else {
		for _, id := range slices.Sorted(maps.Keys(s.instances)) {
			all = append(all, s.instanceItemLocked(s.instances[id]))
		}
	}
	ids := list(form, "InstanceId")
	for _, id := range ids {
		if !slices.ContainsFunc(all, func(it instanceItem) bool { return it.InstanceID == id }) {
			return nil, &APIError{Code: "InvalidInstanceID.NotFound", Message: fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
	}
	fs := filters(form)
	if e := checkFilters(fs, "vpc-id"); e != nil {
		return nil, e
	}
	if e := idsWithMaxResults(form, ids); e != nil {
		return nil, e
	}
	if len(ids) == 0 {
		if e := s.unpaginatedLocked("DescribeInstances", form, len(all)); e != nil {
			return nil, e
		}
	}
	var items []reservation
	for _, it := range all {
		if (len(ids) > 0 && !slices.Contains(ids, it.InstanceID)) || !matches(fs, "vpc-id", it.VPC) {
			continue
		}
		items = append(items, reservation{Instances: []instanceItem{it}})
	}
	items, next, e := page(s, form, items, func(r reservation) string { return r.Instances[0].InstanceID })
	if e != nil {
		return nil, e
	}
	return response{Xmlns: xmlns, RequestID: requestID, Reservations: items, NextToken: next}, nil
}

func (s *Server) describeInstanceTypesLocked(form map[string][]string) (any, *APIError) {
	type cardItem struct {
		Index      int `xml:"networkCardIndex"`
		Interfaces int `xml:"maximumNetworkInterfaces"`
	}
	type typeItem struct {
		InstanceType     string     `xml:"instanceType"`
		Hypervisor       string     `xml:"hypervisor,omitempty"`
		BareMetal        bool       `xml:"bareMetal"`
		VCPUs            int        `xml:"vCpuInfo>defaultVCpus"`
		Interfaces       int        `xml:"networkInfo>maximumNetworkInterfaces"`
		IPv4PerInterface int        `xml:"networkInfo>ipv4AddressesPerInterface"`
		IPv6PerInterface int        `xml:"networkInfo>ipv6AddressesPerInterface"`
		Cards            int        `xml:"networkInfo>maximumNetworkCards"`
		DefaultCard      int        `xml:"networkInfo>defaultNetworkCardIndex"`
		CardSet          []cardItem `xml:"networkInfo>networkCards>item"`
	}
	type response struct {
		XMLName   xml.Name   `xml:"DescribeInstanceTypesResponse"`
		Xmlns     string     `xml:"xmlns,attr"`
		RequestID string     `xml:"requestId"`
		Types     []typeItem `xml:"instanceTypeSet>item"`
		NextToken string     `xml:"nextToken,omitempty"`
	}
	names := list(form, "InstanceType")
	if len(names) == 0 {
		names = slices.Sorted(maps.Keys(Types))
	}
	var items []typeItem
	for _, name := range names {
		t, ok := Types[name]
		if !ok {
			return nil, &APIError{Code: "InvalidInstanceType", Message: fmt.Sprintf("The following supplied instance types do not exist: [%s]", name)}
		}
		// EC2 names no hypervisor for a bare-metal type.
		hv := "xen"
		switch {
		case t.BareMetal:
			hv = ""
		case t.Nitro:
			hv = "nitro"
		}
		it := typeItem{InstanceType: name, Hypervisor: hv, BareMetal: t.BareMetal, VCPUs: t.VCPUs, Interfaces: t.Interfaces, IPv4PerInterface: t.IPv4PerInterface, IPv6PerInterface: t.IPv6PerInterface,
			Cards: 1, DefaultCard: t.DefaultCard, CardSet: []cardItem{{Index: 0, Interfaces: t.Interfaces}}}
		if len(t.Cards) > 0 {
			it.Cards, it.CardSet = len(t.Cards), nil
			for i, n := range t.Cards {
				it.CardSet = append(it.CardSet, cardItem{Index: i, Interfaces: n})
			}
		}
		items = append(items, it)
	}
	items, next, e := page(s, form, items, func(it typeItem) string { return it.InstanceType })
	if e != nil {
		return nil, e
	}
	return response{Xmlns: xmlns, RequestID: requestID, Types: items, NextToken: next}, nil
}

// subnetItem is a subnet as EC2 describes it.
type subnetItem struct {
	ID   string    `xml:"subnetId"`
	VPC  string    `xml:"vpcId"`
	Zone string    `xml:"availabilityZone"`
	CIDR string    `xml:"cidrBlock"`
	Free int       `xml:"availableIpAddressCount"`
	Tags []tagItem `xml:"tagSet>item"`
}

func subnetItemOf(sn *subnet) subnetItem {
	return subnetItem{ID: sn.ID, VPC: sn.VPC, Zone: sn.Zone, CIDR: sn.CIDR.String(), Free: sn.free(), Tags: tagItems(sn.Tags)}
}

// tagMap answers tags as a map.
func tagMap(tags []tagItem) map[string]string {
	out := map[string]string{}
	for _, t := range tags {
		out[t.Key] = t.Value
	}
	return out
}

func (s *Server) describeSubnetsLocked(form map[string][]string) (any, *APIError) {
	type response struct {
		XMLName   xml.Name     `xml:"DescribeSubnetsResponse"`
		Xmlns     string       `xml:"xmlns,attr"`
		RequestID string       `xml:"requestId"`
		Subnets   []subnetItem `xml:"subnetSet>item"`
		NextToken string       `xml:"nextToken,omitempty"`
	}
	fs := filters(form)
	if e := checkFilters(fs, "vpc-id", "availability-zone"); e != nil {
		return nil, e
	}
	var all []subnetItem
	if t, ok := s.staleLocked(); ok {
		all = s.stale.subnets.at(t)
	} else {
		for _, id := range slices.Sorted(maps.Keys(s.subnets)) {
			all = append(all, subnetItemOf(s.subnets[id]))
		}
	}
	ids := list(form, "SubnetId")
	for _, id := range ids {
		if !slices.ContainsFunc(all, func(it subnetItem) bool { return it.ID == id }) {
			return nil, &APIError{Code: "InvalidSubnetID.NotFound", Message: fmt.Sprintf("The subnet ID '%s' does not exist", id)}
		}
	}
	var items []subnetItem
	for _, it := range all {
		if (len(ids) > 0 && !slices.Contains(ids, it.ID)) || !matches(fs, "vpc-id", it.VPC) || !matches(fs, "availability-zone", it.Zone) || !matchTags(fs, tagMap(it.Tags)) {
			continue
		}
		items = append(items, it)
	}
	items, next, e := page(s, form, items, func(it subnetItem) string { return it.ID })
	if e != nil {
		return nil, e
	}
	return response{Xmlns: xmlns, RequestID: requestID, Subnets: items, NextToken: next}, nil
}

type groupItem struct {
	ID string `xml:"groupId"`
}

type addrItem struct {
	Address string `xml:"privateIpAddress"`
	Primary bool   `xml:"primary"`
}

type prefixItem struct {
	Prefix string `xml:"ipv4Prefix"`
}

type ipv6PrefixItem struct {
	Prefix string `xml:"ipv6Prefix"`
}

type attachmentItem struct {
	ID                  string `xml:"attachmentId"`
	InstanceID          string `xml:"instanceId"`
	Device              int    `xml:"deviceIndex"`
	Card                int    `xml:"networkCardIndex"`
	Status              string `xml:"status"`
	DeleteOnTermination bool   `xml:"deleteOnTermination"`
}

// ifaceItem is a network interface as EC2 describes it.
type ifaceItem struct {
	ID         string           `xml:"networkInterfaceId"`
	SubnetID   string           `xml:"subnetId"`
	VPC        string           `xml:"vpcId"`
	Zone       string           `xml:"availabilityZone"`
	Status     string           `xml:"status"`
	Type       string           `xml:"interfaceType"`
	MAC        string           `xml:"macAddress"`
	Primary    string           `xml:"privateIpAddress"`
	Attachment *attachmentItem  `xml:"attachment,omitempty"`
	Groups     []groupItem      `xml:"groupSet>item"`
	Tags       []tagItem        `xml:"tagSet>item"`
	Addresses  []addrItem       `xml:"privateIpAddressesSet>item"`
	Prefixes   []prefixItem     `xml:"ipv4PrefixSet>item"`
	IPv6       []ipv6PrefixItem `xml:"ipv6PrefixSet>item"`
}

func (s *Server) itemLocked(f *iface) ifaceItem {
	sn := s.subnets[f.subnet]
	typ := f.typ
	if typ == "" {
		typ = "interface"
	}
	it := ifaceItem{ID: f.id, SubnetID: f.subnet, VPC: sn.VPC, Zone: sn.Zone, Status: f.status, Type: typ, MAC: f.mac, Primary: f.primary.String(),
		Addresses: []addrItem{{Address: f.primary.String(), Primary: true}}, Tags: tagItems(f.tags)}
	if f.instance != "" {
		status := "attached"
		if f.status == "detaching" {
			status = "detaching"
		}
		it.Attachment = &attachmentItem{ID: f.attachment, InstanceID: f.instance, Device: f.device, Card: f.card, Status: status, DeleteOnTermination: f.deleteOnTermination}
	}
	for _, g := range f.groups {
		it.Groups = append(it.Groups, groupItem{ID: g})
	}
	for _, a := range f.addrs {
		it.Addresses = append(it.Addresses, addrItem{Address: a.String()})
	}
	for _, p := range f.prefixes {
		it.Prefixes = append(it.Prefixes, prefixItem{Prefix: p.String()})
	}
	for _, p := range f.ipv6Prefixes {
		it.IPv6 = append(it.IPv6, ipv6PrefixItem{Prefix: p.String()})
	}
	return it
}

// lookupLocked answers interface id, or EC2's NotFound: for an unknown
// id, and for a new one still invisible (each such answer counts down).
func (s *Server) lookupLocked(id string) (*iface, *APIError) {
	f, ok := s.ifaces[id]
	if ok && f.hidden > 0 {
		f.hidden--
		ok = false
	}
	if !ok {
		return nil, &APIError{Code: "InvalidNetworkInterfaceID.NotFound", Message: fmt.Sprintf("The networkInterface ID '%s' does not exist", id)}
	}
	return f, nil
}

func (s *Server) describeNetworkInterfacesLocked(form map[string][]string) (any, *APIError) {
	type response struct {
		XMLName    xml.Name    `xml:"DescribeNetworkInterfacesResponse"`
		Xmlns      string      `xml:"xmlns,attr"`
		RequestID  string      `xml:"requestId"`
		Interfaces []ifaceItem `xml:"networkInterfaceSet>item"`
		NextToken  string      `xml:"nextToken,omitempty"`
	}
	ids := list(form, "NetworkInterfaceId")
	var all []ifaceItem
	if t, ok := s.staleLocked(); ok {
		all = s.stale.ifaces.at(t)
		for _, id := range ids {
			if !slices.ContainsFunc(all, func(it ifaceItem) bool { return it.ID == id }) {
				return nil, &APIError{Code: "InvalidNetworkInterfaceID.NotFound", Message: fmt.Sprintf("The networkInterface ID '%s' does not exist", id)}
			}
		}
	} else {
		for _, id := range ids {
			if _, e := s.lookupLocked(id); e != nil {
				return nil, e
			}
		}
		for _, id := range slices.Sorted(maps.Keys(s.ifaces)) {
			if f := s.ifaces[id]; len(ids) > 0 || f.hidden == 0 {
				all = append(all, s.itemLocked(f))
			}
		}
	}
	fs := filters(form)
	if e := checkFilters(fs, "attachment.instance-id", "status", "subnet-id", "vpc-id"); e != nil {
		return nil, e
	}
	if e := idsWithMaxResults(form, ids); e != nil {
		return nil, e
	}
	if len(ids) == 0 {
		if e := s.unpaginatedLocked("DescribeNetworkInterfaces", form, len(all)); e != nil {
			return nil, e
		}
	}
	var items []ifaceItem
	for _, it := range all {
		if len(ids) > 0 && !slices.Contains(ids, it.ID) {
			continue
		}
		instance := ""
		if it.Attachment != nil {
			instance = it.Attachment.InstanceID
		}
		if !matches(fs, "attachment.instance-id", instance) || !matches(fs, "status", it.Status) || !matches(fs, "subnet-id", it.SubnetID) ||
			!matches(fs, "vpc-id", it.VPC) || !matchTags(fs, tagMap(it.Tags)) {
			continue
		}
		items = append(items, it)
	}
	items, next, e := page(s, form, items, func(it ifaceItem) string { return it.ID })
	if e != nil {
		return nil, e
	}
	return response{Xmlns: xmlns, RequestID: requestID, Interfaces: items, NextToken: next}, nil
}
