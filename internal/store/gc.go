package store

import (
	"context"

	"github.com/jackc/pgx/v5"
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
		tag, err := s.db.Exec(ctx, `UPDATE leases SET `+releaseSet+` WHERE id IN (
			SELECT id FROM leases WHERE state = 'pending' AND expires_at <= $1
			ORDER BY expires_at LIMIT $3 FOR UPDATE SKIP LOCKED)`, now, now.Add(s.opts.Cooldown), gcBatch)
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
func (s *Store) PurgeCooled(ctx context.Context) (int64, error) {
	var total int64
	for {
		var n int64
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `WITH d AS (
					DELETE FROM leases WHERE id IN (
						SELECT id FROM leases WHERE state = 'released' AND cooldown_until <= $1
						ORDER BY block_id LIMIT $2 FOR UPDATE SKIP LOCKED)
					RETURNING block_id
				), c AS (
					SELECT block_id, count(*) AS n FROM d GROUP BY block_id
				), u AS (
					UPDATE blocks b SET allocated = b.allocated - c.n FROM c WHERE b.id = c.block_id
				)
				SELECT count(*) FROM d`, s.now(), gcBatch).Scan(&n)
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
