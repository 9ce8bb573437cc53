// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"encoding/xml"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// createLocked makes an available interface in subnet with its primary
// address.
func (s *Server) createLocked(subnetID string, groups []string, tags map[string]string) (*iface, *APIError) {
	sn, ok := s.subnets[subnetID]
	if !ok {
		return nil, &APIError{Code: "InvalidSubnetID.NotFound", Message: fmt.Sprintf("The subnet ID '%s' does not exist", subnetID)}
	}
	free := sn.pickAddrs(1, s.addrRNG)
	if len(free) == 0 {
		return nil, insufficientAddresses()
	}
	id := s.newIDLocked("eni")
	// A locally administered unicast MAC, unique as the id's counter.
	mac := fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", byte(s.nextID>>24), byte(s.nextID>>16), byte(s.nextID>>8), byte(s.nextID))
	f := &iface{id: id, mac: mac, subnet: subnetID, primary: free[0], groups: slices.Clone(groups), tags: tags, status: "available"}
	sn.take(free[0], f.id)
	s.ifaces[f.id] = f
	return f, nil
}

func insufficientAddresses() *APIError {
	return &APIError{Code: "InsufficientFreeAddressesInSubnet", Message: "The specified subnet does not have enough free addresses to satisfy the request."}
}

// takeLocked carves n addresses, or n /28 prefixes, of f's subnet for f.
func (s *Server) takeLocked(f *iface, n int, prefixes bool) ([]netip.Addr, []netip.Prefix, *APIError) {
	sn := s.subnets[f.subnet]
	if prefixes {
		got := sn.pickPrefixes(n, s.addrRNG)
		if len(got) < n {
			if len(sn.freeAddrs(PrefixAddresses*n)) < PrefixAddresses*n {
				return nil, nil, insufficientAddresses()
			}
			return nil, nil, &APIError{Code: "InsufficientCidrBlocks", Message: "The specified subnet does not have enough free cidr blocks to satisfy the request."}
		}
		for _, p := range got {
			sn.takePrefix(p, f.id)
		}
		f.prefixes = append(f.prefixes, got...)
		return nil, got, nil
	}
	got := sn.pickAddrs(n, s.addrRNG)
	if len(got) < n {
		return nil, nil, insufficientAddresses()
	}
	for _, a := range got {
		sn.take(a, f.id)
	}
	f.addrs = append(f.addrs, got...)
	return got, nil, nil
}

// attachToLocked attaches f to instance at device, unchecked.
func (s *Server) attachToLocked(f *iface, instanceID string, device int) {
	f.status, f.instance, f.device, f.attachment = "in-use", instanceID, device, s.newIDLocked("eni-attach")
}

// attachLocked attaches f to instance at device of network card 0 as EC2
// checks it.
func (s *Server) attachLocked(f *iface, instanceID string, device int) *APIError {
	return s.attachCardLocked(f, instanceID, 0, device)
}

// attachCardLocked attaches f to instance at device of network card card
// as EC2 checks it: device indexes count per card, and a card of a
// multi-card type takes its own MaximumNetworkInterfaces.
func (s *Server) attachCardLocked(f *iface, instanceID string, card, device int) *APIError {
	in, ok := s.instances[instanceID]
	if !ok || in.terminated {
		return &APIError{Code: "InvalidInstanceID.NotFound", Message: fmt.Sprintf("The instance ID '%s' does not exist", instanceID)}
	}
	if f.status != "available" {
		return &APIError{Code: "InvalidNetworkInterface.InUse", Message: fmt.Sprintf("Interface: [%s] in use.", f.id)}
	}
	t := Types[in.typ]
	if card < 0 || card >= max(len(t.Cards), 1) {
		return &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Network card index %d is not valid for %s.", card, in.typ)}
	}
	attached, onCard := 0, 0
	for _, g := range s.ifaces {
		if g.instance != instanceID {
			continue
		}
		attached++
		if g.card != card {
			continue
		}
		onCard++
		if g.device == device {
			return &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Instance '%s' already has an interface attached at device index '%d'.", instanceID, device)}
		}
	}
	if attached >= t.Interfaces {
		return &APIError{Code: "AttachmentLimitExceeded", Message: fmt.Sprintf("Interface count %d exceeds the limit for %s", attached+1, in.typ)}
	}
	if len(t.Cards) > 0 && onCard >= t.Cards[card] {
		return &APIError{Code: "AttachmentLimitExceeded", Message: fmt.Sprintf("Interface count %d exceeds the limit of network card %d for %s", onCard+1, card, in.typ)}
	}
	if f.slots() > t.IPv4PerInterface {
		return &APIError{Code: "InvalidInterface.IpAddressLimitExceeded", Message: fmt.Sprintf("Number of private addresses %d exceeds the limit of %d for %s", f.slots(), t.IPv4PerInterface, in.typ)}
	}
	if len(f.prefixes) > 0 && !t.TakesPrefixes() {
		return &APIError{Code: "InvalidParameterValue", Message: "Prefix delegation is supported on Nitro instances only."}
	}
	s.attachToLocked(f, instanceID, device)
	f.card = card
	return nil
}

