// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// topUpKey is a node pool family an allocation leased from.
type topUpKey struct {
	space, node, pool string
	family            alloc.Family
}

// topUps is the work the top-up has not done yet: the node pool families
// allocations leased from since its last pass, with how many leases each.
type topUps struct {
	// wake holds a token while a pass is due.
	wake chan struct{}

	mu    sync.Mutex // protects noted
	noted map[topUpKey]int64
}

// topUpHorizon is how many passes' worth of its recent leases a node pool's
// capacity is topped up for, on top of its need: a node leasing faster
// than one pre-allocation per pass finds its next blocks carved when it
// reaches them, instead of carving them on its allocations' path.
const topUpHorizon = 2

// newTopUps answers the top-up's work list, nil when on is false.
func newTopUps(on bool) *topUps {
	if !on {
		return nil
	}
	return &topUps{wake: make(chan struct{}, 1), noted: map[topUpKey]int64{}}
}

// note records, for the top-up, the node pool families of an allocation
// that succeeded (err nil) and leased (Created: a retry answered with held
// leases adds no demand), and wakes the top-up. It never blocks: a pass
// already due reads this note as well. A nil receiver (Options.TopUp off)
// notes nothing.
func (t *topUps) note(a alloc.Allocation, err error) {
	if t == nil || err != nil || !a.Created {
		return
	}
	t.add(a.Leases)
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// add records the node pool families of leases.
func (t *topUps) add(leases []alloc.Lease) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range leases {
		t.noted[topUpKey{space: l.Space, node: l.Node, pool: l.Pool, family: l.Family}]++
	}
}

// take answers the noted node pool families, with their leases since the
// last pass, and forgets them.
func (t *topUps) take() map[topUpKey]int64 {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := maps.Clone(t.noted)
	clear(t.noted)
	return keys
}

// keep notes keys again, without waking the top-up: the next allocation's
// note does.
func (t *topUps) keep(keys map[topUpKey]int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, n := range keys {
		t.noted[k] += n
	}
}

// carveCounts count the blocks this store carved by who carved them.
type carveCounts struct {
	// inline counts the blocks allocations carved on the lease path
	// (the allocation's carve and lease steps).
	inline atomic.Int64
	// topUp and rebalance count the blocks the top-up and Rebalance
	// carved ahead of demand.
	topUp, rebalance atomic.Int64
}

// Carves is what a store's allocations, top-up and Rebalance carved since
// it opened.
type Carves struct {
	// Inline counts the blocks allocations carved on the lease path, for
	// a node without a free address they could take: none left (the
	// top-up fell behind, or is off), or every one in blocks its
	// concurrent allocations held (a busy node gets one block more rather
	// than queueing on one; see carveUnlessFreeRoom).
	Inline int64
	// TopUp and Rebalance count the blocks carved ahead of demand by the
	// top-up (RunTopUps, TopUpPending) and by Rebalance.
	TopUp, Rebalance int64
}

// Carves answers the counts of this store (this replica) since it opened.
// It takes no connection.
func (s *Store) Carves() Carves {
	return Carves{Inline: s.carves.inline.Load(), TopUp: s.carves.topUp.Load(), Rebalance: s.carves.rebalance.Load()}
}

// ToppedUp is what one top-up pass did.
type ToppedUp struct {
	// NodePools counts the noted node pool families the pass read.
	NodePools int64
	// Carved counts the blocks it carved.
	Carved int64
	// InDeficit counts node pools still short of their need afterwards
	// (see Rebalanced.InDeficit).
	InDeficit int64
}

// notedUsageSQL is nodePoolUsageSQL for the node pool families listed by
// @spaces, @nodes, @pools and @families, each read by its
// indexes: the pool and the node by name, the node's blocks of the pool
// family by blocks_node_pool. A node or pool the space no longer has is
// not answered.
const notedUsageSQL = `WITH k AS (
		SELECT DISTINCT * FROM unnest(@spaces::text[], @nodes::text[], @pools::text[], @families::smallint[]) AS k (space, node, pool, family)
	), mp AS (
		` + poolFamiliesSQL + ` AND (p.space, p.name) IN (SELECT space, pool FROM k)
	)
	SELECT ` + nodeUsageColumnsSQL + `
	FROM k JOIN mp ON mp.space = k.space AND mp.name = k.pool AND mp.family = k.family
	JOIN nodes n ON n.space = k.space AND n.name = k.node
	CROSS JOIN LATERAL (
		SELECT count(*) AS blocks, sum(b.capacity) AS capacity, sum(b.allocated) AS demand FROM blocks b
		WHERE b.node_id = n.id AND b.pool_id = mp.id AND b.family = mp.family
	) u
	ORDER BY mp.space, n.name, mp.name, mp.family`

