// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// leasable is how many addresses pool's blocks of family f can lease, from
// the layout of each block it can carve: network, broadcast and node-local
// addresses excluded.
func leasable(t *testing.T, spec alloc.PoolSpec) int64 {
	t.Helper()
	var n int64
	for _, pf := range []*alloc.PoolFamily{spec.IPv4, spec.IPv6} {
		if pf == nil {
			continue
		}
		for _, c := range pf.CIDRs {
			for i := range alloc.BlockCount(c, pf.MaskSize) {
				n += alloc.BlockLayout(alloc.BlockAt(c, pf.MaskSize, i), spec.AllowFirstIP, spec.AllowLastIP, spec.NodeLocal).Capacity
			}
		}
	}
	return n
}

// firstComeSecondBlock tells the one fair way a trial of
// TestFairExhaustion leases fewer than the pool's leasable addresses: one
// node's requests came first, filled its block before any other node
// carved, and then took the second block, which holds its remaining
// requests. Then the node holds both blocks, every lease of the first one
// was recorded before the second was carved (the history's event ids grow
// in time), and the node's leases are all that was leased.
func (f *fixture) firstComeSecondBlock(pool string, leased int) bool {
	f.t.Helper()
	var nodes, full, before, ofNode int64
	if err := f.s.db.QueryRow(f.ctx, `WITH b AS (
			SELECT b.* FROM blocks b JOIN pools p ON p.id = b.pool_id WHERE p.name = $1 ORDER BY b.id
		), first AS (SELECT * FROM b LIMIT 1), second AS (SELECT * FROM b OFFSET 1 LIMIT 1)
		SELECT (SELECT count(DISTINCT node_id) FROM b),
			(SELECT count(*) FROM first WHERE allocated = capacity),
			(SELECT count(*) FROM address_events e, first WHERE e.kind = 'lease' AND e.block = first.cidr
			   AND e.id < (SELECT min(c.id) FROM address_events c, second WHERE c.kind = 'block-carve' AND c.block = second.cidr)),
			(SELECT count(*) FROM leases l, first WHERE l.node_id = first.node_id)
		`, pool).Scan(&nodes, &full, &before, &ofNode); err != nil {
		f.t.Fatal(err)
	}
	capacity := f.count(`SELECT min(capacity) FROM blocks b JOIN pools p ON p.id = b.pool_id WHERE p.name = $1`, pool)
	f.t.Logf("pool %s: %d leased by one node holding both blocks (%d nodes; first block full %t, %d of its leases before the second's carve)",
		pool, leased, nodes, full == 1, before)
	return nodes == 1 && full == 1 && before == capacity && ofNode == int64(leased)
}

