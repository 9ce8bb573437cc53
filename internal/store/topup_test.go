// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// topUpSpec is a multi-pool pool of /28 blocks (12 leasable addresses with
// router and health) in cidr, pre-allocating pre addresses per node.
func topUpSpec(cidr string, pre int) alloc.PoolSpec {
	return alloc.PoolSpec{IPv4: fam(28, cidr), NodeLocal: alloc.DefaultNodeLocal, PreAllocate: &pre}
}

// blocksOf counts the node's blocks.
func (f *fixture) blocksOf(node string) int64 {
	f.t.Helper()
	return f.count(`SELECT count(*) FROM blocks b JOIN nodes n ON n.id = b.node_id WHERE n.name = $1`, node)
}

// topUp runs the store's pending top-up work and fails on an error.
func (f *fixture) topUp(s *Store) ToppedUp {
	f.t.Helper()
	r, err := s.TopUpPending(f.ctx)
	if err != nil {
		f.t.Fatalf("top-up: %v", err)
	}
	return r
}

// After an allocation pushes a node below its need, one pass of the top-up
// carves exactly the blocks NeededIPCeil asks for (of the demand and the
// leases expected at the node's recent rate), and the allocations that
// follow lease from them without carving, until the demand outgrows the
// need again. Without the option the same allocations carve on the lease
// path.
func TestTopUpCarvesWhatNeededIPCeilAsks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.TopUp = true })
	f.pool("default", topUpSpec("10.0.0.0/24", 20))

	// The node's first allocation carves on the lease path: nothing was
	// there to top up.
	f.allocate(req("a", "c0"))
	if c := f.s.Carves(); c != (Carves{Inline: 1}) {
		t.Fatalf("after the first allocation: %+v, want one inline carve", c)
	}
	// Demand 1 needs NeededIPCeil(1, 20) = 40 addresses; one block holds 12.
	want := alloc.NodePoolDemand{InUse: 1, Capacity: 12, PreAlloc: 20}.BlocksToCarve(12)
	if want != 3 {
		t.Fatalf("the formula asks %d blocks, the test expects 3", want)
	}
	if r := f.topUp(f.s); r != (ToppedUp{NodePools: 1, Carved: want}) {
		t.Fatalf("top-up: %+v, want %d blocks carved", r, want)
	}
	if n := f.blocksOf("a"); n != 1+want {
		t.Fatalf("node a holds %d blocks, want %d", n, 1+want)
	}
	if r := f.topUp(f.s); r != (ToppedUp{}) {
		t.Fatalf("a pass with nothing noted: %+v", r)
	}
	// Capacity 48: demand up to 21 leases without carving.
	for i := 1; i <= 20; i++ {
		f.allocate(req("a", fmt.Sprint("c", i)))
	}
	if c := f.s.Carves(); c != (Carves{Inline: 1, TopUp: 3}) || f.blocksOf("a") != 4 {
		t.Fatalf("after 20 more allocations: %+v and %d blocks, want no inline carve and 4 blocks", c, f.blocksOf("a"))
	}
	// Demand 21, and 20 leases since the last pass: the need covers the
	// next topUpHorizon passes at that rate too.
	more := alloc.NodePoolDemand{InUse: 21, Capacity: 48, PreAlloc: 20, Expected: topUpHorizon * 20}.BlocksToCarve(12)
	if plain := (alloc.NodePoolDemand{InUse: 21, Capacity: 48, PreAlloc: 20}).BlocksToCarve(12); plain != 1 || more <= plain {
		t.Fatalf("the formula asks %d blocks at the rate and %d without, the test expects more than 1", more, plain)
	}
	if r := f.topUp(f.s); r != (ToppedUp{NodePools: 1, Carved: more}) {
		t.Fatalf("top-up at demand 21: %+v, want %d blocks", r, more)
	}
	for i := 21; i < 40; i++ {
		f.allocate(req("a", fmt.Sprint("c", i)))
	}
	if c := f.s.Carves(); c != (Carves{Inline: 1, TopUp: 3 + more}) || f.blocksOf("a") != 4+more {
		t.Fatalf("at demand 40: %+v and %d blocks, want still one inline carve and %d blocks", c, f.blocksOf("a"), 4+more)
	}
	// What the top-up carved is what Rebalance would have.
	if r, err := f.s.Rebalance(f.ctx); err != nil || r != (Rebalanced{}) {
		t.Fatalf("rebalance after the top-up: %+v, %v", r, err)
	}

	// Off (the default), allocations note nothing: the 13th carves inline.
	off := newFixture(t, nil)
	off.pool("default", topUpSpec("10.0.0.0/24", 20))
	for i := range 13 {
		off.allocate(req("a", fmt.Sprint("c", i)))
		if r := off.topUp(off.s); r != (ToppedUp{}) {
			t.Fatalf("top-up off: %+v", r)
		}
	}
	if c := off.s.Carves(); c != (Carves{Inline: 2}) || off.blocksOf("a") != 2 {
		t.Fatalf("top-up off: %+v and %d blocks, want 2 inline carves and 2 blocks", c, off.blocksOf("a"))
	}
}

