// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package azure is the cloud.Provider of Azure: a node's Pod addresses are
// secondary IP configurations of its NICs, on standalone VMs (the NIC is
// updated) and on VM scale set instances (the instance's VM model is
// updated), through Azure Resource Manager (azcore, armnetwork,
// armcompute). It never creates a NIC, as Cilium's Azure IPAM never does,
// and takes no prefixes.
package azure

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"

	"github.com/ipam-dev/ipam/internal/cloud"
)

// InterfaceAddressLimit is how many IP configurations one NIC holds.
const InterfaceAddressLimit = 256

// configPrefix starts the names of the IP configurations the provider
// adds (then 8 random letters and digits), as Cilium's operator names
// its own.
const configPrefix = "Cilium-"

// RequiredActions are the Azure RBAC actions the provider's calls need,
// on the nodes' resource group (deploy/cloud/azure-role.json grants these,
// and a test keeps the two equal):
//   - Instance: virtualMachines/read (a VM), networkInterfaces/read (its
//     NICs), virtualMachineScaleSets/read and its virtualMachines'
//     networkInterfaces/read (a scale set instance's NICs);
//   - Instances: networkInterfaces/read (the group's NICs),
//     virtualMachineScaleSets/read (its sets) and their
//     networkInterfaces/read (each set's NICs);
//   - Assign and Unassign on a VM: networkInterfaces/read and write, and
//     for the configurations written subnets/read and join, and
//     applicationSecurityGroups/joinIpConfiguration (each new
//     configuration carries the NIC's groups);
//   - on a scale set instance: its virtualMachines/read and write (the VM
//     model), and the same joins;
//   - the range of each NIC's subnet (subnets/read) and the address space
//     of its virtual network (virtualNetworks/read), read once each.
var RequiredActions = []string{
	"Microsoft.Compute/virtualMachineScaleSets/networkInterfaces/read",
	"Microsoft.Compute/virtualMachineScaleSets/read",
	"Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read",
	"Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
	"Microsoft.Compute/virtualMachineScaleSets/virtualMachines/write",
	"Microsoft.Compute/virtualMachines/read",
	"Microsoft.Network/applicationSecurityGroups/joinIpConfiguration/action",
	"Microsoft.Network/networkInterfaces/read",
	"Microsoft.Network/networkInterfaces/write",
	"Microsoft.Network/virtualNetworks/subnets/join/action",
	"Microsoft.Network/virtualNetworks/read",
	"Microsoft.Network/virtualNetworks/subnets/read",
}

// Provider is the Azure cloud.Provider of one subscription.
type Provider struct {
	nics    *armnetwork.InterfacesClient
	subnets *armnetwork.SubnetsClient
	vnets   *armnetwork.VirtualNetworksClient
	vms     *armcompute.VirtualMachinesClient
	sets    *armcompute.VirtualMachineScaleSetsClient
	vmsVM   *armcompute.VirtualMachineScaleSetVMsClient

	mu sync.Mutex // guards subnetRanges and spaces
	// subnetRanges are the ranges of the subnets NICs were met in, and
	// spaces the address spaces of their virtual networks, by
	// lower-cased resource ID (ARM's IDs are case-insensitive).
	subnetRanges map[string]netip.Prefix
	spaces       map[string][]netip.Prefix
}

var _ cloud.Provider = (*Provider)(nil)

// New answers a provider of subscription through cred; opts carry the
// cloud (endpoint and audience), transport and retries.
func New(subscription string, cred azcore.TokenCredential, opts *arm.ClientOptions) (*Provider, error) {
	nics, err := armnetwork.NewInterfacesClient(subscription, cred, opts)
	if err != nil {
		return nil, err
	}
	subnets, err := armnetwork.NewSubnetsClient(subscription, cred, opts)
	if err != nil {
		return nil, err
	}
	vnets, err := armnetwork.NewVirtualNetworksClient(subscription, cred, opts)
	if err != nil {
		return nil, err
	}
	vms, err := armcompute.NewVirtualMachinesClient(subscription, cred, opts)
	if err != nil {
		return nil, err
	}
	sets, err := armcompute.NewVirtualMachineScaleSetsClient(subscription, cred, opts)
	if err != nil {
		return nil, err
	}
	vmsVM, err := armcompute.NewVirtualMachineScaleSetVMsClient(subscription, cred, opts)
	if err != nil {
		return nil, err
	}
	return &Provider{nics: nics, subnets: subnets, vnets: vnets, vms: vms, sets: sets, vmsVM: vmsVM,
		subnetRanges: map[string]netip.Prefix{}, spaces: map[string][]netip.Prefix{}}, nil
}

