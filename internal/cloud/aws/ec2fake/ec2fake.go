// Package ec2fake is an EC2 endpoint for tests: it speaks EC2's Query
// protocol (form-encoded POST, XML answers, errors as
// <Response><Errors><Error>) so the real aws-sdk-go-v2 EC2 client can be
// pointed at it, and it keeps the state that matters to address
// management: instance types and their limits, subnets whose addresses
// are handed out lowest first and unique across the subnet (the first four
// and the last reserved, as in a VPC), interfaces attached to instances,
// their secondary addresses and their /28 prefixes, carved aligned from
// the subnet's free space. It answers the error codes EC2 answers, and a
// fault hook lets a test refuse any call (throttling, outages).
//
// It serves DescribeInstances, DescribeInstanceTypes,
// DescribeNetworkInterfaces, AssignPrivateIpAddresses and
// UnassignPrivateIpAddresses; any other action is answered
// InvalidAction.
package ec2fake

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"go4.org/netipx"
)

// InstanceType is an EC2 instance type's limits.
type InstanceType struct {
	Interfaces       int // MaximumNetworkInterfaces
	IPv4PerInterface int // Ipv4AddressesPerInterface, the primary included
	IPv6PerInterface int
	Nitro            bool // takes prefixes
}

// Types are the instance types every Server knows, with EC2's limits.
var Types = map[string]InstanceType{
	"t2.medium": {Interfaces: 3, IPv4PerInterface: 6, IPv6PerInterface: 6},
	"t3.small":  {Interfaces: 3, IPv4PerInterface: 4, IPv6PerInterface: 4, Nitro: true},
	"m5.large":  {Interfaces: 3, IPv4PerInterface: 10, IPv6PerInterface: 10, Nitro: true},
	"c5.xlarge": {Interfaces: 4, IPv4PerInterface: 15, IPv6PerInterface: 15, Nitro: true},
}

// APIError is an error answer: EC2's code and message, and the HTTP status
// (400 when zero).
type APIError struct {
	Status  int
	Code    string
	Message string
}

// Throttled is the error EC2 answers a caller over its request rate.
func Throttled() *APIError {
	return &APIError{Status: http.StatusServiceUnavailable, Code: "RequestLimitExceeded", Message: "Request limit exceeded."}
}

// Server is the fake endpoint. Its zero value is not usable: use New.
type Server struct {
	mu        sync.Mutex // guards every field below
	subnets   map[string]*subnet
	instances map[string]*instance
	ifaces    map[string]*iface
	nextID    int
	fault     func(action string) *APIError
	calls     map[string]int
	// pageSize, when positive, bounds the items of one Describe page.
	pageSize int
}

type subnet struct {
	id     string
	cidr   netip.Prefix
	owners map[netip.Addr]string   // assigned address -> interface
	blocks map[netip.Prefix]string // assigned prefix -> interface
}

type instance struct {
	id, typ, subnet string
}

type iface struct {
	id, subnet, instance string
	device               int
	primary              netip.Addr
	addrs                []netip.Addr
	prefixes             []netip.Prefix
}

// New answers an empty fake.
func New() *Server {
	return &Server{subnets: map[string]*subnet{}, instances: map[string]*instance{}, ifaces: map[string]*iface{}, calls: map[string]int{}}
}

// AddSubnet adds subnet id with cidr.
func (s *Server) AddSubnet(id string, cidr netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subnets[id] = &subnet{id: id, cidr: cidr.Masked(), owners: map[netip.Addr]string{}, blocks: map[netip.Prefix]string{}}
}

// AddInstance starts an instance of type typ in subnet, with its primary
// interface (device 0) and that interface's primary address, and answers
// their ids.
func (s *Server) AddInstance(typ, subnetID string) (instanceID, ifaceID string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := Types[typ]; !ok {
		return "", "", fmt.Errorf("unknown instance type %q", typ)
	}
	if _, ok := s.subnets[subnetID]; !ok {
		return "", "", fmt.Errorf("unknown subnet %q", subnetID)
	}
	s.nextID++
	instanceID = fmt.Sprintf("i-%017x", s.nextID)
	s.instances[instanceID] = &instance{id: instanceID, typ: typ, subnet: subnetID}
	f, err := s.attachLocked(instanceID, subnetID, 0)
	if err != nil {
		return "", "", err
	}
	return instanceID, f.id, nil
}

