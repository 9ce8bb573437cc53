// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// The fill curve's bulk path. The leases of the fill points are written
// straight into the tables, as the service would have written them had
// fill-node-NNNNN asked for them one by one, because 550,000 allocations
// through the API take about ten minutes.
//
// They live in an address space of their own, with a pool, a CIDR and nodes
// of their own. The tables and their indexes hold every fill lease (the
// address index is one B-tree over (space, addr) for all spaces), so the
// measured allocations go through indexes of that size; but no pool of the
// measured space touches the fill nodes. (In the measured space, the
// default pool's pre-allocation would make the service's rebalancing carve
// a block for each of the 5,000 fill nodes in the background, during the
// measured runs.)
//
// Per node the loader writes, in one transaction per batch of nodes:
//
//   - the node row (nodes: space, name, timestamps);
//   - one block, number i of the fill CIDR for node i, with the layout
//     alloc.BlockLayout gives the pool's settings (first/last offsets,
//     reserved node-local offsets, router/health/ingress, capacity), as
//     the service's carve does, source 'carved';
//   - perNode active leases at the block's first leasable offsets (state
//     'active', confirmed_at set, expires_at NULL, selected_by 'request',
//     container fill-J, interface eth0, owner fill/fill-J);
//   - the block's counters as leasing them would have left them:
//     allocated = its lease rows, next_offset = one past the last offset
//     leased (wrapping to first_offset);
//
// and moves the CIDR's carve cursor past the blocks. Every constraint of
// migrations/ holds throughout (foreign keys, CHECKs, the exclusion
// constraint, the unique address), since the rows go through them. Then
// ANALYZE, so the planner sees the tables as they are.
const (
	fillPool = "bench-fill"
	// fillCIDR holds 16,384 blocks of /24: room for 5,000 nodes and more.
	fillCIDR = "100.64.0.0/10"
	fillMask = 24
	// fillPerNode is Kubernetes' default Pod limit per node.
	fillPerNode = 110
	// fillBatchNodes is the nodes (and their leases) per transaction.
	fillBatchNodes = 500
)

// fillNodeName is the name of fill node i.
func fillNodeName(i int) string { return fmt.Sprintf("fill-node-%05d", i) }

// fillNodeSQL is fillNodeName in SQL, of the integer expression i.
func fillNodeSQL(i string) string {
	return `format('fill-node-%s', lpad((` + i + `)::text, 5, '0'))`
}

// fillLayout is what the loader needs of the pool: its ids and the layout
// every block of its mask has.
type fillLayout struct {
	poolID, cidrID int64
	cidr           netip.Prefix
	mask           int
	blocks         int64 // blocks the CIDR holds
	layout         alloc.Layout
	// offsets are the first leasable offsets of a block, in the order the
	// service leases them.
	offsets []int64
}

// readFillLayout reads the pool's only IPv4 CIDR and settings and computes
// the layout of its blocks with the service's own alloc.BlockLayout.
func readFillLayout(ctx context.Context, conn *pgx.Conn, space, pool string, perNode int) (fillLayout, error) {
	var f fillLayout
	var first, last, router, health, ingress bool
	var n int
	err := conn.QueryRow(ctx, `SELECT p.id, c.id, c.cidr, c.mask_size, p.allow_first_ip, p.allow_last_ip,
			p.reserve_router, p.reserve_health, p.reserve_ingress, (SELECT count(*) FROM pool_cidrs x WHERE x.pool_id = p.id)
		FROM pools p JOIN pool_cidrs c ON c.pool_id = p.id AND c.family = 4
		WHERE p.space = $1 AND p.name = $2 ORDER BY c.position LIMIT 1`, space, pool).
		Scan(&f.poolID, &f.cidrID, &f.cidr, &f.mask, &first, &last, &router, &health, &ingress, &n)
	if errors.Is(err, pgx.ErrNoRows) {
		return f, fmt.Errorf("pool %q of space %q with an IPv4 CIDR not found", pool, space)
	} else if err != nil {
		return f, err
	}
	if n != 1 {
		return f, fmt.Errorf("pool %q has %d CIDRs; the loader fills a pool of one", pool, n)
	}
	f.blocks = alloc.BlockCount(f.cidr, f.mask)
	f.layout = alloc.BlockLayout(alloc.BlockAt(f.cidr, f.mask, 0), first, last, alloc.NodeLocal{Router: router, Health: health, Ingress: ingress})
	if int64(perNode) > f.layout.Capacity {
		return f, fmt.Errorf("%d leases per node do not fit a /%d block of %d leasable addresses", perNode, f.mask, f.layout.Capacity)
	}
	for o := f.layout.First; len(f.offsets) < perNode; o++ {
		if !slices.Contains(f.layout.Reserved, o) {
			f.offsets = append(f.offsets, o)
		}
	}
	return f, nil
}

