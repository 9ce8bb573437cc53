// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package ec2fake is an EC2 endpoint for tests: it speaks EC2's Query
// protocol (form-encoded POST, XML answers, errors as
// <Response><Errors><Error>) so the real aws-sdk-go-v2 EC2 client can be
// pointed at it, and it keeps the state that matters to address
// management: instance types and their limits, subnets whose addresses
// are handed out lowest first and unique across the subnet (the first four
// and the last reserved, as in a VPC), network interfaces created,
// attached (one per device index, up to the type's limit), detached
// asynchronously and deleted, their secondary addresses and their /28
// prefixes carved aligned from the subnet's free space, and instances
// that terminate (deleting the interfaces marked delete-on-termination,
// leaving the others available). It answers the error codes EC2 answers;
// a fault hook refuses any call (throttling, outages), and a new interface
// can stay invisible for a few calls, as EC2's eventual consistency
// leaves it right after a create. Faults after the change (a 5xx, a cut
// connection, a held or lost answer; faults.go), describes answering a
// past state (stale.go), random free addresses (random.go) and the
// refusal of unpaginated listings (pages.go) are options, off by
// default.
//
// Actions: DescribeInstances, DescribeInstanceTypes, DescribeSubnets,
// DescribeVpcs, DescribeSecurityGroups,
// DescribeNetworkInterfaces, CreateNetworkInterface,
// AttachNetworkInterface, ModifyNetworkInterfaceAttribute,
// DetachNetworkInterface, DeleteNetworkInterface,
// AssignPrivateIpAddresses, UnassignPrivateIpAddresses. Any other is
// answered InvalidAction.
package ec2fake

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"go4.org/netipx"
)

// InstanceType is an EC2 instance type's limits.
type InstanceType struct {
	Interfaces       int // MaximumNetworkInterfaces
	IPv4PerInterface int // Ipv4AddressesPerInterface, the primary included
	IPv6PerInterface int
	VCPUs            int  // VCpuInfo.DefaultVCpus
	Nitro            bool // Hypervisor "nitro"
	// BareMetal types run on no hypervisor: EC2 answers no Hypervisor
	// for them, and BareMetal true. They are Nitro-class and take
	// prefixes.
	BareMetal bool
	// Cards are the MaximumNetworkInterfaces of each network card, by
	// NetworkCardIndex, of a type with several (nil: one card taking
	// Interfaces); DefaultCard is its DefaultNetworkCardIndex.
	Cards       []int
	DefaultCard int
}

// TakesPrefixes says whether EC2 delegates prefixes to the type's
// interfaces: Nitro and bare-metal types, not Xen ones.
func (t InstanceType) TakesPrefixes() bool { return t.Nitro || t.BareMetal }

// Types are the instance types every Server knows, with EC2's limits.
var Types = map[string]InstanceType{
	"t2.medium": {Interfaces: 3, IPv4PerInterface: 6, IPv6PerInterface: 6, VCPUs: 2},
	"t3.nano":   {Interfaces: 2, IPv4PerInterface: 2, IPv6PerInterface: 2, VCPUs: 2, Nitro: true},
	"t3.small":  {Interfaces: 3, IPv4PerInterface: 4, IPv6PerInterface: 4, VCPUs: 2, Nitro: true},
	"m5.large":  {Interfaces: 3, IPv4PerInterface: 10, IPv6PerInterface: 10, VCPUs: 2, Nitro: true},
	"c5.xlarge": {Interfaces: 4, IPv4PerInterface: 15, IPv6PerInterface: 15, VCPUs: 4, Nitro: true},
	"m5.metal":  {Interfaces: 15, IPv4PerInterface: 50, IPv6PerInterface: 50, VCPUs: 96, BareMetal: true},
	// Two network cards of 8 interfaces each (DescribeInstanceTypes, as
	// the VPC CNI's generated limits record it).
	"c6in.32xlarge": {Interfaces: 16, IPv4PerInterface: 50, IPv6PerInterface: 50, VCPUs: 128, Nitro: true, Cards: []int{8, 8}},
}

// PrefixAddresses is the size of a delegated IPv4 prefix (a /28).
const PrefixAddresses = 16

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

