// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// NodeTotals is one node's use of all its pools, in Cilium operator's
// terms: Available is what the node holds (the leasable addresses of its
// blocks), Used what of that is taken (leased, pending, or released and
// not free yet), Needed the addresses it lacks to meet its pools' need
// (the sum of the deficits).
type NodeTotals struct {
	Space, Node             string
	Available, Used, Needed int64
	// InDeficit: some multi-pool pool family of the node is below its need.
	InDeficit bool
	// AtCapacity: in some pool family the node holds blocks of, none has a
	// free address.
	AtCapacity bool
	// For a node served in Cilium's crd mode, in Cilium's terms:
	// CiliumPool is how many addresses its CiliumNode's pool holds
	// (reserved and used), CiliumUsed how many of them Pods use. Both
	// count within Used.
	CiliumPool, CiliumUsed int64
}

// PoolFamilyReport is the capacity report of one family of one pool.
type PoolFamilyReport struct {
	Space, Pool string
	Family      alloc.Family
	alloc.FamilyCapacity
}

// UsageReport is the service-wide picture the metrics export: every node
// and every pool family, from one snapshot.
type UsageReport struct {
	Nodes []NodeTotals
	Pools []PoolFamilyReport
	// LBPools are the VIP pools, LBOwners each space's VIP owners.
	LBPools  []LBPoolReport
	LBOwners []LBOwnersReport
}

// LBPoolReport is one VIP pool in Cilium's LB IPAM terms: addresses
// available and used over its families (at most math.MaxInt64).
type LBPoolReport struct {
	Space, Pool     string
	Conflicting     bool
	Available, Used int64
}

// LBOwnersReport counts a space's VIP owners (Cilium's services matching
// LB IPAM) and those whose last request was not satisfied.
type LBOwnersReport struct {
	Space                 string
	Matching, Unsatisfied int64
}

// UsageReport reads every node's totals and every pool family's capacity
// (with the forecast over window) in one read-only snapshot. Its cost
// grows with nodes, blocks and pools, not with leases: it reads the
// blocks' lease counters and the released rows only.
func (s *Store) UsageReport(ctx context.Context, window time.Duration) (UsageReport, error) {
	var out UsageReport
	err := s.readSnapshot(ctx, func(tx querier) error {
		out = UsageReport{}
		rows, err := tx.Query(ctx, `SELECT space, name FROM nodes ORDER BY space, name`)
		if err != nil {
			return err
		}
		out.Nodes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (NodeTotals, error) {
			var n NodeTotals
			return n, r.Scan(&n.Space, &n.Node)
		})
		if err != nil {
			return err
		}
		usage, err := s.nodePoolUsage(ctx, tx, nil, nil, nil)
		if err != nil {
			return err
		}
		type key struct{ space, node string }
		index := make(map[key]int, len(out.Nodes))
		for i, n := range out.Nodes {
			index[key{n.Space, n.Node}] = i
		}
		for _, u := range usage {
			i, ok := index[key{u.Space, u.Node}]
			if !ok {
				continue
			}
			n := &out.Nodes[i]
			n.Available += u.Capacity
			n.Used += u.Demand()
			n.Needed += u.Deficit()
			n.InDeficit = n.InDeficit || u.Deficit() > 0
			n.AtCapacity = n.AtCapacity || u.AtCapacity()
		}
		// The nodes served in crd mode are few next to the leases: one
		// probe of leases_attachment each.
		rows, err = tx.Query(ctx, `SELECT n.space, n.name, count(*), count(*) FILTER (WHERE l.state = 'active')
			FROM nodes n JOIN leases l ON l.node_id = n.id AND l.network = $1 AND l.state <> 'released'
			WHERE n.cilium_crd GROUP BY n.space, n.name`, alloc.CiliumPoolNetwork)
		if err != nil {
			return err
		}
		var k key
		var held, used int64
		if _, err := pgx.ForEachRow(rows, []any{&k.space, &k.node, &held, &used}, func() error {
			if i, ok := index[k]; ok {
				out.Nodes[i].CiliumPool, out.Nodes[i].CiliumUsed = held, used
			}
			return nil
		}); err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `SELECT `+poolColumns+` FROM pools p ORDER BY p.space, p.name`)
		if err != nil {
			return err
		}
		pools, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (poolRow, error) { return scanPool(r) })
		if err != nil {
			return err
		}
		for _, p := range pools {
			c, err := s.poolCapacity(ctx, tx, p, usage, window)
			if err != nil {
				return err
			}
			for _, f := range p.Spec.Families() {
				out.Pools = append(out.Pools, PoolFamilyReport{Space: p.Space, Pool: p.Name, Family: f, FamilyCapacity: c[f]})
			}
		}
		return s.lbReport(ctx, tx, &out)
	})
	return out, err
}

// lbReport adds the VIP pools and owners to out: a row per pool and per
// space, whatever the number of VIPs.
func (s *Store) lbReport(ctx context.Context, tx querier, out *UsageReport) error {
	rows, err := tx.Query(ctx, `SELECT `+lbPoolColumns+` FROM lb_pools p ORDER BY p.space, p.name`)
	if err != nil {
		return err
	}
	lbs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lbPoolRow, error) { return scanLBPool(r) })
	if err != nil {
		return err
	}
	for _, p := range lbs {
		r := LBPoolReport{Space: p.Space, Pool: p.Name, Conflicting: p.Status.Conflicting()}
		for _, st := range p.Status.Families {
			r.Available = alloc.SaturatingAdd(r.Available, st.Available())
			r.Used += st.Used
		}
		out.LBPools = append(out.LBPools, r)
	}
	rows, err = tx.Query(ctx, `SELECT space, count(*), count(*) FILTER (WHERE NOT satisfied) FROM vip_owners GROUP BY space ORDER BY space`)
	if err != nil {
		return err
	}
	out.LBOwners, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (LBOwnersReport, error) {
		var o LBOwnersReport
		return o, r.Scan(&o.Space, &o.Matching, &o.Unsatisfied)
	})
	return err
}
