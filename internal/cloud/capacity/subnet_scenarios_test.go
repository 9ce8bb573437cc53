// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"context"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// The subnet scenarios of issue 35: an interface whose subnet is full
// must not block its node. Cilium's operator adds only to an interface
// whose subnet has room and else creates one in a subnet with room; the
// VPC CNI skips a subnet that answered InsufficientFreeAddressesInSubnet
// for 120 s.

const (
	ownSubnet  = "subnet-0123456789abcdef0" // newWorld's, 10.90.0.0/24
	roomSubnet = "subnet-room"
)

// assignsBy counts the Assign calls on each interface, under the
// worker's real provider: which subnet a call went to.
type assignsBy struct {
	cloud.Provider
	mu    sync.Mutex
	calls map[string]int
}

func (c *assignsBy) Assign(ctx context.Context, iface string, n int, prefixes bool) (cloud.Assigned, error) {
	c.mu.Lock()
	c.calls[iface]++
	c.mu.Unlock()
	return c.Provider.Assign(ctx, iface, n, prefixes)
}

func (c *assignsBy) on(iface string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[iface]
}

// countAssigns puts an assignsBy in front of x's worker's provider;
// before the first pass, which hands the provider to the pool's
// reconciler.
func countAssigns(x *scen) *assignsBy {
	c := &assignsBy{Provider: x.provider, calls: map[string]int{}}
	x.w.Cloud = c
	return c
}

// addSubnet adds a subnet of cidr to x's VPC in zone, and its range to the
// pool's CIDRs (the pool's CIDRs are its subnets').
func addSubnet(t *testing.T, x *scen, id, zone, cidr string, spec alloc.CloudSpec) {
	t.Helper()
	x.fake.AddSubnet(ec2fake.Subnet{ID: id, VPC: "vpc-1", Zone: zone, CIDR: netip.MustParsePrefix(cidr)})
	p, err := x.st.GetPool(t.Context(), alloc.DefaultSpace, "eni")
	if err != nil {
		t.Fatal(err)
	}
	ps := p.Spec
	ps.IPv4.CIDRs = append(ps.IPv4.CIDRs, netip.MustParsePrefix(cidr))
	ps.Cloud = &spec
	if _, err := x.st.UpdatePool(t.Context(), alloc.DefaultSpace, "eni", nil, ps); err != nil {
		t.Fatal(err)
	}
}

// fill takes every address of subnet (range cidr) that no interface of
// x's instance holds, as other tenants would: the subnet has none free.
func fill(t *testing.T, x *scen, subnet, cidr string) {
	t.Helper()
	inst, err := x.provider.Instance(t.Context(), x.inst)
	if err != nil {
		t.Fatal(err)
	}
	held := map[netip.Addr]bool{}
	for _, f := range inst.Interfaces {
		held[f.Primary] = true
		for _, a := range f.Addresses {
			held[a] = true
		}
		for _, p := range f.Prefixes {
			for a := p.Addr(); p.Contains(a); a = a.Next() {
				held[a] = true
			}
		}
	}
	r := netip.MustParsePrefix(cidr)
	for a := r.Addr(); r.Contains(a); a = a.Next() {
		if !held[a] {
			x.fake.Take(subnet, a)
		}
	}
	if n := x.fake.FreeAddresses(subnet); n != 0 {
		t.Fatalf("%s still has %d free addresses", subnet, n)
	}
}

// interfaceIn answers the interface of x's instance in subnet, by the
// cloud's reading.
func interfaceIn(t *testing.T, x *scen, subnet string) (cloud.Interface, bool) {
	t.Helper()
	inst, err := x.provider.Instance(t.Context(), x.inst)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range inst.Interfaces {
		if f.SubnetID == subnet {
			return f, true
		}
	}
	return cloud.Interface{}, false
}

// leaseAll leases every free address of n1, as Pods starting would.
func leaseAll(t *testing.T, x *scen, next *int) {
	t.Helper()
	for {
		if _, err := x.lease(t, "c"+strconv.Itoa(*next)); err != nil {
			return
		}
		*next++
	}
}

// TestScenarioFullSubnetNewInterfaceElsewhere: the node's only interface
// is in a full subnet, and another subnet of its zone has room. The
// first pass creates an interface there, without asking the full one,
// and the Pods get its addresses; later passes add to it and to one more
// there, never to the full subnet's.
func TestScenarioFullSubnetNewInterfaceElsewhere(t *testing.T) {
	spec := alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}}
	x := newScen(t, spec)
	addSubnet(t, x, roomSubnet, "eu-west-1a", "10.91.0.0/24", spec)
	fill(t, x, ownSubnet, "10.90.0.0/24")
	c := countAssigns(x)
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatalf("first pass: %v", err)
	}
	f, ok := interfaceIn(t, x, roomSubnet)
	if !ok || len(f.Addresses) != 4 {
		t.Fatalf("after one pass the node has no interface in %s with 4 addresses (%+v); %d Assign calls to the full subnet",
			roomSubnet, f, c.on(x.eni0))
	}
	next := 0
	leaseAll(t, x, &next)
	if next != 4 {
		t.Fatalf("%d Pods got an address, want 4", next)
	}
	for range 12 {
		x.clock.Advance(10 * time.Second)
		// Once the instance takes no more interfaces, the node's only
		// free slots are in the full subnet: it waits, and says so.
		if err := x.w.Pass(t.Context()); err != nil && cloud.KindOf(err) != cloud.KindSubnetFull {
			t.Fatal(err)
		}
		leaseAll(t, x, &next)
	}
	if got := c.on(x.eni0); got != 0 {
		t.Fatalf("%d Assign calls to the interface of the full subnet, known full from the start: want 0", got)
	}
	// The two interfaces the instance still takes, filled from the
	// subnet with room: 18 Pods.
	if next != 18 {
		t.Fatalf("%d Pods got an address, want 18 (two interfaces of 9 in %s)", next, roomSubnet)
	}
}