// Subnet describes a subnet to add.
type Subnet struct {
	ID   string
	VPC  string
	Zone string
	CIDR netip.Prefix
	// IPv6CIDR is the subnet's IPv6 /64, if it has one (AddSubnetIPv6).
	IPv6CIDR netip.Prefix
	Tags     map[string]string
}

// Server is the fake endpoint. Its zero value is not usable: use New.
type Server struct {
	mu        sync.Mutex // guards every field below
	subnets   map[string]*subnet
	instances map[string]*instance
	ifaces    map[string]*iface
	// vpcs are the CIDR blocks of each VPC, the primary first.
	vpcs   map[string][]netip.Prefix
	groups map[string]*securityGroup
	nextID int
	fault  func(action string) *APIError
	calls  map[string]int
	// pageSize, when positive, bounds the items of one Describe page.
	pageSize int
	// invisible is how many calls naming a newly created interface
	// answer that it does not exist.
	invisible int
	// after, rates and rateRNG decide the faults after a call
	// (faults.go); faults counts those injected.
	after   func(action string) AfterFault
	rates   FaultRates
	rateRNG *rand.Rand
	faults  map[FaultKind]int
	// stale keeps the versions eventually consistent reads answer
	// (stale.go), dated by clock (time.Now when nil).
	stale stale
	clock func() time.Time
	// unpaginated bounds unpaginated listings (pages.go).
	unpaginated map[string]unpaginatedLimit
	// addrRNG, when set, draws free addresses at random (random.go).
	addrRNG *rand.Rand
	// done is closed by Close, ending held answers.
	done   chan struct{}
	closed bool
	// tokens are the answers of the creates by their ClientToken
	// (tokens.go); changes counts the changing calls naming each
	// interface.
	tokens  map[string]tokenAnswer
	changes map[string]int
}

type subnet struct {
	Subnet
	// used holds every taken address, assigned or inside an assigned
	// prefix, with its interface; prefixes the assigned prefixes.
	used     map[netip.Addr]string
	prefixes map[netip.Prefix]string
	// nUsed counts the usable addresses in used.
	nUsed int
	// hint and prefixHint bound the scans: no usable address below hint
	// is free, no /28 below prefixHint is wholly free.
	hint, prefixHint netip.Addr
}

type instance struct {
	id, typ, subnet string
	terminated      bool
}

type iface struct {
	id, subnet string
	mac        string
	primary    netip.Addr
	addrs      []netip.Addr
	prefixes   []netip.Prefix
	// ipv6Prefixes are its delegated IPv6 /80s.
	ipv6Prefixes []netip.Prefix
	groups       []string
	tags         map[string]string
	// status is available, in-use or detaching; an attached interface
	// has an instance, device and attachment.
	status              string
	instance            string
	device              int
	attachment          string
	card                int
	deleteOnTermination bool
	// typ is its InterfaceType: interface, trunk, efa, efa-only.
	typ string
	// hidden is how many more calls naming it answer NotFound.
	hidden int
}

// New answers an empty fake.
func New() *Server {
	return &Server{subnets: map[string]*subnet{}, instances: map[string]*instance{}, ifaces: map[string]*iface{},
		vpcs: map[string][]netip.Prefix{}, groups: map[string]*securityGroup{}, calls: map[string]int{},
		faults: map[FaultKind]int{}, done: make(chan struct{}), unpaginated: map[string]unpaginatedLimit{},
		tokens: map[string]tokenAnswer{}, changes: map[string]int{}}
}

// AddSubnet adds a subnet.
func (s *Server) AddSubnet(sn Subnet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.recordLocked()
	sn.CIDR = sn.CIDR.Masked()
	sn.Tags = maps.Clone(sn.Tags)
	if _, ok := s.vpcs[sn.VPC]; !ok {
		s.vpcs[sn.VPC] = []netip.Prefix{sn.CIDR}
	}
	s.subnets[sn.ID] = &subnet{Subnet: sn, used: map[netip.Addr]string{}, prefixes: map[netip.Prefix]string{}, hint: sn.CIDR.Addr(), prefixHint: sn.CIDR.Addr()}
}

