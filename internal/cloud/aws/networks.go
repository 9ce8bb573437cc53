// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/ipam-dev/ipam/internal/cloud"
)

// subnetInfo is what the provider keeps of a subnet: its range and VPC.
type subnetInfo struct {
	cidr netip.Prefix
	vpc  string
}

// withNetworks fills the SubnetCIDR, Gateway and VPCCIDRs of ifaces from
// the provider's caches, reading what they miss: one DescribeSubnets for
// every missing subnet, then one DescribeVpcs for every missing VPC.
// Subnets keep their range and VPCs their blocks for as long as the
// workers run (a VPC's blocks only grow, and rarely: a block associated
// later shows after a restart), so a reading costs calls only the first
// time it meets a subnet or a VPC.
func (p *Provider) withNetworks(ctx context.Context, ifaces []cloud.Interface) error {
	if err := p.readSubnets(ctx, ifaces); err != nil {
		return err
	}
	if err := p.readVPCs(ctx); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range ifaces {
		sn, ok := p.subnets[ifaces[i].SubnetID]
		if !ok {
			return fmt.Errorf("interface %s: EC2 described no subnet %s", ifaces[i].ID, ifaces[i].SubnetID)
		}
		ifaces[i].SubnetCIDR = sn.cidr
		// AWS's router answers at the subnet's base address plus one.
		ifaces[i].Gateway = sn.cidr.Addr().Next()
		ifaces[i].VPCCIDRs = slices.Clone(p.vpcs[sn.vpc])
	}
	return nil
}

// readSubnets reads the subnets of ifaces the cache misses.
func (p *Provider) readSubnets(ctx context.Context, ifaces []cloud.Interface) error {
	p.mu.Lock()
	var missing []string
	for _, f := range ifaces {
		if _, ok := p.subnets[f.SubnetID]; !ok && f.SubnetID != "" && !slices.Contains(missing, f.SubnetID) {
			missing = append(missing, f.SubnetID)
		}
	}
	p.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	pages := ec2.NewDescribeSubnetsPaginator(p.ec2, &ec2.DescribeSubnetsInput{SubnetIds: missing})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return classify(err)
		}
		for _, sn := range page.Subnets {
			cidr, err := netip.ParsePrefix(sdkaws.ToString(sn.CidrBlock))
			if err != nil {
				return fmt.Errorf("subnet %s: %w", sdkaws.ToString(sn.SubnetId), err)
			}
			p.mu.Lock()
			p.subnets[sdkaws.ToString(sn.SubnetId)] = subnetInfo{cidr: cidr, vpc: sdkaws.ToString(sn.VpcId)}
			p.mu.Unlock()
		}
	}
	return nil
}

// readVPCs reads the blocks of the cached subnets' VPCs the cache misses:
// the primary block and every associated one, in EC2's order.
func (p *Provider) readVPCs(ctx context.Context) error {
	p.mu.Lock()
	var missing []string
	for _, sn := range p.subnets {
		if _, ok := p.vpcs[sn.vpc]; !ok && sn.vpc != "" && !slices.Contains(missing, sn.vpc) {
			missing = append(missing, sn.vpc)
		}
	}
	p.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	slices.Sort(missing)
	pages := ec2.NewDescribeVpcsPaginator(p.ec2, &ec2.DescribeVpcsInput{VpcIds: missing})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return classify(err)
		}
		for _, v := range page.Vpcs {
			var blocks []netip.Prefix
			add := func(s string) error {
				b, err := netip.ParsePrefix(s)
				if err != nil {
					return fmt.Errorf("VPC %s: %w", sdkaws.ToString(v.VpcId), err)
				}
				if !slices.Contains(blocks, b) {
					blocks = append(blocks, b)
				}
				return nil
			}
			if v.CidrBlock != nil {
				if err := add(*v.CidrBlock); err != nil {
					return err
				}
			}
			for _, a := range v.CidrBlockAssociationSet {
				// A block being disassociated, or whose association
				// failed, routes nothing.
				if a.CidrBlockState != nil && a.CidrBlockState.State != "associated" {
					continue
				}
				if err := add(sdkaws.ToString(a.CidrBlock)); err != nil {
					return err
				}
			}
			p.mu.Lock()
			p.vpcs[sdkaws.ToString(v.VpcId)] = blocks
			p.mu.Unlock()
		}
	}
	return nil
}
