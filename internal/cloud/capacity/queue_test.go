// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
)

// watched records the order of Assign calls and how many ran at once.
type watched struct {
	cloud.Provider
	delay time.Duration

	mu             sync.Mutex
	order          []string
	inFlight, most int
}

func (p *watched) Assign(ctx context.Context, iface string, n int, prefixes bool) (cloud.Assigned, error) {
	p.mu.Lock()
	p.order = append(p.order, iface)
	p.inFlight++
	p.most = max(p.most, p.inFlight)
	p.mu.Unlock()
	time.Sleep(p.delay)
	defer func() { p.mu.Lock(); p.inFlight--; p.mu.Unlock() }()
	return p.Provider.Assign(ctx, iface, n, prefixes)
}

// addNode adds an m5.large and its node to x, answering its first
// interface.
func (x *world) addNode(t *testing.T, name string) string {
	t.Helper()
	inst, eni0, err := x.fake.AddInstance("m5.large", "subnet-0123456789abcdef0")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := x.st.PutNode(t.Context(), alloc.Node{Space: alloc.DefaultSpace, Name: name, ProviderID: "aws:///eu-west-1a/" + inst}); err != nil {
		t.Fatal(err)
	}
	return eni0
}

// TestPassServesLargestDeficitFirst: with one round at a time, the node
// short of the most addresses gets the cloud's first call, whatever the
// order of the nodes in the store.
func TestPassServesLargestDeficitFirst(t *testing.T) {
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 6}})
	eni2 := x.addNode(t, "n2")
	eni3 := x.addNode(t, "n3")
	// n1 lacks 1, n2 lacks 6, n3 lacks 3.
	if _, err := x.w.Cloud.Assign(t.Context(), x.eni0, 5, false); err != nil {
		t.Fatal(err)
	}
	if _, err := x.w.Cloud.Assign(t.Context(), eni3, 3, false); err != nil {
		t.Fatal(err)
	}
	p := &watched{Provider: x.w.Cloud}
	x.w.Cloud, x.w.Parallel = p, 1
	x.pass(t)
	if want := []string{eni2, eni3, x.eni0}; !slices.Equal(p.order, want) {
		t.Fatalf("assigned to %v, want %v (largest deficit first)", p.order, want)
	}
	for _, eni := range []string{x.eni0, eni2, eni3} {
		if held, _ := x.fake.Held(eni); len(held) != 6 {
			t.Fatalf("%s holds %v after the pass", eni, held)
		}
	}
}

// TestPassBoundsParallelRounds: a pass over many nodes runs at most
// Parallel rounds at once, and more than one (run it with -race: the
// rounds share the worker's maps).
func TestPassBoundsParallelRounds(t *testing.T) {
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 2}, ReleaseDelay: time.Minute})
	enis := []string{x.eni0}
	for i := range 7 {
		enis = append(enis, x.addNode(t, "m"+string(rune('a'+i))))
	}
	p := &watched{Provider: x.w.Cloud, delay: 50 * time.Millisecond}
	x.w.Cloud, x.w.Parallel = p, 3
	x.pass(t)
	if p.most > 3 || p.most < 2 {
		t.Fatalf("%d rounds at once, want 2 or 3 (Parallel 3)", p.most)
	}
	nodes, err := x.st.CloudNodes(t.Context(), alloc.DefaultSpace, "eni")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if len(n.Blocks) != 2 {
			t.Fatalf("node %s has %d blocks, want 2", n.Name, len(n.Blocks))
		}
	}
	for _, eni := range enis {
		if held, _ := x.fake.Held(eni); len(held) != 2 {
			t.Fatalf("%s holds %v", eni, held)
		}
	}
	// Excess on every node at once: the releases share the excess map.
	if _, err := x.st.UpdatePool(t.Context(), alloc.DefaultSpace, "eni", nil, alloc.PoolSpec{
		IPv4: &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.90.0.0/24")}, MaskSize: 28}, NodeLocal: alloc.DefaultNodeLocal,
		Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 1}, ReleaseDelay: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	x.pass(t)
	x.clock.Advance(time.Minute)
	x.pass(t)
	for _, eni := range enis {
		if held, _ := x.fake.Held(eni); len(held) != 1 {
			t.Fatalf("%s holds %v after the release", eni, held)
		}
	}
}

// TestPassListsInsteadOfDescribing: with an Inventory, a pass lists the
// nodes' network (the first pass describes one node to learn it) (one DescribeInstances and one
// DescribeNetworkInterfaces for all of them) instead of describing each
// node's instance, and serves them as well; a node the listing lacks is
// described alone.
func TestPassListsInsteadOfDescribing(t *testing.T) {
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 2}})
	const nodes = 5
	for i := 2; i <= nodes; i++ {
		inst, _, err := x.fake.AddInstance("m5.large", "subnet-0123456789abcdef0")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := x.st.PutNode(t.Context(), alloc.Node{Space: alloc.DefaultSpace, Name: "n" + strconv.Itoa(i), ProviderID: "aws:///eu-west-1a/" + inst}); err != nil {
			t.Fatal(err)
		}
	}
	describes := func() (instances, ifaces int) {
		return x.fake.Calls("DescribeInstances"), x.fake.Calls("DescribeNetworkInterfaces")
	}
	// No network known yet: one node described to learn it, then the
	// network listed, in the first pass already.
	x.pass(t)
	if i0, _ := describes(); i0 != 2 {
		t.Fatalf("the first pass made %d DescribeInstances for %d nodes, want 2 (one node's, the listing)", i0, nodes)
	}
	// The rounds' answers updated the listing: the next pass describes
	// nothing; once a resync has passed, one listing serves them all.
	x.pass(t)
	i0, f0 := describes()
	if i0 != 2 {
		t.Fatalf("the pass after the rounds made %d DescribeInstances, want none", i0-2)
	}
	x.clock.Advance(DefaultResync)
	x.pass(t)
	i1, f1 := describes()
	if i1-i0 != 1 || f1-f0 != 1 {
		t.Fatalf("a pass over %d nodes of one network: %d DescribeInstances, %d DescribeNetworkInterfaces; want 1 and 1", nodes, i1-i0, f1-f0)
	}
	held := 0
	for _, f := range x.fake.Interfaces() {
		if f.Instance != "" {
			held += len(f.Addresses)
		}
	}
	if held != 2*nodes {
		t.Fatalf("%d addresses over %d nodes, want 2 each", held, nodes)
	}
	// A node whose instance is not in the listing (another network, or
	// not running) is described alone.
	x.fake.TerminateInstance(x.inst)
	x.clock.Advance(DefaultResync)
	x.pass(t)
	if i2, _ := describes(); i2-i1 != 2 {
		t.Fatalf("with one instance gone: %d DescribeInstances, want the listing and the one node's", i2-i1)
	}
}
