// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// TestInstanceDescribesNetworks: each interface carries its MAC, its
// subnet's range and router (base + 1), the VPC's primary and associated
// blocks and its IPv6 prefixes; subnets and VPCs are read once each, in
// one call for every subnet and one for every VPC an inventory meets.
func TestInstanceDescribesNetworks(t *testing.T) {
	fake := ec2fake.New()
	fake.AddVPC("vpc-1", netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("100.64.0.0/16"))
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-a", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("10.0.1.0/24")})
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-b", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("100.64.8.0/22")})
	inst, eni0, err := fake.AddInstance("m5.large", "subnet-a")
	if err != nil {
		t.Fatal(err)
	}
	eni1, err := fake.AttachInterface(inst, "subnet-b", 1)
	if err != nil {
		t.Fatal(err)
	}
	v6 := netip.MustParsePrefix("2a05:d018:1:2:3::/80")
	if err := fake.DelegateIPv6Prefix(eni1, v6); err != nil {
		t.Fatal(err)
	}
	other, _, err := fake.AddInstance("m5.large", "subnet-b")
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, fake, 1)
	ctx := context.Background()
	all, err := p.Instances(ctx, "vpc-1")
	if err != nil {
		t.Fatal(err)
	}
	if s, v := fake.Calls("DescribeSubnets"), fake.Calls("DescribeVpcs"); s != 1 || v != 1 {
		t.Errorf("inventory of 3 interfaces in 2 subnets: %d DescribeSubnets, %d DescribeVpcs; want 1 and 1", s, v)
	}
	blocks := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("100.64.0.0/16")}
	macs := map[string]bool{}
	for _, id := range []string{inst, other} {
		for _, f := range all[id].Interfaces {
			if f.MAC == "" || macs[f.MAC] {
				t.Errorf("interface %s: MAC %q empty or shared", f.ID, f.MAC)
			}
			macs[f.MAC] = true
			if !slices.Equal(f.VPCCIDRs, blocks) {
				t.Errorf("interface %s: VPC blocks %v, want %v", f.ID, f.VPCCIDRs, blocks)
			}
		}
	}
	got, err := p.Instance(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Interfaces) != 2 {
		t.Fatalf("%d interfaces, want 2", len(got.Interfaces))
	}
	want := []struct {
		id, subnet, gateway string
		v6                  []netip.Prefix
	}{
		{eni0, "10.0.1.0/24", "10.0.1.1", nil},
		{eni1, "100.64.8.0/22", "100.64.8.1", []netip.Prefix{v6}},
	}
	for i, w := range want {
		f := got.Interfaces[i]
		if f.ID != w.id || f.SubnetCIDR != netip.MustParsePrefix(w.subnet) || f.Gateway != netip.MustParseAddr(w.gateway) ||
			!slices.Equal(f.IPv6Prefixes, w.v6) || !slices.Equal(f.VPCCIDRs, blocks) {
			t.Errorf("interface %d: %+v\nwant %+v", i, f, w)
		}
	}
	if fi := fake.Interfaces(); !slices.ContainsFunc(fi, func(x ec2fake.Interface) bool { return x.ID == eni1 && x.MAC == got.Interfaces[1].MAC }) {
		t.Errorf("MAC %s is not the fake's of %s", got.Interfaces[1].MAC, eni1)
	}
	// Cached: the next readings call neither again.
	if _, err := p.Instance(ctx, other); err != nil {
		t.Fatal(err)
	}
	if s, v := fake.Calls("DescribeSubnets"), fake.Calls("DescribeVpcs"); s != 1 || v != 1 {
		t.Errorf("after cached readings: %d DescribeSubnets, %d DescribeVpcs; want 1 and 1", s, v)
	}
}

// TestCreateInterfaceDescribesItsNetwork: a created interface answers its
// subnet's range and router, though the instance's reading met only the
// primary's subnet.
func TestCreateInterfaceDescribesItsNetwork(t *testing.T) {
	fake, inst, _ := world(t, "m5.large", "10.0.0.0/24")
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-b", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("10.0.4.0/22")})
	p := newProvider(t, fake, 1)
	f, err := p.CreateInterface(context.Background(), cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-b", SecurityGroups: []string{"sg-pods"}, Addresses: 1, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	if f.SubnetCIDR != netip.MustParsePrefix("10.0.4.0/22") || f.Gateway != netip.MustParseAddr("10.0.4.1") || f.MAC == "" {
		t.Fatalf("created %+v", f)
	}
	// world's VPC was made by its first subnet: its block is that range.
	if !slices.Equal(f.VPCCIDRs, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}) {
		t.Fatalf("VPC blocks %v", f.VPCCIDRs)
	}
}