// Two replicas noted the same node pool and top it up at once, both having
// read the same deficit: the second reads the node's blocks again under
// the pool's CIDR lock, so together they carve what the need asks, once.
func TestTopUpTwoReplicasCarveOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.TopUp = true })
	f.pool("default", topUpSpec("10.0.0.0/24", 20))
	other, err := Open(f.ctx, f.conn, f.opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	f.allocate(req("a", "c0"))
	if _, err := other.Allocate(f.ctx, req("a", "c1")); err != nil {
		t.Fatal(err)
	}

	// Another transaction holds the pool's CIDR rows: both passes read the
	// deficit (demand 2 needs 40, capacity 12) and wait for the lock.
	tx := f.otherTx(t)
	if _, err := tx.Exec(f.ctx, `SELECT id FROM pool_cidrs FOR NO KEY UPDATE`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   ToppedUp
		err error
	}
	done := make(chan result, 2)
	for _, s := range []*Store{f.s, other} {
		go func() {
			r, err := s.TopUpPending(f.ctx)
			done <- result{r, err}
		}()
	}
	f.waitForLockWaiters(2)
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	var carved int64
	for range 2 {
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		carved += r.r.Carved
	}
	if carved != 3 || f.blocksOf("a") != 4 {
		t.Fatalf("the replicas carved %d blocks (node holds %d), want 3 (4)", carved, f.blocksOf("a"))
	}
	if c, o := f.s.Carves(), other.Carves(); c.TopUp+o.TopUp != 3 {
		t.Fatalf("counted %d + %d top-up carves, want 3", c.TopUp, o.TopUp)
	}
}

// waitForLockWaiters returns once n statements of the test's database wait
// for a row lock taken FOR NO KEY UPDATE.
func (f *fixture) waitForLockWaiters(n int64) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%FOR NO KEY UPDATE%'`) < n {
		if time.Now().After(deadline) {
			f.t.Fatalf("fewer than %d statements waited for a lock", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// One pass tops up every noted node pool of a pool family, over as many
// transactions as maxTopUpBlocks asks, and the node pools with the fewest
// available addresses first: when the pool cannot serve them all, the
// blocks go where an allocation would otherwise carve soonest.
func TestTopUpManyNodesOnePass(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.TopUp = true })
	f.pool("default", topUpSpec("10.0.0.0/20", 20))
	const nodes = 10
	for i := range nodes {
		f.allocate(req(fmt.Sprint("n", i), "c0"))
	}
	if want := int64(nodes * 3); want <= maxTopUpBlocks {
		t.Fatalf("%d blocks fit in one transaction: the test means more", want)
	}
	if r := f.topUp(f.s); r != (ToppedUp{NodePools: nodes, Carved: nodes * 3}) {
		t.Fatalf("%+v, want 3 blocks for each of %d nodes", r, nodes)
	}
	for i := range nodes {
		if n := f.blocksOf(fmt.Sprint("n", i)); n != 4 {
			t.Errorf("node n%d holds %d blocks, want 4", i, n)
		}
	}

	// Two free blocks, two nodes short of three each: b, with 7 addresses
	// available against a's 11, gets both.
	g := newFixture(t, func(o *Options) { o.TopUp = true })
	g.pool("default", topUpSpec("10.0.0.0/26", 20))
	g.allocate(req("a", "a0"))
	for i := range 5 {
		g.allocate(req("b", fmt.Sprint("b", i)))
	}
	if r := g.topUp(g.s); r != (ToppedUp{NodePools: 2, Carved: 2, InDeficit: 2}) {
		t.Fatalf("%+v, want 2 blocks carved and both nodes left in deficit", r)
	}
	if a, b := g.blocksOf("a"), g.blocksOf("b"); a != 1 || b != 3 {
		t.Fatalf("a holds %d blocks and b %d, want 1 and 3", a, b)
	}
}