func (f *iface) slots() int { return 1 + len(f.addrs) + len(f.prefixes) }

// deleteLocked deletes f and frees its addresses.
func (s *Server) deleteLocked(f *iface) {
	sn := s.subnets[f.subnet]
	sn.release(f.primary)
	for _, a := range f.addrs {
		sn.release(a)
	}
	for _, p := range f.prefixes {
		sn.releasePrefix(p)
	}
	delete(s.ifaces, f.id)
}

// returnTrue is the answer of the actions that answer only that they did.
func returnTrue(name string) any {
	type response struct {
		XMLName   xml.Name
		Xmlns     string `xml:"xmlns,attr"`
		RequestID string `xml:"requestId"`
		Return    bool   `xml:"return"`
	}
	return response{XMLName: xml.Name{Local: name + "Response"}, Xmlns: xmlns, RequestID: requestID, Return: true}
}

func (s *Server) createNetworkInterfaceLocked(form map[string][]string) (any, *APIError) {
	type response struct {
		XMLName   xml.Name  `xml:"CreateNetworkInterfaceResponse"`
		Xmlns     string    `xml:"xmlns,attr"`
		RequestID string    `xml:"requestId"`
		Interface ifaceItem `xml:"networkInterface"`
	}
	token := first(form, "ClientToken")
	if answer, ok, e := s.repeatedLocked(token, form); ok || e != nil {
		if e != nil {
			return nil, e
		}
		return response{Xmlns: xmlns, RequestID: requestID, Interface: answer}, nil
	}
	count, prefixCount := first(form, "SecondaryPrivateIpAddressCount"), first(form, "Ipv4PrefixCount")
	if count != "" && prefixCount != "" {
		return nil, &APIError{Code: "InvalidParameterCombination", Message: "Specify either SecondaryPrivateIpAddressCount or Ipv4PrefixCount."}
	}
	typ := first(form, "InterfaceType")
	if typ != "" && typ != "interface" && typ != "trunk" && typ != "efa" && typ != "efa-only" {
		return nil, &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Value (%s) for parameter interfaceType is invalid.", typ)}
	}
	n := 0
	if v := count + prefixCount; v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 0 {
			return nil, &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Invalid value '%s' for the count.", v)}
		}
	}
	tags := map[string]string{}
	for i := 1; ; i++ {
		spec := "TagSpecification." + strconv.Itoa(i)
		if _, ok := form[spec+".ResourceType"]; !ok {
			break
		}
		if rt := first(form, spec+".ResourceType"); rt != "network-interface" {
			return nil, &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("'%s' is not a valid taggable resource type for this operation.", rt)}
		}
		for j := 1; ; j++ {
			key, ok := form[spec+".Tag."+strconv.Itoa(j)+".Key"]
			if !ok {
				break
			}
			tags[key[0]] = first(form, spec+".Tag."+strconv.Itoa(j)+".Value")
		}
	}
	sn, ok := s.subnets[first(form, "SubnetId")]
	if !ok {
		return nil, &APIError{Code: "InvalidSubnetID.NotFound", Message: fmt.Sprintf("The subnet ID '%s' does not exist", first(form, "SubnetId"))}
	}
	// Check the subnet's room first: a refused create takes nothing.
	if prefixCount != "" && len(sn.freePrefixes(n)) < n {
		if sn.free() < PrefixAddresses*n+1 {
			return nil, insufficientAddresses()
		}
		return nil, &APIError{Code: "InsufficientCidrBlocks", Message: "The specified subnet does not have enough free cidr blocks to satisfy the request."}
	}
	if prefixCount == "" && sn.free() < n+1 {
		return nil, insufficientAddresses()
	}
	f, e := s.createLocked(sn.ID, list(form, "SecurityGroupId"), tags)
	if e != nil {
		return nil, e
	}
	if n > 0 {
		if _, _, e := s.takeLocked(f, n, prefixCount != ""); e != nil {
			s.deleteLocked(f)
			return nil, e
		}
	}
	f.typ = typ
	f.hidden = s.invisible
	item := s.itemLocked(f)
	s.rememberLocked(token, form, item)
	return response{Xmlns: xmlns, RequestID: requestID, Interface: item}, nil
}

