// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// probeItem is a batch write inserting k into batch_probe and reading it
// back; got holds what its last run read.
func probeItem(ctx context.Context, sql string, k int) (*batchItem, *[]int) {
	got := new([]int)
	it := &batchItem{ctx: ctx, sql: sql, args: []any{k}, done: make(chan error, 1), read: func(rows pgx.Rows) error {
		var err error
		*got, err = pgx.CollectRows(rows, pgx.RowTo[int])
		return err
	}}
	return it, got
}

// TestBatchOneBadWriteKeepsTheOthers sends one batch whose middle write
// fails (a duplicate key): the others commit exactly once, each with its own
// rows, and the bad one answers its own error.
func TestBatchOneBadWriteKeepsTheOthers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	if _, err := f.s.db.Exec(f.ctx, `CREATE TABLE batch_probe (k int PRIMARY KEY); INSERT INTO batch_probe VALUES (2)`); err != nil {
		t.Fatal(err)
	}
	const ins = `INSERT INTO batch_probe VALUES ($1) RETURNING k`
	var items []*batchItem
	var got []*[]int
	for _, k := range []int{1, 2, 3} {
		it, g := probeItem(f.ctx, ins, k)
		items, got = append(items, it), append(got, g)
	}
	b := &batcher{db: f.s.db}
	b.send(items)
	for i, it := range items {
		err := <-it.done
		if i == 1 {
			if code, constraint := pgCode(err); code != codeUniqueViolation || constraint != "batch_probe_pkey" {
				t.Fatalf("write %d: %v, want its own unique violation", i, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if want := []int{i + 1}; fmt.Sprint(*got[i]) != fmt.Sprint(want) {
			t.Fatalf("write %d read %v, want %v", i, *got[i], want)
		}
	}
	var rows []int
	r, err := f.s.db.Query(f.ctx, `SELECT k FROM batch_probe ORDER BY k`)
	if err == nil {
		rows, err = pgx.CollectRows(r, pgx.RowTo[int])
	}
	if err != nil || fmt.Sprint(rows) != "[1 2 3]" {
		t.Fatalf("table holds %v (%v), want [1 2 3]", rows, err)
	}
}

// TestBatchSharesOneCommit sends writes as one batch: they commit together,
// in one transaction.
func TestBatchSharesOneCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	if _, err := f.s.db.Exec(f.ctx, `CREATE TABLE batch_probe (k int PRIMARY KEY, tx xid8 DEFAULT pg_current_xact_id())`); err != nil {
		t.Fatal(err)
	}
	var items []*batchItem
	for k := range 5 {
		it, _ := probeItem(f.ctx, `INSERT INTO batch_probe (k) VALUES ($1) RETURNING k`, k)
		items = append(items, it)
	}
	var sizes []int
	b := &batcher{db: f.s.db, onBatch: func(n int) { sizes = append(sizes, n) }}
	b.send(items)
	for _, it := range items {
		if err := <-it.done; err != nil {
			t.Fatal(err)
		}
	}
	var txs int
	if err := f.s.db.QueryRow(f.ctx, `SELECT count(DISTINCT tx) FROM batch_probe`).Scan(&txs); err != nil {
		t.Fatal(err)
	}
	if txs != 1 || fmt.Sprint(sizes) != "[5]" {
		t.Fatalf("5 writes in %d transactions, batches %v; want 1 and [5]", txs, sizes)
	}
}

// TestBatchSkipsEndedCallers: a write whose caller has gone before its
// batch is sent is not run.
func TestBatchSkipsEndedCallers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	if _, err := f.s.db.Exec(f.ctx, `CREATE TABLE batch_probe (k int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(f.ctx)
	cancel()
	a, _ := probeItem(gone, `INSERT INTO batch_probe VALUES ($1) RETURNING k`, 1)
	c, _ := probeItem(f.ctx, `INSERT INTO batch_probe VALUES ($1) RETURNING k`, 2)
	(&batcher{db: f.s.db}).send([]*batchItem{a, c})
	if err := <-a.done; err != context.Canceled {
		t.Fatalf("ended caller: %v", err)
	}
	if err := <-c.done; err != nil {
		t.Fatal(err)
	}
	var n int
	if err := f.s.db.QueryRow(f.ctx, `SELECT count(*) FROM batch_probe`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows (%v), want the live caller's 1", n, err)
	}
}

// TestBatchedAllocationsAndReleases runs allocations and releases of many
// nodes at once through the store's batcher: batches form, every address
// is held once, each allocation's history names its own actor, and the
// blocks' counters match their rows.
func TestBatchedAllocationsAndReleases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.BatchWriters = 2 })
	f.pool("default", alloc.PoolSpec{IPv4: fam(26, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	var batched atomic.Int64
	f.s.batch.onBatch = func(n int) {
		if n > 1 {
			batched.Add(1)
		}
	}
	const nodes, perNode = 8, 12
	var wg sync.WaitGroup
	errs := make(chan error, nodes*perNode)
	addrs := sync.Map{}
	for n := range nodes {
		for i := range perNode {
			wg.Add(1)
			go func() {
				defer wg.Done()
				node := fmt.Sprintf("n%d", n)
				ctx := alloc.WithActor(f.ctx, "node:"+node)
				r := req(node, fmt.Sprintf("c%d", i))
				a, err := f.s.Allocate(ctx, r)
				if err != nil {
					errs <- err
					return
				}
				if other, dup := addrs.LoadOrStore(a.Leases[0].Addr, node); dup {
					errs <- fmt.Errorf("%s leased twice (%s, %s)", a.Leases[0].Addr, other, node)
				}
				if i%2 == 0 {
					if _, err := f.s.ReleaseAttachment(ctx, alloc.DefaultSpace, node, r.Attachment); err != nil {
						errs <- err
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if batched.Load() == 0 {
		t.Fatal("no batch held more than one write")
	}
	var wrongActor, offCounters int
	if err := f.s.db.QueryRow(f.ctx, `SELECT count(*) FROM address_events WHERE kind IN ('lease', 'release') AND actor <> 'node:' || node`).
		Scan(&wrongActor); err != nil || wrongActor != 0 {
		t.Fatalf("%d events with another node's actor (%v)", wrongActor, err)
	}
	if err := f.s.db.QueryRow(f.ctx, `SELECT count(*) FROM blocks b
		WHERE allocated <> (SELECT count(*) FROM leases l WHERE l.block_id = b.id)`).Scan(&offCounters); err != nil || offCounters != 0 {
		t.Fatalf("%d blocks whose counter is off (%v)", offCounters, err)
	}
	var held int
	if err := f.s.db.QueryRow(f.ctx, `SELECT count(*) FROM leases WHERE state <> 'released'`).Scan(&held); err != nil || held != nodes*perNode/2 {
		t.Fatalf("%d leases held (%v), want %d", held, err, nodes*perNode/2)
	}
}

// TestBatchQueues: the writes of one key always go to one queue, so a
// node's leases share batches; writes without a key go to each in turn.
func TestBatchQueues(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.BatchWriters = 4 })
	b := f.s.batch
	for _, key := range []string{"default/n1", "default/n2", "other/n1"} {
		q := b.queueFor(key)
		for range 20 {
			if b.queueFor(key) != q {
				t.Fatalf("key %q went to two queues", key)
			}
		}
	}
	seen := map[chan *batchItem]bool{}
	for range 4 {
		seen[b.queueFor("")] = true
	}
	if len(seen) != 4 {
		t.Fatalf("4 writes without a key went to %d of the 4 queues", len(seen))
	}
}

// TestBatchMergesANodesLeases sends one batch of lease writes of two nodes,
// each asked by its own actor: they share one statement, each gets its own address in the
// node's block until the block is full, the rest get "not leased" (their
// allocations take the general path), and the counters and the history
// match.
func TestBatchMergesANodesLeases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	f.allocate(req("n1", "first"))
	f.allocate(req("n2", "first"))
	room := int(f.count(`SELECT capacity - allocated FROM blocks b JOIN nodes n ON n.id = b.node_id WHERE n.name = 'n1'`))
	items, outs, leases := leaseItems(t, f, 20, func(i int) string {
		if i == 19 {
			return "n2"
		}
		return "n1"
	})
	if got := len(statements(items)); got != 1 {
		t.Fatalf("%d statements for the leases of 2 nodes, want 1 (all merged)", got)
	}
	sendWithoutFallback(t, f.s.db, items)
	seen := map[string]bool{}
	var leased int
	for i := range items {
		if !outs[i].got.leased {
			continue
		}
		leased++
		a := leases[i].Addr.String()
		if seen[a] {
			t.Fatalf("%s leased twice", a)
		}
		seen[a] = true
	}
	// n1: the room left in its block; n2: 1.
	if leased != room+1 || !outs[19].got.leased {
		t.Fatalf("%d leased (n2's: %v), want %d of n1's 19 and n2's", leased, outs[19].got.leased, room)
	}
	for i := range room {
		if !outs[i].got.leased {
			t.Fatalf("write %d of n1 not leased while its block had room", i)
		}
	}
	if n := f.count(`SELECT count(*) FROM blocks b WHERE allocated <> (SELECT count(*) FROM leases l WHERE l.block_id = b.id)`); n != 0 {
		t.Fatalf("%d block counters off", n)
	}
	if n := f.count(`SELECT count(*) FROM address_events WHERE kind = 'lease' AND container_id LIKE 'm%' AND actor = 'node:' || node`); n != int64(room+1) {
		t.Fatalf("%d lease events naming their node's actor, want %d", n, room+1)
	}
	// The cursor moved past the last address leased: the next one is fresh.
	next := f.allocate(req("n2", "after"))
	if seen[next.Leases[0].Addr.String()] {
		t.Fatalf("next lease %s reuses a batched address", next.Leases[0].Addr)
	}
}

// TestBatchMergesANodesReleases sends one batch of releases of two nodes,
// each asked by its own actor: they share one statement, each answers the leases of its own
// attachment (a duplicate of one answers none), and the history records
// each release with its node's actor.
func TestBatchMergesANodesReleases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(26, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	held := map[string]alloc.Allocation{}
	for i := range 5 {
		held[fmt.Sprint("r", i)] = f.allocate(req("n1", fmt.Sprint("r", i)))
	}
	held["other"] = f.allocate(req("n2", "other"))
	var items []*batchItem
	var outs []*mergedRelease
	release := func(node, container string) {
		ctx := alloc.WithActor(f.ctx, "node:"+node)
		it, m := f.s.releaseItem(ctx, alloc.DefaultSpace, node, alloc.Attachment{ContainerID: container, Interface: "eth0"})
		it.ctx, it.done = f.ctx, make(chan error, 1)
		items, outs = append(items, it), append(outs, m)
	}
	for i := range 5 {
		release("n1", fmt.Sprint("r", i))
	}
	release("n1", "r0")     // a duplicate: released once, by the first
	release("n1", "absent") // nothing held: not an error
	release("n2", "other")
	if got := len(statements(items)); got != 1 {
		t.Fatalf("%d statements for the releases of 2 nodes, want 1 (all merged)", got)
	}
	sendWithoutFallback(t, f.s.db, items)
	for i, m := range outs {
		want := 0
		if i < 5 || i == 7 {
			want = 1
		}
		if len(m.out) != want {
			t.Fatalf("release %d (%s) answered %d leases, want %d", i, m.att.ContainerID, len(m.out), want)
		}
		if want == 1 {
			h := held[m.att.ContainerID]
			if got := m.out[0]; got.Addr != h.Leases[0].Addr || got.State != alloc.StateCooling {
				t.Fatalf("release %d answered %s %s, want %s cooling", i, got.Addr, got.State, h.Leases[0].Addr)
			}
		}
	}
	if n := f.count(`SELECT count(*) FROM leases WHERE state <> 'released'`); n != 0 {
		t.Fatalf("%d leases still held", n)
	}
	if n := f.count(`SELECT count(*) FROM address_events WHERE kind = 'release' AND actor = 'node:' || node AND reason = $1`, reasonReleaseAttachment); n != 6 {
		t.Fatalf("%d release events naming their node's actor, want 6", n)
	}
}

// TestBatchKeepsANodesActorsApart sends one batch of releases in which one
// node's are asked by two actors: a statement holds one actor per node, so
// the second actor's go to a second statement, and the history records
// each release with the actor that asked it.
func TestBatchKeepsANodesActorsApart(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(26, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	type asked struct{ node, container, actor string }
	all := []asked{
		{"n1", "a0", "node:n1"}, {"n1", "b0", "operator"}, {"n2", "c0", "node:n2"},
		{"n1", "a1", "node:n1"}, {"n1", "b1", "operator"}, {"n2", "c1", "node:n2"},
	}
	var items []*batchItem
	for _, a := range all {
		f.allocate(req(a.node, a.container))
		it, _ := f.s.releaseItem(alloc.WithActor(f.ctx, a.actor), alloc.DefaultSpace, a.node, alloc.Attachment{ContainerID: a.container, Interface: "eth0"})
		it.ctx, it.done = f.ctx, make(chan error, 1)
		items = append(items, it)
	}
	if got := len(statements(items)); got != 2 {
		t.Fatalf("%d statements, want 2 (n1's second actor apart)", got)
	}
	sendWithoutFallback(t, f.s.db, items)
	for _, a := range all {
		var actor string
		if err := f.s.db.QueryRow(f.ctx, `SELECT actor FROM address_events WHERE kind = 'release' AND container_id = $1`, a.container).Scan(&actor); err != nil {
			t.Fatalf("%s: %v", a.container, err)
		}
		if actor != a.actor {
			t.Fatalf("%s released by %q in the history, want %q", a.container, actor, a.actor)
		}
	}
}

// sendWithoutFallback sends items as one batch and fails the test when the
// batch failed and its writes ran again alone, or when a write answered an
// error.
func sendWithoutFallback(t *testing.T, db *pgxpool.Pool, items []*batchItem) {
	t.Helper()
	b := &batcher{db: db}
	b.send(items)
	if n := b.fallbacks.Load(); n != 0 {
		t.Fatalf("the batch failed: %d writes ran again alone", n)
	}
}

// TestBatchMergesLookups sends the lookups of many allocations as one
// batch: they share one statement, and each answers what its own lookup
// answers (the node, or none; whether the attachment holds leases; the
// pools it names and those that select, and no other), with a generation
// number of its own.
func TestBatchMergesLookups(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	v4 := func(cidr string) alloc.PoolSpec {
		return alloc.PoolSpec{IPv4: fam(28, cidr), NodeLocal: alloc.DefaultNodeLocal}
	}
	f.pool("default", v4("10.1.0.0/16"))
	f.pool("blue", v4("10.2.0.0/16"))
	f.pool("green", v4("10.3.0.0/16"))
	selecting := v4("10.4.0.0/16")
	selecting.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}
	f.pool("selecting", selecting)
	f.allocate(req("n1", "held"))
	f.allocate(req("n2", "other"))

	var reqs []alloc.LeaseRequest
	for i, node := range []string{"n1", "n2", "ghost", "n1", "n2"} {
		r := req(node, fmt.Sprint("c", i))
		switch i {
		case 1:
			r.Pool = "blue"
		case 2:
			r.Pools = map[alloc.Family]string{alloc.IPv4: "green"}
		case 3:
			r.Attachment.ContainerID = "held"
		case 4:
			r.Pool = "missing"
		}
		reqs = append(reqs, r)
	}
	wants := make([]allocLookup, len(reqs))
	items := make([]*batchItem, len(reqs))
	got := make([]*allocLookup, len(reqs))
	for i, r := range reqs {
		sel := r.Selection(alloc.DefaultPool)
		lk, err := f.s.lookup(f.ctx, f.s.db, r, sel)
		if err != nil {
			t.Fatal(err)
		}
		wants[i] = lk
		m := &mergedLookup{req: r, named: sel.Named()}
		items[i] = &batchItem{ctx: f.ctx, done: make(chan error, 1), sql: lookupSQL, args: []any{lookupArgs(r, sel)},
			merge: &merging{group: "lookup/" + r.Space, combine: combineLookups, payload: m}}
		got[i] = &m.lk
	}
	if n := len(statements(items)); n != 1 {
		t.Fatalf("%d statements for %d lookups of one space, want 1", n, len(items))
	}
	sendWithoutFallback(t, f.s.db, items)
	generations := map[int64]bool{}
	names := func(ps []allocPoolJSON) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		slices.Sort(out)
		return out
	}
	for i := range items {
		g, w := got[i], wants[i]
		if g.nodeID != w.nodeID || g.held != w.held {
			t.Errorf("lookup %d (%s/%s): node %d held %v, want node %d held %v", i, reqs[i].Node,
				reqs[i].Attachment.ContainerID, g.nodeID, g.held, w.nodeID, w.held)
		}
		if gn, wn := names(g.pools), names(w.pools); !slices.Equal(gn, wn) {
			t.Errorf("lookup %d: pools %v, want %v", i, gn, wn)
		}
		if g.generation <= w.generation || generations[g.generation] {
			t.Errorf("lookup %d: generation %d, want a new one after %d", i, g.generation, w.generation)
		}
		generations[g.generation] = true
	}
	if !wants[3].held || wants[2].nodeID != 0 || wants[0].nodeID == 0 {
		t.Fatalf("the lookups alone answered %+v: the cases are not the ones meant", wants)
	}
}

// leaseItems makes the batch writes of n leases from a block with room, the
// i-th for node nodeOf(i), each asked by its node's actor, as the fast path
// makes them; outs and leases receive their outcomes.
func leaseItems(t *testing.T, f *fixture, n int, nodeOf func(i int) string) (items []*batchItem, outs []*mergedLease, leases []alloc.Lease) {
	t.Helper()
	leases = make([]alloc.Lease, n)
	for i := range leases {
		node := nodeOf(i)
		a := &allocation{s: f.s, req: req(node, fmt.Sprint("m", i)), actor: "node:" + node}
		a.sel = a.req.Selection(alloc.DefaultPool)
		lk, err := f.s.lookup(f.ctx, f.s.db, a.req, a.sel)
		if err != nil {
			t.Fatal(err)
		}
		choices, pools, err := a.choose(lk)
		if err != nil {
			t.Fatal(err)
		}
		p := pools[choices[0].Pool]
		leases[i] = a.newLease(p, choices[0], lk.generation)
		it, m := leaseItem(leaseSkippingSQL, a.leaseRow(lk.nodeID, p, leases[i]), &leases[i])
		it.ctx, it.done = f.ctx, make(chan error, 1)
		items, outs = append(items, it), append(outs, m)
	}
	return items, outs, leases
}

// TestBatchLeasesPastTheEndOfABlock sends a batch of a node's leases that
// want more than its oldest block has room for: the statement takes the
// rest from the node's next block, each address once, with both blocks'
// counters and cursors right.
func TestBatchLeasesPastTheEndOfABlock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	f.allocate(req("n1", "first"))
	// A second block for n1, as a carve would make it.
	if _, err := f.s.db.Exec(f.ctx, `INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr,
			first_offset, last_offset, reserved, capacity, next_offset, created_at, router)
		SELECT space, pool_id, pool_cidr_id, parent_cidr, node_id, family, '10.244.200.0/28', first_offset, last_offset,
			reserved, capacity, first_offset, created_at + interval '1 second', router
		FROM blocks`); err != nil {
		t.Fatal(err)
	}
	room := int(f.count(`SELECT capacity - allocated FROM blocks ORDER BY id LIMIT 1`))
	items, outs, leases := leaseItems(t, f, room+3, func(int) string { return "n1" })
	sendWithoutFallback(t, f.s.db, items)
	seen := map[string]bool{}
	inSecond := 0
	for i := range items {
		if !outs[i].got.leased {
			t.Fatalf("write %d of %d not leased: the node's blocks had room for all", i, len(items))
		}
		a := leases[i].Addr
		if seen[a.String()] {
			t.Fatalf("%s leased twice", a)
		}
		seen[a.String()] = true
		if leases[i].Block.String() == "10.244.200.0/28" {
			inSecond++
		}
	}
	if inSecond != 3 {
		t.Fatalf("%d leases from the second block, want the 3 past the first's room of %d", inSecond, room)
	}
	if n := f.count(`SELECT count(*) FROM blocks b WHERE allocated <> (SELECT count(*) FROM leases l WHERE l.block_id = b.id)`); n != 0 {
		t.Fatalf("%d block counters off", n)
	}
	// The second block's cursor is past its three leases.
	next := f.allocate(req("n1", "after"))
	if seen[next.Leases[0].Addr.String()] {
		t.Fatalf("next lease %s reuses a batched address", next.Leases[0].Addr)
	}
}

// A write alone that meets a deadlock or a serialization failure (its
// statement rolled back whole) runs again, and answers what the run that
// committed read; other errors, and a conflict that outlasts
// maxTxAttempts, are answered as they are.
func TestWriteAloneRetriesConflicts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	// flaky(seq, fails, code) fails with code the first fails times it
	// runs: the count is a sequence's, which no rollback undoes.
	if _, err := f.s.db.Exec(f.ctx, `CREATE FUNCTION flaky(seq text, fails int, code text) RETURNS bigint LANGUAGE plpgsql AS $$
		DECLARE runs bigint := nextval(seq);
		BEGIN
			IF runs <= fails THEN
				RAISE EXCEPTION 'conflict on run %', runs USING ERRCODE = code;
			END IF;
			RETURN runs;
		END $$`); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		code      string
		fails     int
		wantRuns  int64  // the run whose answer is read; 0: none
		wantError string // the code answered; "" for none
		runs      int64  // how many times it ran
	}{
		{codeDeadlock, 2, 3, "", 3},
		{codeSerialization, 1, 2, "", 2},
		{codeDeadlock, maxTxAttempts, 0, codeDeadlock, maxTxAttempts},
		{codeUniqueViolation, 1, 0, codeUniqueViolation, 1},
	} {
		seq := fmt.Sprintf("flaky_%d", i)
		if _, err := f.s.db.Exec(f.ctx, "CREATE SEQUENCE "+seq); err != nil {
			t.Fatal(err)
		}
		var got []int64
		it := &batchItem{sql: `SELECT flaky($1, $2, $3)`, args: []any{seq, c.fails, c.code}, read: func(rows pgx.Rows) error {
			var err error
			got, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			return err
		}}
		err := writeAlone(f.ctx, f.s.db, it)
		if code, _ := pgCode(err); code != c.wantError {
			t.Errorf("%s failing %d times: %v; want code %q", c.code, c.fails, err, c.wantError)
		}
		if c.wantRuns != 0 && !slices.Equal(got, []int64{c.wantRuns}) {
			t.Errorf("%s failing %d times: read %v; want run %d's answer", c.code, c.fails, got, c.wantRuns)
		}
		var runs int64
		if err := f.s.db.QueryRow(f.ctx, "SELECT last_value FROM "+seq).Scan(&runs); err != nil {
			t.Fatal(err)
		}
		if runs != c.runs {
			t.Errorf("%s failing %d times: ran %d times, want %d", c.code, c.fails, runs, c.runs)
		}
	}
}