// A full pool leaves the node in deficit, pass after pass, without an
// error; a node at its block limit is not in deficit (its need is clamped
// to what it may hold) and nothing is tried for it.
func TestTopUpShortOfNeed(t *testing.T) {
	t.Parallel()
	t.Run("full pool", func(t *testing.T) {
		f := newFixture(t, func(o *Options) { o.TopUp = true })
		f.pool("default", topUpSpec("10.0.0.0/27", 20)) // two blocks
		f.allocate(req("a", "c0"))
		if r := f.topUp(f.s); r != (ToppedUp{NodePools: 1, Carved: 1, InDeficit: 1}) {
			t.Fatalf("first pass: %+v, want the pool's last block and the node in deficit", r)
		}
		for i := 1; i < 3; i++ {
			f.allocate(req("a", fmt.Sprint("c", i)))
			if r := f.topUp(f.s); r != (ToppedUp{NodePools: 1, InDeficit: 1}) {
				t.Fatalf("pass %d: %+v, want the node in deficit, nothing carved", i+1, r)
			}
		}
	})
	t.Run("disabled pool", func(t *testing.T) {
		f := newFixture(t, func(o *Options) { o.TopUp = true })
		spec := topUpSpec("10.0.0.0/24", 20)
		f.pool("default", spec)
		f.allocate(req("a", "c0"))
		spec.Disabled = true
		if _, err := f.s.UpdatePool(f.ctx, alloc.DefaultSpace, "default", nil, spec); err != nil {
			t.Fatal(err)
		}
		f.allocate(req("a", "c1"))
		if r := f.topUp(f.s); r != (ToppedUp{NodePools: 1, InDeficit: 1}) {
			t.Fatalf("%+v, want the node in deficit, nothing carved", r)
		}
	})
	t.Run("block limit", func(t *testing.T) {
		f := newFixture(t, func(o *Options) { o.TopUp = true })
		two := 2
		spec := topUpSpec("10.0.0.0/24", 100)
		spec.MaxBlocksPerNode = &two
		f.pool("default", spec)
		f.allocate(req("a", "c0"))
		if r := f.topUp(f.s); r != (ToppedUp{NodePools: 1, Carved: 1}) {
			t.Fatalf("first pass: %+v, want one block, up to the limit", r)
		}
		f.allocate(req("a", "c1"))
		if r := f.topUp(f.s); r != (ToppedUp{NodePools: 1}) {
			t.Fatalf("second pass: %+v, want nothing to do", r)
		}
		if n := f.blocksOf("a"); n != 2 {
			t.Fatalf("node a holds %d blocks, want the limit 2", n)
		}
	})
}

// The top-up leaves alone what Rebalance leaves alone: a cluster-pool
// block never grows, and the blocks of Cilium's multi-pool agents are
// theirs to size. A multi-pool pool next to them is topped up.
func TestTopUpLeavesClusterPoolAndAgentsAlone(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.TopUp = true; o.AgentPoolsSpace = "agents" })
	pre := 20
	f.pool("default", topUpSpec("10.0.0.0/24", pre))
	f.pool("cluster", alloc.PoolSpec{Mode: alloc.ModeClusterPool, IPv4: fam(28, "10.1.0.0/24"), NodeLocal: alloc.DefaultNodeLocal})
	if _, err := f.s.CreateSpace(f.ctx, "agents"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.CreatePool(f.ctx, alloc.Pool{Space: "agents", Name: "default", Spec: topUpSpec("10.2.0.0/24", pre)}); err != nil {
		t.Fatal(err)
	}
	inCluster := req("c", "c0")
	inCluster.Pool = "cluster"
	f.allocate(inCluster)
	ofAgents := req("x", "x0")
	ofAgents.Space = "agents"
	f.allocate(ofAgents)
	f.allocate(req("m", "m0"))
	if r := f.topUp(f.s); r.Carved != 3 || r.InDeficit != 0 {
		t.Fatalf("top-up: %+v, want 3 blocks for node m only", r)
	}
	for node, want := range map[string]int64{"c": 1, "x": 1, "m": 4} {
		if n := f.blocksOf(node); n != want {
			t.Errorf("node %s holds %d blocks, want %d", node, n, want)
		}
	}
}

