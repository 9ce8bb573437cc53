// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Blocks of nodes whose agent allocates inside them itself: Cilium's agent
// in its cluster-pool and multi-pool modes, whose operator internal/cilium
// plays. The store has no lease in such a block; it knows the block is the
// node's, and, in multi-pool mode, whether the agent still holds it
// (blocks.emptied_at is NULL) or gave it back (emptied_at is when: the
// block became empty of the agent's Pods then, in the column's own sense).

// reasonAgentPools is the history's reason for changes an agent's
// CiliumNode asked for.
const reasonAgentPools = "agent-pools"

// registerNode resolves the node, registering it when unknown whatever
// AutoRegisterNodes says: the operator registers the nodes it serves.
func (s *Store) registerNode(ctx context.Context, tx querier, space, name string, now time.Time) (int64, error) {
	if err := alloc.ValidateNodeName("node", name); err != nil {
		return 0, err
	}
	for range 3 {
		id, err := s.nodeID(ctx, tx, space, name)
		if !alloc.IsKind(err, alloc.KindNotFound) {
			return id, err
		}
		if e := (*alloc.Error)(nil); errors.As(err, &e) && e.Field == "space" {
			return 0, err
		}
		err = tx.QueryRow(ctx, `INSERT INTO nodes (space, name, created_at, updated_at) VALUES ($1, $2, $3, $3)
			ON CONFLICT (space, name) DO NOTHING RETURNING id`, space, name, now).Scan(&id)
		if !errors.Is(err, pgx.ErrNoRows) {
			return id, err
		}
		// Registered concurrently (and maybe deleted again): read it.
	}
	return 0, fmt.Errorf("registering node %q: it keeps being deleted", name)
}

// ClusterPoolBlocks gives a node its one block per family of a cluster-pool
// pool, as Cilium's cluster-pool operator fills spec.ipam.podCIDRs: it
// registers the node when unknown, adopts the CIDRs the node already lists
// (podCIDRs, each of the pool and of its mask, as PutNode adopts a
// Kubernetes-assigned one; a node holding other blocks of the pool is
// refused with Cilium's conflict message), and carves each family the node
// lacks, in a transaction of its own. It answers the node's blocks of the
// pool, IPv4 first; when the pool cannot give a family, it answers the
// blocks the node has with the KindPoolExhausted (or KindNodeBlockLimit)
// error.
func (s *Store) ClusterPoolBlocks(ctx context.Context, space, node, pool string, podCIDRs []netip.Prefix) ([]netip.Prefix, error) {
	nodeID, fams, err := s.adoptClusterPoolBlocks(ctx, space, node, pool, podCIDRs)
	if err != nil {
		return nil, err
	}
	var short error
	for _, f := range fams {
		err := s.inTxWhy(ctx, reasonRegistration, func(tx querier) error {
			p, err := s.allocPool(ctx, tx, space, pool)
			if err != nil || !p.has(f) {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT id FROM pool_cidrs WHERE pool_id = $1 AND family = $2 ORDER BY position FOR NO KEY UPDATE`,
				p.id, int16(f)); err != nil {
				return err
			}
			if have, err := nodeBlocksOf(ctx, tx, nodeID, p.id, f); err != nil || len(have) > 0 {
				return err
			}
			_, ok, err := carve(ctx, tx, carving{space: space, node: nodeID, pool: p, family: f, now: s.now()}, carveAlways)
			if err == nil && !ok {
				err = alloc.Exhausted(pool, f)
			}
			return err
		})
		switch {
		case alloc.IsKind(err, alloc.KindPoolExhausted) || alloc.IsKind(err, alloc.KindNodeBlockLimit):
			if short == nil {
				short = err
			}
		case err != nil:
			return nil, err
		}
	}
	var have []netip.Prefix
	err = s.db.QueryRow(ctx, `SELECT coalesce(array_agg(b.cidr ORDER BY b.family, b.cidr), '{}') FROM blocks b
		JOIN pools p ON p.id = b.pool_id WHERE b.node_id = $1 AND p.space = $2 AND p.name = $3`, nodeID, space, pool).Scan(&have)
	if err != nil {
		return nil, err
	}
	return have, short
}

// RestoreClusterPoolBlocks only adopts the CIDRs a node lists (podCIDRs)
// as its blocks of the cluster-pool pool, carving nothing: the restore a
// new operator runs over every CiliumNode before it carves for any (as
// Cilium's cluster-pool allocator occupies every listed CIDR before it
// allocates), so that a CIDR one node lists is never carved for another.
// A CIDR held by another node is refused with KindConflict.
func (s *Store) RestoreClusterPoolBlocks(ctx context.Context, space, node, pool string, podCIDRs []netip.Prefix) error {
	_, _, err := s.adoptClusterPoolBlocks(ctx, space, node, pool, podCIDRs)
	return err
}

// adoptClusterPoolBlocks registers node and adopts podCIDRs as its blocks
// of the cluster-pool pool, in one transaction; it answers the node and
// the pool's families it still holds no block of.
func (s *Store) adoptClusterPoolBlocks(ctx context.Context, space, node, pool string, podCIDRs []netip.Prefix) (int64, []alloc.Family, error) {
	if err := validatePodCIDRs(podCIDRs); err != nil {
		return 0, nil, err
	}
	var nodeID int64
	var fams []alloc.Family // the pool's families the node holds no block of
	err := s.inTxWhy(ctx, reasonRegistration, func(tx querier) error {
		now := s.now()
		var err error
		if nodeID, err = s.registerNode(ctx, tx, space, node, now); err != nil {
			return err
		}
		// Its agent uses the cluster pool alone: no multi-pool pool
		// pre-allocates for it (nodePoolUsageSQL).
		if _, err := tx.Exec(ctx, `UPDATE nodes SET cilium_cluster_pool = true WHERE id = $1 AND NOT cilium_cluster_pool`, nodeID); err != nil {
			return err
		}
		p, err := s.allocPool(ctx, tx, space, pool)
		if err != nil {
			return err
		}
		if p.mode != alloc.ModeClusterPool {
			return alloc.Invalid("pool", "pool %q is a %s pool; Cilium's cluster-pool mode gives each node one block per family of a cluster-pool pool", pool, p.mode)
		}
		for i, c := range podCIDRs {
			var in bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pool_cidrs WHERE pool_id = $1 AND cidr >>= $2)`, p.id, c).Scan(&in); err != nil {
				return err
			}
			if !in {
				return alloc.Invalid(fmt.Sprintf("podCIDRs[%d]", i), "%s lies in no CIDR of the cluster pool %q", c, pool)
			}
		}
		if err := s.adopt(ctx, tx, space, nodeID, podCIDRs, now); err != nil {
			return err
		}
		// The common case, a node served before, takes no carve lock.
		fams = nil
		for _, f := range p.families() {
			have, err := nodeBlocksOf(ctx, tx, nodeID, p.id, f)
			if err != nil {
				return err
			}
			if len(have) == 0 {
				fams = append(fams, f)
			}
		}
		return nil
	})
	return nodeID, fams, err
}