// nodeLocalOffset answers the offset of a node-local address of the
// layout, or -1 when the pool does not reserve it.
func nodeLocalOffset(l alloc.Layout, a netip.Addr) int64 {
	if !a.IsValid() {
		return -1
	}
	for _, o := range l.Reserved {
		if alloc.AddrAt(l.Prefix, o) == a {
			return o
		}
	}
	return -1
}

// loadFill makes pool (see the comment above) hold target active leases,
// perNode per node on nodes fill-node-00000 on, adding to what earlier
// calls loaded; target may not be less than what the pool holds. It
// answers the leases added.
func loadFill(ctx context.Context, conn *pgx.Conn, space, pool string, perNode, target int) (int, error) {
	if perNode <= 0 || target < 0 {
		return 0, fmt.Errorf("fill: %d leases per node, target %d", perNode, target)
	}
	f, err := readFillLayout(ctx, conn, space, pool, perNode)
	if err != nil {
		return 0, err
	}
	var have int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM leases WHERE pool_id = $1`, f.poolID).Scan(&have); err != nil {
		return 0, err
	}
	if have > target {
		return 0, fmt.Errorf("fill: pool %q holds %d leases already, more than %d", pool, have, target)
	}
	nodes := (target + perNode - 1) / perNode
	if int64(nodes) > f.blocks {
		return 0, fmt.Errorf("fill: %d nodes need more /%d blocks than %s holds (%d)", nodes, f.mask, f.cidr, f.blocks)
	}
	size := alloc.BlockSize(alloc.IPv4, f.mask)
	routerOff, healthOff, ingressOff := nodeLocalOffset(f.layout, f.layout.Router), nodeLocalOffset(f.layout, f.layout.Health), nodeLocalOffset(f.layout, f.layout.Ingress)
	reserved := f.layout.Reserved
	if reserved == nil {
		reserved = []int64{}
	}
	now := time.Now()
	for lo := have / perNode; lo < nodes; lo += fillBatchNodes {
		hi := min(lo+fillBatchNodes, nodes) // nodes [lo, hi)
		from, to := max(have, lo*perNode), min(target, hi*perNode)
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO nodes (space, name, created_at, updated_at)
				SELECT $1, `+fillNodeSQL("i")+`, $4, $4 FROM generate_series($2::int, $3::int - 1) i
				ON CONFLICT (space, name) DO NOTHING`, space, lo, hi, now); err != nil {
				return fmt.Errorf("nodes: %w", err)
			}
			// The block of node i: number i of the CIDR; the node-local
			// addresses at their offsets, NULL when not reserved.
			if _, err := tx.Exec(ctx, `INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr,
					first_offset, last_offset, reserved, router, health, ingress, capacity, allocated, next_offset, created_at, source)
				SELECT $1, $2, $3, $4::cidr, n.id, 4, set_masklen(host($4::cidr)::inet + i::bigint * $5::bigint, $6)::cidr,
					$7, $8, $9, CASE WHEN $10::bigint >= 0 THEN host($4::cidr)::inet + (i::bigint * $5::bigint + $10::bigint) END,
					CASE WHEN $11::bigint >= 0 THEN host($4::cidr)::inet + (i::bigint * $5::bigint + $11::bigint) END,
					CASE WHEN $12::bigint >= 0 THEN host($4::cidr)::inet + (i::bigint * $5::bigint + $12::bigint) END,
					$13, 0, $7, $14, 'carved'
				FROM generate_series($15::int, $16::int - 1) i
				JOIN nodes n ON n.space = $1 AND n.name = `+fillNodeSQL("i")+`
				WHERE NOT EXISTS (SELECT 1 FROM blocks b WHERE b.node_id = n.id AND b.pool_id = $2)`,
				space, f.poolID, f.cidrID, f.cidr, size, f.mask, f.layout.First, f.layout.Last, reserved,
				routerOff, healthOff, ingressOff, f.layout.Capacity, now, lo, hi); err != nil {
				return fmt.Errorf("blocks: %w", err)
			}
			if from < to {
				if _, err := tx.Exec(ctx, `INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state,
						container_id, interface, owner_namespace, owner_name, owner_uid, created_at, expires_at, confirmed_at, selected_by)
					SELECT $1, host(b.cidr::inet)::inet + ($3::bigint[])[j % $4 + 1], b.id, b.cidr, b.node_id, $2, 4, 'active',
						'fill-' || j, $7, 'fill', 'fill-' || j, '', $8, NULL, $8, 'request'
					FROM generate_series($5::bigint, $6::bigint - 1) j
					JOIN nodes n ON n.space = $1 AND n.name = `+fillNodeSQL("j / $4")+`
					JOIN blocks b ON b.node_id = n.id AND b.pool_id = $2`,
					space, f.poolID, f.offsets, perNode, from, to, benchInterface, now); err != nil {
					return fmt.Errorf("leases: %w", err)
				}
			}
			// Counters as leasing would have left them: allocated is the
			// block's lease rows, the cursor one past the last offset.
			if _, err := tx.Exec(ctx, `UPDATE blocks b SET allocated = c.n,
					next_offset = CASE WHEN c.n = 0 THEN b.first_offset
						WHEN ($3::bigint[])[c.n] + 1 > b.last_offset THEN b.first_offset ELSE ($3::bigint[])[c.n] + 1 END
				FROM (SELECT x.id, (SELECT count(*) FROM leases l WHERE l.block_id = x.id)::int AS n
				      FROM generate_series($4::int, $5::int - 1) i
				      JOIN nodes n ON n.space = $1 AND n.name = `+fillNodeSQL("i")+`
				      JOIN blocks x ON x.node_id = n.id AND x.pool_id = $2) c
				WHERE b.id = c.id`, space, f.poolID, f.offsets, lo, hi); err != nil {
				return fmt.Errorf("block counters: %w", err)
			}
			_, err := tx.Exec(ctx, `UPDATE pool_cidrs SET carve_hint = greatest(carve_hint, $2) WHERE id = $1`, f.cidrID, hi)
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("fill nodes %d..%d: %w", lo, hi-1, err)
		}
	}
	if _, err := conn.Exec(ctx, `ANALYZE nodes, blocks, leases`); err != nil {
		return 0, err
	}
	return target - have, nil
}

