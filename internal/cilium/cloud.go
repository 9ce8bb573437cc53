// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"

	awstypes "github.com/cilium/cilium/pkg/aws/types"
	azuretypes "github.com/cilium/cilium/pkg/azure/types"
	iputil "github.com/cilium/cilium/pkg/ip"
	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/store"
)

// A CiliumNode whose labels select a cloud pool holds the cloud's
// addresses: the capacity workers give its instance's interfaces what the
// pool's cloud sizing says and record them as the node's blocks, and the
// crd-mode round reserves them into spec.ipam.pool as it reserves carved
// ones. Three things differ, all done here:
//
//   - the node's providerID is recorded (the Kubernetes Node's, else one
//     made of the CiliumNode's spec.instance-id), so that the workers
//     serve its instance at all;
//   - each spec.ipam.pool entry's resource is the interface holding the
//     address (Cilium's agent finds its routing by it), and an address
//     the workers' last reading of the interfaces does not show yet stays
//     out of the pool until it does;
//   - the status carries that reading, as Cilium's operator writes it:
//     status.eni.enis on AWS, status.azure.interfaces on Azure.
//
// On AWS the CiliumNode's spec.eni says which interfaces are for Pods, as
// Cilium's AWS operator reads it (ENI.IsExcludedBySpec): none below its
// first-interface-index, none carrying every tag of its
// exclude-interface-tags. It is recorded with the providerID, and the
// workers neither count, nor add to, nor give back from the others; no
// address of theirs enters spec.ipam.pool. An unset spec.ipam.pre-allocate
// is seeded from the instance type's limits (preAllocateSeed).
//
// Cilium's agent in ipam.mode=eni (v1.20) allocates from the addresses
// status.eni.enis lists, so each interface lists exactly the CiliumNode's
// pool addresses it holds; the agent reports the ones it keeps (in use
// or spare) in spec.ipam.pools.allocated rather than status.ipam.used
// (allocatedUse), and gives one back by leaving it out of that list for
// the release delay (multiPoolAgent).

// providerID is the node's cloud id: the Kubernetes Node's
// spec.providerID, else one made of the CiliumNode's spec.instance-id as
// the cloud providers write it (aws:///ZONE/i-..., azure://RESOURCE-ID).
func (o *Operator) providerID(name string, cn *ciliumv2.CiliumNode) string {
	if n := o.kubeNode(name); n != nil && n.Spec.ProviderID != "" {
		return n.Spec.ProviderID
	}
	id := cn.Spec.InstanceID
	switch {
	case strings.HasPrefix(id, "i-"):
		return "aws:///" + cn.Spec.ENI.AvailabilityZone + "/" + id
	case strings.HasPrefix(strings.ToLower(id), "/subscriptions/"):
		return "azure://" + id
	}
	return ""
}

// cloudNode is what a round knows of the node's cloud: whether its pool
// is a cloud pool, the provider its providerID names, and the workers'
// last reading of its interfaces.
type cloudNode struct {
	isCloud  bool
	provider alloc.CloudProvider
	reading  store.CloudInterfaces
}