// agentBlockRow is a node's block of a multi-pool pool.
type agentBlockRow struct {
	id int64
	alloc.AgentBlock
	family                alloc.Family
	allowFirst, allowLast bool
	allocated             int64 // lease rows (none unless leased through the API too)
}

// agentBlocks reads the node's blocks of multi-pool pools, by pool, family
// and CIDR; with lock, it locks them.
func agentBlocks(ctx context.Context, q querier, nodeID int64, lock bool) ([]agentBlockRow, error) {
	sql := `SELECT b.id, p.name, b.cidr, b.emptied_at, b.family, p.allow_first_ip, p.allow_last_ip, b.allocated
		FROM blocks b JOIN pools p ON p.id = b.pool_id
		WHERE b.node_id = $1 AND p.mode = 'multi-pool' ORDER BY p.name, b.family, b.cidr`
	if lock {
		sql += ` FOR NO KEY UPDATE OF b`
	}
	rows, err := q.Query(ctx, sql, nodeID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (agentBlockRow, error) {
		var b agentBlockRow
		var returned *time.Time
		var fam int16
		err := r.Scan(&b.id, &b.Pool, &b.CIDR, &returned, &fam, &b.allowFirst, &b.allowLast, &b.allocated)
		if returned != nil {
			b.ReturnedAt = *returned
		}
		b.family = alloc.Family(fam)
		return b, err
	})
}