// AttachInterface attaches a new interface in subnet to instance at
// device, as one created and attached earlier, and answers its id.
func (s *Server) AttachInterface(instanceID, subnetID string, device int) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.instances[instanceID]
	if !ok {
		return "", fmt.Errorf("unknown instance %q", instanceID)
	}
	if _, ok := s.subnets[subnetID]; !ok {
		return "", fmt.Errorf("unknown subnet %q", subnetID)
	}
	n := 0
	for _, f := range s.ifaces {
		if f.instance == instanceID {
			n++
			if f.device == device {
				return "", fmt.Errorf("device %d of %s is taken", device, instanceID)
			}
		}
	}
	if n >= Types[in.typ].Interfaces {
		return "", fmt.Errorf("%s takes no more interfaces", instanceID)
	}
	f, err := s.attachLocked(instanceID, subnetID, device)
	if err != nil {
		return "", err
	}
	return f.id, nil
}

func (s *Server) attachLocked(instanceID, subnetID string, device int) (*iface, error) {
	sn := s.subnets[subnetID]
	free := sn.freeAddrs(1)
	if len(free) == 0 {
		return nil, fmt.Errorf("subnet %s is full", subnetID)
	}
	s.nextID++
	f := &iface{id: fmt.Sprintf("eni-%017x", s.nextID), subnet: subnetID, instance: instanceID, device: device, primary: free[0]}
	sn.owners[free[0]] = f.id
	s.ifaces[f.id] = f
	return f, nil
}

// Take marks addr of subnet as used by something else (another tenant's
// interface), as a test fragments a subnet.
func (s *Server) Take(subnetID string, addr netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subnets[subnetID].owners[addr] = "eni-other"
}

// SetFault makes f decide, before each call, whether to refuse it: a
// non-nil *APIError is answered instead. nil removes the hook.
func (s *Server) SetFault(f func(action string) *APIError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = f
}

// SetPageSize bounds the items of every Describe page (0: no bound), so
// tests see the SDK follow NextToken.
func (s *Server) SetPageSize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pageSize = n
}

// Calls answers how many calls of action the fake received, refused ones
// included.
func (s *Server) Calls(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[action]
}

// Held answers the secondary addresses and prefixes interface id holds.
func (s *Server) Held(id string) ([]netip.Addr, []netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.ifaces[id]
	if !ok {
		return nil, nil
	}
	return slices.Clone(f.addrs), slices.Clone(f.prefixes)
}

// usable reports whether addr is an address of the subnet that EC2 may
// hand out: not the network address, not the next three (router, DNS,
// reserved) and not the last.
func (sn *subnet) usable(addr netip.Addr) bool {
	first := sn.cidr.Addr()
	last := netipx.PrefixLastIP(sn.cidr)
	return sn.cidr.Contains(addr) && addr.Compare(first.Next().Next().Next()) > 0 && addr != last
}

