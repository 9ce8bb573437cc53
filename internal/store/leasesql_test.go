// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Many clients on one node, with small blocks so that blocks are carved
// while allocations go on, and the purge freeing cooled rows meanwhile: no
// call fails, and deadlocks, which the retry hides, stay rare (PostgreSQL
// counts every deadlock it broke in pg_stat_database; the store's
// connections report their counts when they close). Before the lock order
// was fixed (carve waiting for a block while holding the pool's CIDR rows;
// leasing from "the oldest block with room" after carving; the purge
// locking blocks after lease rows), this ran into dozens; what remains is
// a lock PostgreSQL keeps on a block that "LIMIT 1 FOR NO KEY UPDATE"
// passed over after waiting for it (the row no longer qualified).
func TestHotNodeLockOrder(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Cooldown = 0; o.Now = time.Now })
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.0.0.0/16")})
	const clients, rounds = 32, 40
	var wg sync.WaitGroup
	errs := make(chan error, clients+1)
	stop, purged := make(chan struct{}), make(chan struct{})
	go func() { // the GC's purge, as often as it can
		defer close(purged)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := f.s.PurgeCooled(f.ctx); err != nil {
				errs <- fmt.Errorf("purge: %w", err)
				return
			}
		}
	}()
	for c := range clients {
		wg.Go(func() {
			// Hold two of every three leases, so the node keeps growing
			// and carving while the others churn.
			for i := range rounds {
				r := req("hot", fmt.Sprintf("c%d-%d", c, i))
				if _, err := f.s.Allocate(f.ctx, r); err != nil {
					errs <- fmt.Errorf("allocate: %w", err)
					return
				}
				if i%3 != 0 {
					continue
				}
				if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "hot", r.Attachment); err != nil {
					errs <- fmt.Errorf("release: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-purged
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	blocks := f.count(`SELECT count(*) FROM blocks`)
	f.s.Close() // its backends exit and report their statistics
	conn, err := pgx.Connect(f.ctx, f.conn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(f.ctx)
	var deadlocks int64
	// An exiting backend reports its counts as it goes; give the last
	// ones a moment.
	for range 10 {
		if _, err := conn.Exec(f.ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(f.ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks); err != nil {
			t.Fatal(err)
		}
		if deadlocks > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	calls := int64(clients * (rounds + (rounds+2)/3))
	t.Logf("%d clients x %d allocations (a third released) on one node with /28 blocks: %d blocks carved, %d deadlocks in %d calls",
		clients, rounds, blocks, deadlocks, calls)
	if deadlocks*100 > calls {
		t.Errorf("PostgreSQL broke %d deadlocks in %d calls: more than 1%%", deadlocks, calls)
	}
}

// TestLeaseWhenTheSnapshotMissesTheFreeAddress: an allocation waits for
// its block while the holder leases the block's last free address and a
// purge frees another. Its probe reads a snapshot from before the wait:
// there the last address still looks free and the purged row still holds
// its address. It must lease the purged address all the same (a new
// statement, with a new snapshot), neither fail nor carve.
func TestLeaseWhenTheSnapshotMissesTheFreeAddress(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Cooldown = 0 })
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.0.0.0/28")}) // one block, no room to carve another
	f.allocate(req("n", "c0"))
	capacity := f.count(`SELECT capacity FROM blocks`)
	var purged netip.Addr
	for i := int64(1); i < capacity-1; i++ { // all but the last address
		a := f.allocate(req("n", fmt.Sprint("c", i)))
		if i == 5 {
			purged = a.Leases[0].Addr
		}
	}
	if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "n", alloc.Attachment{ContainerID: "c5", Interface: "eth0"}); err != nil {
		t.Fatal(err)
	}

	// Another holder of the block: it leases the last address (moving the
	// cursor past it, to the start) and purges the cooled row.
	tx := f.otherTx(t)
	for _, sql := range []string{
		`SELECT id FROM blocks FOR NO KEY UPDATE`,
		`INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface,
			owner_namespace, owner_name, owner_uid, created_at, selected_by, generation)
		SELECT l.space, set_masklen(b.cidr::inet, 32) + o, b.id, b.cidr, b.node_id, b.pool_id, 4, 'active', 'last', 'eth0',
			'default', 'pod-last', '', l.created_at, l.selected_by, l.generation
		FROM blocks b, generate_series(b.first_offset, b.last_offset) o, (SELECT * FROM leases LIMIT 1) l
		WHERE o <> ALL (b.reserved) AND NOT EXISTS (SELECT 1 FROM leases x WHERE x.addr = set_masklen(b.cidr::inet, 32) + o)`,
		`UPDATE blocks SET next_offset = first_offset`,
		`DELETE FROM leases WHERE state = 'released'`,
	} {
		if tag, err := tx.Exec(f.ctx, sql); err != nil {
			t.Fatal(err)
		} else if tag.RowsAffected() != 1 {
			t.Fatalf("%d rows: %s", tag.RowsAffected(), sql)
		}
	}

	done := f.allocateAsync(req("n", "late"))
	// Commit once the allocation waits for the block.
	deadline := time.Now().Add(10 * time.Second)
	for f.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%FOR NO KEY UPDATE%'`) == 0 {
		select {
		case r := <-done:
			t.Fatalf("the allocation did not wait for the block: %+v", r)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the allocation never waited for the block")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("allocate: %v", r.err)
	}
	if got := r.a.Leases[0].Addr; got != purged {
		t.Errorf("leased %s, want the purged %s", got, purged)
	}
	if n := f.count(`SELECT count(*) FROM blocks`); n != 1 {
		t.Errorf("%d blocks, want 1", n)
	}
	if n := f.count(`SELECT count(*) FROM leases`); n != capacity {
		t.Errorf("%d leases, want %d", n, capacity)
	}
}