// notedUsage reads the usage of the node pool families keys in one
// statement.
// Each row expects topUpHorizon times the leases noted for it.
func (s *Store) notedUsage(ctx context.Context, keys map[topUpKey]int64) ([]nodeUsageRow, error) {
	var spaces, nodes, pools []string
	var families []int16
	for k := range keys {
		spaces, nodes, pools, families = append(spaces, k.space), append(nodes, k.node), append(pools, k.pool), append(families, int16(k.family))
	}
	rows, err := s.queryNodeUsage(ctx, s.db, notedUsageSQL,
		namedArgs{"spaces": spaces, "nodes": nodes, "pools": pools, "families": families})
	for i, u := range rows {
		rows[i].Expected = topUpHorizon * keys[topUpKey{space: u.Space, node: u.Node, pool: u.Pool, family: u.Family}]
	}
	return rows, err
}

// TopUpPending runs, now, the top-up's pass over the node pool families
// that allocations noted since the last pass (Options.TopUp): it reads
// their usage in one statement, and where a multi-pool node pool's
// capacity is below its need, NeededIPCeil(demand + expected, preAllocate)
// with expected topUpHorizon times the leases noted for it, it carves
// the blocks that cover the deficit as Rebalance does (topUp: the pool
// family's CIDR rows are locked and the node's blocks read again under
// that lock, so no block is carved twice, whatever other replicas and
// allocations carve meanwhile). Cluster-pool pools and AgentPoolsSpace are
// left alone, as Rebalance leaves them; a node or pool deleted meanwhile
// is skipped. A pool that is full or disabled, or a node at its block
// limit, leaves the node pool in deficit (InDeficit), which is not an
// error.
//
// On an error, the node pool families of the pass are noted again for the
// next one. RunTopUps calls it as allocations note; tests call it to run
// the top-up's work at a point of their choosing.
func (s *Store) TopUpPending(ctx context.Context) (ToppedUp, error) {
	keys := s.topUps.take()
	if len(keys) == 0 {
		return ToppedUp{}, nil
	}
	usage, err := s.notedUsage(ctx, keys)
	if err != nil {
		s.topUps.keep(keys)
		return ToppedUp{}, err
	}
	out, err := s.topUpRows(ctx, usage)
	if err != nil {
		s.topUps.keep(keys)
	}
	return out, err
}

// topUpRows tops up the node pools of usage that are short of their need,
// one pool family at a time (topUp).
func (s *Store) topUpRows(ctx context.Context, usage []nodeUsageRow) (ToppedUp, error) {
	out := ToppedUp{NodePools: int64(len(usage))}
	type poolFamily struct {
		space, pool string
		family      alloc.Family
	}
	var order []poolFamily
	short := map[poolFamily][]nodeUsageRow{}
	for _, u := range usage {
		if !s.sizesBlocks(u) || u.Deficit() <= 0 {
			continue
		}
		k := poolFamily{u.Space, u.Pool, u.Family}
		if short[k] == nil {
			order = append(order, k)
		}
		short[k] = append(short[k], u)
	}
	for _, k := range order {
		n, inDeficit, err := s.topUp(ctx, short[k])
		out.Carved, out.InDeficit = out.Carved+n, out.InDeficit+inDeficit
		s.carves.topUp.Add(n)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// RunTopUps runs the top-up until ctx ends: a pass (TopUpPending) as soon
// as an allocation notes its node pool, and then at most one pass every
// interval, so that what allocations note meanwhile is read in one
// statement (as Cilium's operator works its queue on demand, at most once a
// second). report gets each pass and its error (nil when ctx ended it).
// Without Options.TopUp it only waits for ctx to end. The store's changes
// are recorded as alloc.ActorSystem's.
func (s *Store) RunTopUps(ctx context.Context, interval time.Duration, report func(context.Context, ToppedUp, error)) {
	if s.topUps == nil {
		<-ctx.Done()
		return
	}
	ctx = alloc.WithActor(ctx, alloc.ActorSystem)
	pace := time.NewTimer(interval)
	pace.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.topUps.wake:
		}
		r, err := s.TopUpPending(ctx)
		if ctx.Err() != nil {
			err = nil
		}
		report(ctx, r, err)
		pace.Reset(interval)
		select {
		case <-ctx.Done():
			return
		case <-pace.C:
		}
	}
}