// taken reports whether addr is assigned, or inside an assigned prefix.
func (sn *subnet) taken(addr netip.Addr) bool {
	if _, ok := sn.owners[addr]; ok {
		return true
	}
	for p := range sn.blocks {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// freeAddrs answers the n lowest free addresses, fewer when the subnet
// has fewer.
func (sn *subnet) freeAddrs(n int) []netip.Addr {
	var out []netip.Addr
	for a := sn.cidr.Addr(); sn.cidr.Contains(a) && len(out) < n; a = a.Next() {
		if sn.usable(a) && !sn.taken(a) {
			out = append(out, a)
		}
	}
	return out
}

// freePrefixes answers the n lowest aligned /28s of the subnet whose every
// address is usable and free, fewer when there are fewer.
func (sn *subnet) freePrefixes(n int) []netip.Prefix {
	var out []netip.Prefix
	if sn.cidr.Bits() > 28 {
		return nil
	}
	for p := netip.PrefixFrom(sn.cidr.Addr(), 28); sn.cidr.Contains(p.Addr()) && len(out) < n; {
		free := true
		for a := p.Addr(); p.Contains(a); a = a.Next() {
			if !sn.usable(a) || sn.taken(a) {
				free = false
				break
			}
		}
		if free {
			out = append(out, p)
		}
		next := netipx.PrefixLastIP(p).Next()
		if !next.IsValid() {
			break
		}
		p = netip.PrefixFrom(next, 28)
	}
	return out
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, &APIError{Status: http.StatusMethodNotAllowed, Code: "InvalidHttpRequest", Message: "EC2 takes POST"})
		return
	}
	if err := r.ParseForm(); err != nil {
		writeError(w, &APIError{Code: "MalformedQueryString", Message: err.Error()})
		return
	}
	action := r.PostForm.Get("Action")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[action]++
	if s.fault != nil {
		if e := s.fault(action); e != nil {
			writeError(w, e)
			return
		}
	}
	var (
		answer any
		e      *APIError
	)
	switch action {
	case "DescribeInstances":
		answer, e = s.describeInstancesLocked(r.PostForm)
	case "DescribeInstanceTypes":
		answer, e = s.describeInstanceTypesLocked(r.PostForm)
	case "DescribeNetworkInterfaces":
		answer, e = s.describeNetworkInterfacesLocked(r.PostForm)
	case "AssignPrivateIpAddresses":
		answer, e = s.assignLocked(r.PostForm)
	case "UnassignPrivateIpAddresses":
		answer, e = s.unassignLocked(r.PostForm)
	default:
		e = &APIError{Code: "InvalidAction", Message: fmt.Sprintf("The action %s is not valid for this web service.", action)}
	}
	if e != nil {
		writeError(w, e)
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = w.Write([]byte(xml.Header))
	_ = xml.NewEncoder(w).Encode(answer)
}

// xmlns is the namespace of EC2's answers.
const xmlns = "http://ec2.amazonaws.com/doc/2016-11-15/"

// requestID is the fake's request id in every answer.
const requestID = "7a62c49f-347e-4fc4-9331-6e8eEXAMPLE"

func writeError(w http.ResponseWriter, e *APIError) {
	type errorResponse struct {
		XMLName   xml.Name `xml:"Response"`
		Code      string   `xml:"Errors>Error>Code"`
		Message   string   `xml:"Errors>Error>Message"`
		RequestID string   `xml:"RequestID"`
	}
	status := e.Status
	if status == 0 {
		status = http.StatusBadRequest
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(xml.Header))
	_ = xml.NewEncoder(w).Encode(errorResponse{Code: e.Code, Message: e.Message, RequestID: requestID})
}

// list answers the values of a flattened list parameter name.1, name.2, ...
func list(form map[string][]string, name string) []string {
	var out []string
	for i := 1; ; i++ {
		v, ok := form[name+"."+strconv.Itoa(i)]
		if !ok || len(v) == 0 {
			return out
		}
		out = append(out, v[0])
	}
}

// filters answers the Filter.N.Name -> values of a request.
func filters(form map[string][]string) map[string][]string {
	out := map[string][]string{}
	for i := 1; ; i++ {
		name, ok := form["Filter."+strconv.Itoa(i)+".Name"]
		if !ok || len(name) == 0 {
			return out
		}
		out[name[0]] = list(form, "Filter."+strconv.Itoa(i)+".Value")
	}
}

// page cuts items after the NextToken of form (an offset), answering the
// page and the token of the next one ("" at the end).
func page[T any](s *Server, form map[string][]string, items []T) ([]T, string, *APIError) {
	start := 0
	if tok := first(form, "NextToken"); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n > len(items) {
			return nil, "", &APIError{Code: "InvalidPaginationToken", Message: "The pagination token is not valid."}
		}
		start = n
	}
	size := len(items) - start
	if max, err := strconv.Atoi(first(form, "MaxResults")); err == nil && max > 0 {
		size = min(size, max)
	}
	if s.pageSize > 0 {
		size = min(size, s.pageSize)
	}
	end := start + size
	if end < len(items) {
		return items[start:end], strconv.Itoa(end), nil
	}
	return items[start:end], "", nil
}

