// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// UsageRetention is how long pool usage samples are kept: the forecast
// reads at most this far back.
const UsageRetention = 24 * time.Hour

// SampleUsage records, for every pool family of every space, the addresses
// in use (lease rows of its blocks: leased and cooling) and what the pool
// could hold, unless a replica sampled less than every ago; it prunes
// samples older than UsageRetention. It answers how many it recorded.
func (s *Store) SampleUsage(ctx context.Context, every time.Duration) (int64, error) {
	var n int64
	err := s.inTx(ctx, func(tx querier) error {
		n = 0
		var mine bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, sampleLockKey).Scan(&mine); err != nil || !mine {
			return err
		}
		now := s.now()
		var recent bool
		// 5% slack: a pass that comes a little early still samples.
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pool_usage_samples WHERE at > $1)`,
			now.Add(-every+every/20)).Scan(&recent); err != nil || recent {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT `+poolColumns+` FROM pools p ORDER BY p.id`)
		if err != nil {
			return err
		}
		pools, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (poolRow, error) { return scanPool(r) })
		if err != nil {
			return err
		}
		var ids, capacities []int64
		var fams []int16
		for _, p := range pools {
			for _, f := range p.Spec.Families() {
				ids = append(ids, p.id)
				fams = append(fams, int16(f))
				capacities = append(capacities, possibleAddresses(p.Spec, f))
			}
		}
		tag, err := tx.Exec(ctx, `INSERT INTO pool_usage_samples (pool_id, family, at, used, capacity)
			SELECT x.id, x.family, $4, (SELECT coalesce(sum(b.allocated), 0) FROM blocks b WHERE b.pool_id = x.id AND b.family = x.family), x.cap
			FROM unnest($1::bigint[], $2::smallint[], $3::bigint[]) x (id, family, cap)`, ids, fams, capacities, now)
		if err != nil {
			return err
		}
		n = tag.RowsAffected()
		_, err = tx.Exec(ctx, `DELETE FROM pool_usage_samples WHERE at < $1`, now.Add(-UsageRetention))
		return err
	})
	return n, err
}

// sampleLockKey is the advisory lock of SampleUsage ("ipamsu").
const sampleLockKey int64 = 0x697061_6d7375

// possibleAddresses is what family f of a pool could lease with every
// block carved, at most math.MaxInt64 (see BlocksPossible).
func possibleAddresses(spec alloc.PoolSpec, f alloc.Family) int64 {
	pf := spec.Family(f)
	if pf == nil || len(pf.CIDRs) == 0 {
		return 0
	}
	l := alloc.BlockLayout(netip.PrefixFrom(pf.CIDRs[0].Addr(), pf.MaskSize), spec.AllowFirstIP, spec.AllowLastIP, spec.NodeLocal)
	return alloc.SaturatingMul(pf.BlocksPossible(), l.Capacity)
}

// PoolCapacity reports, per family, what the pool holds and can still
// give, its fragmentation, the nodes at capacity or in deficit, and the
// exhaustion forecast from the usage samples of the last window. It reads
// one snapshot.
func (s *Store) PoolCapacity(ctx context.Context, space, name string, window time.Duration) (map[alloc.Family]alloc.FamilyCapacity, error) {
	var out map[alloc.Family]alloc.FamilyCapacity
	err := s.readSnapshot(ctx, func(tx querier) error {
		p, err := s.getPool(ctx, tx, space, name, false)
		if err != nil {
			return err
		}
		usage, err := s.nodePoolUsage(ctx, tx, &space, &name, nil)
		if err != nil {
			return err
		}
		out, err = s.poolCapacity(ctx, tx, p, usage, window)
		return err
	})
	return out, err
}

// readSnapshot runs fn in a read-only repeatable-read transaction: every
// statement sees the same snapshot, and nothing waits for it.
func (s *Store) readSnapshot(ctx context.Context, fn func(tx querier) error) error {
	return pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error { return fn(tx) })
}

// poolCapacity is PoolCapacity of a pool already read, given the node
// usage of (at least) its pool.
func (s *Store) poolCapacity(ctx context.Context, q querier, p poolRow, usage []nodeUsageRow, window time.Duration) (map[alloc.Family]alloc.FamilyCapacity, error) {
	if err := s.fillStatus(ctx, q, &p); err != nil {
		return nil, err
	}
	now := s.now()
	out := map[alloc.Family]alloc.FamilyCapacity{}
	for _, f := range p.Spec.Families() {
		st := p.Status[f]
		c := alloc.FamilyCapacity{
			BlocksPossible: st.BlocksPossible, BlocksCarved: st.BlocksCarved,
			AddressesPossible: possibleAddresses(p.Spec, f), AddressesInBlocks: st.AddressesTotal,
			Leased: st.Leased, Cooling: st.Cooling,
		}
		var blocks []netip.Prefix
		rows, err := q.Query(ctx, `SELECT cidr FROM blocks WHERE pool_id = $1 AND family = $2`, p.id, int16(f))
		if err != nil {
			return nil, err
		}
		if blocks, err = pgx.CollectRows(rows, pgx.RowTo[netip.Prefix]); err != nil {
			return nil, err
		}
		c.LargestFreeBlock, c.FreeBlocks = alloc.FreeSpace(*p.Spec.Family(f), blocks)
		for _, u := range usage {
			if u.Space != p.Space || u.Pool != p.Name || u.Family != f {
				continue
			}
			if u.Blocks > 0 {
				c.NodesWithBlocks++
			}
			if u.AtCapacity() {
				c.NodesAtCapacity++
			}
			if u.Deficit() > 0 {
				c.NodesInDeficit++
			}
		}
		rows, err = q.Query(ctx, `SELECT at, used FROM pool_usage_samples
			WHERE pool_id = $1 AND family = $2 AND at >= $3 ORDER BY at`, p.id, int16(f), now.Add(-window))
		if err != nil {
			return nil, err
		}
		samples, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.UsageSample, error) {
			var u alloc.UsageSample
			return u, r.Scan(&u.At, &u.Used)
		})
		if err != nil {
			return nil, err
		}
		used := int64(0)
		if len(samples) > 0 {
			used = samples[len(samples)-1].Used
		}
		c.Forecast = alloc.ForecastExhaustion(samples, used, c.AddressesPossible)
		out[f] = c
	}
	return out, nil
}
