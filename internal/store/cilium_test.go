// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// crdFixture is a store whose default pool leases IPv4 from 10.0.0.0/16 in
// blocks of mask (router and health reserved), and whose actor is the
// Cilium operator's.
func crdFixture(t *testing.T, mask int) *fixture {
	t.Helper()
	f := newFixture(t, nil)
	f.ctx = alloc.WithActor(f.ctx, "cilium-operator")
	f.pool("default", alloc.PoolSpec{IPv4: fam(mask, "10.0.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	return f
}

// reserve reserves n IPv4 addresses for node, failing the test on error.
func (f *fixture) reserve(node string, labels map[string]string, n int) []alloc.HeldAddress {
	f.t.Helper()
	got, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, node, labels, "", alloc.IPv4, n)
	if err != nil {
		f.t.Fatalf("reserve %d for %s: %v", n, node, err)
	}
	if len(got) != n {
		f.t.Fatalf("reserve %d for %s: got %d", n, node, len(got))
	}
	return got
}

// held answers the node's addresses, failing the test on error.
func (f *fixture) held(node string) []alloc.HeldAddress {
	f.t.Helper()
	h, err := f.s.NodeAddresses(f.ctx, alloc.DefaultSpace, node)
	if err != nil {
		f.t.Fatal(err)
	}
	return h
}

func addrsOf(hs []alloc.HeldAddress) []netip.Addr {
	out := make([]netip.Addr, len(hs))
	for i, h := range hs {
		out[i] = h.Addr
	}
	return out
}

// events answers the address's history as "kind state owner reason" lines.
func (f *fixture) events(a netip.Addr) []string {
	f.t.Helper()
	var out []string
	for _, e := range f.history(alloc.HistoryFilter{Space: alloc.DefaultSpace, Address: a}) {
		owner := ""
		if e.Owner.Name != "" {
			owner = e.Owner.Namespace + "/" + e.Owner.Name
		}
		out = append(out, strings.Join([]string{string(e.Kind), e.State, owner, e.Reason}, " "))
	}
	return out
}

func TestReserveNodeAddresses(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 24)
	if got, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", nil, "", alloc.IPv4, 0); err != nil || got != nil {
		t.Fatalf("n=0: %v, %v", got, err)
	}
	if _, err := f.s.GetNode(f.ctx, alloc.DefaultSpace, "n1"); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("n=0 registered the node: %v", err)
	}
	labels := map[string]string{"topology.kubernetes.io/zone": "a"}
	first := f.reserve("n1", labels, 8)
	// The router and health addresses (.1, .2) are the block's own.
	want := []netip.Addr{}
	for i := 3; i <= 10; i++ {
		want = append(want, netip.MustParseAddr(fmt.Sprintf("10.0.0.%d", i)))
	}
	if !slices.Equal(addrsOf(first), want) {
		t.Fatalf("reserved %v, want %v", addrsOf(first), want)
	}
	for _, h := range first {
		if h.State != alloc.StateReserved || h.Pool != "default" || h.Block != netip.MustParsePrefix("10.0.0.0/24") ||
			h.Family != alloc.IPv4 || h.Owner != (alloc.Owner{}) || !h.CoolUntil.IsZero() || !h.Since.Equal(f.clock.Now()) || h.Generation == 0 {
			t.Fatalf("reserved %+v", h)
		}
	}
	more := f.reserve("n1", labels, 4)
	if more[0].Addr != netip.MustParseAddr("10.0.0.11") {
		t.Fatalf("second reservation starts at %s, want the cursor's 10.0.0.11", more[0].Addr)
	}
	if got := f.held("n1"); !slices.Equal(addrsOf(got), append(addrsOf(first), addrsOf(more)...)) {
		t.Fatalf("NodeAddresses %v", addrsOf(got))
	}
	n, err := f.s.GetNode(f.ctx, alloc.DefaultSpace, "n1")
	if err != nil || n.Labels["topology.kubernetes.io/zone"] != "a" || n.Leases != 12 || n.Blocks != 1 {
		t.Fatalf("node %+v, %v", n, err)
	}
	if c := f.count(`SELECT count(*) FROM nodes WHERE name = 'n1' AND cilium_crd`); c != 1 {
		t.Fatal("the node is not marked as served in crd mode")
	}
	// The rest of the store sees reserved leases: taken, not free.
	l, err := f.s.GetAddress(f.ctx, alloc.DefaultSpace, first[0].Addr)
	if err != nil || l.State != alloc.StateReserved || l.Node != "n1" ||
		l.Attachment != (alloc.Attachment{Network: alloc.CiliumPoolNetwork, ContainerID: "10.0.0.3", Interface: alloc.CiliumPoolInterface}) {
		t.Fatalf("GetAddress %+v, %v", l, err)
	}
	listed, _, err := f.s.ListLeases(f.ctx, alloc.LeaseFilter{Space: alloc.DefaultSpace, State: alloc.StateReserved}, alloc.Page{Limit: 100})
	if err != nil || len(listed) != 12 {
		t.Fatalf("ListLeases(reserved): %d, %v", len(listed), err)
	}
	p, err := f.s.GetPool(f.ctx, alloc.DefaultSpace, "default")
	if st := p.Status[alloc.IPv4]; err != nil || st.Leased != 12 || st.Free() != 252-12 {
		t.Fatalf("pool status %+v, %v", st, err)
	}
	if c := f.count(`SELECT allocated FROM blocks`); c != 12 {
		t.Fatalf("block counts %d", c)
	}
	// The history: a lease to the node, no owner, the selection rule as
	// reason, the operator as actor.
	ev := f.history(alloc.HistoryFilter{Space: alloc.DefaultSpace, Address: first[0].Addr})
	if len(ev) != 1 || ev[0].Kind != alloc.EventLease || ev[0].State != "reserved" || ev[0].Owner != (alloc.Owner{}) ||
		ev[0].Reason != "default" || ev[0].Actor != "cilium-operator" || ev[0].Node != "n1" || ev[0].Attachment.Network != alloc.CiliumPoolNetwork {
		t.Fatalf("history %+v", ev)
	}
	// Labels replace what the node had.
	f.reserve("n1", map[string]string{"rack": "r1"}, 1)
	if n, _ := f.s.GetNode(f.ctx, alloc.DefaultSpace, "n1"); len(n.Labels) != 1 || n.Labels["rack"] != "r1" {
		t.Fatalf("labels %v", n.Labels)
	}
	f.checkClean()
}