// cloudOf records the node's providerID when its pool is a cloud pool, for
// the workers, and answers the node's cloud.
func (o *Operator) cloudOf(ctx context.Context, name string, cn *ciliumv2.CiliumNode) (cloudNode, error) {
	pid := o.providerID(name, cn)
	if pid == "" {
		return cloudNode{}, nil
	}
	var pods store.PodInterfaces
	if strings.HasPrefix(pid, string(alloc.CloudAWS)+"://") {
		pods = podInterfaces(cn.Spec.ENI)
	}
	// The Node's max Pods, as the VPC CNI's ipamd reads it: the workers
	// bound the node's addresses by it when its pool sets none.
	if n := o.kubeNode(name); n != nil {
		if v, ok := n.Status.Capacity.Pods().AsInt64(); ok && v > 0 && v <= math.MaxInt32 {
			pods.MaxPods = int(v)
		}
	}
	isCloud, err := o.store.SetCiliumNodeProviderID(ctx, o.cfg.Space, name, o.nodeLabels(name, cn), o.cfg.DefaultPool, pid, pods)
	if err != nil || !isCloud {
		return cloudNode{}, err
	}
	c := cloudNode{isCloud: true}
	switch {
	case strings.HasPrefix(pid, string(alloc.CloudAWS)+"://"):
		c.provider = alloc.CloudAWS
	case strings.HasPrefix(pid, string(alloc.CloudAzure)+"://"):
		c.provider = alloc.CloudAzure
	}
	if c.reading, err = o.store.CloudInterfaces(ctx, o.cfg.Space, name); err != nil {
		return cloudNode{}, fmt.Errorf("reading the node's cloud interfaces: %w", err)
	}
	return c, nil
}

// podInterfaces is what a CiliumNode's spec.eni says of the interfaces
// for Pods.
func podInterfaces(spec awstypes.ENISpec) store.PodInterfaces {
	pi := store.PodInterfaces{ExcludeTags: spec.ExcludeInterfaceTags}
	if spec.FirstInterfaceIndex != nil {
		first := *spec.FirstInterfaceIndex
		pi.FirstIndex = &first
	}
	return pi
}

// excludedBySpec says whether the CiliumNode's spec.eni leaves interface f
// out of Pod addressing (Cilium's ENI.IsExcludedBySpec); on Azure nothing
// is.
func excludedBySpec(p alloc.CloudProvider, spec awstypes.ENISpec, f store.CloudInterface) bool {
	if p != alloc.CloudAWS {
		return false
	}
	e := awstypes.ENI{Number: f.DeviceIndex, Tags: f.Tags}
	return e.IsExcludedBySpec(spec)
}

// preAllocateSeed is the spec.ipam.pre-allocate Cilium's operator writes
// into a CiliumNode that has none (nodemanager/node.go, syncToAPIServer:
// GetMinimumAllocatableIPv4), and whether to write it now. On AWS it is
// the default 8 lowered to what the interfaces from the node's
// first-interface-index can hold (cloud.Limits.MinimumPreAllocate), 8
// when the node names no index, 0 (nothing written) when the type has no
// interface from it; on Azure always 8 (pkg/azure/ipam). Cilium reads
// the limits from a table it has at start; here they come with the
// workers' first reading of the instance, so nothing is written before
// it (the round sizes with the default 8 meanwhile): a seed written from
// unknown limits would stay for good.
func preAllocateSeed(p alloc.CloudProvider, cn *ciliumv2.CiliumNode, limits store.InstanceLimits) (int, bool) {
	if cn.Spec.IPAM.PreAllocate != 0 {
		return 0, false
	}
	switch p {
	case alloc.CloudAzure:
		return alloc.DefaultPreAllocate, true
	case alloc.CloudAWS:
		if !limits.Known() {
			return 0, false
		}
		if cn.Spec.ENI.FirstInterfaceIndex == nil {
			return alloc.DefaultPreAllocate, true
		}
		l := cloud.Limits{Interfaces: limits.Interfaces, IPv4PerInterface: limits.IPv4PerInterface}
		n := l.MinimumPreAllocate(*cn.Spec.ENI.FirstInterfaceIndex)
		return n, n > 0
	}
	return 0, false
}

// excessReleased says whether a node of the provider's cloud pool (""
// for other pools) gives excess addresses back, as Cilium's operator
// decides it: AWS only with --aws-release-excess-ips (off by default),
// Azure never (v1.20.2's Azure IPAM prepares no release). Other pools
// have no Cilium operator to follow (Cilium's crd mode leaves allocation
// to an external one): they give back what exceeds the watermark, so that
// a shared pool's addresses return to it.
func (o *Operator) excessReleased(p alloc.CloudProvider) bool {
	switch p {
	case alloc.CloudAWS:
		return o.cfg.AWSReleaseExcessIPs
	case alloc.CloudAzure:
		return false
	}
	return true
}