func first(form map[string][]string, key string) string {
	if v := form[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (s *Server) describeInstancesLocked(form map[string][]string) (any, *APIError) {
	type instanceItem struct {
		InstanceID   string `xml:"instanceId"`
		InstanceType string `xml:"instanceType"`
		SubnetID     string `xml:"subnetId"`
		State        string `xml:"instanceState>name"`
	}
	type reservation struct {
		Instances []instanceItem `xml:"instancesSet>item"`
	}
	type response struct {
		XMLName      xml.Name      `xml:"DescribeInstancesResponse"`
		Xmlns        string        `xml:"xmlns,attr"`
		RequestID    string        `xml:"requestId"`
		Reservations []reservation `xml:"reservationSet>item"`
	}
	res := response{Xmlns: xmlns, RequestID: requestID}
	for _, id := range list(form, "InstanceId") {
		in, ok := s.instances[id]
		if !ok {
			return nil, &APIError{Code: "InvalidInstanceID.NotFound", Message: fmt.Sprintf("The instance ID '%s' does not exist", id)}
		}
		res.Reservations = append(res.Reservations, reservation{Instances: []instanceItem{{InstanceID: in.id, InstanceType: in.typ, SubnetID: in.subnet, State: "running"}}})
	}
	return res, nil
}

func (s *Server) describeInstanceTypesLocked(form map[string][]string) (any, *APIError) {
	type typeItem struct {
		InstanceType     string `xml:"instanceType"`
		Hypervisor       string `xml:"hypervisor"`
		Interfaces       int    `xml:"networkInfo>maximumNetworkInterfaces"`
		IPv4PerInterface int    `xml:"networkInfo>ipv4AddressesPerInterface"`
		IPv6PerInterface int    `xml:"networkInfo>ipv6AddressesPerInterface"`
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
		for name := range Types {
			names = append(names, name)
		}
		slices.Sort(names)
	}
	var items []typeItem
	for _, name := range names {
		t, ok := Types[name]
		if !ok {
			return nil, &APIError{Code: "InvalidInstanceType", Message: fmt.Sprintf("The following supplied instance types do not exist: [%s]", name)}
		}
		hv := "xen"
		if t.Nitro {
			hv = "nitro"
		}
		items = append(items, typeItem{InstanceType: name, Hypervisor: hv, Interfaces: t.Interfaces, IPv4PerInterface: t.IPv4PerInterface, IPv6PerInterface: t.IPv6PerInterface})
	}
	items, next, e := page(s, form, items)
	if e != nil {
		return nil, e
	}
	return response{Xmlns: xmlns, RequestID: requestID, Types: items, NextToken: next}, nil
}

func (s *Server) describeNetworkInterfacesLocked(form map[string][]string) (any, *APIError) {
	type addrItem struct {
		Address string `xml:"privateIpAddress"`
		Primary bool   `xml:"primary"`
	}
	type prefixItem struct {
		Prefix string `xml:"ipv4Prefix"`
	}
	type ifaceItem struct {
		ID         string       `xml:"networkInterfaceId"`
		SubnetID   string       `xml:"subnetId"`
		Status     string       `xml:"status"`
		Primary    string       `xml:"privateIpAddress"`
		InstanceID string       `xml:"attachment>instanceId"`
		Device     int          `xml:"attachment>deviceIndex"`
		Attachment string       `xml:"attachment>status"`
		Addresses  []addrItem   `xml:"privateIpAddressesSet>item"`
		Prefixes   []prefixItem `xml:"ipv4PrefixSet>item"`
	}
	type response struct {
		XMLName    xml.Name    `xml:"DescribeNetworkInterfacesResponse"`
		Xmlns      string      `xml:"xmlns,attr"`
		RequestID  string      `xml:"requestId"`
		Interfaces []ifaceItem `xml:"networkInterfaceSet>item"`
		NextToken  string      `xml:"nextToken,omitempty"`
	}
	want := map[string]bool{}
	for _, id := range list(form, "NetworkInterfaceId") {
		if _, ok := s.ifaces[id]; !ok {
			return nil, &APIError{Code: "InvalidNetworkInterfaceID.NotFound", Message: fmt.Sprintf("The networkInterface ID '%s' does not exist", id)}
		}
		want[id] = true
	}
	fs := filters(form)
	for name := range fs {
		if name != "attachment.instance-id" {
			return nil, &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("The filter '%s' is invalid", name)}
		}
	}
	var ids []string
	for id, f := range s.ifaces {
		if len(want) > 0 && !want[id] {
			continue
		}
		if v, ok := fs["attachment.instance-id"]; ok && !slices.Contains(v, f.instance) {
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var items []ifaceItem
	for _, id := range ids {
		f := s.ifaces[id]
		it := ifaceItem{ID: f.id, SubnetID: f.subnet, Status: "in-use", Primary: f.primary.String(), InstanceID: f.instance, Device: f.device, Attachment: "attached",
			Addresses: []addrItem{{Address: f.primary.String(), Primary: true}}}
		for _, a := range f.addrs {
			it.Addresses = append(it.Addresses, addrItem{Address: a.String()})
		}
		for _, p := range f.prefixes {
			it.Prefixes = append(it.Prefixes, prefixItem{Prefix: p.String()})
		}
		items = append(items, it)
	}
	items, next, e := page(s, form, items)
	if e != nil {
		return nil, e
	}
	return response{Xmlns: xmlns, RequestID: requestID, Interfaces: items, NextToken: next}, nil
}

func (s *Server) assignLocked(form map[string][]string) (any, *APIError) {
	type addrItem struct {
		Address string `xml:"privateIpAddress"`
	}
	type prefixItem struct {
		Prefix string `xml:"ipv4Prefix"`
	}
	type response struct {
		XMLName   xml.Name     `xml:"AssignPrivateIpAddressesResponse"`
		Xmlns     string       `xml:"xmlns,attr"`
		RequestID string       `xml:"requestId"`
		IfaceID   string       `xml:"networkInterfaceId"`
		Addresses []addrItem   `xml:"assignedPrivateIpAddressesSet>item"`
		Prefixes  []prefixItem `xml:"assignedIpv4PrefixSet>item"`
	}
	id := first(form, "NetworkInterfaceId")
	f, ok := s.ifaces[id]
	if !ok {
		return nil, &APIError{Code: "InvalidNetworkInterfaceID.NotFound", Message: fmt.Sprintf("The networkInterface ID '%s' does not exist", id)}
	}
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
	t := Types[s.instances[f.instance].typ]
	if prefixes && !t.Nitro {
		return nil, &APIError{Code: "InvalidParameterValue", Message: "Prefix delegation is supported on Nitro instances only."}
	}
	if 1+len(f.addrs)+len(f.prefixes)+n > t.IPv4PerInterface {
		return nil, &APIError{Code: "PrivateIpAddressLimitExceeded", Message: "Number of private addresses will exceed limit."}
	}
	sn := s.subnets[f.subnet]
	res := response{Xmlns: xmlns, RequestID: requestID, IfaceID: f.id}
	if prefixes {
		got := sn.freePrefixes(n)
		if len(got) < n {
			if len(sn.freeAddrs(PrefixAddresses*n)) < PrefixAddresses*n {
				return nil, &APIError{Code: "InsufficientFreeAddressesInSubnet", Message: "The specified subnet does not have enough free addresses to satisfy the request."}
			}
			return nil, &APIError{Code: "InsufficientCidrBlocks", Message: "The specified subnet does not have enough free cidr blocks to satisfy the request."}
		}
		for _, p := range got {
			sn.blocks[p] = f.id
			f.prefixes = append(f.prefixes, p)
			res.Prefixes = append(res.Prefixes, prefixItem{Prefix: p.String()})
		}
		return res, nil
	}
	got := sn.freeAddrs(n)
	if len(got) < n {
		return nil, &APIError{Code: "InsufficientFreeAddressesInSubnet", Message: "The specified subnet does not have enough free addresses to satisfy the request."}
	}
	for _, a := range got {
		sn.owners[a] = f.id
		f.addrs = append(f.addrs, a)
		res.Addresses = append(res.Addresses, addrItem{Address: a.String()})
	}
	return res, nil
}

// PrefixAddresses is the size of a delegated IPv4 prefix.
const PrefixAddresses = 16

func (s *Server) unassignLocked(form map[string][]string) (any, *APIError) {
	type response struct {
		XMLName   xml.Name `xml:"UnassignPrivateIpAddressesResponse"`
		Xmlns     string   `xml:"xmlns,attr"`
		RequestID string   `xml:"requestId"`
		Return    bool     `xml:"return"`
	}
	id := first(form, "NetworkInterfaceId")
	f, ok := s.ifaces[id]
	if !ok {
		return nil, &APIError{Code: "InvalidNetworkInterfaceID.NotFound", Message: fmt.Sprintf("The networkInterface ID '%s' does not exist", id)}
	}
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
		delete(sn.owners, a)
		f.addrs = slices.DeleteFunc(f.addrs, func(x netip.Addr) bool { return x == a })
	}
	for _, p := range prefixes {
		delete(sn.blocks, p)
		f.prefixes = slices.DeleteFunc(f.prefixes, func(x netip.Prefix) bool { return x == p })
	}
	return response{Xmlns: xmlns, RequestID: requestID, Return: true}, nil
}