// checkClean fails the test when the consistency check finds anything.
func (f *fixture) checkClean() {
	f.t.Helper()
	r, err := f.s.CheckConsistency(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	if len(r.Findings) > 0 {
		f.t.Fatalf("consistency findings: %+v", r.Findings)
	}
}

// A pool that cannot give all the addresses asked for commits those it
// can and says why; the next call gets the cooled ones back once their
// cooldown ended.
func TestReserveNodeAddressesExhaustion(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	// One /28 block: 16 addresses less network, broadcast, router and
	// health.
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.0.0.0/28"), NodeLocal: alloc.DefaultNodeLocal})
	got, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", nil, "", alloc.IPv4, 20)
	var e *alloc.Error
	if !errors.As(err, &e) || e.Kind != alloc.KindPoolExhausted || e.Pool != "default" || e.Family != alloc.IPv4 || len(got) != 12 {
		t.Fatalf("reserve 20 of 12: %d addresses, %v", len(got), err)
	}
	if h := f.held("n1"); !slices.Equal(addrsOf(h), addrsOf(got)) {
		t.Fatalf("committed %v, answered %v", addrsOf(h), addrsOf(got))
	}
	got, err = f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n2", nil, "", alloc.IPv4, 1)
	if wantKind(t, err, alloc.KindPoolExhausted); len(got) != 0 {
		t.Fatalf("another node got %v from a full pool", addrsOf(got))
	}
	// Two go back; they cool down before anyone gets them.
	back := addrsOf(f.held("n1"))[:2]
	if rel, err := f.s.ReleaseNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", back); err != nil || !slices.Equal(rel, back) {
		t.Fatalf("release %v: %v, %v", back, rel, err)
	}
	if got, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", nil, "", alloc.IPv4, 2); !alloc.IsKind(err, alloc.KindPoolExhausted) || len(got) != 0 {
		t.Fatalf("reserved cooling addresses: %v, %v", addrsOf(got), err)
	}
	f.clock.Advance(f.opts.Cooldown)
	again := f.reserve("n1", nil, 2)
	if !slices.Equal(addrsOf(again), back) {
		t.Fatalf("after the cooldown got %v, want the cooled %v back", addrsOf(again), back)
	}
	if c := f.count(`SELECT count(*) FROM leases`); c != 12 {
		t.Fatalf("%d lease rows, want 12 (cooled rows reused in place)", c)
	}
	ev := f.events(back[0])
	want := []string{"lease reserved  default", "release cooling  cilium-released", "cooldown-end free  reused", "lease reserved  default"}
	if !slices.Equal(ev, want) {
		t.Fatalf("history of %s:\n%s\nwant\n%s", back[0], strings.Join(ev, "\n"), strings.Join(want, "\n"))
	}
	f.checkClean()
}

