// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// nodeUsageRow is one node's use of one pool family, with its space.
type nodeUsageRow struct {
	Space string
	alloc.NodePoolUsage
}

// poolFamiliesSQL lists, as the rows of mp, every family of pools p that
// has a block mask, with the pool's effective pre-allocation (pre:
// multi-pool pools only; @defaultPool names the default pool, which
// pre-allocates @defaultPre unless set) and what the capacity of a node's blocks is bounded by. The
// caller appends its own condition on p (AND ...).
const poolFamiliesSQL = `SELECT p.id, p.space, p.name, p.mode, f.family,
		       CASE WHEN p.mode = 'multi-pool' THEN coalesce(p.pre_allocate, CASE WHEN p.name = @defaultPool THEN @defaultPre ELSE 0 END) ELSE 0 END AS pre,
		       CASE f.family WHEN 4 THEN p.ipv4_mask_size ELSE p.ipv6_mask_size END AS mask, p.max_blocks_per_node,
		       p.allow_first_ip, p.allow_last_ip, p.reserve_router, p.reserve_health, p.reserve_ingress
		FROM pools p CROSS JOIN (VALUES (4::smallint), (6::smallint)) f (family)
		WHERE CASE f.family WHEN 4 THEN p.ipv4_mask_size IS NOT NULL ELSE p.ipv6_mask_size IS NOT NULL END`

// nodeUsageColumnsSQL are the columns scanNodeUsage reads, of a pool family
// mp (poolFamiliesSQL), a node n and the totals u of the node's blocks of
// that pool family (blocks, capacity, demand; NULL without blocks). A node
// served in Cilium's crd mode (nodes.cilium_crd) pre-allocates nothing in
// blocks: its CiliumNode's watermarks size it in addresses (cilium.go), so
// its blocks hold what it holds and go back once empty. Nor does a node of
// Cilium's cluster-pool mode (nodes.cilium_cluster_pool), whose agent uses
// only its podCIDRs.
const nodeUsageColumnsSQL = `mp.space, n.name, mp.name, mp.mode, mp.family, CASE WHEN n.cilium_crd OR n.cilium_cluster_pool THEN 0 ELSE mp.pre END,
	       coalesce(u.blocks, 0), coalesce(u.capacity, 0), coalesce(u.demand, 0),
	       mp.mask, mp.max_blocks_per_node, mp.allow_first_ip, mp.allow_last_ip, mp.reserve_router, mp.reserve_health, mp.reserve_ingress`

// nodePoolUsageSQL aggregates, per node, pool and family of the space
// @space, pool @pool and node @node (every one when NULL), the node's blocks: their
// capacity and their lease rows (blocks.allocated: pending, active, and
// released rows not yet purged, which the purge just before Rebalance
// removes when cooled). Multi-pool pools whose effective pre-allocation is
// positive also list every node of the space that holds no block of them
// yet (crd-mode and cluster-pool-mode nodes excepted): Cilium's agent asks for the
// pre-allocation of such pools before the node's first Pod.
const nodePoolUsageSQL = `WITH mp AS (
		` + poolFamiliesSQL + ` AND (@space::text IS NULL OR p.space = @space) AND (@pool::text IS NULL OR p.name = @pool)
	), used AS (
		SELECT b.node_id, b.pool_id, b.family, count(*) AS blocks, sum(b.capacity) AS capacity, sum(b.allocated) AS demand
		FROM blocks b JOIN mp ON mp.id = b.pool_id AND mp.family = b.family
		GROUP BY b.node_id, b.pool_id, b.family
	)
	SELECT ` + nodeUsageColumnsSQL + `
	FROM mp JOIN nodes n ON n.space = mp.space AND (@node::text IS NULL OR n.name = @node)
	LEFT JOIN used u ON u.node_id = n.id AND u.pool_id = mp.id AND u.family = mp.family
	WHERE u.node_id IS NOT NULL OR (mp.pre > 0 AND NOT n.cilium_crd AND NOT n.cilium_cluster_pool)
	ORDER BY mp.space, n.name, mp.name, mp.family`

// nodePoolUsage lists the use of the pools by every node that holds blocks
// of them or should (pre-allocation): of one space, pool and node, or of
// all when nil.
func (s *Store) nodePoolUsage(ctx context.Context, q querier, space, pool, node *string) ([]nodeUsageRow, error) {
	return s.queryNodeUsage(ctx, q, nodePoolUsageSQL, namedArgs{"space": space, "pool": pool, "node": node})
}

