// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// A consistency check is a query answering rows of (kind, space, detail,
// objects): one per broken invariant, at most $1 of them. Each reads whole
// tables once (hash joins, sorts, a window for overlaps) rather than
// probing an index per row, so its cost is linear in the rows whatever
// constraints or indexes survive; none of them relies on the constraint it
// verifies.
type consistencyCheck struct {
	name string
	sql  string
}

// fullLen is the host mask length of an inet's family.
const fullLen = `CASE family(%[1]s) WHEN 4 THEN 32 ELSE 128 END`

// overlapSQL finds overlapping CIDRs of a table within a space without a
// pairwise join: sorted by CIDR (network address, then shorter first), a row
// overlaps an earlier one exactly when the furthest end of the earlier rows
// reaches its network address. Only those rows are then joined to the rows
// containing them, to name both sides of each overlap.
func overlapSQL(table, kind, what, label string) string {
	return fmt.Sprintf(`WITH ordered AS (
		SELECT t.id, t.space, t.cidr,
			max(set_masklen(broadcast(t.cidr), `+fmt.Sprintf(fullLen, "t.cidr")+`)) OVER (
				PARTITION BY t.space, family(t.cidr) ORDER BY t.cidr, t.id
				ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
		FROM %[1]s t
	), flagged AS (
		SELECT * FROM ordered WHERE reach >= set_masklen(cidr::inet, `+fmt.Sprintf(fullLen, "cidr")+`)
	)
	SELECT '%[2]s', f.space, format('%[3]s %%s (id %%s) overlaps %%s (id %%s)', o.cidr, o.id, f.cidr, f.id),
		ARRAY[format('%[3]s %%s (id %%s%%s)', o.cidr, o.id, %[4]s), format('%[3]s %%s (id %%s%%s)', f.cidr, f.id, %[5]s)]
	FROM flagged f
	JOIN %[1]s o ON o.space = f.space AND o.cidr >>= f.cidr AND (o.cidr, o.id) < (f.cidr, f.id)
	JOIN %[1]s fr ON fr.id = f.id
	ORDER BY f.space, f.cidr, o.cidr LIMIT $1`, table, kind, what,
		fmt.Sprintf(label, "o"), fmt.Sprintf(label, "fr"))
}