// A node at its pool's block limit gets what its blocks hold and the
// limit's refusal.
func TestReserveNodeAddressesBlockLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	one := 1
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.0.0.0/24"), NodeLocal: alloc.DefaultNodeLocal, MaxBlocksPerNode: &one})
	got, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", nil, "", alloc.IPv4, 20)
	if wantKind(t, err, alloc.KindNodeBlockLimit); len(got) != 12 {
		t.Fatalf("got %d addresses", len(got))
	}
}

// Many nodes reserving at once from one small pool: no address is in two
// nodes' pools, and each call got all it asked for or says the pool is
// exhausted, with what it got committed.
func TestReserveNodeAddressesConcurrently(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	// 16 blocks of 12 addresses: 192 for 30 nodes asking 2 x 8.
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.0.0.0/24"), NodeLocal: alloc.DefaultNodeLocal})
	const nodes, rounds, each = 30, 2, 8
	type result struct {
		node string
		got  []alloc.HeldAddress
		err  error
	}
	results := make(chan result, nodes*rounds)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			node := fmt.Sprintf("n%02d", i)
			for range rounds {
				got, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, node, nil, "", alloc.IPv4, each)
				results <- result{node, got, err}
			}
		})
	}
	wg.Wait()
	close(results)
	answered := map[string][]netip.Addr{}
	owner := map[netip.Addr]string{}
	exhausted := 0
	for r := range results {
		switch {
		case r.err == nil && len(r.got) == each:
		case alloc.IsKind(r.err, alloc.KindPoolExhausted) && len(r.got) < each:
			exhausted++
		default:
			t.Fatalf("%s: %d addresses, %v", r.node, len(r.got), r.err)
		}
		for _, h := range r.got {
			if o, dup := owner[h.Addr]; dup {
				t.Fatalf("%s answered to %s and %s", h.Addr, o, r.node)
			}
			owner[h.Addr] = r.node
			answered[r.node] = append(answered[r.node], h.Addr)
		}
	}
	// Every block is carved; what a node's blocks hold beyond what it got
	// is its own, not another's.
	if b := f.count(`SELECT count(*) FROM blocks`); exhausted == 0 || b != 16 {
		t.Fatalf("%d blocks carved, %d exhausted calls: want the whole pool (16) and some refusals", b, exhausted)
	}
	for i := range nodes {
		node := fmt.Sprintf("n%02d", i)
		want := answered[node]
		slices.SortFunc(want, netip.Addr.Compare)
		if got := addrsOf(f.held(node)); !slices.Equal(got, want) {
			t.Fatalf("%s holds %v, was answered %v", node, got, want)
		}
	}
	f.checkClean()
}

