// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package azure

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"

	"github.com/ipam-dev/ipam/internal/cloud"
)

// withNetwork fills f's SubnetCIDR, Gateway and VPCCIDRs: its subnet's
// range (Subnets.Get) and its virtual network's address space
// (VirtualNetworks.Get), each read once and cached, as neither moves
// while a NIC sits in it. The gateway is the subnet's first usable
// address, base + 1, where Azure answers.
func (p *Provider) withNetwork(ctx context.Context, f *cloud.Interface) error {
	if f.SubnetID == "" {
		return nil
	}
	rid, err := arm.ParseResourceID(f.SubnetID)
	if err != nil || rid.Parent == nil {
		return fmt.Errorf("NIC %s: subnet %q is no subnet ID: %v", f.ID, f.SubnetID, err)
	}
	cidr, err := p.subnetRange(ctx, rid)
	if err != nil {
		return err
	}
	space, err := p.addressSpace(ctx, rid.Parent)
	if err != nil {
		return err
	}
	f.SubnetCIDR, f.Gateway, f.VPCCIDRs = cidr, cidr.Addr().Next(), space
	return nil
}

func (p *Provider) subnetRange(ctx context.Context, rid *arm.ResourceID) (netip.Prefix, error) {
	k := strings.ToLower(rid.String())
	p.mu.Lock()
	cidr, ok := p.subnetRanges[k]
	p.mu.Unlock()
	if ok {
		return cidr, nil
	}
	got, err := p.subnets.Get(ctx, rid.ResourceGroupName, rid.Parent.Name, rid.Name, nil)
	if err != nil {
		return netip.Prefix{}, classify(err)
	}
	if got.Properties == nil {
		return netip.Prefix{}, fmt.Errorf("subnet %s has no properties", rid)
	}
	// A subnet has one prefix, or a list of them (IPv4 and IPv6 on a
	// dual-stack subnet): the IPv4 one is the NIC's.
	candidates := got.Properties.AddressPrefixes
	if got.Properties.AddressPrefix != nil {
		candidates = append(candidates, got.Properties.AddressPrefix)
	}
	for _, c := range candidates {
		pf, err := netip.ParsePrefix(str(c))
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("subnet %s: %w", rid, err)
		}
		if pf.Addr().Is4() {
			cidr, ok = pf.Masked(), true
		}
	}
	if !ok {
		return netip.Prefix{}, fmt.Errorf("subnet %s has no IPv4 prefix", rid)
	}
	p.mu.Lock()
	p.subnetRanges[k] = cidr
	p.mu.Unlock()
	return cidr, nil
}

func (p *Provider) addressSpace(ctx context.Context, rid *arm.ResourceID) ([]netip.Prefix, error) {
	k := strings.ToLower(rid.String())
	p.mu.Lock()
	space, ok := p.spaces[k]
	p.mu.Unlock()
	if ok {
		return slices.Clone(space), nil
	}
	got, err := p.vnets.Get(ctx, rid.ResourceGroupName, rid.Name, nil)
	if err != nil {
		return nil, classify(err)
	}
	if got.Properties == nil || got.Properties.AddressSpace == nil {
		return nil, fmt.Errorf("virtual network %s has no address space", rid)
	}
	for _, c := range got.Properties.AddressSpace.AddressPrefixes {
		pf, err := netip.ParsePrefix(str(c))
		if err != nil {
			return nil, fmt.Errorf("virtual network %s: %w", rid, err)
		}
		space = append(space, pf.Masked())
	}
	p.mu.Lock()
	p.spaces[k] = space
	p.mu.Unlock()
	return slices.Clone(space), nil
}
