// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package armfake is an Azure Resource Manager endpoint for tests, serving
// what the Azure provider calls with the real SDK's wire format (JSON of
// armnetwork's and armcompute's own types): standalone VMs and their NICs,
// VM scale set instances with their VM models and NICs, subnets handing
// out the lowest free address (the first four and the last reserved),
// subnets (with the IP configurations in them) and virtual networks to
// read, NICs with a MAC each, scale set instances with several NICs (one
// primary), long-running writes answered with an Azure-AsyncOperation to
// poll that take as long as SetOperationDuration says on a clock the test
// sets (SetClock), ETags with If-Match, paged lists, an Entra ID
// authority, ARM's error bodies, and two fault hooks: one refusing a
// request before it is served (a 429 with a Retry-After of minutes, say),
// one replacing the answer of a request it served, its change made (a
// 5xx, or the answer lost with the connection cut).
//
// Faithful where the workers depend on it: a write's new IP configurations
// get their addresses when ARM accepts it, and provision (Updating, then
// Succeeded) when its operation ends; a subnet without as many free
// addresses as the write asks refuses it whole with 400 SubnetIsFull and
// leaves the NIC as it was; a NIC (or a scale set instance) with an
// operation under way refuses another write with 409
// AnotherOperationInProgress; a scale set NIC
// takes 256 configurations (SecondaryIpConfigurationCountPerVMSSVMExceeded),
// all in one subnet (VMScaleSetIpConfigurationsOnSameNicCannotUseDifferentSubnets);
// an instance made from a Compute Gallery image refuses a model naming
// the image (LinkedAuthorizationFailed), as it does a caller without read
// access to the gallery; a configuration can be made to fail its
// provisioning. A standalone NIC past 256 configurations is refused with
// 400 InvalidParameter (the fake's choice of code).
package armfake

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
	"go4.org/netipx"
)

// Subscription is the fake's only subscription.
const Subscription = "00000000-0000-0000-0000-000000000001"

// configLimit is how many IP configurations a NIC takes.
const configLimit = 256

// Error is an ARM error answer.
type Error struct {
	Status  int
	Code    string
	Message string
	// RetryAfterMs, when positive, is sent as Retry-After-Ms.
	RetryAfterMs int
	// RetryAfter, when positive, is sent as Retry-After in whole seconds
	// (rounded up), as ARM's throttling answers say it.
	RetryAfter time.Duration
}

// Throttled is ARM's answer to a caller over its rate.
func Throttled() *Error {
	return &Error{Status: http.StatusTooManyRequests, Code: "TooManyRequests", Message: "The request is being throttled.", RetryAfterMs: 1}
}

// ThrottledFor is ARM's answer to a caller over its rate for a while: 429
// with Retry-After d (ARM asks for minutes when a subscription's write
// budget is spent, more than the SDK waits, cilium#19695).
func ThrottledFor(d time.Duration) *Error {
	return &Error{Status: http.StatusTooManyRequests, Code: "TooManyRequests", Message: "The request is being throttled.", RetryAfter: d}
}

// After is what a fault after the fact does with a request the fake
// served, its change made: the answer replaced by Err (a 5xx), or, when
// Err is nil, lost (the connection cut before any byte of the answer).
type After struct {
	Err *Error
}

// Server is the fake. Use New.
type Server struct {
	mu      sync.Mutex // guards every field below
	base    string     // the server's URL, for operation links
	subnets map[string]*subnet
	// vnets are the address spaces of the virtual networks, by
	// lower-cased resource ID.
	vnets  map[string][]netip.Prefix
	nics   map[string]*nic // by lower-cased resource ID
	vms    map[string][]string
	sets   map[string]*setVM
	ops    map[string]*operation
	nextOp int
	// pending are the operations not finished yet.
	pending []*operation
	// now is the clock operations end by; opDuration how long one lasts.
	now        func() time.Time
	opDuration time.Duration
	fault      func(method, path string) *Error
	faultAfter func(method, path string) *After
	calls      map[string]int
	// nextMAC counts the NICs made: each one's MAC.
	nextMAC int
	// pageSize bounds the items of a list's page (SetPageSize).
	pageSize int
	// clientID and clientSecret are the one client the authority knows,
	// tokens those it issued (entra.go); nil tokens: ARM takes any.
	clientID, clientSecret string
	tokens                 map[string]bool
	// failNext makes the next n configurations provisioned end Failed.
	failNext int
}

type subnet struct {
	id    string
	cidr  netip.Prefix
	taken map[netip.Addr]bool
}

type nic struct {
	id, name string
	vm       string // the resource ID of the VM or scale set instance it is on
	mac      string
	primary  bool
	configs  []*ipConfig
	// etag counts the NIC's accepted writes (its own, or its scale set
	// instance's model's): ARM's ETag of the NIC; a scale set instance's
	// model's is the sum of its NICs' (etag.go).
	etag int
	// op is the write under way on the NIC, nil when none.
	op *operation
}