// AddInstance starts an instance of type typ in subnet, with its primary
// interface (device 0, security group sg-node, deleted with the
// instance) and that interface's primary address, and answers their ids.
func (s *Server) AddInstance(typ, subnetID string) (instanceID, ifaceID string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.recordLocked()
	if _, ok := Types[typ]; !ok {
		return "", "", fmt.Errorf("unknown instance type %q", typ)
	}
	if _, ok := s.subnets[subnetID]; !ok {
		return "", "", fmt.Errorf("unknown subnet %q", subnetID)
	}
	instanceID = s.newIDLocked("i")
	s.instances[instanceID] = &instance{id: instanceID, typ: typ, subnet: subnetID}
	f, e := s.createLocked(subnetID, []string{"sg-node"}, nil)
	if e != nil {
		return "", "", fmt.Errorf("%s: %s", e.Code, e.Message)
	}
	s.attachToLocked(f, instanceID, 0)
	f.deleteOnTermination = true
	return instanceID, f.id, nil
}

// AttachInterface creates an interface in subnet and attaches it to
// instance at device, as one created and attached earlier, and answers
// its id.
func (s *Server) AttachInterface(instanceID, subnetID string, device int) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.recordLocked()
	if _, ok := s.subnets[subnetID]; !ok {
		return "", fmt.Errorf("unknown subnet %q", subnetID)
	}
	f, e := s.createLocked(subnetID, []string{"sg-node"}, nil)
	if e == nil {
		e = s.attachLocked(f, instanceID, device)
	}
	if e != nil {
		return "", fmt.Errorf("%s: %s", e.Code, e.Message)
	}
	return f.id, nil
}

// AttachTaggedInterface is AttachInterface with tags on the interface
// and n secondary addresses assigned: one a user attached for something
// else than Pods.
func (s *Server) AttachTaggedInterface(instanceID, subnetID string, device int, tags map[string]string, n int) (string, error) {
	id, err := s.AttachInterface(instanceID, subnetID, device)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.recordLocked()
	f := s.ifaces[id]
	f.tags = maps.Clone(tags)
	if _, _, e := s.takeLocked(f, n, false); e != nil {
		return "", fmt.Errorf("%s: %s", e.Code, e.Message)
	}
	return id, nil
}

// TerminateInstance terminates an instance: its interfaces marked delete
// on termination are deleted with their addresses, the others detached
// (available).
func (s *Server) TerminateInstance(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.recordLocked()
	in, ok := s.instances[id]
	if !ok {
		return
	}
	in.terminated = true
	for _, f := range s.ifaces {
		if f.instance != id {
			continue
		}
		if f.deleteOnTermination {
			s.deleteLocked(f)
			continue
		}
		f.status, f.instance, f.attachment = "available", "", ""
	}
}

// FinishDetaches completes every detach under way: EC2 detaches
// asynchronously, and an interface is available (deletable) only after.
func (s *Server) FinishDetaches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.recordLocked()
	for _, f := range s.ifaces {
		if f.status == "detaching" {
			f.status, f.instance, f.attachment = "available", "", ""
		}
	}
}

// SetInvisibleAfterCreate makes every interface created from now on
// unknown to the next n calls that name it.
func (s *Server) SetInvisibleAfterCreate(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.invisible = n
}

// Take marks addr of subnet as used by something else (another tenant's
// interface), as a test fragments a subnet.
func (s *Server) Take(subnetID string, addr netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.recordLocked()
	s.subnets[subnetID].take(addr, "eni-other")
}

// SetFault makes f decide, before each call, whether to refuse it: a
// non-nil *APIError is answered instead. nil removes the hook. f runs
// with the fake's lock held: it must not call the fake.
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

// Interface is what a test may read of an interface.
type Interface struct {
	ID                  string
	MAC                 string
	Status              string // available, in-use or detaching
	Instance            string
	Card                int
	Device              int
	Type                string
	DeleteOnTermination bool
	Groups              []string
	Tags                map[string]string
	Addresses           []netip.Addr
	Prefixes            []netip.Prefix
}