// ProviderIDPrefix starts a Kubernetes node's providerID on Azure, before
// its VM's resource ID.
const ProviderIDPrefix = "azure://"

// Instance describes a VM or a scale set instance by its resource ID (a
// node's providerID without ProviderIDPrefix): its NICs and, per NIC, the
// addresses of the IP configurations that provisioned (Succeeded) only.
// Limits: the NICs it has (none is ever added) and 256 addresses each.
func (p *Provider) Instance(ctx context.Context, id string) (cloud.Instance, error) {
	rid, err := arm.ParseResourceID(strings.TrimPrefix(id, ProviderIDPrefix))
	if err != nil {
		return cloud.Instance{}, &cloud.Error{Kind: cloud.KindInvalid, Code: "InvalidResourceID", Message: err.Error(), Err: err}
	}
	var nics []*armnetwork.Interface
	switch {
	case strings.EqualFold(rid.ResourceType.String(), "Microsoft.Compute/virtualMachines"):
		vm, err := p.vms.Get(ctx, rid.ResourceGroupName, rid.Name, nil)
		if err != nil {
			return cloud.Instance{}, classify(err)
		}
		if vm.Properties == nil || vm.Properties.NetworkProfile == nil {
			return cloud.Instance{}, fmt.Errorf("VM %s has no network profile", id)
		}
		for _, ref := range vm.Properties.NetworkProfile.NetworkInterfaces {
			nicID, err := arm.ParseResourceID(str(ref.ID))
			if err != nil {
				return cloud.Instance{}, fmt.Errorf("VM %s: NIC %w", id, err)
			}
			nic, err := p.nics.Get(ctx, nicID.ResourceGroupName, nicID.Name, nil)
			if err != nil {
				return cloud.Instance{}, classify(err)
			}
			nics = append(nics, &nic.Interface)
		}
	case strings.EqualFold(rid.ResourceType.String(), "Microsoft.Compute/virtualMachineScaleSets/virtualMachines"):
		pager := p.nics.NewListVirtualMachineScaleSetVMNetworkInterfacesPager(rid.ResourceGroupName, rid.Parent.Name, rid.Name, nil)
		for pager.More() {
			page, err := pager.NextPage(ctx)
			if err != nil {
				return cloud.Instance{}, classify(err)
			}
			nics = append(nics, page.Value...)
		}
	default:
		return cloud.Instance{}, &cloud.Error{Kind: cloud.KindInvalid, Code: "InvalidResourceType", Message: fmt.Sprintf("%s is no VM nor scale set instance", id)}
	}
	return p.instanceOf(ctx, id, rid, nics)
}

// instanceOf is the instance id (rid parsed) with NICs nics.
func (p *Provider) instanceOf(ctx context.Context, id string, rid *arm.ResourceID, nics []*armnetwork.Interface) (cloud.Instance, error) {
	inst := cloud.Instance{ID: id, Type: rid.ResourceType.String(), VPC: groupID(rid),
		Limits: cloud.Limits{Interfaces: len(nics), IPv4PerInterface: InterfaceAddressLimit}}
	// The primary NIC is device 0, the others follow by resource ID, so
	// that a listing (Instances) numbers them as a Get does.
	nics = slices.Clone(nics)
	slices.SortStableFunc(nics, func(a, b *armnetwork.Interface) int {
		if c := boolRank(isPrimaryNIC(b)) - boolRank(isPrimaryNIC(a)); c != 0 {
			return c
		}
		return strings.Compare(strings.ToLower(str(a.ID)), strings.ToLower(str(b.ID)))
	})
	for i, nic := range nics {
		f, err := interfaceOf(nic)
		if err != nil {
			return cloud.Instance{}, err
		}
		f.DeviceIndex = i
		if err := p.withNetwork(ctx, &f); err != nil {
			return cloud.Instance{}, err
		}
		inst.Interfaces = append(inst.Interfaces, f)
	}
	return inst, nil
}