type ipConfig struct {
	name, subnet string
	addr         netip.Addr
	primary      bool
	state        string
	asgs         []string
}

type setVM struct {
	nics    []string // resource IDs of its NICs (compute paths)
	gallery string   // image of a Compute Gallery, "" for a marketplace image
}

// operation is a long-running write: accepted, it ends at doneAt (on the
// fake's clock), whether or not anyone polls it.
type operation struct {
	doneAt   time.Time
	finish   func() // provisions what the write asked, once
	finished bool
}

// New answers an empty fake; SetBase must name its URL before a write.
func New() *Server {
	return &Server{subnets: map[string]*subnet{}, vnets: map[string][]netip.Prefix{}, nics: map[string]*nic{}, vms: map[string][]string{}, sets: map[string]*setVM{},
		ops: map[string]*operation{}, calls: map[string]int{}, now: time.Now}
}

// SetClock makes now the clock operations end by (time.Now by default).
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// SetOperationDuration makes each write accepted from now on take d on
// the fake's clock before its operation ends (0, the default: it ends at
// once). ARM's NIC and scale set writes take tens of seconds; with a
// clock of the test's, a test moves past them without sleeping.
func (s *Server) SetOperationDuration(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opDuration = d
}

// PendingOperations answers how many accepted writes have not ended yet.
func (s *Server) PendingOperations() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked()
	return len(s.pending)
}

// settleLocked ends the operations whose time has come.
func (s *Server) settleLocked() {
	now := s.now()
	left := s.pending[:0]
	for _, op := range s.pending {
		if now.Before(op.doneAt) {
			left = append(left, op)
			continue
		}
		op.finish()
		op.finished = true
	}
	clear(s.pending[len(left):])
	s.pending = left
}

// SetBase tells the fake its URL (httptest's, once started).
func (s *Server) SetBase(url string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.base = url
}

func key(id string) string { return strings.ToLower(id) }

// SubnetID is the resource ID of subnet name of network vnet in group rg.
func SubnetID(rg, vnet, name string) string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/virtualNetworks/%s/subnets/%s", Subscription, rg, vnet, name)
}

// AddSubnet adds subnet id (see SubnetID) with cidr. A subnet of a
// virtual network the fake does not know makes one whose address space is
// the subnet's range.
func (s *Server) AddSubnet(id string, cidr netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subnets[key(id)] = &subnet{id: id, cidr: cidr.Masked(), taken: map[netip.Addr]bool{}}
	if vnet, _, ok := strings.Cut(key(id), "/subnets/"); ok {
		if _, known := s.vnets[vnet]; !known {
			s.vnets[vnet] = []netip.Prefix{cidr.Masked()}
		}
	}
}

// VirtualNetworkID is the resource ID of virtual network vnet in group rg.
func VirtualNetworkID(rg, vnet string) string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/virtualNetworks/%s", Subscription, rg, vnet)
}

// AddVirtualNetwork adds virtual network id (see VirtualNetworkID) with
// the address space space.
func (s *Server) AddVirtualNetwork(id string, space ...netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	blocks := make([]netip.Prefix, len(space))
	for i, p := range space {
		blocks[i] = p.Masked()
	}
	s.vnets[key(id)] = blocks
}

// AddVM adds standalone VM name of group rg with one NIC in subnet, and
// answers the VM's and the NIC's resource IDs.
func (s *Server) AddVM(rg, name, subnetID string) (vmID, nicID string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vmID = fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachines/%s", Subscription, rg, name)
	nicID = fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/networkInterfaces/%s-nic", Subscription, rg, name)
	n, err := s.newNICLocked(nicID, name+"-nic", subnetID)
	if err != nil {
		return "", "", err
	}
	n.vm = vmID
	s.nics[key(nicID)] = n
	s.vms[key(vmID)] = []string{nicID}
	return vmID, nicID, nil
}

// AddScaleSetVM adds instance of scale set set in group rg with one NIC
// in subnet, made from a Compute Gallery image when gallery, and answers
// the instance's and the NIC's resource IDs.
func (s *Server) AddScaleSetVM(rg, set, instance, subnetID string, gallery bool) (vmID, nicID string, err error) {
	vmID, nics, err := s.AddScaleSetVMWithNICs(rg, set, instance, gallery, 0, subnetID)
	if err != nil {
		return "", "", err
	}
	return vmID, nics[0], nil
}