// createFillPool creates the fill's space and pool through the API (so its
// settings are the service's defaults): one /24 per node, multi-pool
// without pre-allocation, so the service's rebalancing carves nothing for
// it.
func createFillPool(ctx context.Context, c *ipamclient.ClientWithResponses, space string) error {
	if err := createSpace(ctx, c, space); err != nil {
		return err
	}
	zero := 0
	resp, err := c.CreatePoolWithResponse(ctx, &ipamclient.CreatePoolParams{Space: &space}, ipamclient.PoolRequest{
		Name: fillPool,
		Spec: ipamclient.PoolSpec{Ipv4: &ipamclient.PoolFamilySpec{Cidrs: []string{fillCIDR}, MaskSize: fillMask}, PreAllocate: &zero},
	})
	if err != nil {
		return fmt.Errorf("create pool %s: %w", fillPool, err)
	}
	return statusError("create pool "+fillPool, resp.StatusCode(), resp.Body)
}

// verifyFill asks the service what it sees of the fill: the pool's status
// must count leases active leases in nodes blocks, and the first node's
// leases must list min(perNode, leases) active leases.
func verifyFill(ctx context.Context, c *ipamclient.ClientWithResponses, space string, perNode, leases int) error {
	nodes := int64((leases + perNode - 1) / perNode)
	p, err := c.GetPoolWithResponse(ctx, fillPool, &ipamclient.GetPoolParams{Space: &space})
	if err != nil {
		return err
	}
	if err := statusError("get pool "+fillPool, p.StatusCode(), p.Body); err != nil {
		return err
	}
	if p.JSON200 == nil || p.JSON200.Status.Ipv4 == nil {
		return fmt.Errorf("pool %s: no IPv4 status in %s", fillPool, p.Body)
	}
	st := p.JSON200.Status.Ipv4
	if st.Leased != int64(leases) || st.BlocksCarved != nodes || st.Cooling != 0 {
		return fmt.Errorf("pool %s shows leased=%d blocksCarved=%d cooling=%d; the loader wrote %d leases in %d blocks",
			fillPool, st.Leased, st.BlocksCarved, st.Cooling, leases, nodes)
	}
	if leases == 0 {
		return nil
	}
	node, pool, limit := fillNodeName(0), fillPool, 1000
	l, err := c.ListLeasesWithResponse(ctx, &ipamclient.ListLeasesParams{Space: &space, Node: &node, Pool: &pool, Limit: &limit})
	if err != nil {
		return err
	}
	if err := statusError("list leases of "+node, l.StatusCode(), l.Body); err != nil {
		return err
	}
	want := min(perNode, leases)
	active := 0
	for _, x := range l.JSON200.Items {
		if x.State == ipamclient.Active {
			active++
		}
	}
	if len(l.JSON200.Items) != want || active != want {
		return fmt.Errorf("node %s lists %d leases (%d active); the loader wrote %d", node, len(l.JSON200.Items), active, want)
	}
	return nil
}