// The agent's status.ipam.used moves addresses between reserved and
// active, changes owners, and leaves other nodes' and unknown addresses
// alone; the history records each step.
func TestSyncNodeUse(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 24)
	h := addrsOf(f.reserve("n1", nil, 4))
	other := f.reserve("n2", nil, 1)[0].Addr
	free := netip.MustParseAddr("10.0.200.9")
	pod1, pod2 := alloc.Owner{Namespace: "shop", Name: "web-0"}, alloc.Owner{Namespace: "shop", Name: "web-1"}
	router := alloc.CiliumOwner("router")

	sync := func(used map[netip.Addr]alloc.Owner) alloc.NodeUseChange {
		t.Helper()
		c, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "n1", used)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	f.clock.Advance(time.Second)
	c := sync(map[netip.Addr]alloc.Owner{h[0]: pod1, h[1]: router, other: pod2, free: pod2})
	if !slices.Equal(addrsOf(c.Used), h[:2]) || len(c.Unused)+len(c.OwnerChanged) != 0 || !slices.Equal(c.Unknown, []netip.Addr{other, free}) {
		t.Fatalf("first sync %+v", c)
	}
	if c.Used[0].State != alloc.StateActive || c.Used[0].Owner != pod1 || !c.Used[0].Since.Equal(f.clock.Now()) {
		t.Fatalf("used %+v", c.Used[0])
	}
	if l, err := f.s.GetAddress(f.ctx, alloc.DefaultSpace, h[0]); err != nil || l.State != alloc.StateActive || l.Owner != pod1 {
		t.Fatalf("GetAddress %+v, %v", l, err)
	}
	if l, _ := f.s.GetAddress(f.ctx, alloc.DefaultSpace, other); l.Node != "n2" || l.State != alloc.StateReserved {
		t.Fatalf("another node's address changed: %+v", l)
	}
	// The same status again writes nothing.
	events := f.count(`SELECT count(*) FROM address_events`)
	if c := sync(map[netip.Addr]alloc.Owner{h[0]: pod1, h[1]: router}); !c.Empty() {
		t.Fatalf("an unchanged status changed %+v", c)
	}
	if n := f.count(`SELECT count(*) FROM address_events`); n != events {
		t.Fatalf("an unchanged status recorded %d events", n-events)
	}
	// web-1 took over web-0's address; the router's is no longer used.
	f.clock.Advance(time.Second)
	c = sync(map[netip.Addr]alloc.Owner{h[0]: pod2})
	if !slices.Equal(addrsOf(c.OwnerChanged), h[:1]) || !slices.Equal(addrsOf(c.Unused), h[1:2]) || len(c.Used) != 0 || len(c.Unknown) != 0 {
		t.Fatalf("second sync %+v", c)
	}
	cool := f.clock.Now().Add(f.opts.Cooldown)
	if u := c.Unused[0]; u.State != alloc.StateReserved || u.Owner != (alloc.Owner{}) || !u.CoolUntil.Equal(cool) {
		t.Fatalf("unused %+v", u)
	}
	byAddr := map[netip.Addr]alloc.HeldAddress{}
	for _, x := range f.held("n1") {
		byAddr[x.Addr] = x
	}
	if x := byAddr[h[0]]; x.State != alloc.StateActive || x.Owner != pod2 {
		t.Fatalf("%s held as %+v", h[0], x)
	}
	if x := byAddr[h[1]]; x.State != alloc.StateReserved || !x.CoolUntil.Equal(cool) || x.Releasable(f.clock.Now()) {
		t.Fatalf("%s held as %+v", h[1], x)
	}
	wantEvents := map[netip.Addr][]string{
		h[0]: {"lease reserved  default", "lease active shop/web-0 cilium-used", "release reserved shop/web-0 cilium-used",
			"lease active shop/web-1 cilium-used"},
		h[1]: {"lease reserved  default", "lease active cilium-agent/router cilium-used", "release reserved cilium-agent/router cilium-unused"},
		h[2]: {"lease reserved  default"},
	}
	for a, want := range wantEvents {
		if got := f.events(a); !slices.Equal(got, want) {
			t.Errorf("history of %s:\n%s\nwant\n%s", a, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	// Who held h[0] when: web-0, then web-1.
	at := func(a netip.Addr, when time.Time) alloc.Holding {
		t.Helper()
		hd, err := f.s.HolderAt(f.ctx, alloc.DefaultSpace, a, when)
		if err != nil {
			t.Fatalf("HolderAt(%s, %s): %v", a, when, err)
		}
		return hd
	}
	t0 := f.clock.Now().Add(-2 * time.Second)
	if hd := at(h[0], t0.Add(time.Second)); hd.Owner != pod1 || !hd.To.Equal(f.clock.Now()) {
		t.Fatalf("holder of %s after the first sync: %+v", h[0], hd)
	}
	if hd := at(h[0], f.clock.Now()); hd.Owner != pod2 {
		t.Fatalf("holder of %s now: %+v", h[0], hd)
	}
	// Between reservation and first use, and after the router let go of
	// h[1], the node holds the address itself.
	if hd := at(h[0], t0); hd.Owner != (alloc.Owner{}) || hd.Node != "n1" || !hd.To.Equal(t0.Add(time.Second)) {
		t.Fatalf("holder of %s before its first use: %+v", h[0], hd)
	}
	if hd := at(h[1], f.clock.Now()); hd.Owner != (alloc.Owner{}) || hd.Node != "n1" || !hd.From.Equal(f.clock.Now()) || !hd.To.IsZero() {
		t.Fatalf("holder of %s after the router let go: %+v", h[1], hd)
	}
	f.checkClean()
}

// Owners must pass the lease owner validation; a refused sync writes
// nothing. A node the store does not know holds nothing.
func TestSyncNodeUseRefusals(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 24)
	h := addrsOf(f.reserve("n1", nil, 2))
	_, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "n1", map[netip.Addr]alloc.Owner{
		h[0]: {Namespace: "shop", Name: "web-0"}, h[1]: {Namespace: "Bad NS", Name: "x"}})
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "used["+h[1].String()+"].owner.namespace" {
		t.Fatalf("field %q", e.Field)
	}
	if x := f.held("n1"); x[0].State != alloc.StateReserved {
		t.Fatalf("a refused sync changed %+v", x[0])
	}
	c, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "stranger", map[netip.Addr]alloc.Owner{h[0]: {Namespace: "a", Name: "b"}})
	if err != nil || !slices.Equal(c.Unknown, h[:1]) || len(c.Used) != 0 {
		t.Fatalf("sync of an unknown node: %+v, %v", c, err)
	}
	if x := f.held("n1"); x[0].State != alloc.StateReserved {
		t.Fatalf("an unknown node took %+v", x[0])
	}
	if _, err := f.s.SyncNodeUse(f.ctx, "nowhere", "n1", nil); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("sync in a missing space: %v", err)
	}
}