// SyncAgentPools brings a node's blocks of multi-pool pools in line with
// what its agent reports (Cilium's spec.ipam.pools), as Cilium's
// multi-pool operator does, registering the node when unknown:
//   - a block the agent no longer lists, it gave back: the block stays the
//     node's for the hold-off (BlockReleaseHoldOff), then goes back to its
//     pool; a returned block the agent lists again is its own again;
//   - a CIDR the agent lists that the node does not hold is adopted when
//     it is a free block of the pool it is listed under (as Cilium's
//     operator occupies the CIDRs of a CiliumNode it finds);
//   - where the blocks of a requested pool family give fewer addresses
//     (alloc.CiliumBlockAddrs) than the agent needs, the node takes back
//     its returned blocks of it, then gets new ones carved, until covered.
//
// Each pool family is its own transaction. A need the store cannot meet,
// or a CIDR it cannot adopt, is no error: it is in the answer's Errors,
// and the rest is done. The answer lists the blocks the agent is to list,
// and when the first returned block's hold-off ends: ReleaseReturnedBlocks
// then gives it back to its pool.
func (s *Store) SyncAgentPools(ctx context.Context, space, node string, r alloc.AgentPools) (alloc.AgentPoolsState, error) {
	var st alloc.AgentPoolsState
	var nodeID int64
	var blocks []agentBlockRow
	err := s.inTxWhy(ctx, reasonAgentPools, func(tx querier) error {
		st.Errors = nil
		now := s.now()
		var err error
		if nodeID, err = s.registerNode(ctx, tx, space, node, now); err != nil {
			return err
		}
		if blocks, err = agentBlocks(ctx, tx, nodeID, true); err != nil {
			return err
		}
		node := make([]alloc.AgentBlock, len(blocks))
		for i, b := range blocks {
			node[i] = b.AgentBlock
		}
		d := alloc.DiffAgentBlocks(node, r.Allocated)
		if err := setReturned(ctx, tx, blocks, d.Return, &now); err != nil {
			return err
		}
		if err := setReturned(ctx, tx, blocks, d.Retake, nil); err != nil {
			return err
		}
		for _, a := range d.Adopt {
			if err := s.adoptAgentCIDR(ctx, tx, space, nodeID, a, now); err != nil {
				var ae *alloc.Error
				if !errors.As(err, &ae) {
					return err
				}
				st.Errors = append(st.Errors, ae)
			}
		}
		blocks, err = agentBlocks(ctx, tx, nodeID, false)
		return err
	})
	if err != nil {
		return st, err
	}
	for _, req := range slices.SortedFunc(slices.Values(r.Requested), func(a, b alloc.PoolRequest) int {
		return strings.Compare(a.Pool, b.Pool)
	}) {
		for _, f := range alloc.Families {
			need := req.Need(f)
			if need <= 0 || agentHeld(blocks, req.Pool, f) >= need {
				continue
			}
			short, err := s.coverAgentNeed(ctx, space, nodeID, req.Pool, f, need)
			if err != nil {
				return st, err
			}
			if short != nil {
				st.Errors = append(st.Errors, short)
			}
		}
	}
	if blocks, err = agentBlocks(ctx, s.db, nodeID, false); err != nil {
		return st, err
	}
	for _, b := range blocks {
		if b.Returned() {
			if _, at := b.ReleaseDue(s.now(), s.opts.BlockReleaseHoldOff); st.NextRelease.IsZero() || at.Before(st.NextRelease) {
				st.NextRelease = at
			}
			continue
		}
		if n := len(st.Pools); n == 0 || st.Pools[n-1].Pool != b.Pool {
			st.Pools = append(st.Pools, alloc.AgentPool{Pool: b.Pool, AllowFirstIP: b.allowFirst, AllowLastIP: b.allowLast})
		}
		p := &st.Pools[len(st.Pools)-1]
		p.CIDRs = append(p.CIDRs, b.CIDR)
	}
	return st, nil
}

// ReleaseReturnedBlocks gives the blocks a node's agent returned back to
// their pools once their hold-off has passed, unless listed (the agent's
// spec.ipam.pools.allocated as read just now) names them again: the caller
// reads the CiliumNode afresh first, so a stale copy of it never releases
// a block the agent holds (a stale copy may lack a block the operator
// wrote since). It answers when the next returned block's hold-off ends
// (zero: none is left).
func (s *Store) ReleaseReturnedBlocks(ctx context.Context, space, node string, listed []netip.Prefix) (time.Time, error) {
	var next time.Time
	err := s.inTxWhy(ctx, reasonBlockReleased, func(tx querier) error {
		next = time.Time{}
		nodeID, err := s.nodeID(ctx, tx, space, node)
		if alloc.IsKind(err, alloc.KindNotFound) {
			return nil
		} else if err != nil {
			return err
		}
		blocks, err := agentBlocks(ctx, tx, nodeID, true)
		if err != nil {
			return err
		}
		now := s.now()
		var due []int64
		for _, b := range blocks {
			if !b.Returned() || b.allocated > 0 || slices.Contains(listed, b.CIDR) {
				continue
			}
			if ok, at := b.ReleaseDue(now, s.opts.BlockReleaseHoldOff); ok {
				due = append(due, b.id)
			} else if next.IsZero() || at.Before(next) {
				next = at
			}
		}
		if len(due) == 0 {
			return nil
		}
		if err := lockCarveRowsOf(ctx, tx, `id = ANY (@blocks)`, namedArgs{"blocks": due}); err != nil {
			return err
		}
		return deleteBlocks(ctx, tx, `DELETE FROM blocks WHERE id = ANY ($1) AND allocated = 0
			RETURNING pool_cidr_id, parent_cidr, cidr`, due)
	})
	return next, err
}