func (s *Server) attachNetworkInterfaceLocked(form map[string][]string) (any, *APIError) {
	type response struct {
		XMLName    xml.Name `xml:"AttachNetworkInterfaceResponse"`
		Xmlns      string   `xml:"xmlns,attr"`
		RequestID  string   `xml:"requestId"`
		Attachment string   `xml:"attachmentId"`
		Card       int      `xml:"networkCardIndex"`
	}
	f, e := s.lookupLocked(first(form, "NetworkInterfaceId"))
	if e != nil {
		return nil, e
	}
	device, err := strconv.Atoi(first(form, "DeviceIndex"))
	if err != nil || device < 0 {
		return nil, &APIError{Code: "MissingParameter", Message: "The request must contain the parameter deviceIndex"}
	}
	card := 0
	if v := first(form, "NetworkCardIndex"); v != "" {
		if card, err = strconv.Atoi(v); err != nil {
			return nil, &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Invalid value '%s' for networkCardIndex.", v)}
		}
	}
	s.changedLocked(f)
	if e := s.attachCardLocked(f, first(form, "InstanceId"), card, device); e != nil {
		return nil, e
	}
	return response{Xmlns: xmlns, RequestID: requestID, Attachment: f.attachment, Card: f.card}, nil
}

func (s *Server) modifyNetworkInterfaceLocked(form map[string][]string) (any, *APIError) {
	f, e := s.lookupLocked(first(form, "NetworkInterfaceId"))
	if e != nil {
		return nil, e
	}
	s.changedLocked(f)
	att, del := first(form, "Attachment.AttachmentId"), first(form, "Attachment.DeleteOnTermination")
	if att == "" || del == "" {
		return nil, &APIError{Code: "InvalidParameterCombination", Message: "This fake modifies an attachment's DeleteOnTermination only."}
	}
	if att != f.attachment {
		return nil, &APIError{Code: "InvalidAttachmentID.NotFound", Message: fmt.Sprintf("The attachment ID '%s' does not exist", att)}
	}
	f.deleteOnTermination = strings.EqualFold(del, "true")
	return returnTrue("ModifyNetworkInterfaceAttribute"), nil
}

func (s *Server) detachNetworkInterfaceLocked(form map[string][]string) (any, *APIError) {
	att := first(form, "AttachmentId")
	for _, f := range s.ifaces {
		if f.attachment != att || att == "" {
			continue
		}
		s.changedLocked(f)
		if f.device == 0 && f.card == 0 {
			return nil, &APIError{Code: "OperationNotPermitted", Message: "The network interface at device index 0 cannot be detached."}
		}
		// Asynchronous: available only once FinishDetaches runs.
		f.status = "detaching"
		return returnTrue("DetachNetworkInterface"), nil
	}
	return nil, &APIError{Code: "InvalidAttachmentID.NotFound", Message: fmt.Sprintf("The attachment ID '%s' does not exist", att)}
}

func (s *Server) deleteNetworkInterfaceLocked(form map[string][]string) (any, *APIError) {
	f, e := s.lookupLocked(first(form, "NetworkInterfaceId"))
	if e != nil {
		return nil, e
	}
	s.changedLocked(f)
	if f.status != "available" {
		return nil, &APIError{Code: "InvalidNetworkInterface.InUse", Message: fmt.Sprintf("The network interface '%s' is currently in use.", f.id)}
	}
	s.deleteLocked(f)
	return returnTrue("DeleteNetworkInterface"), nil
}