// A release is all or nothing: an address in use or in its cooldown
// refuses the whole call, naming the address.
func TestReleaseNodeAddresses(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 24)
	h := addrsOf(f.reserve("n1", nil, 4))
	other := f.reserve("n2", nil, 1)[0].Addr
	if _, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "n1", map[netip.Addr]alloc.Owner{h[0]: {Namespace: "shop", Name: "web-0"},
		h[1]: {Namespace: "shop", Name: "web-1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "n1", map[netip.Addr]alloc.Owner{h[0]: {Namespace: "shop", Name: "web-0"}}); err != nil {
		t.Fatal(err)
	}
	before := f.held("n1")
	_, err := f.s.ReleaseNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", []netip.Addr{h[3], h[0]})
	if e := wantKind(t, err, alloc.KindInUse); e.Field != "addresses[1]" || !strings.Contains(e.Detail, "used by shop/web-0") {
		t.Fatalf("refusal %+v", e)
	}
	_, err = f.s.ReleaseNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", []netip.Addr{h[1], h[2]})
	if e := wantKind(t, err, alloc.KindInUse); e.Field != "addresses[0]" || !strings.Contains(e.Detail, "stays with the node until") {
		t.Fatalf("refusal %+v", e)
	}
	if after := f.held("n1"); !slices.Equal(after, before) {
		t.Fatalf("a refused release changed the node's addresses:\n%+v\n%+v", before, after)
	}
	// Another node's address, a free one and a duplicate are skipped.
	rel, err := f.s.ReleaseNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", []netip.Addr{h[3], other, netip.MustParseAddr("10.0.9.9"), h[2], h[3]})
	if err != nil || !slices.Equal(rel, []netip.Addr{h[2], h[3]}) {
		t.Fatalf("release: %v, %v", rel, err)
	}
	if l, _ := f.s.GetAddress(f.ctx, alloc.DefaultSpace, other); l.State != alloc.StateReserved || l.Node != "n2" {
		t.Fatalf("another node's address was released: %+v", l)
	}
	if l, _ := f.s.GetAddress(f.ctx, alloc.DefaultSpace, h[2]); l.State != alloc.StateCooling ||
		!l.CooldownUntil.Equal(f.clock.Now().Add(f.opts.Cooldown)) {
		t.Fatalf("released %+v", l)
	}
	// A retry releases nothing more; once the cooldown ended, h[1] goes.
	if rel, err := f.s.ReleaseNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", []netip.Addr{h[2], h[3]}); err != nil || len(rel) != 0 {
		t.Fatalf("retry: %v, %v", rel, err)
	}
	f.clock.Advance(f.opts.Cooldown)
	if rel, err := f.s.ReleaseNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", []netip.Addr{h[1]}); err != nil || len(rel) != 1 {
		t.Fatalf("release after the cooldown: %v, %v", rel, err)
	}
	if got := addrsOf(f.held("n1")); !slices.Equal(got, h[:1]) {
		t.Fatalf("n1 holds %v", got)
	}
	f.checkClean()
}

// A deleted CiliumNode's addresses all go back, with the cooldown, and
// its empty blocks go back to the pool after the hold-off.
func TestReleaseAllNodeAddresses(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 28)
	h := addrsOf(f.reserve("n1", nil, 14)) // two /28 blocks
	if _, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "n1", map[netip.Addr]alloc.Owner{h[0]: {Namespace: "shop", Name: "web-0"}}); err != nil {
		t.Fatal(err)
	}
	n, err := f.s.ReleaseAllNodeAddresses(f.ctx, alloc.DefaultSpace, "n1")
	if err != nil || n != 14 {
		t.Fatalf("released %d, %v", n, err)
	}
	if got := f.held("n1"); len(got) != 0 {
		t.Fatalf("n1 still holds %v", addrsOf(got))
	}
	if c := f.count(`SELECT count(*) FROM leases WHERE state = 'released' AND cooldown_until = $1`, f.clock.Now().Add(f.opts.Cooldown)); c != 14 {
		t.Fatalf("%d addresses cooling", c)
	}
	if ev := f.events(h[0]); ev[len(ev)-1] != "release cooling shop/web-0 cilium-node-deleted" {
		t.Fatalf("history of %s: %v", h[0], ev)
	}
	if ev := f.events(h[1]); ev[len(ev)-1] != "release cooling  cilium-node-deleted" {
		t.Fatalf("history of %s: %v", h[1], ev)
	}
	if n, err := f.s.ReleaseAllNodeAddresses(f.ctx, alloc.DefaultSpace, "n1"); err != nil || n != 0 {
		t.Fatalf("again: %d, %v", n, err)
	}
	if n, err := f.s.ReleaseAllNodeAddresses(f.ctx, alloc.DefaultSpace, "never-seen"); err != nil || n != 0 {
		t.Fatalf("unknown node: %d, %v", n, err)
	}
	if names, err := f.s.CiliumNodes(f.ctx, alloc.DefaultSpace); err != nil || len(names) != 0 {
		t.Fatalf("CiliumNodes %v, %v", names, err)
	}
	f.clock.Advance(f.opts.Cooldown)
	if n, err := f.s.PurgeCooled(f.ctx); err != nil || n != 14 {
		t.Fatalf("purged %d, %v", n, err)
	}
	f.clock.Advance(f.opts.BlockReleaseHoldOff)
	if r, err := f.s.Rebalance(f.ctx); err != nil || r.Released != 2 || r.Carved != 0 {
		t.Fatalf("rebalance %+v, %v", r, err)
	}
	if c := f.count(`SELECT count(*) FROM blocks`); c != 0 {
		t.Fatalf("%d blocks left", c)
	}
	f.checkClean()
}

