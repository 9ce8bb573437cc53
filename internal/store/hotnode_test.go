package store

import (
	"fmt"
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
