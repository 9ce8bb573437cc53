// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"context"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
)

// failingInventory is an Inventory whose listings fail (EC2 throttling
// or refusing them).
type failingInventory struct{ calls int }

func (f *failingInventory) Instances(context.Context, string) (map[string]cloud.Instance, error) {
	f.calls++
	return nil, &cloud.Error{Kind: cloud.KindThrottled, Code: "RequestLimitExceeded", Message: "slow down"}
}

// fiveNodes is a world of five m5.large nodes, listed once (the first
// pass describes each, the second lists their network).
func fiveNodes(t *testing.T) (*world, func() int) {
	t.Helper()
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 2}})
	for _, n := range []string{"n2", "n3", "n4", "n5"} {
		x.addNode(t, n)
	}
	x.pass(t)
	x.pass(t)
	return x, func() int { return x.fake.Calls("DescribeInstances") }
}

// TestPassListsOncePerResync: the network is listed once a Resync (a
// minute, Cilium's), not every pass; between, a node a round changed is
// read as the cloud's answer left it, not described again.
func TestPassListsOncePerResync(t *testing.T) {
	x, describes := fiveNodes(t)
	d0 := describes()
	x.pass(t)
	if d := describes() - d0; d != 0 {
		t.Fatalf("a pass within the resync over unchanged nodes made %d DescribeInstances, want 0", d)
	}
	// n1 needs more: its round assigns, and the next passes read it as
	// the answer left it.
	for _, c := range []string{"c1", "c2"} {
		if _, err := x.lease(t, c); err != nil {
			t.Fatal(err)
		}
	}
	x.pass(t)
	if got, _ := x.fake.Held(x.eni0); len(got) != 4 {
		t.Fatalf("n1's interface holds %v, want 4 addresses", got)
	}
	d1 := describes()
	x.pass(t)
	if d := describes() - d1; d != 0 {
		t.Fatalf("after a round on n1: %d DescribeInstances, want none (the answer said what it holds)", d)
	}
	d2 := describes()
	x.pass(t)
	if d := describes() - d2; d != 0 {
		t.Fatalf("n1 described again with no change: %d DescribeInstances", d)
	}
	if x.blocks(t) != 4 {
		t.Fatalf("n1 has %d blocks, want 4", x.blocks(t))
	}
	x.clock.Advance(DefaultResync)
	d3 := describes()
	x.pass(t)
	if d := describes() - d3; d != 1 {
		t.Fatalf("a pass a resync later made %d DescribeInstances, want the listing", d)
	}
}

// TestPassNoDescribeHerdWhenListingFails: a listing that fails is not
// followed by a describe of every node: the last listing is read while
// young enough, then the network's nodes wait for a listing.
func TestPassNoDescribeHerdWhenListingFails(t *testing.T) {
	x, describes := fiveNodes(t)
	inv := &failingInventory{}
	x.w.Inventory = inv
	x.clock.Advance(DefaultResync)
	d0 := describes()
	if err := x.w.Pass(t.Context()); err == nil {
		t.Fatal("the failed listing was not answered")
	}
	if d := describes() - d0; d != 0 || inv.calls != 1 {
		t.Fatalf("after a failed listing: %d DescribeInstances (want 0), %d listings (want 1)", d, inv.calls)
	}
	// Too old to read: the nodes wait, served by no call.
	x.clock.Advance(ListingMaxAge * DefaultResync)
	if _, err := x.lease(t, "c1"); err != nil {
		t.Fatal(err)
	}
	before := x.fake.Calls("AssignPrivateIpAddresses")
	if err := x.w.Pass(t.Context()); err == nil {
		t.Fatal("the failed listing was not answered")
	}
	if d := describes() - d0; d != 0 {
		t.Fatalf("after a failed listing, the last too old: %d DescribeInstances, want 0", d)
	}
	if a := x.fake.Calls("AssignPrivateIpAddresses") - before; a != 0 {
		t.Fatalf("%d assigns on an old listing", a)
	}
	// Listed again: served.
	x.w.Inventory = x.provider
	x.pass(t)
	if got, _ := x.fake.Held(x.eni0); len(got) != 3 {
		t.Fatalf("n1's interface holds %v once listed, want 3 addresses", got)
	}
}