// TestFairExhaustion: a /27 in /28 blocks (2 blocks of 12 leasable
// addresses with router and health reserved) and 40 concurrent allocations
// over 3 nodes, 13 or 14 each. Two nodes get a block each and fill it; the
// third is refused. Every trial must lease exactly the pool's leasable
// count: no node may carve the second block while its first has room
// (which left 11 addresses free while the other nodes were refused), and
// no allocation may fail while its node's block has room. (Unless one
// node's requests all came first: see firstComeSecondBlock.)
func TestFairExhaustion(t *testing.T) {
	f := newFixture(t, nil)
	const trials, allocations, nodes = 20, 40, 3
	for trial := range trials {
		name := fmt.Sprintf("fair-%d", trial)
		spec := alloc.PoolSpec{IPv4: fam(28, fmt.Sprintf("10.%d.0.0/27", trial)), NodeLocal: alloc.DefaultNodeLocal}
		f.pool(name, spec)
		want := leasable(t, spec)
		if want != 24 {
			t.Fatalf("leasable %d, want 24", want)
		}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			leased  = map[netip.Addr]string{}
			refused int
			start   = make(chan struct{})
		)
		for i := range allocations {
			r := req(fmt.Sprintf("t%d-n%d", trial, i%nodes), fmt.Sprintf("t%d-c%d", trial, i))
			r.Pool = name
			wg.Go(func() {
				<-start
				a, err := f.s.Allocate(f.ctx, r)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					for _, l := range a.Leases {
						if other, dup := leased[l.Addr]; dup {
							t.Errorf("trial %d: %s leased to %s and %s", trial, l.Addr, other, r.Attachment.ContainerID)
						}
						leased[l.Addr] = r.Attachment.ContainerID
					}
				case alloc.IsKind(err, alloc.KindPoolExhausted):
					refused++
				default:
					t.Errorf("trial %d: allocate %s on %s: %v", trial, r.Attachment.ContainerID, r.Node, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if int64(len(leased)) != want && !f.firstComeSecondBlock(name, len(leased)) {
			t.Errorf("trial %d: leased %d addresses (%d refused), want the pool's %d leasable", trial, len(leased), refused, want)
		}
		if n := f.count(`SELECT count(*) FROM leases l JOIN pools p ON p.id = l.pool_id WHERE p.name = $1`, name); n != int64(len(leased)) {
			t.Errorf("trial %d: %d lease rows, %d answered", trial, n, len(leased))
		}
	}
}

// TestBusyNodeKeepsThePoolsLastBlock: a node whose block has room, held by
// another transaction, waits for it instead of carving the pool's last
// free block, which goes to the next node that has none. With more free
// blocks, it carves one more as before (a busy node spreads its
// allocations).
func TestBusyNodeKeepsThePoolsLastBlock(t *testing.T) {
	for _, tc := range []struct {
		cidr       string
		wantBlocks int64 // of node a after the allocation
	}{
		{"10.0.0.0/27", 1}, // two blocks: the second is the last
		{"10.0.0.0/26", 2}, // four: one more for the busy node
	} {
		t.Run(tc.cidr, func(t *testing.T) {
			f := newFixture(t, nil)
			f.pool("default", alloc.PoolSpec{IPv4: fam(28, tc.cidr), NodeLocal: alloc.DefaultNodeLocal})
			f.allocate(req("a", "a0"))

			// Another allocation of node a holds its block.
			tx := f.otherTx(t)
			if _, err := tx.Exec(f.ctx, `SELECT id FROM blocks FOR NO KEY UPDATE`); err != nil {
				t.Fatal(err)
			}

			done := f.allocateAsync(req("a", "a1"))
			if tc.wantBlocks == 2 {
				r := <-done
				if r.err != nil {
					t.Fatal(r.err)
				}
				if got := r.a.Leases[0].Block.String(); got != "10.0.0.16/28" {
					t.Errorf("leased from %s, want a new block 10.0.0.16/28", got)
				}
			} else {
				waitForLockWait(t, f, func() {
					select {
					case r := <-done:
						t.Fatalf("the allocation did not wait for its node's block: leased %v, %v", r.a.Leases, r.err)
					default:
					}
				})
				if err := tx.Commit(f.ctx); err != nil {
					t.Fatal(err)
				}
				r := <-done
				if r.err != nil {
					t.Fatal(r.err)
				}
				if got := r.a.Leases[0].Block.String(); got != "10.0.0.0/28" {
					t.Errorf("leased from %s, want its node's block 10.0.0.0/28", got)
				}
				// The last block goes to a node without one.
				if got := f.allocate(req("b", "b0")).Leases[0].Block.String(); got != "10.0.0.16/28" {
					t.Errorf("node b leased from %s, want the pool's last block 10.0.0.16/28", got)
				}
			}
			if n := f.count(`SELECT count(*) FROM blocks b JOIN nodes n ON n.id = b.node_id WHERE n.name = 'a'`); n != tc.wantBlocks {
				t.Errorf("node a holds %d blocks, want %d", n, tc.wantBlocks)
			}
		})
	}
}

// waitForLockWait returns once a statement of the store waits for a row
// lock, calling meanwhile (which may fail the test) between looks.
func waitForLockWait(t *testing.T, f *fixture, meanwhile func()) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FOR NO KEY UPDATE%'`) == 0 {
		meanwhile()
		if time.Now().After(deadline) {
			t.Fatal("no statement waited for a lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestExhaustedSaysWhatIsCooling: a refusal while the node's released
// addresses cool says how many will become free and when the first does
// (RetryAfter); an address bound to a sticky identity is told apart, since
// it becomes free only when its retention ends.
func TestExhaustedSaysWhatIsCooling(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("default", lab1Spec) // one /28: 11 leasable, no room for another block
	for i := range 10 {
		f.allocate(req("n", fmt.Sprint("c", i)))
	}
	sticky := req("n", "web-0")
	sticky.Sticky = &alloc.StickyRequest{Identity: "statefulset/default/web/0", Retention: time.Hour}
	f.allocate(sticky)

	_, err := f.s.Allocate(f.ctx, req("n", "x"))
	if e := wantKind(t, err, alloc.KindPoolExhausted); e.RetryAfter != 0 || strings.Contains(e.Detail, ";") {
		t.Errorf("nothing released: %q, retry after %s", e.Detail, e.RetryAfter)
	}

	release := func(container string) {
		t.Helper()
		if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "n", alloc.Attachment{ContainerID: container, Interface: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	release("web-0") // bound for an hour
	release("c3")    // free in 30 s
	f.clock.Advance(5 * time.Second)
	release("c4") // free in 35 s from the start
	f.clock.Advance(2500 * time.Millisecond)

	for _, tc := range []struct {
		advance    time.Duration
		detail     string
		retryAfter time.Duration
	}{
		{0, `allocator full: pool "default" has no free ipv4 block for this node; 2 addresses cooling, the first free in 23 s; ` +
			`1 address bound to sticky identities, the first free in 3593 s unless its workload comes back`, 22500 * time.Millisecond},
		{25 * time.Second, `allocator full: pool "default" has no free ipv4 block for this node; 1 address cooling, the first free in 3 s; ` +
			`1 address bound to sticky identities, the first free in 3568 s unless its workload comes back`, 2500 * time.Millisecond},
	} {
		f.clock.Advance(tc.advance)
		if tc.advance > 0 {
			f.allocate(req("n", "after-c3")) // c3's address is free now
		}
		_, err := f.s.Allocate(f.ctx, req("n", "x"))
		e := wantKind(t, err, alloc.KindPoolExhausted)
		if e.Detail != tc.detail || e.RetryAfter != tc.retryAfter {
			t.Errorf("got %q, retry after %s\nwant %q, retry after %s", e.Detail, e.RetryAfter, tc.detail, tc.retryAfter)
		}
	}

	// Only the bound address is left: it says when its retention ends.
	f.clock.Advance(5 * time.Second)
	f.allocate(req("n", "after-c4"))
	_, err = f.s.Allocate(f.ctx, req("n", "x"))
	e := wantKind(t, err, alloc.KindPoolExhausted)
	if want := time.Hour - 37500*time.Millisecond; e.RetryAfter != want || !strings.HasSuffix(e.Detail, "; 1 address bound to sticky identities, the first free in 3563 s unless its workload comes back") {
		t.Errorf("got %q, retry after %s, want %s", e.Detail, e.RetryAfter, want)
	}
}

// TestLargeIPv6Blocks: a carved pool of IPv6 /96 blocks (2^32 addresses
// each, the largest a block may be) leases at once, from the block's
// start and around its cursor.
func TestLargeIPv6Blocks(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv6: fam(96, "fd00:77::/80"), NodeLocal: alloc.DefaultNodeLocal})
	first := f.allocate(req("n1", "c1")).Leases[0].Addr
	if !netip.MustParsePrefix("fd00:77::/96").Contains(first) {
		t.Fatalf("leased %v", first)
	}
	// The cursor at the block's last offset: the next lease takes it, and
	// the one after wraps around to the start.
	if _, err := f.s.db.Exec(f.ctx, `UPDATE blocks SET next_offset = last_offset`); err != nil {
		t.Fatal(err)
	}
	last := f.allocate(req("n1", "c2")).Leases[0].Addr
	wrapped := f.allocate(req("n1", "c3")).Leases[0].Addr
	if !netip.MustParsePrefix("fd00:77::/96").Contains(last) || last.Compare(first) <= 0 ||
		!netip.MustParsePrefix("fd00:77::/96").Contains(wrapped) || wrapped.Compare(last) >= 0 || wrapped == first {
		t.Fatalf("leased %v, then %v at the cursor, then %v", first, last, wrapped)
	}
}