// A node served in crd mode holds the blocks its addresses need: the
// multi-pool pre-allocation of the default pool (8 addresses beyond
// demand, in blocks) is not carved for it.
func TestCrdNodesAreNotPreAllocated(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 28)
	f.reserve("n1", nil, 8) // one /28 of 12: below neededIPCeil(8, 8) = 16
	if r, err := f.s.Rebalance(f.ctx); err != nil || r.Carved != 0 {
		t.Fatalf("rebalance %+v, %v", r, err)
	}
	if c := f.count(`SELECT count(*) FROM blocks`); c != 1 {
		t.Fatalf("%d blocks", c)
	}
	u, err := f.s.NodeUsage(f.ctx, alloc.DefaultSpace, "n1", alloc.UsageFilter{})
	if err != nil || len(u.Items) != 1 || u.Items[0].PreAlloc != 0 || u.Items[0].Leased != 8 || u.Items[0].Deficit() != 0 {
		t.Fatalf("usage %+v, %v", u, err)
	}
}

// A node's pool follows its labels: one pool whose nodeSelector matches,
// else the default pool; two matching pools refuse and change nothing.
func TestReserveSelectsPoolByNodeLabels(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 24)
	rack := func(r string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"rack": r}}
	}
	f.pool("rack1", alloc.PoolSpec{IPv4: fam(24, "10.1.0.0/16"), NodeLocal: alloc.DefaultNodeLocal, NodeSelector: rack("r1")})
	f.pool("zoned", alloc.PoolSpec{IPv4: fam(24, "10.2.0.0/16"), IPv6: fam(120, "fd00:2::/112"), NodeLocal: alloc.DefaultNodeLocal,
		NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "zone", Operator: metav1.LabelSelectorOpExists}}}})
	if p, _ := f.s.GetPool(f.ctx, alloc.DefaultSpace, "rack1"); p.Spec.NodeSelector == nil || p.Spec.NodeSelector.MatchLabels["rack"] != "r1" {
		t.Fatalf("nodeSelector stored as %+v", p.Spec.NodeSelector)
	}
	r1 := f.reserve("n1", map[string]string{"rack": "r1"}, 2)
	if r1[0].Pool != "rack1" || !netip.MustParsePrefix("10.1.0.0/16").Contains(r1[0].Addr) {
		t.Fatalf("rack r1 node got %+v", r1[0])
	}
	if ev := f.events(r1[0].Addr); ev[0] != "lease reserved  node-selector" {
		t.Fatalf("history %v", ev)
	}
	if d := f.reserve("n2", nil, 1); d[0].Pool != "default" {
		t.Fatalf("unlabelled node got %+v", d[0])
	}
	// Two pools match n3: nothing happens, not even its registration.
	_, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n3", map[string]string{"rack": "r1", "zone": "a"}, "", alloc.IPv4, 2)
	if e := wantKind(t, err, alloc.KindPoolMatch); !strings.Contains(e.Detail, "rack1, zoned") {
		t.Fatalf("detail %q", e.Detail)
	}
	if _, err := f.s.GetNode(f.ctx, alloc.DefaultSpace, "n3"); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("a refused reservation registered n3: %v", err)
	}
	// Only zoned has IPv6: n3's IPv6 comes from it, and rack1's node has
	// no IPv6 to hold (the default pool has none).
	if v6, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n3", map[string]string{"rack": "r1", "zone": "a"}, "", alloc.IPv6, 2); err != nil ||
		len(v6) != 2 || v6[0].Pool != "zoned" || v6[0].Family != alloc.IPv6 {
		t.Fatalf("IPv6 of n3: %+v, %v", v6, err)
	}
	if v6, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", map[string]string{"rack": "r1"}, "", alloc.IPv6, 2); err != nil || len(v6) != 0 {
		t.Fatalf("IPv6 of n1: %+v, %v", v6, err)
	}
	// n1 moves to another rack: it keeps what it holds, and new addresses
	// come from the default pool.
	moved := f.reserve("n1", map[string]string{"rack": "r2"}, 1)
	if moved[0].Pool != "default" {
		t.Fatalf("moved node got %+v", moved[0])
	}
	pools := map[string]int{}
	for _, x := range f.held("n1") {
		pools[x.Pool]++
	}
	if pools["rack1"] != 2 || pools["default"] != 1 {
		t.Fatalf("n1 holds %v", pools)
	}
	// A missing default pool is not found, unless a pool matches.
	if _, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n4", nil, "nonesuch", alloc.IPv4, 1); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("missing default pool: %v", err)
	}
	if got, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n4", map[string]string{"rack": "r1"}, "nonesuch", alloc.IPv4, 1); err != nil || got[0].Pool != "rack1" {
		t.Fatalf("matching node, missing default pool: %+v, %v", got, err)
	}
	if names, err := f.s.CiliumNodes(f.ctx, alloc.DefaultSpace); err != nil || !slices.Equal(names, []string{"n1", "n2", "n3", "n4"}) {
		t.Fatalf("CiliumNodes %v, %v", names, err)
	}
	f.checkClean()
}