func isPrimaryNIC(n *armnetwork.Interface) bool {
	return n.Properties != nil && boolOf(n.Properties.Primary)
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// interfaceOf converts a NIC: the primary IP configuration's address is
// the interface's own, the others' are its addresses once provisioned.
func interfaceOf(nic *armnetwork.Interface) (cloud.Interface, error) {
	f := cloud.Interface{ID: str(nic.ID), Name: str(nic.Name), Attached: true}
	if nic.Properties == nil {
		return f, nil
	}
	if m := str(nic.Properties.MacAddress); m != "" {
		// Azure writes 00-0D-3A-...; the agent and AWS use 00:0d:3a:...
		hw, err := net.ParseMAC(m)
		if err != nil {
			return cloud.Interface{}, fmt.Errorf("NIC %s: MAC %w", f.ID, err)
		}
		f.MAC = hw.String()
	}
	for _, c := range nic.Properties.IPConfigurations {
		if c.Properties == nil {
			continue
		}
		cp := c.Properties
		if f.SubnetID == "" && cp.Subnet != nil {
			f.SubnetID = str(cp.Subnet.ID)
		}
		if cp.ProvisioningState == nil || *cp.ProvisioningState != armnetwork.ProvisioningStateSucceeded || cp.PrivateIPAddress == nil {
			continue
		}
		addr, err := netip.ParseAddr(*cp.PrivateIPAddress)
		if err != nil {
			return cloud.Interface{}, fmt.Errorf("NIC %s: %w", f.ID, err)
		}
		if boolOf(cp.Primary) {
			f.Primary = addr
			for _, asg := range cp.ApplicationSecurityGroups {
				f.SecurityGroups = append(f.SecurityGroups, str(asg.ID))
			}
			continue
		}
		f.Addresses = append(f.Addresses, addr)
	}
	return f, nil
}

// Assign adds n IP configurations to NIC iface (a NIC's resource ID, or a
// scale set instance's NIC as Instance answers it), in the subnet of its
// primary configuration and with its application security groups (a NIC's
// configurations must share them), named Cilium-<8 random>. Azure picks
// the addresses (Dynamic); the answer holds those that provisioned.
func (p *Provider) Assign(ctx context.Context, iface string, n int, prefixes bool) (cloud.Assigned, error) {
	if prefixes {
		return cloud.Assigned{}, &cloud.Error{Kind: cloud.KindInvalid, Code: "PrefixesNotSupported", Message: "Azure NICs take no prefixes"}
	}
	if n < 1 {
		return cloud.Assigned{}, &cloud.Error{Kind: cloud.KindInvalid, Code: "InvalidParameter", Message: fmt.Sprintf("assign %d addresses", n)}
	}
	rid, err := arm.ParseResourceID(iface)
	if err != nil {
		return cloud.Assigned{}, &cloud.Error{Kind: cloud.KindInvalid, Code: "InvalidResourceID", Message: err.Error(), Err: err}
	}
	names := make([]string, n)
	for i := range names {
		names[i] = configName()
	}
	var nic *armnetwork.Interface
	if isScaleSetNIC(rid) {
		nic, err = p.changeScaleSetNIC(ctx, rid, func(c *armcompute.VirtualMachineScaleSetNetworkConfiguration) error {
			first := firstScaleSetConfig(c)
			if err := checkRoom(iface, first != nil, len(c.Properties.IPConfigurations), n); err != nil {
				return err
			}
			for _, name := range names {
				c.Properties.IPConfigurations = append(c.Properties.IPConfigurations, &armcompute.VirtualMachineScaleSetIPConfiguration{
					Name: to.Ptr(name),
					Properties: &armcompute.VirtualMachineScaleSetIPConfigurationProperties{
						Subnet:                    first.Properties.Subnet,
						PrivateIPAddressVersion:   to.Ptr(armcompute.IPVersionIPv4),
						ApplicationSecurityGroups: first.Properties.ApplicationSecurityGroups,
					},
				})
			}
			return nil
		})
	} else {
		nic, err = p.changeNIC(ctx, rid, func(nic *armnetwork.Interface) error {
			first := firstConfig(nic)
			if err := checkRoom(iface, first != nil, len(nic.Properties.IPConfigurations), n); err != nil {
				return err
			}
			for _, name := range names {
				nic.Properties.IPConfigurations = append(nic.Properties.IPConfigurations, &armnetwork.InterfaceIPConfiguration{
					Name: to.Ptr(name),
					Properties: &armnetwork.InterfaceIPConfigurationPropertiesFormat{
						Subnet:                    &armnetwork.Subnet{ID: first.Properties.Subnet.ID},
						PrivateIPAllocationMethod: to.Ptr(armnetwork.IPAllocationMethodDynamic),
						PrivateIPAddressVersion:   to.Ptr(armnetwork.IPVersionIPv4),
						ApplicationSecurityGroups: first.Properties.ApplicationSecurityGroups,
					},
				})
			}
			return nil
		})
	}
	if err != nil {
		return cloud.Assigned{}, err
	}
	var got cloud.Assigned
	for _, c := range nic.Properties.IPConfigurations {
		if c.Properties == nil || !slices.Contains(names, str(c.Name)) || c.Properties.PrivateIPAddress == nil ||
			c.Properties.ProvisioningState == nil || *c.Properties.ProvisioningState != armnetwork.ProvisioningStateSucceeded {
			continue
		}
		addr, err := netip.ParseAddr(*c.Properties.PrivateIPAddress)
		if err != nil {
			return cloud.Assigned{}, fmt.Errorf("NIC %s: %w", iface, err)
		}
		got.Addresses = append(got.Addresses, addr)
	}
	return got, nil
}

// Unassign removes the IP configurations holding addrs from NIC iface;
// an address it does not hold (or its primary one) removes nothing.
func (p *Provider) Unassign(ctx context.Context, iface string, addrs []netip.Addr, prefixes []netip.Prefix) error {
	if len(prefixes) > 0 {
		return &cloud.Error{Kind: cloud.KindInvalid, Code: "PrefixesNotSupported", Message: "Azure NICs take no prefixes"}
	}
	if len(addrs) == 0 {
		return nil
	}
	rid, err := arm.ParseResourceID(iface)
	if err != nil {
		return &cloud.Error{Kind: cloud.KindInvalid, Code: "InvalidResourceID", Message: err.Error(), Err: err}
	}
	// The configurations to drop, by name, read from the NIC itself: a
	// scale set's VM model carries no addresses.
	current, err := p.getNIC(ctx, rid)
	if err != nil {
		return err
	}
	drop := map[string]bool{}
	for _, a := range addrs {
		name := ""
		for _, c := range current.Properties.IPConfigurations {
			if c.Properties != nil && !boolOf(c.Properties.Primary) && str(c.Properties.PrivateIPAddress) == a.String() {
				name = str(c.Name)
			}
		}
		if name == "" {
			return &cloud.Error{Kind: cloud.KindInvalid, Code: "AddressNotAssigned", Message: fmt.Sprintf("NIC %s holds no secondary address %s", iface, a)}
		}
		drop[name] = true
	}
	if isScaleSetNIC(rid) {
		_, err = p.changeScaleSetNIC(ctx, rid, func(c *armcompute.VirtualMachineScaleSetNetworkConfiguration) error {
			c.Properties.IPConfigurations = slices.DeleteFunc(c.Properties.IPConfigurations, func(ic *armcompute.VirtualMachineScaleSetIPConfiguration) bool {
				return drop[str(ic.Name)]
			})
			return nil
		})
	} else {
		_, err = p.changeNIC(ctx, rid, func(nic *armnetwork.Interface) error {
			nic.Properties.IPConfigurations = slices.DeleteFunc(nic.Properties.IPConfigurations, func(ic *armnetwork.InterfaceIPConfiguration) bool {
				return drop[str(ic.Name)]
			})
			return nil
		})
	}
	return err
}

// isScaleSetNIC reports whether rid is a scale set instance's NIC
// (.../virtualMachineScaleSets/S/virtualMachines/I/networkInterfaces/N).
func isScaleSetNIC(rid *arm.ResourceID) bool {
	return rid.Parent != nil && strings.EqualFold(rid.Parent.ResourceType.Type, "virtualMachineScaleSets/virtualMachines")
}

func (p *Provider) getNIC(ctx context.Context, rid *arm.ResourceID) (*armnetwork.Interface, error) {
	if isScaleSetNIC(rid) {
		nic, err := p.nics.GetVirtualMachineScaleSetNetworkInterface(ctx, rid.ResourceGroupName, rid.Parent.Parent.Name, rid.Parent.Name, rid.Name, nil)
		if err != nil {
			return nil, classify(err)
		}
		return &nic.Interface, nil
	}
	nic, err := p.nics.Get(ctx, rid.ResourceGroupName, rid.Name, nil)
	if err != nil {
		return nil, classify(err)
	}
	return &nic.Interface, nil
}

// writeTries bounds the reads and writes of one change to a NIC whose
// writes keep losing to others' (412 on If-Match).
const writeTries = 4

// withIfMatch is ctx whose requests carry If-Match etag (none when etag
// is empty): ARM refuses the write with 412 when the resource changed
// since it was read.
func withIfMatch(ctx context.Context, etag *string) context.Context {
	if str(etag) == "" {
		return ctx
	}
	return policy.WithHTTPHeader(ctx, http.Header{"If-Match": {*etag}})
}

// isStale reports whether err is ARM's 412: the resource changed since
// the read the write was made of.
func isStale(err error) bool {
	var re *azcore.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusPreconditionFailed
}

// changeNIC reads a standalone VM's NIC, changes it with change and writes
// it back with the read's etag, waiting for the operation; it answers the
// NIC as written. A write refused because the NIC changed in between
// (another writer's change would be lost) is made again from a new read.
func (p *Provider) changeNIC(ctx context.Context, rid *arm.ResourceID, change func(*armnetwork.Interface) error) (*armnetwork.Interface, error) {
	return untilFresh(func() (*armnetwork.Interface, error) { return p.changeNICOnce(ctx, rid, change) })
}

// untilFresh runs once again while ARM refuses its write as stale (412),
// at most writeTries times, and answers its last result, classified.
func untilFresh(once func() (*armnetwork.Interface, error)) (*armnetwork.Interface, error) {
	for try := 1; ; try++ {
		nic, err := once()
		if !isStale(err) || try == writeTries {
			return nic, classifyStale(err)
		}
	}
}

func (p *Provider) changeNICOnce(ctx context.Context, rid *arm.ResourceID, change func(*armnetwork.Interface) error) (*armnetwork.Interface, error) {
	got, err := p.nics.Get(ctx, rid.ResourceGroupName, rid.Name, nil)
	if err != nil {
		return nil, classify(err)
	}
	nic := got.Interface
	if nic.Properties == nil {
		return nil, fmt.Errorf("NIC %s has no properties", rid)
	}
	if err := change(&nic); err != nil {
		return nil, err
	}
	poller, err := p.nics.BeginCreateOrUpdate(withIfMatch(ctx, nic.Etag), rid.ResourceGroupName, rid.Name, nic, nil)
	if isStale(err) {
		return nil, err
	} else if err != nil {
		return nil, classify(err)
	}
	done, err := poller.PollUntilDone(ctx, nil)
	if err != nil {
		return nil, classify(err)
	}
	return &done.Interface, nil
}

// changeScaleSetNIC reads the VM model of the scale set instance owning
// NIC rid, changes that NIC's configuration with change and writes the
// model back, waiting for the operation, then answers the NIC as it is
// now. The model is written without its image reference: an instance
// made from a Compute Gallery image refuses an update naming the image to
// anyone without read access to the gallery. As changeNIC, it writes
// with the read's etag and starts over from a new read on a 412.
func (p *Provider) changeScaleSetNIC(ctx context.Context, rid *arm.ResourceID, change func(*armcompute.VirtualMachineScaleSetNetworkConfiguration) error) (*armnetwork.Interface, error) {
	return untilFresh(func() (*armnetwork.Interface, error) { return p.changeScaleSetNICOnce(ctx, rid, change) })
}

func (p *Provider) changeScaleSetNICOnce(ctx context.Context, rid *arm.ResourceID, change func(*armcompute.VirtualMachineScaleSetNetworkConfiguration) error) (*armnetwork.Interface, error) {
	rg, set, instance := rid.ResourceGroupName, rid.Parent.Parent.Name, rid.Parent.Name
	got, err := p.vmsVM.Get(ctx, rg, set, instance, nil)
	if err != nil {
		return nil, classify(err)
	}
	vm := got.VirtualMachineScaleSetVM
	if vm.Properties == nil || vm.Properties.NetworkProfileConfiguration == nil {
		return nil, fmt.Errorf("scale set instance %s/%s has no network profile", set, instance)
	}
	var cfg *armcompute.VirtualMachineScaleSetNetworkConfiguration
	for _, c := range vm.Properties.NetworkProfileConfiguration.NetworkInterfaceConfigurations {
		if strings.EqualFold(str(c.Name), rid.Name) && c.Properties != nil {
			cfg = c
		}
	}
	if cfg == nil {
		return nil, &cloud.Error{Kind: cloud.KindNotFound, Code: "NotFound", Message: fmt.Sprintf("scale set instance %s/%s has no NIC %s", set, instance, rid.Name)}
	}
	if err := change(cfg); err != nil {
		return nil, err
	}
	if vm.Properties.StorageProfile != nil {
		vm.Properties.StorageProfile.ImageReference = nil
	}
	poller, err := p.vmsVM.BeginUpdate(ctx, rg, set, instance, vm, &armcompute.VirtualMachineScaleSetVMsClientBeginUpdateOptions{IfMatch: vm.Etag})
	if isStale(err) {
		return nil, err
	} else if err != nil {
		return nil, classify(err)
	}
	if _, err := poller.PollUntilDone(ctx, nil); err != nil {
		return nil, classify(err)
	}
	return p.getNIC(ctx, rid)
}

func firstConfig(nic *armnetwork.Interface) *armnetwork.InterfaceIPConfiguration {
	for _, c := range nic.Properties.IPConfigurations {
		if c.Properties != nil && boolOf(c.Properties.Primary) && c.Properties.Subnet != nil {
			return c
		}
	}
	return nil
}

func firstScaleSetConfig(c *armcompute.VirtualMachineScaleSetNetworkConfiguration) *armcompute.VirtualMachineScaleSetIPConfiguration {
	for _, ic := range c.Properties.IPConfigurations {
		if ic.Properties != nil && boolOf(ic.Properties.Primary) && ic.Properties.Subnet != nil {
			return ic
		}
	}
	return nil
}

// checkRoom refuses adding n configurations to NIC iface holding have,
// or to one without a primary configuration to copy (hasFirst false).
func checkRoom(iface string, hasFirst bool, have, n int) error {
	if !hasFirst {
		return fmt.Errorf("NIC %s has no IP configuration to copy", iface)
	}
	if have+n > InterfaceAddressLimit {
		return &cloud.Error{Kind: cloud.KindInterfaceFull, Code: "InterfaceAddressLimit",
			Message: fmt.Sprintf("NIC %s holds %d IP configurations; %d more pass the %d a NIC takes", iface, have, n, InterfaceAddressLimit)}
	}
	return nil
}

// configName is a new IP configuration's name.
func configName() string {
	const letters = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 8)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return configPrefix + string(b)
}