// queryNodeUsage runs sql, whose columns are nodeUsageColumnsSQL, with
// args and poolFamiliesSQL's @defaultPool and @defaultPre.
func (s *Store) queryNodeUsage(ctx context.Context, q querier, sql string, args namedArgs) ([]nodeUsageRow, error) {
	args["defaultPool"], args["defaultPre"] = s.opts.DefaultPool, alloc.DefaultPreAllocate
	rows, err := q.Query(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (nodeUsageRow, error) {
		var u nodeUsageRow
		var fam, mask int16
		var maxBlocks *int
		var first, last bool
		var nl alloc.NodeLocal
		err := r.Scan(&u.Space, &u.Node, &u.Pool, &u.Mode, &fam, &u.PreAlloc, &u.Blocks, &u.Capacity, &u.InUse,
			&mask, &maxBlocks, &first, &last, &nl.Router, &nl.Health, &nl.Ingress)
		u.Family = alloc.Family(fam)
		u.MaxCapacity = alloc.NodeCapacityLimit(maxBlocks, u.Family, int(mask), first, last, nl)
		return u, err
	})
}

// NodeUsage reports one node's use of every pool it holds blocks of or
// pre-allocates from (or, with a filter, of exactly the pools it names, every
// family of each): capacity, leases, need, deficit and whether a lease would
// find an address, per pool family. It reads one snapshot (a read-only
// repeatable-read transaction), so the lease counts and the block totals
// agree.
//
// With a filter, a pool the space lacks is a KindNotFound error (field
// "pool"), and a node the space lacks is answered as one without blocks when
// the store registers nodes on their first lease (else KindNotFound, field
// "node", as without a filter).
func (s *Store) NodeUsage(ctx context.Context, space, node string, only alloc.UsageFilter) (alloc.NodeUsage, error) {
	out := alloc.NodeUsage{DefaultPool: s.opts.DefaultPool}
	err := s.readSnapshot(ctx, func(tx querier) error {
		out.Items = nil
		nodeID, err := s.nodeID(ctx, tx, space, node)
		if err != nil {
			var e *alloc.Error
			if only.IsZero() || !s.opts.AutoRegisterNodes || !errors.As(err, &e) || e.Kind != alloc.KindNotFound || e.Field != "node" {
				return err
			}
			nodeID = 0 // unknown: its first lease registers it
		}
		pools := map[string]allocPool{}
		if only.IsZero() {
			rows, err := s.nodePoolUsage(ctx, tx, &space, nil, &node)
			if err != nil {
				return err
			}
			for _, r := range rows {
				out.Items = append(out.Items, r.NodePoolUsage)
			}
		} else {
			names := slices.Clone(only.Pools)
			if only.Default {
				names = append(names, s.opts.DefaultPool)
			}
			slices.Sort(names)
			for _, name := range slices.Compact(names) {
				p, err := s.allocPool(ctx, tx, space, name)
				if err != nil {
					return err
				}
				pools[name] = p
				var rows []nodeUsageRow
				if nodeID != 0 {
					if rows, err = s.nodePoolUsage(ctx, tx, &space, &name, &node); err != nil {
						return err
					}
				}
				for _, f := range alloc.Families {
					if !p.has(f) {
						continue
					}
					u := alloc.NodePoolUsage{Node: node, Pool: name, Mode: p.mode, Family: f}
					u.MaxCapacity = p.capacityLimit(f)
					for _, r := range rows {
						if r.Family == f {
							u = r.NodePoolUsage
						}
					}
					out.Items = append(out.Items, u)
				}
			}
		}
		if nodeID == 0 {
			return s.fillCanLease(ctx, tx, space, 0, pools, out.Items)
		}
		// The partial index leases_attachment (node_id, ... WHERE state <>
		// 'released') answers this without touching released rows.
		leasedRows, err := tx.Query(ctx, `SELECT p.name, l.family, count(*) FROM leases l JOIN pools p ON p.id = l.pool_id
			WHERE l.node_id = $1 AND l.state <> 'released' GROUP BY p.name, l.family`, nodeID)
		if err != nil {
			return err
		}
		type key struct {
			pool string
			fam  alloc.Family
		}
		leased := map[key]int64{}
		var k key
		var fam int16
		var n int64
		if _, err := pgx.ForEachRow(leasedRows, []any{&k.pool, &fam, &n}, func() error {
			k.fam = alloc.Family(fam)
			leased[k] = n
			return nil
		}); err != nil {
			return err
		}
		for i := range out.Items {
			out.Items[i].Leased = leased[key{out.Items[i].Pool, out.Items[i].Family}]
		}
		return s.fillCanLease(ctx, tx, space, nodeID, pools, out.Items)
	})
	return out, err
}

