// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"fmt"
	"net/netip"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// nodeFromAPI parses a node registration; absent labels and addresses are
// empty.
func nodeFromAPI(space, name string, s ipamv1.NodeSpec) (alloc.Node, error) {
	labels, err := labelsFromAPI("labels", s.Labels)
	if err != nil {
		return alloc.Node{}, err
	}
	n := alloc.Node{Space: space, Name: name, Labels: labels, ProviderID: deref(s.ProviderID, "")}
	for _, err := range []error{
		checkLen("providerID", n.ProviderID, maxProviderIDLen),
		checkCount("addresses", len(deref(s.Addresses, nil)), maxNodeAddresses),
		checkCount("podCIDRs", len(deref(s.PodCIDRs, nil)), maxNodePodCIDRs),
	} {
		if err != nil {
			return alloc.Node{}, err
		}
	}
	if s.Addresses != nil {
		n.Addresses = make([]alloc.NodeAddress, len(*s.Addresses))
		for i, a := range *s.Addresses {
			if !a.Type.Valid() {
				return alloc.Node{}, alloc.Invalid(fmt.Sprintf("addresses[%d].type", i), "%q is not InternalIP or ExternalIP", a.Type)
			}
			addr, err := parseAddr(fmt.Sprintf("addresses[%d].address", i), a.Address)
			if err != nil {
				return alloc.Node{}, err
			}
			n.Addresses[i] = alloc.NodeAddress{Type: string(a.Type), Address: addr}
		}
	}
	for i, c := range deref(s.PodCIDRs, nil) {
		p, err := parsePrefix(fmt.Sprintf("podCIDRs[%d]", i), c)
		if err != nil {
			return alloc.Node{}, err
		}
		n.PodCIDRs = append(n.PodCIDRs, p)
	}
	return n, nil
}

func nodeToAPI(n alloc.Node) ipamv1.Node {
	out := ipamv1.Node{
		Name:       n.Name,
		Space:      n.Space,
		Labels:     labelsToAPI(n.Labels),
		Addresses:  make([]ipamv1.NodeAddress, len(n.Addresses)),
		ProviderID: optString(n.ProviderID),
		Blocks:     int(n.Blocks),
		Leases:     int(n.Leases),
		CreatedAt:  n.CreatedAt.UTC(),
		UpdatedAt:  n.UpdatedAt.UTC(),
	}
	for i, a := range n.Addresses {
		out.Addresses[i] = ipamv1.NodeAddress{Type: ipamv1.NodeAddressType(a.Type), Address: a.Address.String()}
	}
	return out
}

func nodeListToAPI(items []alloc.Node, next string) ipamv1.NodeList {
	l := ipamv1.NodeList{Items: make([]ipamv1.Node, len(items)), Continue: optString(next)}
	for i, n := range items {
		l.Items[i] = nodeToAPI(n)
	}
	return l
}

func ciliumNodeToAPI(st alloc.CiliumNodeState) *ipamv1.CiliumNodeState {
	out := &ipamv1.CiliumNodeState{Mode: st.Mode, ResourceVersion: st.ResourceVersion,
		OperatorError: optString(st.OperatorError), Ipv4: ciliumFamilyToAPI(st.IPv4), Ipv6: ciliumFamilyToAPI(st.IPv6)}
	if len(st.PodCIDRs) > 0 {
		cidrs := prefixStrings(st.PodCIDRs)
		out.PodCIDRs = &cidrs
	}
	if len(st.Pools) > 0 {
		pools := make([]ipamv1.CiliumPoolState, len(st.Pools))
		for i, p := range st.Pools {
			pools[i] = ipamv1.CiliumPoolState{Pool: p.Pool, Allocated: prefixStrings(p.Allocated),
				NeededIPv4: optInt(p.NeededIPv4), NeededIPv6: optInt(p.NeededIPv6)}
		}
		out.Pools = &pools
	}
	return out
}

func ciliumFamilyToAPI(f *alloc.CiliumFamilyState) *ipamv1.CiliumFamilyState {
	if f == nil {
		return nil
	}
	out := &ipamv1.CiliumFamilyState{Pool: f.Pool, Used: f.Used}
	out.Releasing.MarkedForRelease = f.MarkedForRelease
	out.Releasing.ReadyForRelease = f.ReadyForRelease
	out.Releasing.DoNotRelease = f.DoNotRelease
	out.Releasing.Released = f.Released
	return out
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// usageFilterFromAPI parses which pools a node-usage query names: at most
// maxUsagePools, each a DNS label, and maybe the default pool.
func usageFilterFromAPI(p ipamv1.GetNodeUsageParams) (alloc.UsageFilter, error) {
	var only alloc.UsageFilter
	if p.Pool != nil {
		if n := len(*p.Pool); n > maxUsagePools {
			return alloc.UsageFilter{}, alloc.Invalid("pool", "%d pools named, at most %d", n, maxUsagePools)
		}
		for i, name := range *p.Pool {
			if err := alloc.ValidateLabelName(fmt.Sprintf("pool[%d]", i), name); err != nil {
				return alloc.UsageFilter{}, err
			}
		}
		only.Pools = *p.Pool
	}
	only.Default = p.DefaultPool != nil && *p.DefaultPool
	return only, nil
}

func nodeUsageToAPI(node string, usage alloc.NodeUsage) ipamv1.NodeUsage {
	out := ipamv1.NodeUsage{Node: node, DefaultPool: usage.DefaultPool, Items: make([]ipamv1.NodePoolUsage, len(usage.Items))}
	for i, u := range usage.Items {
		out.Items[i] = ipamv1.NodePoolUsage{
			Pool: u.Pool, Family: familyToAPI(u.Family), Mode: ipamv1.PoolMode(u.Mode),
			Blocks: u.Blocks, Capacity: u.Capacity, Leased: u.Leased, Released: u.Released(),
			PreAllocate: u.PreAlloc, Needed: u.Needed(), Available: u.Available(), Deficit: u.Deficit(),
			AtCapacity: u.AtCapacity(), CanLease: u.CanLease,
		}
	}
	return out
}

func blockToAPI(b alloc.Block) ipamv1.Block {
	out := ipamv1.Block{
		Cidr:    b.Layout.Prefix.String(),
		Node:    b.Node,
		Pool:    b.Pool,
		Family:  familyToAPI(b.Family),
		Gateway: optAddr(b.Layout.Router),
		Reserved: ipamv1.ReservedAddresses{
			Router:  optAddr(b.Layout.Router),
			Health:  optAddr(b.Layout.Health),
			Ingress: optAddr(b.Layout.Ingress),
		},
		Capacity:  b.Layout.Capacity,
		Leased:    b.Leased,
		Cooling:   b.Cooling,
		CreatedAt: b.CreatedAt.UTC(),
	}
	if b.Source != "" {
		out.Source = ptr(ipamv1.BlockSource(b.Source))
	}
	return out
}

func blockListToAPI(items []alloc.Block) ipamv1.BlockList {
	l := ipamv1.BlockList{Items: make([]ipamv1.Block, len(items))}
	for i, b := range items {
		l.Items[i] = blockToAPI(b)
	}
	return l
}