// kinds are the ARM error codes the workers act on.
var kinds = map[string]cloud.Kind{
	"SubnetIsFull": cloud.KindSubnetFull,
	"SecondaryIpConfigurationCountPerVMSSVMExceeded":               cloud.KindInterfaceFull,
	"VMScaleSetIpConfigurationsOnSameNicCannotUseDifferentSubnets": cloud.KindInvalid,
	"ResourceNotFound": cloud.KindNotFound,
	"NotFound":         cloud.KindNotFound,
}

// classify makes an ARM error a *cloud.Error of its kind: by code, else
// 404 not found and 429 throttled (after the SDK's retries, which honour
// Retry-After); an error that is no ARM answer is returned as it is.
func classify(err error) error {
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return err
	}
	kind, ok := kinds[re.ErrorCode]
	switch {
	case ok:
	case re.StatusCode == http.StatusNotFound:
		kind = cloud.KindNotFound
	case re.StatusCode == http.StatusTooManyRequests:
		kind = cloud.KindThrottled
	}
	return &cloud.Error{Kind: kind, Code: re.ErrorCode, Message: fmt.Sprintf("HTTP %d", re.StatusCode),
		RetryAfter: retryAfter(re.RawResponse), Err: err}
}

// classifyStale is classify for a change's last error, which may be a
// 412 left unclassified for the retry.
func classifyStale(err error) error {
	if isStale(err) {
		return classify(err)
	}
	return err
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func boolOf(p *bool) bool { return p != nil && *p }