// agentHeld is the addresses the node's blocks of a pool family give its
// agent, returned blocks left out.
func agentHeld(blocks []agentBlockRow, pool string, f alloc.Family) int64 {
	var n int64
	for _, b := range blocks {
		if b.Pool == pool && b.family == f && !b.Returned() {
			n = satAdd(n, alloc.CiliumBlockAddrs(b.CIDR, b.allowFirst, b.allowLast))
		}
	}
	return n
}

// satAdd adds non-negative counts, saturating (IPv6 blocks of /64).
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return int64(^uint64(0) >> 1)
}

// setReturned marks the blocks of which (rows of blocks) returned at *at,
// or held again when at is nil.
func setReturned(ctx context.Context, tx querier, blocks []agentBlockRow, which []alloc.AgentBlock, at *time.Time) error {
	if len(which) == 0 {
		return nil
	}
	var ids []int64
	for _, w := range which {
		for _, b := range blocks {
			if b.CIDR == w.CIDR {
				ids = append(ids, b.id)
			}
		}
	}
	_, err := tx.Exec(ctx, `UPDATE blocks SET emptied_at = $2 WHERE id = ANY ($1)`, ids, at)
	return err
}

// adoptAgentCIDR makes a CIDR the agent lists under a pool the node's
// block: it must be a block of the pool (inside one of its CIDRs, of its
// mask) that no other block overlaps, and within the node's block limit.
// A refusal is an *alloc.Error naming Pool and Family.
func (s *Store) adoptAgentCIDR(ctx context.Context, tx querier, space string, nodeID int64, a alloc.PoolCIDR, now time.Time) error {
	f := alloc.FamilyOf(a.CIDR.Addr())
	refuse := func(k alloc.Kind, format string, args ...any) error {
		return &alloc.Error{Kind: k, Field: "cidr", Pool: a.Pool, Family: f, Detail: fmt.Sprintf(format, args...)}
	}
	p, err := s.allocPool(ctx, tx, space, a.Pool)
	if alloc.IsKind(err, alloc.KindNotFound) {
		return refuse(alloc.KindNotFound, "unable to find pool %s, prefix %s is still allocated to the node", a.Pool, a.CIDR)
	} else if err != nil {
		return err
	}
	if p.mode != alloc.ModeMultiPool {
		return refuse(alloc.KindInvalid, "cidr %s is listed under pool %s, which is a %s pool", a.CIDR, a.Pool, p.mode)
	}
	// The CIDR rows first, as carving locks them: the block limit and the
	// free space are read under that lock.
	rows, err := tx.Query(ctx, `SELECT id, cidr, mask_size FROM pool_cidrs WHERE pool_id = $1 AND family = $2
		ORDER BY position FOR NO KEY UPDATE`, p.id, int16(f))
	if err != nil {
		return err
	}
	parents, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (carveParent, error) {
		var pc carveParent
		return pc, r.Scan(&pc.id, &pc.cidr, &pc.mask)
	})
	if err != nil {
		return err
	}
	i := slices.IndexFunc(parents, func(pc carveParent) bool { return pc.cidr.Contains(a.CIDR.Addr()) && pc.cidr.Bits() <= a.CIDR.Bits() })
	if i < 0 {
		return refuse(alloc.KindInvalid, "cidr %s is not part of the requested pool", a.CIDR)
	}
	parent := parents[i]
	if int(parent.mask) != a.CIDR.Bits() {
		return refuse(alloc.KindInvalid, "cidr %s is a /%d; pool %s carves /%d blocks", a.CIDR, a.CIDR.Bits(), a.Pool, parent.mask)
	}
	var owner string
	var other netip.Prefix
	err = tx.QueryRow(ctx, `SELECT n.name, b.cidr FROM blocks b JOIN nodes n ON n.id = b.node_id
		WHERE b.space = $1 AND b.cidr && $2 LIMIT 1`, space, a.CIDR).Scan(&owner, &other)
	if err == nil {
		e := refuse(alloc.KindOverlap, "cidr %s has already been allocated (block %s of node %s)", a.CIDR, other, owner).(*alloc.Error)
		e.Nodes = []string{owner}
		return e
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	if err := checkBlockLimit(ctx, tx, nodeID, p, f, 1); err != nil {
		return err
	}
	// An exclusion violation (a block carved meanwhile) makes inTx retry,
	// and the retry sees the overlap.
	_, err = insertBlock(ctx, tx, space, nodeID, p, f, parent.id, parent.cidr, a.CIDR, now, blockAdopted)
	return err
}

