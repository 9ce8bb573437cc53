// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// TestReconcilerNewInterfaceNextSubnet: a node whose interfaces are full
// gets a new interface; a subnet that answers full cools down and the
// next is tried, and the next node's round skips it.
func TestReconcilerNewInterfaceNextSubnet(t *testing.T) {
	ctx := context.Background()
	fake := ec2fake.New()
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-a", VPC: "vpc-1", Zone: "z", CIDR: netip.MustParsePrefix("10.60.0.0/24")})
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-b", VPC: "vpc-1", Zone: "z", CIDR: netip.MustParsePrefix("10.60.1.0/25")})
	p := newProvider(t, fake, 1)
	now := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	rec := &cloud.Reconciler{Provider: p, Interfaces: p, Tags: map[string]string{cloud.TagCluster: "prod"}, Now: func() time.Time { return now }}
	opts := cloud.PlanOptions{Sizing: cloud.Sizing{Watermarks: alloc.Watermarks{PreAllocate: 4}}}
	// subnet-a, the nodes' own and the freest, refuses creates as if
	// another tenant had just filled it.
	creates := 0
	fake.SetFault(func(action string) *ec2fake.APIError {
		if action != "CreateNetworkInterface" {
			return nil
		}
		if creates++; creates == 1 {
			return &ec2fake.APIError{Code: "InsufficientFreeAddressesInSubnet", Message: "The specified subnet does not have enough free addresses to satisfy the request."}
		}
		return nil
	})
	for i, want := range []string{"subnet-b", "subnet-b"} {
		inst, eni0, err := fake.AddInstance("t3.small", "subnet-a")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Assign(ctx, eni0, 3, false); err != nil {
			t.Fatal(err)
		}
		described, err := p.Instance(ctx, inst)
		if err != nil {
			t.Fatal(err)
		}
		used := map[netip.Addr]bool{}
		for _, a := range described.Interfaces[0].Addresses {
			used[a] = true
		}
		plan, added, err := rec.Round(ctx, "node", cloud.NodeState{Instance: described, Used: used}, opts)
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
		if plan.Create == nil || !added.Created || added.NewInterface.SubnetID != want || len(added.Addresses) != 3 {
			t.Fatalf("node %d: plan %+v added %+v", i, plan, added)
		}
	}
	// One refused create, then one in subnet-b per node: the second node
	// did not try subnet-a.
	if n := fake.Calls("CreateNetworkInterface"); n != 3 {
		t.Fatalf("%d creates, want 3", n)
	}
	// Two minutes on, subnet-a is tried again.
	now = now.Add(cloud.DefaultSubnetCooldown)
	inst, eni0, _ := fake.AddInstance("t3.small", "subnet-a")
	if _, err := p.Assign(ctx, eni0, 3, false); err != nil {
		t.Fatal(err)
	}
	described, _ := p.Instance(ctx, inst)
	used := map[netip.Addr]bool{}
	for _, a := range described.Interfaces[0].Addresses {
		used[a] = true
	}
	if _, added, err := rec.Round(ctx, "node", cloud.NodeState{Instance: described, Used: used}, opts); err != nil || added.NewInterface.SubnetID != "subnet-a" {
		t.Fatalf("after the cooldown: %+v, %v", added, err)
	}
}

// TestReconcilerFallsBackToAddresses: on a subnet whose free space has no
// aligned /28 left (cilium#29634) a prefix round gets single addresses,
// as many as the node lacks; the subnet is asked no prefix again until
// its cooldown ends.
func TestReconcilerFallsBackToAddresses(t *testing.T) {
	ctx := context.Background()
	fake, inst, _ := world(t, "m5.large", "10.61.0.0/26")
	// Take one address in each of the three /28s past the first.
	for _, a := range []string{"10.61.0.20", "10.61.0.36", "10.61.0.52"} {
		fake.Take("subnet-a", netip.MustParseAddr(a))
	}
	p := newProvider(t, fake, 1)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := &cloud.Reconciler{Provider: p, Now: func() time.Time { return now }}
	opts := cloud.PlanOptions{Prefixes: true, Sizing: cloud.Sizing{Watermarks: alloc.Watermarks{PreAllocate: 6}}}
	round := func() (cloud.Added, int) {
		t.Helper()
		described, err := p.Instance(ctx, inst)
		if err != nil {
			t.Fatal(err)
		}
		// Every address held is in use: the node lacks its pre-allocation.
		used := map[netip.Addr]bool{}
		for _, f := range described.Interfaces {
			for _, a := range f.Addresses {
				used[a] = true
			}
		}
		before := fake.Calls("AssignPrivateIpAddresses")
		_, added, err := rec.Round(ctx, "node", cloud.NodeState{Instance: described, Used: used}, opts)
		if err != nil {
			t.Fatal(err)
		}
		if len(added.Prefixes) != 0 {
			t.Fatalf("added prefixes %v on a fragmented subnet", added.Prefixes)
		}
		return added, fake.Calls("AssignPrivateIpAddresses") - before
	}
	if added, calls := round(); len(added.Addresses) != 6 || calls != 2 {
		t.Fatalf("first round: %d addresses in %d calls, want 6 in 2 (the prefix refused, then the addresses)", len(added.Addresses), calls)
	}
	// The interface has 3 slots left (10 less the primary and 6).
	if added, calls := round(); len(added.Addresses) != 3 || calls != 1 {
		t.Fatalf("in the cooldown: %d addresses in %d calls, want 3 in 1 (no prefix asked)", len(added.Addresses), calls)
	}
}