// cloudRound applies the cloud's part to desired after the round, for a
// node of a cloud pool: it sets each pool entry's resource and the status
// from the workers' last reading. used are the addresses Pods use.
func (o *Operator) cloudRound(ctx context.Context, name string, cn, desired *ciliumv2.CiliumNode, c cloudNode, used map[netip.Addr]alloc.Owner) error {
	if !c.isCloud {
		return nil
	}
	// Interfaces the node's spec.eni leaves out hold none of its pool's
	// addresses.
	forPods := slices.DeleteFunc(slices.Clone(c.reading.Interfaces), func(f store.CloudInterface) bool {
		return excludedBySpec(c.provider, cn.Spec.ENI, f)
	})
	pool := desired.Spec.IPAM.Pool
	onIface := map[string][]netip.Addr{}
	for ip, a := range pool {
		addr, err := netip.ParseAddr(ip)
		if err != nil {
			continue
		}
		f := interfaceHolding(forPods, addr)
		if f == nil && inUse(used, addr) {
			// In use, yet not in the last reading: a reading that lags
			// the assignment (the clouds' reads are eventually
			// consistent). The entry keeps the interface it was last
			// listed on, and that interface lists it: Cilium's ENI agent
			// configures no device while a pool entry names an interface
			// the status lacks or one that does not list the address
			// (pkg/ipam/eni.go, validateENIConfig), and the crd agent
			// routes the address by its entry's interface.
			f = interfaceByID(forPods, cn.Spec.IPAM.Pool[ip].Resource)
			if f == nil {
				o.log.Warn("an address in use is on none of the node's interfaces the cloud last listed", "node", name, "address", ip)
			}
		}
		switch {
		case f != nil:
			a.Resource = f.ID
			pool[ip] = a
			onIface[f.ID] = append(onIface[f.ID], addr)
		case !inUse(used, addr):
			// Not routable by the agent before the interface shows it.
			delete(pool, ip)
		}
	}
	if len(pool) == 0 {
		desired.Spec.IPAM.Pool = nil
	}
	switch c.provider {
	case alloc.CloudAWS:
		desired.Status.ENI.ENIs = eniStatus(c.reading.Interfaces, onIface, func(f store.CloudInterface) bool {
			return excludedBySpec(c.provider, cn.Spec.ENI, f)
		})
	case alloc.CloudAzure:
		desired.Status.Azure.Interfaces = azureStatus(c.reading.Interfaces, onIface)
	}
	return nil
}

func inUse(used map[netip.Addr]alloc.Owner, a netip.Addr) bool {
	_, ok := used[a]
	return ok
}

// interfaceByID is the interface of the reading with that id, nil when
// none (or id is empty).
func interfaceByID(ifaces []store.CloudInterface, id string) *store.CloudInterface {
	for i := range ifaces {
		if id != "" && ifaces[i].ID == id {
			return &ifaces[i]
		}
	}
	return nil
}

// interfaceHolding is the interface of ifaces that holds a (a secondary
// address, the primary, or inside a prefix); nil when none does.
func interfaceHolding(ifaces []store.CloudInterface, a netip.Addr) *store.CloudInterface {
	for i := range ifaces {
		f := &ifaces[i]
		if f.Primary == a || slices.Contains(f.Addresses, a) || slices.Contains(f.IPv6Addresses, a) {
			return f
		}
		for _, p := range f.Prefixes {
			if p.Contains(a) {
				return f
			}
		}
		for _, p := range f.IPv6Prefixes {
			if p.Contains(a) {
				return f
			}
		}
	}
	return nil
}