// A node or pool deleted after an allocation noted it, before the pass or
// between its read and its carve, is skipped without an error.
func TestTopUpSkipsDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.TopUp = true })
	f.pool("default", topUpSpec("10.0.0.0/24", 20))
	f.pool("other", topUpSpec("10.1.0.0/24", 20))

	// Before the pass.
	f.allocate(req("gone", "c0"))
	if err := f.s.DeleteNode(f.ctx, alloc.DefaultSpace, "gone", true); err != nil {
		t.Fatal(err)
	}
	f.s.topUps.add([]alloc.Lease{{Space: alloc.DefaultSpace, Node: "a", Pool: "no-such-pool", Family: alloc.IPv4}})
	if r := f.topUp(f.s); r != (ToppedUp{}) {
		t.Fatalf("deleted before the pass: %+v, want nothing read", r)
	}

	// Between the read and the carve: node b (pool default) and pool
	// other (node c, which holds no block of it yet) go away.
	f.allocate(req("b", "b0"))
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "c"}); err != nil {
		t.Fatal(err)
	}
	keys := map[topUpKey]int64{
		{space: alloc.DefaultSpace, node: "b", pool: "default", family: alloc.IPv4}: 1,
		{space: alloc.DefaultSpace, node: "c", pool: "other", family: alloc.IPv4}:   1,
	}
	usage, err := f.s.notedUsage(f.ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(usage) != 2 || usage[0].Deficit() <= 0 || usage[1].Deficit() <= 0 {
		t.Fatalf("usage %+v, want both node pools in deficit", usage)
	}
	if err := f.s.DeleteNode(f.ctx, alloc.DefaultSpace, "b", true); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.DeletePool(f.ctx, alloc.DefaultSpace, "other"); err != nil {
		t.Fatal(err)
	}
	if r, err := f.s.topUpRows(f.ctx, usage); err != nil || r.Carved != 0 || r.InDeficit != 0 {
		t.Fatalf("deleted meanwhile: %+v, %v; want nothing carved", r, err)
	}
	if n := f.count(`SELECT count(*) FROM blocks`); n != 0 {
		t.Fatalf("%d blocks left, want none", n)
	}
}

// A pass that fails keeps its work for the next one.
func TestTopUpFailedPassKeepsItsWork(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.TopUp = true })
	f.pool("default", topUpSpec("10.0.0.0/24", 20))
	f.allocate(req("a", "c0"))
	ended, cancel := context.WithCancel(f.ctx)
	cancel()
	if _, err := f.s.TopUpPending(ended); err == nil {
		t.Fatal("a pass with an ended context succeeded")
	}
	if r := f.topUp(f.s); r.Carved != 3 {
		t.Fatalf("the next pass: %+v, want the 3 blocks the failed one did not carve", r)
	}
}

// RunTopUps makes a pass when an allocation notes its node pool, reports
// it, and returns when its context ends; without the option it only
// waits for that.
func TestRunTopUps(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		f := newFixture(t, func(o *Options) { o.TopUp = on })
		f.pool("default", topUpSpec("10.0.0.0/24", 20))
		ctx, cancel := context.WithCancel(f.ctx)
		reports := make(chan ToppedUp, 10)
		done := make(chan struct{})
		go func() {
			defer close(done)
			f.s.RunTopUps(ctx, time.Hour, func(_ context.Context, r ToppedUp, err error) {
				if err != nil {
					t.Errorf("pass: %v", err)
				}
				reports <- r
			})
		}()
		f.allocate(req("a", "c0"))
		if on {
			if r := <-reports; r.Carved != 3 {
				t.Errorf("the pass after the allocation: %+v, want 3 blocks", r)
			}
		}
		cancel()
		<-done
		if !on && len(reports) > 0 {
			t.Errorf("off: a pass ran: %+v", <-reports)
		}
	}
}

// carve tells a block it carved from one it answered because the node had
// room after all: only the first counts as a carve (Carves.Inline).
func TestCarveSaysWhetherItCarved(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", topUpSpec("10.0.0.0/24", 8))
	first := f.allocate(req("a", "c0")).Leases[0].Block
	tx, err := f.s.db.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(f.ctx) }()
	p, err := f.s.allocPool(f.ctx, tx, alloc.DefaultSpace, "default")
	if err != nil {
		t.Fatal(err)
	}
	node, err := f.s.nodeID(f.ctx, tx, alloc.DefaultSpace, "a")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		recheck carveRecheck
		carved  bool
	}{{carveUnlessFreeRoom, false}, {carveUnlessRoom, false}, {carveAlways, true}} {
		b, ok, err := carve(f.ctx, tx, carving{space: alloc.DefaultSpace, node: node, pool: p, family: alloc.IPv4, now: f.clock.Now()}, tc.recheck)
		if err != nil || !ok || b.carved != tc.carved || (b.cidr == first) == tc.carved {
			t.Fatalf("recheck %d: block %s (carved %v), %v, %v; want carved %v", tc.recheck, b.cidr, b.carved, ok, err, tc.carved)
		}
	}
}