// AddScaleSetVMWithNICs adds instance of scale set set in group rg with a
// NIC in each of subnets (named <set>-nic, then <set>-nic1, ...), the
// primary one the primary-th, and answers the instance's and the NICs'
// resource IDs, in the order of subnets.
func (s *Server) AddScaleSetVMWithNICs(rg, set, instance string, gallery bool, primary int, subnets ...string) (vmID string, nicIDs []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if primary < 0 || primary >= len(subnets) {
		return "", nil, fmt.Errorf("primary NIC %d of %d", primary, len(subnets))
	}
	vmID = fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s/virtualMachines/%s", Subscription, rg, set, instance)
	v := &setVM{}
	var made []*nic
	for i, subnetID := range subnets {
		name := set + "-nic"
		if i > 0 {
			name += strconv.Itoa(i)
		}
		id := vmID + "/networkInterfaces/" + name
		n, err := s.newNICLocked(id, name, subnetID)
		if err != nil {
			for _, m := range made {
				delete(s.subnets[key(m.configs[0].subnet)].taken, m.configs[0].addr)
			}
			return "", nil, err
		}
		n.vm, n.primary = vmID, i == primary
		made = append(made, n)
		v.nics = append(v.nics, id)
	}
	for _, n := range made {
		s.nics[key(n.id)] = n
	}
	if gallery {
		v.gallery = fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/galleries/images/images/node/versions/1.0.0", Subscription, rg)
	}
	s.sets[key(vmID)] = v
	return vmID, v.nics, nil
}

func (s *Server) newNICLocked(id, name, subnetID string) (*nic, error) {
	sn, ok := s.subnets[key(subnetID)]
	if !ok {
		return nil, fmt.Errorf("unknown subnet %s", subnetID)
	}
	a, ok := sn.lowestFree()
	if !ok {
		return nil, fmt.Errorf("subnet %s is full", subnetID)
	}
	sn.taken[a] = true
	// A MAC as Azure writes it, unique as the count of NICs.
	s.nextMAC++
	n := s.nextMAC
	mac := fmt.Sprintf("00-0D-3A-%02X-%02X-%02X", byte(n>>16), byte(n>>8), byte(n))
	return &nic{id: id, name: name, mac: mac, primary: true, configs: []*ipConfig{{name: "ipconfig1", subnet: subnetID, addr: a, primary: true,
		state: string(armnetwork.ProvisioningStateSucceeded), asgs: []string{"/subscriptions/" + Subscription + "/resourceGroups/rg/providers/Microsoft.Network/applicationSecurityGroups/nodes"}}}}, nil
}

// Take marks addr of subnet used by something else.
func (s *Server) Take(subnetID string, addr netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subnets[key(subnetID)].taken[addr] = true
}

// FailNextProvisioning makes the next n IP configurations written end
// in provisioning state Failed (with the address they were given).
func (s *Server) FailNextProvisioning(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext = n
}

// SetFault makes f decide, before each request, whether to refuse it. f
// runs with the fake's lock held: it must not call the fake.
func (s *Server) SetFault(f func(method, path string) *Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = f
}

// SetFaultAfter makes f decide, after each request the fake served (its
// change made, its operation started), whether its answer is replaced
// (After.Err) or lost (After with Err nil): what a client sees when ARM
// applied a write and then failed, or the network dropped the answer. f
// runs with the fake's lock held: it must not call the fake.
func (s *Server) SetFaultAfter(f func(method, path string) *After) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faultAfter = f
}

// Free answers how many addresses subnet id can still hand out.
func (s *Server) Free(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked()
	sn := s.subnets[key(id)]
	free := 0
	for a := sn.cidr.Addr(); sn.cidr.Contains(a); a = a.Next() {
		if sn.usable(a) && !sn.taken[a] {
			free++
		}
	}
	return free
}

// Calls answers how many requests of method the fake received for paths
// ending in suffix (case-insensitive), refused ones included.
func (s *Server) Calls(method, suffix string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method+" "+strings.ToLower(suffix)]
}

// Requests answers how many requests of method the fake received in all.
func (s *Server) Requests(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, c := range s.calls {
		if strings.HasPrefix(k, method+" ") {
			n += c
		}
	}
	return n
}

// Addresses answers the addresses of NIC id's configurations by name,
// provisioned or not.
func (s *Server) Addresses(id string) map[string]netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleLocked()
	out := map[string]netip.Addr{}
	for _, c := range s.nics[key(id)].configs {
		out[c.name] = c.addr
	}
	return out
}