// dropFill deletes the fill's leases, blocks and nodes in one transaction
// (on a shared database, before its pool and space are deleted through the
// API, which would take one call per node).
func dropFill(ctx context.Context, conn *pgx.Conn, space, pool string) error {
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var poolID int64
		err := tx.QueryRow(ctx, `SELECT id FROM pools WHERE space = $1 AND name = $2`, space, pool).Scan(&poolID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		} else if err != nil {
			return err
		}
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{`DELETE FROM leases WHERE pool_id = $1`, []any{poolID}},
			{`DELETE FROM blocks WHERE pool_id = $1`, []any{poolID}},
			{`DELETE FROM nodes n WHERE n.space = $1 AND n.name LIKE 'fill-node-%' AND NOT EXISTS (SELECT 1 FROM blocks b WHERE b.node_id = n.id)`, []any{space}},
			{`UPDATE pool_cidrs SET carve_hint = 0 WHERE pool_id = $1`, []any{poolID}},
		} {
			if _, err := tx.Exec(ctx, q.sql, q.args...); err != nil {
				return err
			}
		}
		return nil
	})
}

// sizes is what the database holds on disk: the whole database, and the
// leases and address_events tables with their indexes and TOAST, with
// their row counts as the statistics estimate them (the fill ANALYZEs).
type sizes struct {
	database, leases, events int64
	leaseRows, eventRows     float64
}

func (s sizes) String() string {
	per := func(bytes int64, rows float64) string {
		if rows < 1 {
			return "-"
		}
		return fmt.Sprintf("%.0f", float64(bytes)/rows)
	}
	return fmt.Sprintf("database %.0f MiB; leases %.0f MiB for %.0f rows (%s bytes a row with its indexes); address_events %.0f MiB for %.0f rows (%s bytes a row)",
		float64(s.database)/(1<<20), float64(s.leases)/(1<<20), s.leaseRows, per(s.leases, s.leaseRows),
		float64(s.events)/(1<<20), s.eventRows, per(s.events, s.eventRows))
}

func readSizes(ctx context.Context, conn *pgx.Conn) (sizes, error) {
	var s sizes
	err := conn.QueryRow(ctx, `SELECT pg_database_size(current_database()),
			pg_total_relation_size('leases'), pg_total_relation_size('address_events'),
			(SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = 'leases'::regclass),
			(SELECT greatest(reltuples, 0) FROM pg_class WHERE oid = 'address_events'::regclass)`).
		Scan(&s.database, &s.leases, &s.events, &s.leaseRows, &s.eventRows)
	return s, err
}