// Migration 00011 goes down with addresses held in crd mode (the reserved
// ones go back to their pools, those Pods use stay leased) and up again.
func TestMigrationDownWithNodeAddresses(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 24)
	h := addrsOf(f.reserve("n1", nil, 3))
	if _, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "n1", map[netip.Addr]alloc.Owner{h[0]: {Namespace: "a", Name: "b"}}); err != nil {
		t.Fatal(err)
	}
	p := migrationProvider(t, f.conn)
	if _, err := p.DownTo(f.ctx, 10); err != nil {
		t.Fatalf("down: %v", err)
	}
	if c := f.count(`SELECT count(*) FROM leases WHERE state = 'released'`); c != 2 {
		t.Fatalf("%d released after down, want the 2 reserved", c)
	}
	if _, err := p.Up(f.ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if got := f.held("n1"); len(got) != 1 || got[0].Addr != h[0] || got[0].State != alloc.StateActive {
		t.Fatalf("n1 holds %+v", got)
	}
}

// The store's other calls cannot change a node's addresses for Cilium:
// their attachment cannot be named, a release by address is refused, and
// so is the node's deletion unless forced.
func TestOtherCallsLeaveNodeAddressesAlone(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 24)
	h := f.reserve("n1", nil, 2)
	if _, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "n1", map[netip.Addr]alloc.Owner{h[0].Addr: {Namespace: "a", Name: "b"}}); err != nil {
		t.Fatal(err)
	}
	held := f.held("n1")
	crdAtt := alloc.Attachment{Network: alloc.CiliumPoolNetwork, ContainerID: h[1].Addr.String(), Interface: alloc.CiliumPoolInterface}
	for name, err := range map[string]error{
		"release attachment": func() error { _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "n1", crdAtt); return err }(),
		"release attachment at": func() error {
			_, err := f.s.ReleaseAttachmentAt(f.ctx, alloc.DefaultSpace, "n1", crdAtt, h[1].Generation)
			return err
		}(),
		"confirm": func() error { _, err := f.s.Confirm(f.ctx, alloc.DefaultSpace, "n1", crdAtt); return err }(),
		"confirm at": func() error {
			_, err := f.s.ConfirmAt(f.ctx, alloc.DefaultSpace, "n1", crdAtt, h[1].Generation)
			return err
		}(),
		"reconcile": func() error {
			_, err := f.s.Reconcile(f.ctx, alloc.DefaultSpace, "n1", alloc.CiliumPoolNetwork, nil)
			return err
		}(),
	} {
		if e := wantKind(t, err, alloc.KindInvalid); e.Field != "network" {
			t.Errorf("%s: field %q", name, e.Field)
		}
	}
	for _, x := range held {
		if _, err := f.s.ReleaseAddress(f.ctx, alloc.DefaultSpace, x.Addr); !alloc.IsKind(err, alloc.KindInUse) {
			t.Errorf("release %s (%s): %v", x.Addr, x.State, err)
		}
		if _, err := f.s.ReleaseAddressAt(f.ctx, alloc.DefaultSpace, x.Addr, x.Generation); !alloc.IsKind(err, alloc.KindInUse) {
			t.Errorf("release %s at its generation: %v", x.Addr, err)
		}
	}
	// A reconcile of the unnamed network and a lease of the node leave
	// them be.
	if rel, err := f.s.Reconcile(f.ctx, alloc.DefaultSpace, "n1", "", nil); err != nil || len(rel) != 0 {
		t.Fatalf("reconcile: %v, %v", rel, err)
	}
	if a := f.allocate(req("n1", "c1")); slices.Contains(addrsOf(held), a.Leases[0].Addr) {
		t.Fatalf("leased %s, which n1 holds for Cilium", a.Leases[0].Addr)
	}
	if after := f.held("n1"); !slices.Equal(after, held) {
		t.Fatalf("n1's addresses changed:\n%+v\n%+v", held, after)
	}
	e := wantKind(t, f.s.DeleteNode(f.ctx, alloc.DefaultSpace, "n1", false), alloc.KindInUse)
	if !strings.Contains(e.Detail, "2 addresses for Cilium's agent (crd mode) and 1 other leases") {
		t.Fatalf("detail %q", e.Detail)
	}
	if err := f.s.DeleteNode(f.ctx, alloc.DefaultSpace, "n1", true); err != nil {
		t.Fatal(err)
	}
	if ev := f.events(h[1].Addr); ev[len(ev)-1] != "release free  node-deleted" {
		t.Fatalf("history of %s: %v", h[1].Addr, ev)
	}
	f.checkClean()
}