// fillCanLease sets CanLease of each item of node nodeID (0: a node not
// registered yet); pools caches the pools read so far by name.
func (s *Store) fillCanLease(ctx context.Context, tx querier, space string, nodeID int64, pools map[string]allocPool, items []alloc.NodePoolUsage) error {
	for i := range items {
		u := &items[i]
		if u.Available() > 0 {
			u.CanLease = true // the common case costs nothing more
			continue
		}
		p, ok := pools[u.Pool]
		if !ok {
			var err error
			if p, err = s.allocPool(ctx, tx, space, u.Pool); err != nil {
				return err
			}
			pools[u.Pool] = p
		}
		var err error
		u.CanLease, err = s.canLease(ctx, tx, space, nodeID, p, *u)
		if err != nil {
			return err
		}
	}
	return nil
}

// canLease reports whether a lease of node nodeID from family u.Family of
// pool p would find an address although the node's blocks have no free
// one: a released address whose cooldown has ended (leaseCooledSQL reuses
// it), or a block carve would take for the node. It reads what carve and
// leaseCooledSQL read, without their locks.
func (s *Store) canLease(ctx context.Context, tx querier, space string, nodeID int64, p allocPool, u alloc.NodePoolUsage) (bool, error) {
	f := u.Family
	if nodeID != 0 && u.Blocks > 0 {
		var cooled bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM blocks b JOIN leases l ON l.block_id = b.id
			WHERE b.node_id = $1 AND b.pool_id = $2 AND b.family = $3 AND l.state = 'released' AND l.cooldown_until <= $4)`,
			nodeID, p.id, int16(f), s.now()).Scan(&cooled); err != nil || cooled {
			return cooled, err
		}
	}
	if !p.carves() || (p.mode == alloc.ModeClusterPool && u.Blocks > 0) || u.Blocks >= p.blockLimit(f) {
		return false, nil // carve refuses: see carve
	}
	rows, err := tx.Query(ctx, `SELECT id, cidr, mask_size, carve_hint, reserved_start, reserved_end FROM pool_cidrs
		WHERE pool_id = $1 AND family = $2 ORDER BY position`, p.id, int16(f))
	if err != nil {
		return false, err
	}
	parents, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (carveParent, error) {
		var pc carveParent
		return pc, r.Scan(&pc.id, &pc.cidr, &pc.mask, &pc.hint, &pc.starts, &pc.ends)
	})
	if err != nil || len(parents) == 0 {
		return false, err
	}
	return anyFreeBlock(ctx, tx, space, f, parents, parents[0].hint)
}

// Rebalanced is what one Rebalance pass did.
type Rebalanced struct {
	Carved, Released int64
	// InDeficit counts node pools still short of their need afterwards
	// (their pool is full or disabled, or the node holds the pool's
	// per-node limit of blocks).
	InDeficit int64
}

// Rebalance keeps every node's multi-pool capacity at its need, as Cilium's
// operator and agent do between them: it carves blocks where a node's
// capacity is below NeededIPCeil(demand, preAllocate), and returns blocks
// that are completely free, were empty for the hold-off, and are above the
// need. One replica rebalances at a time (a session advisory lock the others
// skip); each node pool is its own transaction.
//
// It leaves the space of Cilium's multi-pool agents (AgentPoolsSpace)
// alone: they size their blocks themselves (SyncAgentPools).
//
// Allocation never waits for it: a node with no room carves on the lease
// path. Rebalance is what makes the pre-allocation ready before the Pods
// arrive, and what gives blocks back when they leave. With Options.TopUp,
// the top-up (RunTopUps) carves right after a node's allocations, and
// Rebalance is the safety net for what it missed (a pass that failed, the
// notes of a replica that stopped).
func (s *Store) Rebalance(ctx context.Context) (Rebalanced, error) {
	var out Rebalanced
	_, err := s.withSessionLock(ctx, rebalanceLockKey, func(ctx context.Context) error {
		var err error
		out, err = s.rebalance(ctx)
		return err
	})
	return out, err
}

// rebalance is Rebalance's pass, run under its lock.
func (s *Store) rebalance(ctx context.Context) (Rebalanced, error) {
	var out Rebalanced
	usage, err := s.nodePoolUsage(ctx, s.db, nil, nil, nil)
	if err != nil {
		return out, err
	}
	holdOff := s.opts.BlockReleaseHoldOff
	for _, u := range usage {
		switch {
		case !s.sizesBlocks(u):
		case u.Deficit() > 0:
			n, short, err := s.topUp(ctx, []nodeUsageRow{u})
			out.Carved, out.InDeficit = out.Carved+n, out.InDeficit+short
			s.carves.rebalance.Add(n)
			if err != nil {
				return out, err
			}
		case u.Blocks > 0 && u.Capacity > u.Needed():
			n, err := s.releaseAboveNeed(ctx, u, holdOff)
			out.Released += n
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// rebalanceLockKey is the advisory lock of Rebalance ("ipamrb").
const rebalanceLockKey int64 = 0x697061_6d7262

// sizesBlocks says whether Rebalance and the top-up size the node's blocks
// of u's pool family to its need. A cluster-pool block is the node's for
// good: never topped up, never returned. Cilium's multi-pool agents size
// the blocks of AgentPoolsSpace themselves (SyncAgentPools).
func (s *Store) sizesBlocks(u nodeUsageRow) bool {
	return u.Mode == alloc.ModeMultiPool && u.Space != s.opts.AgentPoolsSpace
}

// nodePoolIDs resolves a usage row's node and pool; ok is false when either
// went away.
func (s *Store) nodePoolIDs(ctx context.Context, tx querier, u nodeUsageRow) (nodeID int64, p allocPool, ok bool, err error) {
	nodeID, err = s.nodeID(ctx, tx, u.Space, u.Node)
	if err == nil {
		p, err = s.allocPool(ctx, tx, u.Space, u.Pool)
	}
	switch {
	case alloc.IsKind(err, alloc.KindNotFound):
		return 0, p, false, nil // deleted meanwhile
	case err != nil:
		return 0, p, false, err
	}
	return nodeID, p, p.mode == alloc.ModeMultiPool, nil
}

// maxTopUpBlocks bounds the blocks one transaction of topUp carves, and so
// how long it holds the pool family's carve lock.
const maxTopUpBlocks = 16

// topUp carves, for node pools of one pool family (rows: one space, pool
// and family), the blocks each lacks to meet its need, the node pools with
// the fewest available addresses first. Each transaction locks the pool's
// CIDR rows of the family (as carving does) and reads the nodes' blocks
// again under that lock, so a block the lease path or another replica
// carved meanwhile counts and none is carved twice; it carves at most
// maxTopUpBlocks, and the next transaction goes on from there.
//
// short counts the node pools left below their need because the pool is
// full or disabled, or the node holds the pool's per-node limit of blocks:
// not an error, since the need is clamped to what may be carved, as Cilium
// clamps to max-allocate. A node or pool deleted meanwhile, or a pool no
// longer multi-pool, is skipped.
func (s *Store) topUp(ctx context.Context, rows []nodeUsageRow) (carved, short int64, err error) {
	if len(rows) == 0 {
		return 0, 0, nil
	}
	rows = slices.Clone(rows)
	slices.SortStableFunc(rows, func(a, b nodeUsageRow) int { return cmp.Compare(a.Available(), b.Available()) })
	space, pool, f := rows[0].Space, rows[0].Pool, rows[0].Family
	names := make([]string, len(rows))
	for i, u := range rows {
		names[i] = u.Node
	}
	for done := 0; done < len(rows); {
		var n, sh int64
		next := len(rows)
		err := s.inTxWhy(ctx, reasonRebalance, func(tx querier) error {
			n, sh, next = 0, 0, len(rows)
			p, err := s.allocPool(ctx, tx, space, pool)
			switch {
			case alloc.IsKind(err, alloc.KindNotFound):
				return nil // deleted meanwhile
			case err != nil:
				return err
			case p.mode != alloc.ModeMultiPool || !p.has(f):
				return nil
			}
			if _, err := tx.Exec(ctx, `SELECT id FROM pool_cidrs WHERE pool_id = $1 AND family = $2 ORDER BY position FOR NO KEY UPDATE`,
				p.id, int16(f)); err != nil {
				return err
			}
			have, err := nodeBlockTotals(ctx, tx, space, p.id, f, names[done:])
			if err != nil {
				return err
			}
			full := false // the pool carves no more
			for i := done; i < len(rows); i++ {
				h, ok := have[rows[i].Node]
				if !ok {
					continue // deleted meanwhile
				}
				d := rows[i].NodePoolDemand
				d.Capacity, d.InUse = h.capacity, h.inUse
				for d.Deficit() > 0 {
					if full {
						sh++
						break
					}
					if n == maxTopUpBlocks {
						next = i
						return nil
					}
					b, ok, err := carve(ctx, tx, carving{space: space, node: h.id, pool: p, family: f, now: s.now()}, carveAlways)
					if err == nil && !ok {
						err = alloc.Exhausted(p.name, f)
					}
					if alloc.IsKind(err, alloc.KindPoolExhausted) || alloc.IsKind(err, alloc.KindNodeBlockLimit) {
						full = alloc.IsKind(err, alloc.KindPoolExhausted)
						sh++
						break
					}
					if err != nil {
						return err
					}
					n++
					d.Capacity += alloc.BlockLayout(b.cidr, p.allowFirst, p.allowLast, p.nodeLocal).Capacity
				}
			}
			return nil
		})
		if err != nil {
			return carved, short, err
		}
		carved, short, done = carved+n, short+sh, next
	}
	return carved, short, nil
}

// blockTotals are a node's id and the totals of its blocks of one pool
// family.
type blockTotals struct {
	id              int64
	capacity, inUse int64
}

// nodeBlockTotals reads, for the named nodes of space, the totals of their
// blocks of pool poolID and family f; a node the space lacks is absent.
func nodeBlockTotals(ctx context.Context, q querier, space string, poolID int64, f alloc.Family, nodes []string) (map[string]blockTotals, error) {
	rows, err := q.Query(ctx, `SELECT n.name, n.id, coalesce(sum(b.capacity), 0), coalesce(sum(b.allocated), 0)
		FROM nodes n LEFT JOIN blocks b ON b.node_id = n.id AND b.pool_id = $2 AND b.family = $3
		WHERE n.space = $1 AND n.name = ANY ($4)
		GROUP BY n.id, n.name`, space, poolID, int16(f), nodes)
	if err != nil {
		return nil, err
	}
	out := map[string]blockTotals{}
	var name string
	var t blockTotals
	_, err = pgx.ForEachRow(rows, []any{&name, &t.id, &t.capacity, &t.inUse}, func() error {
		out[name] = t
		return nil
	})
	return out, err
}

// releaseAboveNeed returns the node pool's blocks that are empty, have been
// for the hold-off, and are not needed to meet the node's need, newest
// first. The blocks are locked (in the allocation path's order) and checked
// empty again under the lock.
func (s *Store) releaseAboveNeed(ctx context.Context, u nodeUsageRow, holdOff time.Duration) (int64, error) {
	var released int64
	err := s.inTxWhy(ctx, reasonRebalance, func(tx querier) error {
		released = 0
		nodeID, p, ok, err := s.nodePoolIDs(ctx, tx, u)
		if err != nil || !ok {
			return err
		}
		type blk struct {
			id, capacity, allocated int64
			quiet                   bool // empty for the hold-off
		}
		rows, err := tx.Query(ctx, `SELECT id, capacity, allocated, coalesce(emptied_at, created_at) <= $4 FROM blocks
			WHERE node_id = $1 AND pool_id = $2 AND family = $3 ORDER BY id FOR NO KEY UPDATE`,
			nodeID, p.id, int16(u.Family), s.now().Add(-holdOff))
		if err != nil {
			return err
		}
		blocks, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (blk, error) {
			var b blk
			return b, r.Scan(&b.id, &b.capacity, &b.allocated, &b.quiet)
		})
		if err != nil {
			return err
		}
		d := u.NodePoolDemand
		d.Capacity, d.InUse = 0, 0
		for _, b := range blocks {
			d.Capacity += b.capacity
			d.InUse += b.allocated
		}
		var freeIDs, freeCaps []int64
		for i := len(blocks) - 1; i >= 0; i-- { // newest first
			if b := blocks[i]; b.allocated == 0 && b.quiet {
				freeIDs, freeCaps = append(freeIDs, b.id), append(freeCaps, b.capacity)
			}
		}
		var ids []int64
		for _, i := range d.Releasable(freeCaps) {
			ids = append(ids, freeIDs[i])
		}
		if len(ids) == 0 {
			return nil
		}
		if err := lockCarveRowsOf(ctx, tx, `id = ANY (@blocks)`, namedArgs{"blocks": ids}); err != nil {
			return err
		}
		if err := deleteBlocks(ctx, tx, `DELETE FROM blocks WHERE id = ANY ($1) AND allocated = 0
			RETURNING pool_cidr_id, parent_cidr, cidr`, ids); err != nil {
			return err
		}
		released = int64(len(ids))
		return nil
	})
	return released, err
}