// Interfaces answers every interface, by id.
func (s *Server) Interfaces() []Interface {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Interface
	for _, id := range slices.Sorted(maps.Keys(s.ifaces)) {
		f := s.ifaces[id]
		out = append(out, Interface{ID: f.id, MAC: f.mac, Status: f.status, Instance: f.instance, Card: f.card, Device: f.device, Type: f.typ,
			DeleteOnTermination: f.deleteOnTermination, Groups: slices.Clone(f.groups), Tags: maps.Clone(f.tags),
			Addresses: slices.Clone(f.addrs), Prefixes: slices.Clone(f.prefixes)})
	}
	return out
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

// FreeAddresses answers how many addresses subnet id can still hand out.
func (s *Server) FreeAddresses(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.subnets[id].free()
}

func (s *Server) newIDLocked(kind string) string {
	s.nextID++
	return fmt.Sprintf("%s-%017x", kind, s.nextID)
}

// usable reports whether addr is an address of the subnet that EC2 may
// hand out: not the network address, not the next three (router, DNS,
// reserved) and not the last.
func (sn *subnet) usable(addr netip.Addr) bool {
	first := sn.CIDR.Addr()
	last := netipx.PrefixLastIP(sn.CIDR)
	return sn.CIDR.Contains(addr) && addr.Compare(first.Next().Next().Next()) > 0 && addr != last
}

// taken reports whether addr is assigned, or inside an assigned prefix.
func (sn *subnet) taken(addr netip.Addr) bool {
	_, ok := sn.used[addr]
	return ok
}

// take marks addr taken by owner.
func (sn *subnet) take(addr netip.Addr, owner string) {
	if _, ok := sn.used[addr]; !ok && sn.usable(addr) {
		sn.nUsed++
	}
	sn.used[addr] = owner
}

// release frees addr and lowers the scans' bounds to it.
func (sn *subnet) release(addr netip.Addr) {
	if _, ok := sn.used[addr]; ok && sn.usable(addr) {
		sn.nUsed--
	}
	delete(sn.used, addr)
	if addr.Less(sn.hint) {
		sn.hint = addr
	}
	if p, _ := addr.Prefix(28); p.Addr().Less(sn.prefixHint) {
		sn.prefixHint = p.Addr()
	}
}

// takePrefix marks p and its addresses taken by owner.
func (sn *subnet) takePrefix(p netip.Prefix, owner string) {
	sn.prefixes[p] = owner
	for a := p.Addr(); p.Contains(a); a = a.Next() {
		sn.take(a, owner)
	}
}

// releasePrefix frees p and its addresses.
func (sn *subnet) releasePrefix(p netip.Prefix) {
	delete(sn.prefixes, p)
	for a := p.Addr(); p.Contains(a); a = a.Next() {
		sn.release(a)
	}
}

// free answers how many addresses the subnet can still hand out (EC2's
// AvailableIpAddressCount).
func (sn *subnet) free() int {
	size := 1 << (sn.CIDR.Addr().BitLen() - sn.CIDR.Bits())
	return size - 5 - sn.nUsed
}

// freeAddrs answers the n lowest free addresses, fewer when the subnet
// has fewer.
func (sn *subnet) freeAddrs(n int) []netip.Addr {
	var out []netip.Addr
	for a := sn.hint; sn.CIDR.Contains(a) && len(out) < n; a = a.Next() {
		if sn.usable(a) && !sn.taken(a) {
			if len(out) == 0 {
				sn.hint = a
			}
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		sn.hint = netipx.PrefixLastIP(sn.CIDR)
	}
	return out
}

// freePrefixes answers the n lowest aligned /28s of the subnet whose every
// address is usable and free, fewer when there are fewer.
func (sn *subnet) freePrefixes(n int) []netip.Prefix {
	var out []netip.Prefix
	if sn.CIDR.Bits() > 28 {
		return nil
	}
	for p := netip.PrefixFrom(sn.prefixHint, 28); sn.CIDR.Contains(p.Addr()) && len(out) < n; {
		free := true
		for a := p.Addr(); p.Contains(a); a = a.Next() {
			if !sn.usable(a) || sn.taken(a) {
				free = false
				break
			}
		}
		if free {
			if len(out) == 0 {
				sn.prefixHint = p.Addr()
			}
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

// DelegateIPv6Prefix delegates IPv6 prefix p to interface id, as a test
// sets up an interface that holds one.
func (s *Server) DelegateIPv6Prefix(id string, p netip.Prefix) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.recordLocked()
	f, ok := s.ifaces[id]
	if !ok {
		return fmt.Errorf("unknown interface %q", id)
	}
	f.ipv6Prefixes = append(f.ipv6Prefixes, p.Masked())
	return nil
}