// A Node's labels follow Kubernetes' rules, however many there are
// (node-feature-discovery gives hundreds); a bad one changes nothing.
func TestReserveTakesKubernetesNodeLabels(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 24)
	many := map[string]string{}
	for i := range 300 {
		many[fmt.Sprintf("feature.node.kubernetes.io/cpu-cpuid.f%d", i)] = "true"
	}
	f.reserve("n1", many, 1)
	if n, err := f.s.GetNode(f.ctx, alloc.DefaultSpace, "n1"); err != nil || len(n.Labels) != 300 {
		t.Fatalf("node has %d labels, %v", len(n.Labels), err)
	}
	_, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n2", map[string]string{"bad key!": "x"}, "", alloc.IPv4, 1)
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "labels[bad key!]" {
		t.Fatalf("field %q", e.Field)
	}
	if _, err := f.s.GetNode(f.ctx, alloc.DefaultSpace, "n2"); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("a refused reservation registered n2: %v", err)
	}
}

// The usage report counts a crd-mode node's pool and its Pods' use in
// Cilium's terms; its reserved addresses are used (not free) in the
// blocks' terms.
func TestUsageReportCountsNodeAddresses(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 24)
	h := f.reserve("n1", nil, 4)
	if _, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "n1", map[netip.Addr]alloc.Owner{h[0].Addr: {Namespace: "a", Name: "b"}}); err != nil {
		t.Fatal(err)
	}
	f.allocate(req("n2", "c1"))
	r, err := f.s.UsageReport(f.ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]NodeTotals{}
	for _, n := range r.Nodes {
		got[n.Node] = n
	}
	if n1 := got["n1"]; n1.CiliumPool != 4 || n1.CiliumUsed != 1 || n1.Used != 4 || n1.Available != 252 {
		t.Fatalf("n1 %+v", n1)
	}
	if n2 := got["n2"]; n2.CiliumPool != 0 || n2.CiliumUsed != 0 || n2.Used != 1 {
		t.Fatalf("n2 %+v", n2)
	}
}

// Expiry, purge and rebalance leave a node's addresses alone, reserved
// ones whose cooldown ended long ago included.
func TestMaintenanceLeavesNodeAddresses(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 24)
	h := f.reserve("n1", nil, 3)
	pod := map[netip.Addr]alloc.Owner{h[0].Addr: {Namespace: "a", Name: "b"}, h[1].Addr: {Namespace: "a", Name: "c"}}
	if _, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "n1", pod); err != nil {
		t.Fatal(err)
	}
	delete(pod, h[1].Addr)
	if _, err := f.s.SyncNodeUse(f.ctx, alloc.DefaultSpace, "n1", pod); err != nil {
		t.Fatal(err)
	}
	before := f.held("n1")
	f.clock.Advance(f.opts.LeaseExpiry + f.opts.Cooldown + f.opts.BlockReleaseHoldOff)
	if n, err := f.s.ExpirePending(f.ctx); err != nil || n != 0 {
		t.Fatalf("expired %d, %v", n, err)
	}
	if n, err := f.s.PurgeCooled(f.ctx); err != nil || n != 0 {
		t.Fatalf("purged %d, %v", n, err)
	}
	if r, err := f.s.Rebalance(f.ctx); err != nil || r.Released != 0 || r.Carved != 0 {
		t.Fatalf("rebalance %+v, %v", r, err)
	}
	if after := f.held("n1"); !slices.Equal(after, before) {
		t.Fatalf("maintenance changed n1's addresses:\n%+v\n%+v", before, after)
	}
	f.checkClean()
}