var consistencyChecks = []consistencyCheck{
	// Duplicates are found on the keys alone, then described: describing
	// every group would format every lease.
	{"duplicate addresses", `WITH d AS (
			SELECT space, addr FROM leases GROUP BY space, addr HAVING count(*) > 1 ORDER BY space, addr LIMIT $1
		)
		SELECT 'duplicate-address', d.space, format('address %s has %s lease rows', host(d.addr), count(*)),
			array_agg(format('lease %s (node id %s, %s %s/%s)', host(l.addr), l.node_id, l.state, l.owner_namespace, l.owner_name) ORDER BY l.node_id)
		FROM d JOIN leases l ON l.space = d.space AND l.addr = d.addr
		GROUP BY d.space, d.addr ORDER BY d.space, d.addr`},
	{"duplicate attachments", `WITH d AS (
			SELECT node_id, network, container_id, interface, family FROM leases WHERE state <> 'released'
			GROUP BY node_id, network, container_id, interface, family HAVING count(*) > 1 ORDER BY node_id, container_id LIMIT $1
		)
		SELECT 'duplicate-attachment', min(l.space), format('attachment %s%s/%s of node id %s holds %s IPv%s leases',
			CASE WHEN d.network = '' THEN '' ELSE d.network || ':' END, d.container_id, d.interface, d.node_id, count(*), d.family),
			array_agg(format('lease %s', host(l.addr)) ORDER BY l.addr)
		FROM d JOIN leases l ON l.node_id = d.node_id AND l.network = d.network AND l.container_id = d.container_id
			AND l.interface = d.interface AND l.family = d.family AND l.state <> 'released'
		GROUP BY d.node_id, d.network, d.container_id, d.interface, d.family ORDER BY d.node_id, d.container_id`},
	{"block overlaps", overlapSQL("blocks", "block-overlap", "block", `', node id ' || %s.node_id`)},
	{"pool CIDR overlaps", overlapSQL("pool_cidrs", "pool-cidr-overlap", "pool CIDR", `', pool id ' || %s.pool_id`)},
	{"blocks outside their pool CIDR", `SELECT 'block-outside-pool', b.space,
			CASE WHEN c.id IS NULL THEN format('block %s names pool CIDR id %s, which does not exist', b.cidr, b.pool_cidr_id)
			     WHEN NOT (b.cidr <<= c.cidr) THEN format('block %s lies outside its pool CIDR %s', b.cidr, c.cidr)
			     WHEN b.parent_cidr <> c.cidr THEN format('block %s records parent %s but its pool CIDR is %s', b.cidr, b.parent_cidr, c.cidr)
			     ELSE format('block %s is of pool id %s in space %s but its pool CIDR %s is of pool id %s in space %s',
			                 b.cidr, b.pool_id, b.space, c.cidr, c.pool_id, c.space) END,
			ARRAY[format('block %s (id %s)', b.cidr, b.id)] || CASE WHEN c.id IS NULL THEN '{}'::text[] ELSE ARRAY[format('pool CIDR %s (id %s)', c.cidr, c.id)] END
		FROM blocks b LEFT JOIN pool_cidrs c ON c.id = b.pool_cidr_id
		WHERE c.id IS NULL OR NOT (b.cidr <<= c.cidr) OR b.parent_cidr <> c.cidr OR b.pool_id <> c.pool_id
		   OR b.space <> c.space OR b.family <> c.family
		ORDER BY b.space, b.cidr LIMIT $1`},
	{"leases outside their block", `SELECT CASE WHEN b.id IS NULL OR NOT (l.addr <<= b.cidr) THEN 'lease-outside-block' ELSE 'lease-block-mismatch' END,
			l.space,
			CASE WHEN b.id IS NULL THEN format('lease %s names block id %s, which does not exist', host(l.addr), l.block_id)
			     WHEN NOT (l.addr <<= b.cidr) THEN format('lease %s lies outside its block %s', host(l.addr), b.cidr)
			     WHEN l.block_cidr <> b.cidr THEN format('lease %s records block %s but its block is %s', host(l.addr), l.block_cidr, b.cidr)
			     WHEN l.node_id <> b.node_id THEN format('lease %s is of node %s but its block %s is of node %s', host(l.addr),
			          coalesce((SELECT n.name FROM nodes n WHERE n.id = l.node_id), 'id ' || l.node_id), b.cidr,
			          coalesce((SELECT n.name FROM nodes n WHERE n.id = b.node_id), 'id ' || b.node_id))
			     WHEN l.pool_id <> b.pool_id THEN format('lease %s is of pool id %s but its block %s is of pool id %s', host(l.addr), l.pool_id, b.cidr, b.pool_id)
			     ELSE format('lease %s (IPv%s, space %s) differs from its block %s (IPv%s, space %s)', host(l.addr), l.family, l.space, b.cidr, b.family, b.space) END,
			ARRAY[format('lease %s', host(l.addr))] || CASE WHEN b.id IS NULL THEN '{}'::text[] ELSE ARRAY[format('block %s (id %s)', b.cidr, b.id)] END
		FROM leases l LEFT JOIN blocks b ON b.id = l.block_id
		WHERE b.id IS NULL OR NOT (l.addr <<= b.cidr) OR l.block_cidr <> b.cidr OR l.node_id <> b.node_id
		   OR l.pool_id <> b.pool_id OR l.family <> b.family OR l.space <> b.space
		ORDER BY l.space, l.addr LIMIT $1`},
	{"leases of addresses their block does not lease", `SELECT 'lease-reserved-address', l.space,
			format('lease %s is offset %s of block %s, which leases offsets %s to %s except %s',
			       host(l.addr), l.addr - b.cidr::inet, b.cidr, b.first_offset, b.last_offset, b.reserved),
			ARRAY[format('lease %s', host(l.addr)), format('block %s (id %s)', b.cidr, b.id)]
		FROM leases l JOIN blocks b ON b.id = l.block_id
		WHERE l.addr <<= b.cidr AND (l.addr - b.cidr::inet < b.first_offset OR l.addr - b.cidr::inet > b.last_offset
		   OR l.addr - b.cidr::inet = ANY (b.reserved))
		ORDER BY l.space, l.addr LIMIT $1`},
	{"block counters", `SELECT 'block-counter', b.space,
			format('block %s counts %s allocated of capacity %s but holds %s lease rows', b.cidr, b.allocated, b.capacity, coalesce(c.n, 0)),
			ARRAY[format('block %s (id %s)', b.cidr, b.id)]
		FROM blocks b LEFT JOIN (SELECT block_id, count(*) AS n FROM leases GROUP BY block_id) c ON c.block_id = b.id
		WHERE b.allocated <> coalesce(c.n, 0) OR b.allocated > b.capacity
		ORDER BY b.space, b.cidr LIMIT $1`},
	{"missing nodes", `SELECT 'missing-node', x.space, x.detail, ARRAY[x.object] FROM (
			SELECT l.space, format('lease %s is of node id %s, which does not exist in space %s', host(l.addr), l.node_id, l.space) AS detail,
			       format('lease %s', host(l.addr)) AS object, 1 AS ord, l.addr::text AS key
			FROM leases l LEFT JOIN nodes n ON n.id = l.node_id AND n.space = l.space WHERE n.id IS NULL
			UNION ALL
			SELECT b.space, format('block %s is of node id %s, which does not exist in space %s', b.cidr, b.node_id, b.space),
			       format('block %s (id %s)', b.cidr, b.id), 2, b.cidr::text
			FROM blocks b LEFT JOIN nodes n ON n.id = b.node_id AND n.space = b.space WHERE n.id IS NULL
		) x ORDER BY x.space, x.ord, x.key LIMIT $1`},
	{"missing pools", `SELECT 'missing-pool', x.space, x.detail, ARRAY[x.object] FROM (
			SELECT l.space, format('lease %s is of pool id %s, which does not exist in space %s', host(l.addr), l.pool_id, l.space) AS detail,
			       format('lease %s', host(l.addr)) AS object, 1 AS ord, l.addr::text AS key
			FROM leases l LEFT JOIN pools p ON p.id = l.pool_id AND p.space = l.space WHERE p.id IS NULL
			UNION ALL
			SELECT b.space, format('block %s is of pool id %s, which does not exist in space %s', b.cidr, b.pool_id, b.space),
			       format('block %s (id %s)', b.cidr, b.id), 2, b.cidr::text
			FROM blocks b LEFT JOIN pools p ON p.id = b.pool_id AND p.space = b.space WHERE p.id IS NULL
		) x ORDER BY x.space, x.ord, x.key LIMIT $1`},
	// Only what one statement writes together is compared: times written by
	// different replicas (created_at and released_at) may be skewed. A
	// node's address for Cilium (crd mode, network cilium:crd) is reserved
	// (no owner; a cooldown after a Pod's use), active or released, on the
	// attachment (address, "pool"); no other lease is ever reserved.
	{"lease states", `SELECT 'lease-state', space, format('lease %s is %s but %s', host(addr), state, problem),
			ARRAY[format('lease %s', host(addr))]
		FROM (SELECT l.*, CASE
			WHEN state NOT IN ('pending', 'active', 'reserved', 'released') THEN 'that is no state'
			WHEN state = 'pending' AND expires_at IS NULL THEN 'has no expiry'
			WHEN state <> 'pending' AND expires_at IS NOT NULL THEN format('expires at %s', expires_at)
			WHEN state = 'released' AND (released_at IS NULL OR cooldown_until IS NULL) THEN 'has no release time or cooldown'
			WHEN state <> 'released' AND released_at IS NOT NULL THEN 'has a release time'
			WHEN state IN ('pending', 'active') AND cooldown_until IS NOT NULL THEN 'has a cooldown'
			WHEN state = 'released' AND cooldown_until < released_at THEN format('cools down until %s, before its release at %s', cooldown_until, released_at)
			WHEN state = 'pending' AND confirmed_at IS NOT NULL THEN 'was confirmed'
			WHEN state = 'reserved' AND network <> '` + alloc.CiliumPoolNetwork + `' THEN format('is not a node''s address for Cilium (network %L)', network)
			WHEN state = 'reserved' AND (owner_namespace <> '' OR owner_name <> '') THEN format('has an owner, %s/%s', owner_namespace, owner_name)
			WHEN network = '` + alloc.CiliumPoolNetwork + `' AND state = 'pending' THEN 'is a node''s address for Cilium, which is never pending'
			WHEN network = '` + alloc.CiliumPoolNetwork + `' AND (container_id <> host(addr) OR interface <> '` + alloc.CiliumPoolInterface + `')
			     THEN format('is a node''s address for Cilium on attachment %s/%s, not %s/` + alloc.CiliumPoolInterface + `', container_id, interface, host(addr))
			END AS problem FROM leases l) x
		WHERE problem IS NOT NULL ORDER BY space, addr LIMIT $1`},
	// VIP pools (migration 00018): every Pod pool CIDR claims its range,
	// and no claimed range overlaps another unless both are Pod CIDRs
	// (pool CIDR overlaps, above) or one is of a conflicting VIP pool.
	{"pool CIDR claims", `SELECT 'pool-cidr-claim', c.space,
			CASE WHEN r.id IS NULL THEN format('pool CIDR %s (id %s) has no address range', c.cidr, c.id)
			     ELSE format('pool CIDR %s (id %s) claims %s-%s of space %s', c.cidr, c.id, host(r.first_addr), host(r.last_addr), r.space) END,
			ARRAY[format('pool CIDR %s (id %s)', c.cidr, c.id)]
		FROM pool_cidrs c LEFT JOIN address_ranges r ON r.pool_cidr_id = c.id
		WHERE r.id IS NULL OR r.space <> c.space OR r.first_addr <> host(network(c.cidr))::inet OR r.last_addr <> host(broadcast(c.cidr))::inet
		ORDER BY c.space, c.cidr LIMIT $1`},
	// Sorted by first address, a range overlaps an earlier one exactly
	// when the furthest end of the earlier ranges reaches its start, as
	// in overlapSQL.
	{"address range overlaps", `WITH r AS (
			SELECT id, space, kind, first_addr, last_addr, lb_pool_id, pool_cidr_id FROM address_ranges WHERE kind = 'pod' OR NOT conflicting
		), ordered AS (
			SELECT r.*, max(last_addr) OVER (PARTITION BY space, family(first_addr) ORDER BY first_addr, id
				ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
			FROM r
		), flagged AS (
			SELECT * FROM ordered WHERE reach >= first_addr
		)
		SELECT 'address-range-overlap', f.space,
			format('%s range %s-%s (id %s) overlaps %s range %s-%s (id %s)', o.kind, host(o.first_addr), host(o.last_addr), o.id,
				f.kind, host(f.first_addr), host(f.last_addr), f.id),
			ARRAY[format('%s range %s-%s (id %s)', o.kind, host(o.first_addr), host(o.last_addr), o.id),
				format('%s range %s-%s (id %s)', f.kind, host(f.first_addr), host(f.last_addr), f.id)]
		FROM flagged f
		JOIN r o ON o.space = f.space AND family(o.first_addr) = family(f.first_addr) AND o.first_addr <= f.first_addr
			AND o.last_addr >= f.first_addr AND (o.first_addr, o.id) < (f.first_addr, f.id)
		WHERE o.kind = 'vip' OR f.kind = 'vip'
		ORDER BY f.space, f.first_addr, o.first_addr LIMIT $1`},
	{"VIP states", `SELECT 'vip-state', v.space,
			CASE WHEN NOT EXISTS (SELECT 1 FROM vip_holders h WHERE h.vip_id = v.id) THEN format('VIP %s has no holder', host(v.addr))
			     ELSE format('VIP %s lies in Pod pool CIDR %s', host(v.addr), c.cidr) END,
			ARRAY[format('VIP %s (id %s)', host(v.addr), v.id)]
		FROM vips v LEFT JOIN pool_cidrs c ON c.space = v.space AND v.addr <<= c.cidr
		WHERE c.id IS NOT NULL OR NOT EXISTS (SELECT 1 FROM vip_holders h WHERE h.vip_id = v.id)
		ORDER BY v.space, v.addr LIMIT $1`},
}

