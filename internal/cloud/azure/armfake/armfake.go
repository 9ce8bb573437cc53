// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package armfake is an Azure Resource Manager endpoint for tests, serving
// what the Azure provider calls with the real SDK's wire format (JSON of
// armnetwork's and armcompute's own types): standalone VMs and their NICs,
// VM scale set instances with their VM models and NICs, subnets handing
// out the lowest free address (the first four and the last reserved),
// subnets and virtual networks to read, NICs with a MAC each,
// long-running writes answered 201 with an Azure-AsyncOperation to poll,
// ETags with If-Match, paged lists, an Entra ID authority, ARM's error
// bodies, and a fault hook.
//
// Faithful where the workers depend on it: a NIC's IP configurations get
// addresses when the write provisions, so a subnet that ran out fails the
// operation (SubnetIsFull) and leaves the NIC as it was; a scale set NIC
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
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"

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
}

// Throttled is ARM's answer to a caller over its rate.
func Throttled() *Error {
	return &Error{Status: http.StatusTooManyRequests, Code: "TooManyRequests", Message: "The request is being throttled.", RetryAfterMs: 1}
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
	fault  func(method, path string) *Error
	calls  map[string]int
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
	// instance's model's): ARM's ETag of both (etag.go).
	etag int
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

type operation struct {
	polls int    // InProgress answers left
	err   *Error // the failure it ends with, nil for Succeeded
	apply func() // run when it succeeds
}

// New answers an empty fake; SetBase must name its URL before a write.
func New() *Server {
	return &Server{subnets: map[string]*subnet{}, vnets: map[string][]netip.Prefix{}, nics: map[string]*nic{}, vms: map[string][]string{}, sets: map[string]*setVM{},
		ops: map[string]*operation{}, calls: map[string]int{}}
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
	s.mu.Lock()
	defer s.mu.Unlock()
	vmID = fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/virtualMachineScaleSets/%s/virtualMachines/%s", Subscription, rg, set, instance)
	nicID = vmID + "/networkInterfaces/" + set + "-nic"
	n, err := s.newNICLocked(nicID, set+"-nic", subnetID)
	if err != nil {
		return "", "", err
	}
	n.vm = vmID
	s.nics[key(nicID)] = n
	v := &setVM{nics: []string{nicID}}
	if gallery {
		v.gallery = fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Compute/galleries/images/images/node/versions/1.0.0", Subscription, rg)
	}
	s.sets[key(vmID)] = v
	return vmID, nicID, nil
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
	n := len(s.nics) + 1
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

// Addresses answers the addresses of NIC id's configurations by name.
func (s *Server) Addresses(id string) map[string]netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
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
	defer s.mu.Unlock()
	path := strings.TrimSuffix(r.URL.Path, "/")
	lower := strings.ToLower(path)
	// Count by the path's last two segments: ".../networkinterfaces/x" and
	// the like, enough for tests to tell the calls apart.
	segs := strings.Split(lower, "/")
	s.calls[r.Method+" "+strings.Join(segs[max(0, len(segs)-2):], "/")]++
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

// nicJSON is n as ARM answers it.
func nicJSON(n *nic, state armnetwork.ProvisioningState) armnetwork.Interface {
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

func (s *Server) getSubnetLocked(w http.ResponseWriter, path string) {
	sn, ok := s.subnets[key(path)]
	if !ok {
		writeError(w, notFound("Microsoft.Network/virtualNetworks/subnets", path))
		return
	}
	name := path[strings.LastIndex(path, "/")+1:]
	writeJSON(w, http.StatusOK, armnetwork.Subnet{ID: to.Ptr(sn.id), Name: to.Ptr(name), Properties: &armnetwork.SubnetPropertiesFormat{
		AddressPrefix: to.Ptr(sn.cidr.String()), ProvisioningState: to.Ptr(armnetwork.ProvisioningStateSucceeded)}})
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
	writeJSON(w, http.StatusOK, nicJSON(n, armnetwork.ProvisioningStateSucceeded))
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
		n := nicJSON(s.nics[key(id)], armnetwork.ProvisioningStateSucceeded)
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

// applyLocked starts the long-running write of n's configurations to
// want: new names get an address each when it provisions (all or none:
// a subnet without enough fails the operation, SubnetIsFull), missing
// names free theirs.
//
// The answer is status with answer's body, which shows the write under
// way (provisioning state Updating), so the client polls the operation.
func (s *Server) applyLocked(w http.ResponseWriter, n *nic, want []wanted, status int, answer any) {
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
	var fail *Error
	for id, k := range need {
		sn, ok := s.subnets[id]
		if !ok {
			writeError(w, &Error{Status: http.StatusBadRequest, Code: "InvalidResourceReference", Message: "Resource " + id + " referenced by the IP configuration was not found."})
			return
		}
		free := 0
		for a := sn.cidr.Addr(); sn.cidr.Contains(a) && free < k; a = a.Next() {
			if sn.usable(a) && !sn.taken[a] {
				free++
			}
		}
		if free < k {
			fail = &Error{Status: http.StatusOK, Code: "SubnetIsFull", Message: "Subnet " + id + " with address prefix " + sn.cidr.String() + " does not have enough capacity for " + strconv.Itoa(k) + " IP addresses."}
		}
	}
	apply := func() {
		var next []*ipConfig
		for _, c := range want {
			if old := have[c.name]; old != nil {
				old.asgs = c.asgs
				next = append(next, old)
				delete(have, c.name)
				continue
			}
			ic := &ipConfig{name: c.name, subnet: c.subnet, primary: c.primary, asgs: c.asgs, state: string(armnetwork.ProvisioningStateSucceeded)}
			// A configuration that fails to provision still shows the
			// address it was given; only its state says it is unusable.
			sn := s.subnets[key(c.subnet)]
			ic.addr, _ = sn.lowestFree()
			sn.taken[ic.addr] = true
			if s.failNext > 0 {
				s.failNext--
				ic.state = string(armnetwork.ProvisioningStateFailed)
			}
			next = append(next, ic)
		}
		for _, gone := range have {
			if gone.addr.IsValid() {
				delete(s.subnets[key(gone.subnet)].taken, gone.addr)
			}
		}
		n.configs = next
	}
	s.nextOp++
	id := strconv.Itoa(s.nextOp)
	s.ops[id] = &operation{polls: 1, err: fail, apply: apply}
	w.Header().Set("Azure-AsyncOperation", s.base+"/operations/"+id+"?api-version=2025-01-01")
	w.Header().Set("Retry-After-Ms", "1")
	writeJSON(w, status, answer)
}

func (sn *subnet) usable(a netip.Addr) bool {
	first, last := sn.cidr.Addr(), netipx.PrefixLastIP(sn.cidr)
	return a.Compare(first.Next().Next().Next()) > 0 && a != last
}

func (s *Server) pollLocked(w http.ResponseWriter, id string) {
	op, ok := s.ops[id]
	if !ok {
		writeError(w, notFound("operation", id))
		return
	}
	if op.polls > 0 {
		op.polls--
		w.Header().Set("Retry-After-Ms", "1")
		writeJSON(w, http.StatusOK, map[string]string{"status": "InProgress"})
		return
	}
	if op.err != nil {
		writeJSON(w, http.StatusOK, map[string]any{"status": "Failed", "error": map[string]string{"code": op.err.Code, "message": op.err.Message}})
		return
	}
	if op.apply != nil {
		op.apply()
		op.apply = nil
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
	n.etag++
	s.applyLocked(w, n, want, http.StatusCreated, nicJSON(n, armnetwork.ProvisioningStateUpdating))
}

// setVMJSON is a scale set instance's VM model as ARM answers it.
func (s *Server) setVMJSON(path string, vm *setVM, state string) armcompute.VirtualMachineScaleSetVM {
	out := armcompute.VirtualMachineScaleSetVM{ID: to.Ptr(path), Etag: to.Ptr(s.nics[key(vm.nics[0])].etagValue()), Properties: &armcompute.VirtualMachineScaleSetVMProperties{
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
	writeJSON(w, http.StatusOK, s.setVMJSON(path, vm, "Succeeded"))
}

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
	// One NIC per instance in this fake: its write is the model's.
	cfgs := body.Properties.NetworkProfileConfiguration.NetworkInterfaceConfigurations
	if len(cfgs) != 1 {
		writeError(w, &Error{Status: http.StatusBadRequest, Code: "InvalidParameter", Message: fmt.Sprintf("The fake's instances have one NIC; the model names %d.", len(cfgs))})
		return
	}
	cfg := cfgs[0]
	var n *nic
	for _, id := range vm.nics {
		if m := s.nics[key(id)]; strings.EqualFold(m.name, str(cfg.Name)) {
			n = m
		}
	}
	if n == nil || cfg.Properties == nil {
		writeError(w, &Error{Status: http.StatusBadRequest, Code: "InvalidParameter", Message: fmt.Sprintf("The instance has no NIC %q.", str(cfg.Name))})
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
	if e := ifMatch(r, n.etagValue()); e != nil {
		writeError(w, e)
		return
	}
	n.etag++
	s.applyLocked(w, n, want, http.StatusAccepted, s.setVMJSON(path, vm, "Updating"))
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func boolOf(p *bool) bool { return p != nil && *p }
