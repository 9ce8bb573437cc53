// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// gcBatch bounds each maintenance transaction, so locks are held briefly
// and a backlog drains in several short steps.
const gcBatch = 1000

// ExpirePending releases pending leases whose expiry has passed (the CNI
// plugin crashed between allocation and endpoint creation), starting their
// cooldown. It returns how many it released. Safe to run on every replica:
// SKIP LOCKED splits the work.
func (s *Store) ExpirePending(ctx context.Context) (int64, error) {
	var total int64
	for {
		now := s.now()
		tag, err := s.db.Exec(ctx, `UPDATE leases SET `+releaseSet+` WHERE (space, addr) IN (
			SELECT space, addr FROM leases WHERE state = 'pending' AND expires_at <= @now
			ORDER BY expires_at LIMIT @limit FOR UPDATE SKIP LOCKED) AND `+historyContextSQL,
			namedArgs{"now": now, "until": now.Add(s.opts.Cooldown), "limit": gcBatch,
				"actor": historyActor(ctx), "reason": reasonExpired, "at": now})
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < gcBatch {
			return total, nil
		}
	}
}

// PurgeCooled deletes the rows of released addresses whose cooldown has
// ended and gives their blocks the room back. Allocation also reuses such
// rows in place, so purging is housekeeping, not a correctness need.
//
// One replica purges at a time (a transaction-scoped advisory lock that the
// others skip rather than wait for): two purges would update the same
// blocks' counters in different orders and deadlock.
func (s *Store) PurgeCooled(ctx context.Context) (int64, error) {
	var total int64
	for {
		var n int64
		err := s.inTxWhy(ctx, reasonPurged, func(tx querier) error {
			var mine bool
			if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, purgeLockKey).Scan(&mine); err != nil || !mine {
				n = 0
				return err
			}
			// Lock the blocks first, in the order allocations do (IPv4
			// before IPv6, then by id), and skip those an allocation
			// holds: an allocation locks its block and then may wait for
			// a lease row (a unique key), so a purge that held lease rows
			// and then waited for their blocks could close a cycle
			// (deadlocks seen under 32 clients on one node). Holding the
			// blocks first, it waits for nothing.
			rows, err := tx.Query(ctx, `SELECT b.id FROM blocks b WHERE b.id IN (
					SELECT DISTINCT block_id FROM leases WHERE state = 'released' AND cooldown_until <= $1 LIMIT $2)
				ORDER BY b.family, b.id FOR NO KEY UPDATE SKIP LOCKED`, s.now(), gcBatch)
			if err != nil {
				return err
			}
			locked, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil || len(locked) == 0 {
				n = 0
				return err
			}
			rows, err = tx.Query(ctx, `DELETE FROM leases WHERE (space, addr) IN (
					SELECT space, addr FROM leases WHERE state = 'released' AND cooldown_until <= $1 AND block_id = ANY ($3)
					LIMIT $2 FOR UPDATE SKIP LOCKED)
				RETURNING block_id`, s.now(), gcBatch, locked)
			if err != nil {
				return err
			}
			freed := map[int64]int64{}
			blockIDs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return err
			}
			for _, id := range blockIDs {
				freed[id]++
			}
			n = int64(len(blockIDs))
			ids, counts := make([]int64, 0, len(freed)), make([]int64, 0, len(freed))
			for id, c := range freed {
				ids, counts = append(ids, id), append(counts, c)
			}
			_, err = tx.Exec(ctx, `UPDATE blocks b SET allocated = b.allocated - c.n,
					emptied_at = CASE WHEN b.allocated = c.n THEN $3 ELSE b.emptied_at END
				FROM unnest($1::bigint[], $2::bigint[]) AS c (id, n) WHERE b.id = c.id`, ids, counts, s.now())
			return err
		})
		if err != nil {
			return total, err
		}
		total += n
		if n < gcBatch {
			return total, nil
		}
	}
}

// purgeLockKey is the advisory lock key of PurgeCooled ("ipamgc" in ASCII).
const purgeLockKey int64 = 0x697061_6d6763

// Maintainer is what RunMaintenance drives; *Store is one.
type Maintainer interface {
	ExpirePending(ctx context.Context) (int64, error)
	PurgeCooled(ctx context.Context) (int64, error)
	Rebalance(ctx context.Context) (Rebalanced, error)
	SampleUsage(ctx context.Context, every time.Duration) (int64, error)
	PruneHistory(ctx context.Context) (int64, error)
}

// MaintenancePass is the outcome of one pass of RunMaintenance. An error
// caused by ctx ending is not reported.
type MaintenancePass struct {
	Expired, Purged     int64
	Rebalanced          Rebalanced
	Sampled             int64
	Pruned              int64 // history events
	ExpireErr, PurgeErr error
	RebalanceErr        error
	SampleErr           error
	PruneErr            error
}

// Errors lists the pass's errors.
func (p MaintenancePass) Errors() []error {
	var errs []error
	for _, err := range []error{p.ExpireErr, p.PurgeErr, p.RebalanceErr, p.SampleErr, p.PruneErr} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// RunMaintenance, every interval until ctx ends: releases expired pending
// leases, purges cooled addresses, rebalances multi-pool node capacity
// (pre-allocation and block release) and samples pool usage every
// sampleEvery and prunes the address history past its retention, handing
// each pass to report. Every replica may run it: SKIP LOCKED and advisory
// locks split the work. The history records its changes as
// alloc.ActorSystem's.
func RunMaintenance(ctx context.Context, m Maintainer, every, sampleEvery time.Duration, report func(context.Context, MaintenancePass)) {
	ctx = alloc.WithActor(ctx, alloc.ActorSystem)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var p MaintenancePass
		p.Expired, p.ExpireErr = m.ExpirePending(ctx)
		p.Purged, p.PurgeErr = m.PurgeCooled(ctx)
		p.Rebalanced, p.RebalanceErr = m.Rebalance(ctx)
		p.Sampled, p.SampleErr = m.SampleUsage(ctx, sampleEvery)
		p.Pruned, p.PruneErr = m.PruneHistory(ctx)
		if ctx.Err() != nil {
			p.ExpireErr, p.PurgeErr, p.RebalanceErr, p.SampleErr, p.PruneErr = nil, nil, nil, nil, nil
		}
		report(ctx, p)
	}
}