// CheckConsistency verifies the invariants of the schema (see
// alloc.FindingKind) in one read-only REPEATABLE READ snapshot: allocation
// goes on meanwhile (a snapshot takes no lock that a writer waits for), and
// every check sees the same instant, so a lease and its block's counter,
// written in one transaction, are always seen together. It answers at most
// alloc.MaxFindingsPerCheck findings per check (Truncated says more exist).
func (s *Store) CheckConsistency(ctx context.Context) (alloc.ConsistencyReport, error) {
	r := alloc.ConsistencyReport{CheckedAt: s.now(), Findings: []alloc.Finding{}}
	start := time.Now()
	err := pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		// The store's connections forbid sequential scans to keep the
		// allocation path on its indexes; a check reads whole tables, for
		// which a scan is the right plan, and hashes them: room to do so
		// in memory (for this transaction only) spares spilling to disk.
		if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = on; SET LOCAL work_mem = '64MB'`); err != nil {
			return err
		}
		c := &r.Counts
		if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM address_spaces), (SELECT count(*) FROM pools),
				(SELECT count(*) FROM pool_cidrs), (SELECT count(*) FROM nodes), (SELECT count(*) FROM blocks),
				(SELECT count(*) FROM leases)`).Scan(&c.Spaces, &c.Pools, &c.PoolCIDRs, &c.Nodes, &c.Blocks, &c.Leases); err != nil {
			return err
		}
		for _, check := range consistencyChecks {
			rows, err := tx.Query(ctx, check.sql, alloc.MaxFindingsPerCheck+1)
			if err != nil {
				return fmt.Errorf("consistency check %s: %w", check.name, err)
			}
			found, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (alloc.Finding, error) {
				var f alloc.Finding
				var kind string
				err := row.Scan(&kind, &f.Space, &f.Detail, &f.Objects)
				f.Kind = alloc.FindingKind(kind)
				return f, err
			})
			if err != nil {
				return fmt.Errorf("consistency check %s: %w", check.name, err)
			}
			if len(found) > alloc.MaxFindingsPerCheck {
				found, r.Truncated = found[:alloc.MaxFindingsPerCheck], true
			}
			r.Findings = append(r.Findings, found...)
		}
		return nil
	})
	r.Took = time.Since(start)
	return r, err
}