func (s *Server) assignLocked(form map[string][]string) (any, *APIError) {
	type assignedItem struct {
		Address string `xml:"privateIpAddress"`
	}
	type response struct {
		XMLName   xml.Name       `xml:"AssignPrivateIpAddressesResponse"`
		Xmlns     string         `xml:"xmlns,attr"`
		RequestID string         `xml:"requestId"`
		IfaceID   string         `xml:"networkInterfaceId"`
		Addresses []assignedItem `xml:"assignedPrivateIpAddressesSet>item"`
		Prefixes  []prefixItem   `xml:"assignedIpv4PrefixSet>item"`
	}
	f, e := s.lookupLocked(first(form, "NetworkInterfaceId"))
	if e != nil {
		return nil, e
	}
	s.changedLocked(f)
	count, prefixCount := first(form, "SecondaryPrivateIpAddressCount"), first(form, "Ipv4PrefixCount")
	if len(list(form, "PrivateIpAddress")) > 0 || len(list(form, "Ipv4Prefix")) > 0 {
		return nil, &APIError{Code: "InvalidParameterCombination", Message: "This fake hands out addresses of its choosing only; name a count."}
	}
	if (count == "") == (prefixCount == "") {
		return nil, &APIError{Code: "InvalidParameterCombination", Message: "Specify either SecondaryPrivateIpAddressCount or Ipv4PrefixCount."}
	}
	prefixes := prefixCount != ""
	n, err := strconv.Atoi(count + prefixCount)
	if err != nil || n < 1 {
		return nil, &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Invalid value '%s' for the count.", count+prefixCount)}
	}
	if f.instance != "" {
		t := Types[s.instances[f.instance].typ]
		if prefixes && !t.TakesPrefixes() {
			return nil, &APIError{Code: "InvalidParameterValue", Message: "Prefix delegation is supported on Nitro instances only."}
		}
		if 1+len(f.addrs)+len(f.prefixes)+n > t.IPv4PerInterface {
			return nil, &APIError{Code: "PrivateIpAddressLimitExceeded", Message: "Number of private addresses will exceed limit."}
		}
	}
	res := response{Xmlns: xmlns, RequestID: requestID, IfaceID: f.id}
	addrs, prefixes2, e := s.takeLocked(f, n, prefixes)
	if e != nil {
		return nil, e
	}
	for _, a := range addrs {
		res.Addresses = append(res.Addresses, assignedItem{Address: a.String()})
	}
	for _, p := range prefixes2 {
		res.Prefixes = append(res.Prefixes, prefixItem{Prefix: p.String()})
	}
	return res, nil
}

func (s *Server) unassignLocked(form map[string][]string) (any, *APIError) {
	type response struct {
		XMLName   xml.Name `xml:"UnassignPrivateIpAddressesResponse"`
		Xmlns     string   `xml:"xmlns,attr"`
		RequestID string   `xml:"requestId"`
		Return    bool     `xml:"return"`
	}
	f, e := s.lookupLocked(first(form, "NetworkInterfaceId"))
	if e != nil {
		return nil, e
	}
	s.changedLocked(f)
	notHeld := &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Some of the specified addresses are not assigned to interface %s", f.id)}
	var addrs []netip.Addr
	for _, v := range list(form, "PrivateIpAddress") {
		a, err := netip.ParseAddr(v)
		if err != nil || !slices.Contains(f.addrs, a) {
			return nil, notHeld
		}
		addrs = append(addrs, a)
	}
	var prefixes []netip.Prefix
	for _, v := range list(form, "Ipv4Prefix") {
		p, err := netip.ParsePrefix(strings.TrimSpace(v))
		if err != nil || !slices.Contains(f.prefixes, p) {
			return nil, notHeld
		}
		prefixes = append(prefixes, p)
	}
	if len(addrs)+len(prefixes) == 0 {
		return nil, &APIError{Code: "MissingParameter", Message: "Name a private address or a prefix to unassign."}
	}
	sn := s.subnets[f.subnet]
	for _, a := range addrs {
		sn.release(a)
		f.addrs = slices.DeleteFunc(f.addrs, func(x netip.Addr) bool { return x == a })
	}
	for _, p := range prefixes {
		sn.releasePrefix(p)
		f.prefixes = slices.DeleteFunc(f.prefixes, func(x netip.Prefix) bool { return x == p })
	}
	return response{Xmlns: xmlns, RequestID: requestID, Return: true}, nil
}