// coverAgentNeed gives the node's blocks of a pool family need addresses:
// holding them and the pool family's carve lock, it reads them again,
// takes back returned ones, then carves, in one transaction. A need it cannot meet is
// answered as short (an *alloc.Error naming Pool and Family), with what it
// could do committed.
func (s *Store) coverAgentNeed(ctx context.Context, space string, nodeID int64, pool string, f alloc.Family, need int64) (short *alloc.Error, err error) {
	err = s.inTxWhy(ctx, reasonAgentPools, func(tx querier) error {
		short = nil
		p, err := s.allocPool(ctx, tx, space, pool)
		var ae *alloc.Error
		if errors.As(err, &ae) && ae.Kind == alloc.KindNotFound {
			short = &alloc.Error{Kind: alloc.KindNotFound, Field: "pool", Pool: pool, Family: f,
				Detail: "cannot allocate from non-existing pool: " + pool}
			return nil
		} else if err != nil {
			return err
		}
		switch {
		case p.mode != alloc.ModeMultiPool:
			short = &alloc.Error{Kind: alloc.KindInvalid, Field: "pool", Pool: pool, Family: f,
				Detail: fmt.Sprintf("pool %s is a %s pool; multi-pool mode allocates from multi-pool pools", pool, p.mode)}
			return nil
		case !p.has(f):
			short = &alloc.Error{Kind: alloc.KindPoolExhausted, Field: "pool", Pool: pool, Family: f,
				Detail: fmt.Sprintf("pool empty: pool %s has no %s CIDRs", pool, f)}
			return nil
		}
		// The node's blocks, then the pool family's CIDR rows: the order
		// DeleteNode and the block release take them in.
		blocks, err := agentBlocks(ctx, tx, nodeID, true)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT id FROM pool_cidrs WHERE pool_id = $1 AND family = $2 ORDER BY position FOR NO KEY UPDATE`,
			p.id, int16(f)); err != nil {
			return err
		}
		var returned []agentBlockRow
		var returnedAddrs []int64
		for _, b := range blocks {
			if b.Pool == pool && b.family == f && b.Returned() {
				returned = append(returned, b)
				returnedAddrs = append(returnedAddrs, alloc.CiliumBlockAddrs(b.CIDR, b.allowFirst, b.allowLast))
			}
		}
		mask := int(*p.mask(f))
		base := netip.PrefixFrom(netip.IPv4Unspecified(), mask)
		if f == alloc.IPv6 {
			base = netip.PrefixFrom(netip.IPv6Unspecified(), mask)
		}
		retake, carves := alloc.BlocksToCover(need, agentHeld(blocks, pool, f), returnedAddrs,
			alloc.CiliumBlockAddrs(base, p.allowFirst, p.allowLast))
		if retake > 0 {
			var which []alloc.AgentBlock
			for _, b := range returned[:retake] {
				which = append(which, b.AgentBlock)
			}
			if err := setReturned(ctx, tx, blocks, which, nil); err != nil {
				return err
			}
		}
		now := s.now()
		for range carves {
			_, ok, err := carve(ctx, tx, carving{space: space, node: nodeID, pool: p, family: f, now: now}, carveAlways)
			if errors.As(err, &ae) {
				short = ae
				return nil
			} else if err != nil {
				return err
			}
			if !ok {
				short = &alloc.Error{Kind: alloc.KindPoolExhausted, Field: "pool", Pool: pool, Family: f,
					Detail: fmt.Sprintf("pool empty: pool %s has no free %s block", pool, f)}
				return nil
			}
		}
		return nil
	})
	return short, err
}

// AgentNodes names the nodes of a space that hold blocks of pools of the
// mode and no lease: those an operator of that Cilium mode serves (its
// agents allocate themselves, so the store has no lease of theirs). The
// operator reconciles those whose CiliumNode is gone as deleted.
func (s *Store) AgentNodes(ctx context.Context, space string, mode alloc.PoolMode) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT n.name FROM nodes n WHERE n.space = $1
		AND EXISTS (SELECT 1 FROM blocks b JOIN pools p ON p.id = b.pool_id WHERE b.node_id = n.id AND p.mode = $2)
		AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.node_id = n.id AND l.state <> 'released')
		ORDER BY n.name`, space, mode)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