func (sn *subnet) lowestFree() (netip.Addr, bool) {
	first, last := sn.cidr.Addr(), netipx.PrefixLastIP(sn.cidr)
	for a := first.Next().Next().Next().Next(); sn.cidr.Contains(a) && a != last; a = a.Next() {
		if !sn.taken[a] {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	after := s.faultAfter
	if after == nil {
		defer s.mu.Unlock()
		s.serveLocked(w, r)
		return
	}
	rec := httptest.NewRecorder()
	s.serveLocked(rec, r)
	a := after(r.Method, strings.TrimSuffix(r.URL.Path, "/"))
	s.mu.Unlock()
	switch {
	case a == nil:
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	case a.Err != nil:
		writeError(w, a.Err)
	default:
		// The answer lost: net/http cuts the connection, and logs nothing.
		panic(http.ErrAbortHandler)
	}
}

func (s *Server) serveLocked(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	lower := strings.ToLower(path)
	// Count by the path's last two segments: ".../networkinterfaces/x" and
	// the like, enough for tests to tell the calls apart.
	segs := strings.Split(lower, "/")
	s.calls[r.Method+" "+strings.Join(segs[max(0, len(segs)-2):], "/")]++
	s.settleLocked()
	if s.fault != nil {
		if e := s.fault(r.Method, path); e != nil {
			writeError(w, e)
			return
		}
	}
	if s.serveEntraLocked(w, r, path) {
		return
	}
	if !s.authorizedLocked(r) {
		writeError(w, &Error{Status: http.StatusUnauthorized, Code: "InvalidAuthenticationToken", Message: "The access token is invalid."})
		return
	}
	switch {
	case strings.HasPrefix(lower, "/operations/"):
		s.pollLocked(w, strings.TrimPrefix(lower, "/operations/"))
	case r.Method == http.MethodGet && strings.Contains(lower, "/providers/microsoft.compute/virtualmachines/"):
		s.getVMLocked(w, path)
	case r.Method == http.MethodGet && strings.HasSuffix(lower, "/providers/microsoft.network/networkinterfaces"):
		s.listGroupNICsLocked(w, r, path)
	case r.Method == http.MethodGet && strings.HasSuffix(lower, "/providers/microsoft.compute/virtualmachinescalesets"):
		s.listSetsLocked(w, r, path)
	case r.Method == http.MethodGet && isSetNICList(lower):
		s.listSetAllNICsLocked(w, r, path)
	case strings.Contains(lower, "/virtualmachinescalesets/") && strings.HasSuffix(lower, "/networkinterfaces") && r.Method == http.MethodGet:
		s.listSetNICsLocked(w, path)
	case strings.Contains(lower, "/networkinterfaces/") && r.Method == http.MethodGet:
		s.getNICLocked(w, path)
	case strings.Contains(lower, "/providers/microsoft.network/networkinterfaces/") && r.Method == http.MethodPut:
		s.putNICLocked(w, r, path)
	case strings.Contains(lower, "/virtualmachinescalesets/") && r.Method == http.MethodGet:
		s.getSetVMLocked(w, path)
	case strings.Contains(lower, "/virtualmachinescalesets/") && r.Method == http.MethodPut:
		s.putSetVMLocked(w, r, path)
	case strings.Contains(lower, "/providers/microsoft.network/virtualnetworks/") && strings.Contains(lower, "/subnets/") && r.Method == http.MethodGet:
		s.getSubnetLocked(w, path)
	case strings.Contains(lower, "/providers/microsoft.network/virtualnetworks/") && r.Method == http.MethodGet:
		s.getVirtualNetworkLocked(w, path)
	default:
		writeError(w, &Error{Status: http.StatusNotFound, Code: "InvalidResourceType", Message: "The fake serves no " + r.Method + " " + path})
	}
}

func writeError(w http.ResponseWriter, e *Error) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("x-ms-error-code", e.Code)
	if e.RetryAfterMs > 0 {
		w.Header().Set("Retry-After-Ms", strconv.Itoa(e.RetryAfterMs))
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((e.RetryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": e.Code, "message": e.Message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func notFound(kind, id string) *Error {
	return &Error{Status: http.StatusNotFound, Code: "ResourceNotFound", Message: fmt.Sprintf("The %s '%s' was not found.", kind, id)}
}

func (s *Server) getVMLocked(w http.ResponseWriter, path string) {
	nics, ok := s.vms[key(path)]
	if !ok {
		writeError(w, notFound("Microsoft.Compute/virtualMachines", path))
		return
	}
	vm := armcompute.VirtualMachine{ID: to.Ptr(path), Properties: &armcompute.VirtualMachineProperties{NetworkProfile: &armcompute.NetworkProfile{}}}
	for i, id := range nics {
		vm.Properties.NetworkProfile.NetworkInterfaces = append(vm.Properties.NetworkProfile.NetworkInterfaces,
			&armcompute.NetworkInterfaceReference{ID: to.Ptr(id), Properties: &armcompute.NetworkInterfaceReferenceProperties{Primary: to.Ptr(i == 0)}})
	}
	writeJSON(w, http.StatusOK, vm)
}

// state is n's provisioning state: Updating while a write is under way.
func (n *nic) state() armnetwork.ProvisioningState {
	if n.op != nil {
		return armnetwork.ProvisioningStateUpdating
	}
	return armnetwork.ProvisioningStateSucceeded
}

// nicJSON is n as ARM answers it.
func nicJSON(n *nic) armnetwork.Interface {
	state := n.state()
	out := armnetwork.Interface{ID: to.Ptr(n.id), Name: to.Ptr(n.name), Etag: to.Ptr(n.etagValue()),
		Properties: &armnetwork.InterfacePropertiesFormat{Primary: to.Ptr(n.primary), MacAddress: to.Ptr(n.mac), ProvisioningState: to.Ptr(state)}}
	if n.vm != "" {
		out.Properties.VirtualMachine = &armnetwork.SubResource{ID: to.Ptr(n.vm)}
	}
	for _, c := range n.configs {
		cp := &armnetwork.InterfaceIPConfigurationPropertiesFormat{
			Primary: to.Ptr(c.primary), Subnet: &armnetwork.Subnet{ID: to.Ptr(c.subnet)},
			PrivateIPAllocationMethod: to.Ptr(armnetwork.IPAllocationMethodDynamic), PrivateIPAddressVersion: to.Ptr(armnetwork.IPVersionIPv4),
			ProvisioningState: to.Ptr(armnetwork.ProvisioningState(c.state)),
		}
		if c.addr.IsValid() {
			cp.PrivateIPAddress = to.Ptr(c.addr.String())
		}
		for _, a := range c.asgs {
			cp.ApplicationSecurityGroups = append(cp.ApplicationSecurityGroups, &armnetwork.ApplicationSecurityGroup{ID: to.Ptr(a)})
		}
		out.Properties.IPConfigurations = append(out.Properties.IPConfigurations,
			&armnetwork.InterfaceIPConfiguration{ID: to.Ptr(n.id + "/ipConfigurations/" + c.name), Name: to.Ptr(c.name), Properties: cp})
	}
	return out
}

// getSubnetLocked answers the subnet with its IP configurations, one for
// each address taken in it (an address taken by something else than a NIC
// of the fake, Take, shows as another NIC's): the list Cilium counts the
// subnet's free addresses by.
func (s *Server) getSubnetLocked(w http.ResponseWriter, path string) {
	sn, ok := s.subnets[key(path)]
	if !ok {
		writeError(w, notFound("Microsoft.Network/virtualNetworks/subnets", path))
		return
	}
	owner := map[netip.Addr]string{}
	for _, n := range s.nics {
		for _, c := range n.configs {
			if c.addr.IsValid() && strings.EqualFold(c.subnet, sn.id) {
				owner[c.addr] = n.id + "/ipConfigurations/" + c.name
			}
		}
	}
	var configs []*armnetwork.IPConfiguration
	for a := range sn.taken {
		id, ok := owner[a]
		if !ok {
			id = fmt.Sprintf("/subscriptions/%s/resourceGroups/other/providers/Microsoft.Network/networkInterfaces/other-%s/ipConfigurations/ipconfig1", Subscription, a)
		}
		configs = append(configs, &armnetwork.IPConfiguration{ID: to.Ptr(id)})
	}
	slices.SortFunc(configs, func(a, b *armnetwork.IPConfiguration) int { return strings.Compare(*a.ID, *b.ID) })
	name := path[strings.LastIndex(path, "/")+1:]
	writeJSON(w, http.StatusOK, armnetwork.Subnet{ID: to.Ptr(sn.id), Name: to.Ptr(name), Properties: &armnetwork.SubnetPropertiesFormat{
		AddressPrefix: to.Ptr(sn.cidr.String()), ProvisioningState: to.Ptr(armnetwork.ProvisioningStateSucceeded), IPConfigurations: configs}})
}

func (s *Server) getVirtualNetworkLocked(w http.ResponseWriter, path string) {
	space, ok := s.vnets[key(path)]
	if !ok {
		writeError(w, notFound("Microsoft.Network/virtualNetworks", path))
		return
	}
	as := &armnetwork.AddressSpace{}
	for _, p := range space {
		as.AddressPrefixes = append(as.AddressPrefixes, to.Ptr(p.String()))
	}
	name := path[strings.LastIndex(path, "/")+1:]
	writeJSON(w, http.StatusOK, armnetwork.VirtualNetwork{ID: to.Ptr(path), Name: to.Ptr(name), Properties: &armnetwork.VirtualNetworkPropertiesFormat{
		AddressSpace: as, ProvisioningState: to.Ptr(armnetwork.ProvisioningStateSucceeded)}})
}

func (s *Server) getNICLocked(w http.ResponseWriter, path string) {
	n, ok := s.nics[key(path)]
	if !ok {
		writeError(w, notFound("Microsoft.Network/networkInterfaces", path))
		return
	}
	writeJSON(w, http.StatusOK, nicJSON(n))
}

func (s *Server) listSetNICsLocked(w http.ResponseWriter, path string) {
	vm, ok := s.sets[key(strings.TrimSuffix(path, "/networkInterfaces"))]
	if !ok {
		// ARM answers 404 for an instance that left its scale set.
		writeError(w, notFound("Microsoft.Compute/virtualMachineScaleSets/virtualMachines", path))
		return
	}
	var list armnetwork.InterfaceListResult
	for _, id := range vm.nics {
		n := nicJSON(s.nics[key(id)])
		list.Value = append(list.Value, &n)
	}
	writeJSON(w, http.StatusOK, list)
}

// wanted is one IP configuration a write asks for.
type wanted struct {
	name, subnet string
	primary      bool
	asgs         []string
}

// changeLocked makes the write of n's configurations to want, as ARM
// accepts it: new names get an address each now (all or none: a subnet
// without enough refuses the write, SubnetIsFull, and n stays as it was),
// in provisioning state Updating; missing names go. It answers what the
// write's operation does when it ends: the new configurations provisioned
// (or Failed, FailNextProvisioning), the addresses of those gone freed.
func (s *Server) changeLocked(n *nic, want []wanted) (finish func(), _ *Error) {
	have := map[string]*ipConfig{}
	for _, c := range n.configs {
		have[c.name] = c
	}
	need := map[string]int{}
	for _, c := range want {
		if have[c.name] == nil {
			need[key(c.subnet)]++
		}
	}
	for id, k := range need {
		sn, ok := s.subnets[id]
		if !ok {
			return nil, &Error{Status: http.StatusBadRequest, Code: "InvalidResourceReference", Message: "Resource " + id + " referenced by the IP configuration was not found."}
		}
		free := 0
		for a := sn.cidr.Addr(); sn.cidr.Contains(a) && free < k; a = a.Next() {
			if sn.usable(a) && !sn.taken[a] {
				free++
			}
		}
		if free < k {
			// ARM's words (MicrosoftDocs/azure-docs#88211): the subnet by
			// name, its prefix, and how many the write asked.
			return nil, &Error{Status: http.StatusBadRequest, Code: "SubnetIsFull",
				Message: fmt.Sprintf("Subnet %s with address prefix %s does not have enough capacity for %d IP addresses.", sn.id[strings.LastIndex(sn.id, "/")+1:], sn.cidr, k)}
		}
	}
	var next, added, failed []*ipConfig
	for _, c := range want {
		if old := have[c.name]; old != nil {
			old.asgs = c.asgs
			next = append(next, old)
			delete(have, c.name)
			continue
		}
		ic := &ipConfig{name: c.name, subnet: c.subnet, primary: c.primary, asgs: c.asgs, state: string(armnetwork.ProvisioningStateUpdating)}
		// A configuration that fails to provision still shows the
		// address it was given; only its state says it is unusable.
		sn := s.subnets[key(c.subnet)]
		ic.addr, _ = sn.lowestFree()
		sn.taken[ic.addr] = true
		if s.failNext > 0 {
			s.failNext--
			failed = append(failed, ic)
		} else {
			added = append(added, ic)
		}
		next = append(next, ic)
	}
	n.configs = next
	gone := have
	return func() {
		for _, ic := range added {
			ic.state = string(armnetwork.ProvisioningStateSucceeded)
		}
		for _, ic := range failed {
			ic.state = string(armnetwork.ProvisioningStateFailed)
		}
		for _, c := range gone {
			if c.addr.IsValid() {
				delete(s.subnets[key(c.subnet)].taken, c.addr)
			}
		}
	}, nil
}

// startLocked starts the operation of a write accepted on nics, which
// finish when it ends, and answers status with answer's body (which shows
// the write under way, provisioning state Updating) and the operation to
// poll.
func (s *Server) startLocked(w http.ResponseWriter, nics []*nic, finish []func(), status int, answer func() any) {
	op := &operation{doneAt: s.now().Add(s.opDuration)}
	op.finish = func() {
		for _, f := range finish {
			f()
		}
		for _, n := range nics {
			if n.op == op {
				n.op = nil
			}
		}
	}
	for _, n := range nics {
		n.op = op
	}
	s.nextOp++
	id := strconv.Itoa(s.nextOp)
	s.ops[id] = op
	s.pending = append(s.pending, op)
	w.Header().Set("Azure-AsyncOperation", s.base+"/operations/"+id+"?api-version=2025-01-01")
	w.Header().Set("Retry-After-Ms", "1")
	writeJSON(w, status, answer())
}

// busy is ARM's refusal of a write to a resource with one under way.
func busy(id string) *Error {
	return &Error{Status: http.StatusConflict, Code: "AnotherOperationInProgress",
		Message: "Another operation on this or dependent resource is in progress. Resource " + id + "."}
}

func (sn *subnet) usable(a netip.Addr) bool {
	first, last := sn.cidr.Addr(), netipx.PrefixLastIP(sn.cidr)
	return a.Compare(first.Next().Next().Next()) > 0 && a != last
}

// pollLocked answers operation id: InProgress until it ends (settled at
// the start of every request), then Succeeded. The client is asked to
// poll again at once (Retry-After-Ms 1): the time an operation takes is
// the fake's clock's, which only the test moves.
func (s *Server) pollLocked(w http.ResponseWriter, id string) {
	op, ok := s.ops[id]
	if !ok {
		writeError(w, notFound("operation", id))
		return
	}
	if !op.finished {
		w.Header().Set("Retry-After-Ms", "1")
		writeJSON(w, http.StatusOK, map[string]string{"status": "InProgress"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "Succeeded"})
}

func (s *Server) putNICLocked(w http.ResponseWriter, r *http.Request, path string) {
	n, ok := s.nics[key(path)]
	if !ok {
		writeError(w, notFound("Microsoft.Network/networkInterfaces", path))
		return
	}
	var body armnetwork.Interface
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Properties == nil {
		writeError(w, &Error{Status: http.StatusBadRequest, Code: "InvalidRequestFormat", Message: fmt.Sprintf("Cannot parse the request: %v", err)})
		return
	}
	if len(body.Properties.IPConfigurations) > configLimit {
		writeError(w, &Error{Status: http.StatusBadRequest, Code: "InvalidParameter", Message: fmt.Sprintf("A NIC takes %d IP configurations, not %d.", configLimit, len(body.Properties.IPConfigurations))})
		return
	}
	var want []wanted
	for _, c := range body.Properties.IPConfigurations {
		if c.Properties == nil || c.Properties.Subnet == nil {
			writeError(w, &Error{Status: http.StatusBadRequest, Code: "InvalidRequestFormat", Message: "An IP configuration names no subnet."})
			return
		}
		wc := wanted{name: str(c.Name), subnet: str(c.Properties.Subnet.ID), primary: boolOf(c.Properties.Primary)}
		for _, a := range c.Properties.ApplicationSecurityGroups {
			wc.asgs = append(wc.asgs, str(a.ID))
		}
		want = append(want, wc)
	}
	if e := ifMatch(r, n.etagValue()); e != nil {
		writeError(w, e)
		return
	}
	if n.op != nil || s.setBusyLocked(n.vm) {
		writeError(w, busy(n.id))
		return
	}
	finish, e := s.changeLocked(n, want)
	if e != nil {
		writeError(w, e)
		return
	}
	n.etag++
	// An update of a NIC that exists answers 200 (a create 201), its
	// body provisioning state Updating.
	s.startLocked(w, []*nic{n}, []func(){finish}, http.StatusOK, func() any { return nicJSON(n) })
}

// setBusyLocked reports whether vm is a scale set instance with a write
// under way on one of its NICs.
func (s *Server) setBusyLocked(vm string) bool {
	v, ok := s.sets[key(vm)]
	if !ok {
		return false
	}
	for _, id := range v.nics {
		if s.nics[key(id)].op != nil {
			return true
		}
	}
	return false
}

// setVMJSON is a scale set instance's VM model as ARM answers it.
func (s *Server) setVMJSON(path string, vm *setVM) armcompute.VirtualMachineScaleSetVM {
	state := "Succeeded"
	if s.setBusyLocked(path) {
		state = "Updating"
	}
	out := armcompute.VirtualMachineScaleSetVM{ID: to.Ptr(path), Etag: to.Ptr(s.modelEtagLocked(vm)), Properties: &armcompute.VirtualMachineScaleSetVMProperties{
		ProvisioningState:           to.Ptr(state),
		NetworkProfileConfiguration: &armcompute.VirtualMachineScaleSetVMNetworkProfileConfiguration{},
		StorageProfile:              &armcompute.StorageProfile{},
	}}
	if vm.gallery != "" {
		out.Properties.StorageProfile.ImageReference = &armcompute.ImageReference{ID: to.Ptr(vm.gallery)}
	} else {
		out.Properties.StorageProfile.ImageReference = &armcompute.ImageReference{Publisher: to.Ptr("Canonical"), Offer: to.Ptr("ubuntu-24_04-lts"), SKU: to.Ptr("server"), Version: to.Ptr("latest")}
	}
	for _, id := range vm.nics {
		n := s.nics[key(id)]
		cfg := &armcompute.VirtualMachineScaleSetNetworkConfiguration{Name: to.Ptr(n.name), Properties: &armcompute.VirtualMachineScaleSetNetworkConfigurationProperties{Primary: to.Ptr(n.primary)}}
		for _, c := range n.configs {
			ic := &armcompute.VirtualMachineScaleSetIPConfiguration{Name: to.Ptr(c.name), Properties: &armcompute.VirtualMachineScaleSetIPConfigurationProperties{
				Primary: to.Ptr(c.primary), Subnet: &armcompute.APIEntityReference{ID: to.Ptr(c.subnet)}, PrivateIPAddressVersion: to.Ptr(armcompute.IPVersionIPv4)}}
			for _, a := range c.asgs {
				ic.Properties.ApplicationSecurityGroups = append(ic.Properties.ApplicationSecurityGroups, &armcompute.SubResource{ID: to.Ptr(a)})
			}
			cfg.Properties.IPConfigurations = append(cfg.Properties.IPConfigurations, ic)
		}
		out.Properties.NetworkProfileConfiguration.NetworkInterfaceConfigurations = append(out.Properties.NetworkProfileConfiguration.NetworkInterfaceConfigurations, cfg)
	}
	return out
}

func (s *Server) getSetVMLocked(w http.ResponseWriter, path string) {
	vm, ok := s.sets[key(path)]
	if !ok {
		writeError(w, notFound("Microsoft.Compute/virtualMachineScaleSets/virtualMachines", path))
		return
	}
	writeJSON(w, http.StatusOK, s.setVMJSON(path, vm))
}

// putSetVMLocked writes a scale set instance's VM model: each NIC the
// model names gets the IP configurations its configuration lists, all in
// one operation.
func (s *Server) putSetVMLocked(w http.ResponseWriter, r *http.Request, path string) {
	vm, ok := s.sets[key(path)]
	if !ok {
		writeError(w, notFound("Microsoft.Compute/virtualMachineScaleSets/virtualMachines", path))
		return
	}
	var body armcompute.VirtualMachineScaleSetVM
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Properties == nil || body.Properties.NetworkProfileConfiguration == nil {
		writeError(w, &Error{Status: http.StatusBadRequest, Code: "InvalidRequestFormat", Message: fmt.Sprintf("Cannot parse the request: %v", err)})
		return
	}
	if vm.gallery != "" && body.Properties.StorageProfile != nil && body.Properties.StorageProfile.ImageReference != nil {
		writeError(w, &Error{Status: http.StatusForbidden, Code: "LinkedAuthorizationFailed",
			Message: "The client has permission to perform action 'Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write', however it does not have permission to perform action 'Microsoft.Compute/galleries/images/versions/read' on the linked scope(s) '" + vm.gallery + "'."})
		return
	}
	var nics []*nic
	var wants [][]wanted
	for _, cfg := range body.Properties.NetworkProfileConfiguration.NetworkInterfaceConfigurations {
		var n *nic
		for _, id := range vm.nics {
			if m := s.nics[key(id)]; cfg != nil && strings.EqualFold(m.name, str(cfg.Name)) {
				n = m
			}
		}
		if n == nil || cfg.Properties == nil {
			name := ""
			if cfg != nil {
				name = str(cfg.Name)
			}
			writeError(w, &Error{Status: http.StatusBadRequest, Code: "InvalidParameter", Message: fmt.Sprintf("The instance has no NIC %q.", name)})
			return
		}
		if len(cfg.Properties.IPConfigurations) > configLimit {
			writeError(w, &Error{Status: http.StatusBadRequest, Code: "SecondaryIpConfigurationCountPerVMSSVMExceeded",
				Message: fmt.Sprintf("The number of IP configurations on a NIC of a scale set VM cannot exceed %d.", configLimit)})
			return
		}
		var want []wanted
		for _, ic := range cfg.Properties.IPConfigurations {
			if ic.Properties == nil || ic.Properties.Subnet == nil {
				writeError(w, &Error{Status: http.StatusBadRequest, Code: "InvalidRequestFormat", Message: "An IP configuration names no subnet."})
				return
			}
			wc := wanted{name: str(ic.Name), subnet: str(ic.Properties.Subnet.ID), primary: boolOf(ic.Properties.Primary)}
			if len(want) > 0 && !strings.EqualFold(wc.subnet, want[0].subnet) {
				writeError(w, &Error{Status: http.StatusBadRequest, Code: "VMScaleSetIpConfigurationsOnSameNicCannotUseDifferentSubnets",
					Message: "IP configurations on the same NIC of a scale set VM cannot use different subnets."})
				return
			}
			for _, a := range ic.Properties.ApplicationSecurityGroups {
				wc.asgs = append(wc.asgs, str(a.ID))
			}
			want = append(want, wc)
		}
		nics, wants = append(nics, n), append(wants, want)
	}
	if e := ifMatch(r, s.modelEtagLocked(vm)); e != nil {
		writeError(w, e)
		return
	}
	if s.setBusyLocked(path) {
		writeError(w, busy(path))
		return
	}
	// All NICs or none: a refusal of one leaves every NIC as it was (one
	// NIC's change is all or none by itself).
	saved := make([][]*ipConfig, len(nics))
	taken := map[*subnet]map[netip.Addr]bool{}
	if len(nics) > 1 {
		for _, sn := range s.subnets {
			taken[sn] = maps.Clone(sn.taken)
		}
	}
	failNext := s.failNext
	var finish []func()
	for i, n := range nics {
		saved[i] = n.configs
		f, e := s.changeLocked(n, wants[i])
		if e != nil {
			for j := range i {
				nics[j].configs = saved[j]
			}
			for sn, t := range taken {
				sn.taken = t
			}
			s.failNext = failNext
			writeError(w, e)
			return
		}
		finish = append(finish, f)
	}
	for _, id := range vm.nics {
		s.nics[key(id)].etag++
	}
	s.startLocked(w, nics, finish, http.StatusAccepted, func() any { return s.setVMJSON(path, vm) })
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func boolOf(p *bool) bool { return p != nil && *p }