// TestScenarioSubnetFullRefusalFallsThrough: the subnet fills after the
// workers read it. The interface's Assign is refused
// (InsufficientFreeAddressesInSubnet); the same pass creates an interface
// in the subnet with room, and over six minutes of passes the full subnet
// is asked at most once per cooldown.
func TestScenarioSubnetFullRefusalFallsThrough(t *testing.T) {
	spec := alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}}
	x := newScen(t, spec)
	addSubnet(t, x, roomSubnet, "eu-west-1a", "10.91.0.0/24", spec)
	c := countAssigns(x)
	x.pass(t)
	next := 0
	leaseAll(t, x, &next)
	if next != 4 || c.on(x.eni0) != 1 {
		t.Fatalf("%d Pods, %d Assign calls before the subnet filled; want 4 and 1", next, c.on(x.eni0))
	}
	fill(t, x, ownSubnet, "10.90.0.0/24")
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatalf("the pass that met the full subnet: %v", err)
	}
	f, ok := interfaceIn(t, x, roomSubnet)
	if !ok || len(f.Addresses) != 4 || c.on(x.eni0) != 2 {
		t.Fatalf("after the refusal: interface in %s %v with %d addresses, %d Assign calls on %s; want one with 4, 2 calls",
			roomSubnet, ok, len(f.Addresses), c.on(x.eni0), x.eni0)
	}
	leaseAll(t, x, &next)
	// Six minutes of passes, every 10 s, Pods taking what comes: the
	// full subnet's interface keeps 5 free slots all along.
	for range 36 {
		x.clock.Advance(10 * time.Second)
		if err := x.w.Pass(t.Context()); err != nil && cloud.KindOf(err) != cloud.KindSubnetFull {
			t.Fatal(err)
		}
		leaseAll(t, x, &next)
	}
	if extra := c.on(x.eni0) - 2; extra > 3 {
		t.Fatalf("%d more Assign calls to the full subnet in 6 minutes; at most one per 2-minute cooldown", extra)
	}
	if next < 4+9 {
		t.Fatalf("%d Pods got an address, want at least 13 (4, then a whole interface in %s)", next, roomSubnet)
	}
}

// TestScenarioEverySubnetFullNoCalls: the node's zone has one subnet, and
// it fills. The first pass that needs more is refused once; for the
// cooldown and after (the subnets read full), no pass calls
// AssignPrivateIpAddresses or CreateNetworkInterface for the node, and
// each reports it waiting. A subnet with room added to the zone serves
// it at the next reading.
func TestScenarioEverySubnetFullNoCalls(t *testing.T) {
	spec := alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}}
	x := newScen(t, spec)
	x.pass(t)
	next := 0
	leaseAll(t, x, &next)
	fill(t, x, ownSubnet, "10.90.0.0/24")
	before := x.calls("AssignPrivateIpAddresses", "CreateNetworkInterface")
	err := x.w.Pass(t.Context())
	if cloud.KindOf(err) != cloud.KindSubnetFull {
		t.Fatalf("the pass that met the full subnet answered %v, want subnet full", err)
	}
	first := x.calls("AssignPrivateIpAddresses", "CreateNetworkInterface")
	if first["AssignPrivateIpAddresses"]-before["AssignPrivateIpAddresses"] != 1 || first["CreateNetworkInterface"] != before["CreateNetworkInterface"] {
		t.Fatalf("calls %v then %v: want the one refused Assign and no create", before, first)
	}
	for pass := range 30 {
		x.clock.Advance(10 * time.Second)
		if err := x.w.Pass(t.Context()); cloud.KindOf(err) != cloud.KindSubnetFull {
			t.Fatalf("pass %d answered %v, want the node waiting for a subnet", pass, err)
		}
	}
	if now := x.calls("AssignPrivateIpAddresses", "CreateNetworkInterface"); now["AssignPrivateIpAddresses"] != first["AssignPrivateIpAddresses"] ||
		now["CreateNetworkInterface"] != first["CreateNetworkInterface"] {
		t.Fatalf("calls %v after 5 minutes of passes, %v after the refusal: want none against full subnets", now, first)
	}
	addSubnet(t, x, roomSubnet, "eu-west-1a", "10.91.0.0/24", spec)
	x.clock.Advance(cloud.DefaultSubnetRefresh)
	x.pass(t)
	if f, ok := interfaceIn(t, x, roomSubnet); !ok || len(f.Addresses) != 4 {
		t.Fatalf("with a subnet of room in the zone: %v, %+v; want an interface there with 4 addresses", ok, f)
	}
}