// eniStatus is status.eni.enis: every interface of the reading with what
// the agent routes by (MAC, device number, subnet, VPC ranges) and, as
// its addresses, the node's pool addresses it holds (sorted), so that the
// agent allocates those and no other. An interface the node's spec.eni
// excludes is listed with what it holds, as Cilium's operator lists every
// ENI (PopulateStatusFields): the agent skips it by the same spec
// (pkg/ipam/eni.go).
func eniStatus(ifaces []store.CloudInterface, pool map[string][]netip.Addr, excluded func(store.CloudInterface) bool) map[string]awstypes.ENI {
	if len(ifaces) == 0 {
		return nil
	}
	out := make(map[string]awstypes.ENI, len(ifaces))
	for _, f := range ifaces {
		e := awstypes.ENI{ID: f.ID, IP: iputil.AddrFrom(f.Primary), MAC: f.MAC, AvailabilityZone: f.Zone, Number: f.DeviceIndex,
			Subnet:         awstypes.AwsSubnet{ID: f.SubnetID, CIDR: iputil.PrefixFrom(f.SubnetCIDR)},
			VPC:            awstypes.AwsVPC{ID: f.VPC},
			SecurityGroups: slices.Clone(f.SecurityGroups), Tags: f.Tags}
		if len(f.VPCCIDRs) > 0 {
			e.VPC.PrimaryCIDR = iputil.PrefixFrom(f.VPCCIDRs[0])
			for _, c := range f.VPCCIDRs {
				e.VPC.CIDRs = append(e.VPC.CIDRs, iputil.PrefixFrom(c))
			}
		}
		addrs := pool[f.ID]
		if excluded(f) {
			addrs = f.Addresses
			for _, p := range f.Prefixes {
				e.Prefixes = append(e.Prefixes, iputil.PrefixFrom(p))
			}
		}
		for _, a := range slices.SortedFunc(slices.Values(addrs), netip.Addr.Compare) {
			e.Addresses = append(e.Addresses, iputil.AddrFrom(a))
		}
		out[f.ID] = e
	}
	return out
}

// azureStatus is status.azure.interfaces: every NIC of the reading with
// what the agent routes by (MAC, gateway, subnet range), its addresses
// those of the node's pool it holds, Succeeded (the workers record only
// those). The fields v1.20 deprecates (the interface's cidr, the
// address's subnet, mirrors for older agents) are left out: the v1.20
// agent reads subnet.cidr and subnet.id.
func azureStatus(ifaces []store.CloudInterface, pool map[string][]netip.Addr) []azuretypes.AzureInterface {
	var out []azuretypes.AzureInterface
	for _, f := range ifaces {
		ai := azuretypes.AzureInterface{ID: f.ID, IP: iputil.AddrFrom(f.Primary), Name: f.Name, MAC: f.MAC, State: "Succeeded",
			Subnet:  azuretypes.AzureSubnet{ID: f.SubnetID, CIDR: iputil.PrefixFrom(f.SubnetCIDR)},
			Gateway: iputil.AddrFrom(f.Gateway)}
		if len(f.SecurityGroups) > 0 {
			ai.SecurityGroup = f.SecurityGroups[0]
		}
		for _, a := range slices.SortedFunc(slices.Values(pool[f.ID]), netip.Addr.Compare) {
			ai.Addresses = append(ai.Addresses, azuretypes.AzureAddress{IP: iputil.AddrFrom(a), State: "Succeeded"})
		}
		out = append(out, ai)
	}
	return out
}

// allocatedUse is what an agent in ipam.mode=eni (v1.20) reports in use:
// the single-address CIDRs of spec.ipam.pools.allocated (it leaves
// status.ipam.used empty).
func allocatedUse(p ipamtypes.IPAMPoolSpec) []netip.Addr {
	var out []netip.Addr
	for _, a := range p.Allocated {
		for _, c := range a.CIDRs {
			if c.IsValid() && c.IsSingleIP() {
				out = append(out, c.Addr())
			}
		}
	}
	return out
}
