// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The statements that lease an address, and what they bind. They sit below
// allocate.go, which decides which to run; nothing here calls back up.

// leaseRow is what a lease statement writes: the lease the request asks for
// (its address and block still unknown), on node node from pool pool, and
// who asks, for the address history.
type leaseRow struct {
	node  int64
	pool  allocPool
	lease alloc.Lease
	actor string
}

// args binds the row to the lease statements' named parameters:
//
//	@node @pool @family @space      where the address comes from
//	@state @expires                 pending (with its expiry) or active
//	@network @container @iface      the attachment
//	@ns @name @uid                  the owner
//	@now                            the lease's creation time
//	@selectedBy @generation         why this pool, and the lease's number
//	@actor @reason @at              the address history's context
//
// The map is new on every call: a statement may add its own (@block).
func (r leaseRow) args() namedArgs {
	l := r.lease
	var expires *time.Time
	if l.State == alloc.StatePending {
		expires = &l.ExpiresAt
	}
	return namedArgs{
		"node": r.node, "pool": r.pool.id, "family": int16(l.Family), "space": l.Space,
		"state": string(l.State), "expires": expires,
		"network": l.Attachment.Network, "container": l.Attachment.ContainerID, "iface": l.Attachment.Interface,
		"ns": l.Owner.Namespace, "name": l.Owner.Name, "uid": l.Owner.UID,
		"now": l.CreatedAt, "selectedBy": string(l.SelectedBy), "generation": l.Generation,
		"actor": r.actor, "reason": "", "at": l.CreatedAt,
	}
}

// leased is the answer of a lease statement: whether it leased, and else
// the block it holds (0 when none: no block with room, or no row to reuse).
type leased struct {
	leased bool
	block  int64
}

// leaseWith runs a lease statement and reads its answer (address, block
// CIDR, gateway, block id) into l.
func leaseWith(ctx context.Context, q querier, sql string, args namedArgs, l *alloc.Lease) (leased, error) {
	return scanLeased(q.QueryRow(ctx, sql, args), l)
}

func scanLeased(row pgx.Row, l *alloc.Lease) (leased, error) {
	var addr, gw *netip.Addr
	var out leased
	err := row.Scan(&addr, &l.Block, &gw, &out.block)
	if errors.Is(err, pgx.ErrNoRows) {
		return leased{}, nil
	} else if err != nil || addr == nil {
		return out, err
	}
	l.Addr = *addr
	if gw != nil {
		l.Gateway = *gw
	}
	out.leased = true
	return out, nil
}

// leaseFromHeld leases l from block, which tx holds (leaseFreshSQL). The
// block has room by its count: an answer without an address means the count
// is wrong.
func leaseFromHeld(ctx context.Context, tx querier, row leaseRow, block int64, l *alloc.Lease) error {
	args := row.args()
	args["block"] = block
	got, err := leaseWith(ctx, tx, leaseFreshSQL, args, l)
	if err == nil && !got.leased {
		err = fmt.Errorf("block %d has room by its count but no free address", block)
	}
	return err
}

// leaseAlone runs a lease statement as a transaction of its own, in a batch
// with concurrent ones when the store batches (see batcher). In a batch,
// the leases from a block with room (leaseSkippingSQL) of one space share
// one statement (leaseManySQL), as long as each node's are asked by one
// actor.
func (s *Store) leaseAlone(ctx context.Context, sql string, row leaseRow, l *alloc.Lease) (bool, error) {
	it, m := leaseItem(sql, row, l)
	err := s.writeItem(ctx, row.lease.Space+"/"+row.lease.Node, it)
	return m.got.leased, err
}

// leaseItem is the batch write of a lease statement, and where its
// outcome lands.
func leaseItem(sql string, row leaseRow, l *alloc.Lease) (*batchItem, *mergedLease) {
	m := &mergedLease{row: row, lease: l}
	it := &batchItem{sql: sql, args: []any{row.args()}, read: func(rows pgx.Rows) error {
		var err error
		m.got, err = scanLeased(rowsRow{rows}, l)
		return err
	}}
	if sql == leaseSkippingSQL {
		// One statement serves many nodes, but the address history has
		// one actor per node in it.
		it.merge = &merging{group: "lease/" + row.lease.Space, combine: combineLeases, payload: m,
			slot: strconv.FormatInt(row.node, 10), tag: row.actor}
	}
	return it, m
}

// mergedLease is one lease of a leaseManySQL statement, and its outcome.
type mergedLease struct {
	row   leaseRow
	lease *alloc.Lease
	got   leased
}

// combineLeases makes one leaseManySQL statement of writes of one group
// (same space; one actor per node, see leaseItem): for each node, pool and
// family, its leases from one block with room, in their order, as far as
// its free addresses go. A write the statement did not serve answers "not
// leased", and its allocation takes the general path, as after a lone
// leaseSkippingSQL that found no room.
func combineLeases(group []*batchItem) (string, []any, func(pgx.Rows) error) {
	ms := make([]*mergedLease, len(group))
	n := len(group)
	nodes, pools, families := make([]int64, n), make([]int64, n), make([]int16, n)
	states, containers, ifaces, networks := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	nss, names, uids, selected := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	expires, nows, gens := make([]*time.Time, n), make([]time.Time, n), make([]int64, n)
	actors := map[string]string{}
	for i, it := range group {
		m := it.merge.payload.(*mergedLease)
		ms[i], m.got = m, leased{}
		l := m.row.lease
		nodes[i], pools[i], families[i] = m.row.node, m.row.pool.id, int16(l.Family)
		states[i], containers[i], ifaces[i], networks[i] = string(l.State), l.Attachment.ContainerID, l.Attachment.Interface, l.Attachment.Network
		nss[i], names[i], uids[i], selected[i] = l.Owner.Namespace, l.Owner.Name, l.Owner.UID, string(l.SelectedBy)
		if l.State == alloc.StatePending {
			expires[i] = &l.ExpiresAt
		}
		nows[i], gens[i] = l.CreatedAt, l.Generation
		actors[it.merge.slot] = m.row.actor // the node's id, as leaseItem wrote it
	}
	first := ms[0].row
	args := namedArgs{"space": first.lease.Space, "actors": actors, "reason": "", "at": first.lease.CreatedAt,
		"nodes": nodes, "pools": pools, "families": families, "states": states, "containers": containers,
		"ifaces": ifaces, "networks": networks, "nss": nss, "names": names, "uids": uids, "selectedBys": selected,
		"expiresAll": expires, "nows": nows, "generations": gens}
	read := func(rows pgx.Rows) error {
		for _, m := range ms {
			m.got = leased{}
		}
		for rows.Next() {
			var i int
			var l alloc.Lease
			got, err := scanLeased(rowWithIndex{rows, &i}, &l)
			if err != nil {
				return err
			}
			if i < 1 || i > len(ms) || !got.leased {
				continue
			}
			m := ms[i-1]
			m.lease.Addr, m.lease.Block, m.lease.Gateway = l.Addr, l.Block, l.Gateway
			m.got = got
		}
		return rows.Err()
	}
	return leaseManySQL, []any{args}, read
}

// leaseFreshSQL leases, in one statement, the first address of block
// @block, which this transaction holds (carved, or locked by an earlier
// statement), from its round-robin cursor onwards that has no lease row
// (held or cooling) and is not node-local; it inserts the lease and
// advances the cursor and the block's count. It answers the address (NULL
// when every address has a row), the block's CIDR, gateway and id (see
// scanLeased).
var leaseFreshSQL = `WITH b AS (
		SELECT ` + leaseBlockColumns + ` FROM blocks WHERE id = @block
	)` + leaseFromBlockSQL

// leaseSkippingSQL is leaseFreshSQL from the oldest block of node @node,
// pool @pool and family @family whose lease rows leave room and that no
// other transaction holds, which it locks: concurrent allocations of a busy
// node spread over its blocks with room. No row: no such block.
//
// The lock serializes allocations within one block only. It is taken by the
// statement that leases, so it is held for that statement and the commit,
// never for a round trip through the server as well.
//
// Its probe for a free address reads the statement's snapshot, taken
// before the row was locked, so it misses the leases that the block's
// previous holders committed meanwhile. It cannot pick one of them but on a
// nearly full block: the locked row is its newest version (READ COMMITTED
// re-reads a row it locks), so the probe starts at the cursor those holders
// advanced, and each of them leased the first free address from the cursor
// of its time, all behind the cursor now. Only a probe that wraps around the
// whole block can reach them: when the snapshot still shows rows that a
// purge deleted meanwhile, the free addresses are those the snapshot cannot
// see. The insert then skips the address it found taken (ON CONFLICT), and
// the answer has no address but the locked block: leaseFreshSQL, a new
// statement with a new snapshot, leases from it.
var leaseSkippingSQL = `WITH b AS (` + lockOldestWithRoomSQL + ` SKIP LOCKED)` + leaseFromBlockSQL

// leaseWaitingSQL is leaseSkippingSQL waiting for the oldest block with
// room when others hold it.
//
// A transaction uses one of the two, never both: a row locked and then
// found full (READ COMMITTED re-checks a row it locked) stays locked, and a
// statement that skipped a held block and then waited for it while holding
// such a row deadlocked with another doing the reverse (seen with 32 clients
// on one node). Waiting in id order only, a transaction holds lower blocks
// than the one it waits for, so the waits cannot form a cycle; skipping, it
// never waits.
var leaseWaitingSQL = `WITH b AS (` + lockOldestWithRoomSQL + `)` + leaseFromBlockSQL

// lockOldestWithRoomSQL locks the oldest block with room of node @node, pool
// @pool and family @family (blocksWithRoomSQL), with leaseBlockColumns. It
// also sets the address history's context (@actor, @reason, @at) for the
// statement it is part of, which may run as a transaction of its own.
const lockOldestWithRoomSQL = `SELECT ` + leaseBlockColumns + ` FROM ` + blocksWithRoomSQL + `
		AND ` + historyContextSQL + `
		ORDER BY id LIMIT 1 FOR NO KEY UPDATE`

// blocksWithRoomSQL are the blocks of node @node, pool @pool and family
// @family whose lease rows (held or cooling) leave room.
const blocksWithRoomSQL = `blocks WHERE node_id = @node AND pool_id = @pool AND family = @family AND allocated < capacity`

// leaseBlockColumns are the columns of a block row that leaseFromBlockSQL reads.
const leaseBlockColumns = `id, cidr, set_masklen(cidr::inet, CASE WHEN family = 4 THEN 32 ELSE 128 END) AS base,
		first_offset, last_offset, reserved, next_offset, router`

// freeOffsetsSQL is a lateral subquery over block b (leaseBlockColumns):
// its offsets from the round-robin cursor on, wrapping around to the
// first, that are not reserved and have no lease row (held or cooling) in
// space, at most limit of them, as (o, k) with k numbering them in that
// order. space and limit are SQL expressions of the statement.
//
// The cursor makes the common case one index probe; a nearly full block
// costs at most one probe per address of the block, never a scan of the
// pool, and addresses are reused as late as possible (like host-local).
// generate_series stands in a select list, where it yields rows as LIMIT
// asks: in FROM, PostgreSQL materializes every row first, which for an
// IPv6 /96 block (2^32 offsets) never ends.
func freeOffsetsSQL(space, limit string) string {
	return `LATERAL (
			SELECT s.o, s.k FROM (
				SELECT o, o - b.next_offset AS k FROM (SELECT generate_series(b.next_offset, b.last_offset) AS o) g
				UNION ALL
				SELECT o, o - b.first_offset + b.last_offset - b.next_offset + 1
					FROM (SELECT generate_series(b.first_offset, b.next_offset - 1) AS o) g
			) s
			LEFT JOIN LATERAL (
				-- LIMIT keeps this a per-offset probe of the (space, addr)
				-- index; as a plain NOT EXISTS the planner may anti-join
				-- against every lease of the space.
				SELECT 1 AS held FROM leases x WHERE x.space = ` + space + ` AND x.addr = b.base + s.o LIMIT 1
			) h ON true
			WHERE s.o <> ALL (b.reserved) AND h.held IS NULL
			LIMIT ` + limit + `
		)`
}

// leaseFromBlockSQL is the rest of leaseFreshSQL, leaseSkippingSQL and
// leaseWaitingSQL after the CTE b, which names the locked block.
var leaseFromBlockSQL = `, cand AS (
		SELECT b.*, c.o FROM b, ` + freeOffsetsSQL("@space", "1") + ` c
	), ins AS (
		INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface,
			owner_namespace, owner_name, owner_uid, created_at, expires_at, selected_by, generation, network)
		SELECT @space, base + o, id, cidr, @node, @pool, @family, @state, @container, @iface,
			@ns, @name, @uid, @now, @expires, @selectedBy, @generation, @network FROM cand
		ON CONFLICT (space, addr) DO NOTHING
		RETURNING addr
	), upd AS (
		UPDATE blocks SET allocated = allocated + 1,
			next_offset = CASE WHEN cand.o + 1 > cand.last_offset THEN cand.first_offset ELSE cand.o + 1 END
		FROM cand, ins WHERE blocks.id = cand.id
	)
	SELECT ins.addr, b.cidr, b.router, b.id FROM b LEFT JOIN ins ON true`

// leaseCooledSQL re-leases, in place, the address of the node's blocks
// (pool @pool, family @family) whose cooldown ended longest ago. SKIP
// LOCKED lets concurrent requests take different rows. A binding whose
// retention ended goes with the row's old lease.
const leaseCooledSQL = `UPDATE leases l SET state = @state, network = @network, container_id = @container, interface = @iface,
		owner_namespace = @ns, owner_name = @name, owner_uid = @uid, created_at = @now, expires_at = @expires,
		selected_by = @selectedBy, generation = @generation, sticky_identity = NULL, sticky_retention = NULL,
		confirmed_at = NULL, released_at = NULL, cooldown_until = NULL
	FROM blocks b
	WHERE b.id = l.block_id AND l.space = @space AND l.addr = (
		SELECT c.addr FROM blocks cb, LATERAL (
			SELECT c.addr, c.cooldown_until FROM leases c
			WHERE c.block_id = cb.id AND c.state = 'released' AND c.cooldown_until <= @now
			ORDER BY c.cooldown_until LIMIT 1 FOR UPDATE SKIP LOCKED
		) c
		WHERE cb.node_id = @node AND cb.pool_id = @pool AND cb.family = @family
		ORDER BY c.cooldown_until LIMIT 1)
	RETURNING l.addr, l.block_cidr, b.router, l.block_id`

// leaseBoundSQL leases the released address @bound bound to identity
// @identity again, in place, with retention @retention. The row keeps its
// block (counted in allocated) and its binding.
const leaseBoundSQL = `UPDATE leases l SET state = @state, network = @network, container_id = @container, interface = @iface,
		owner_namespace = @ns, owner_name = @name, owner_uid = @uid, created_at = @now, expires_at = @expires,
		selected_by = @selectedBy, generation = @generation, sticky_retention = @retention,
		confirmed_at = NULL, released_at = NULL, cooldown_until = NULL
	FROM blocks b
	WHERE b.id = l.block_id AND l.space = @space AND l.addr = @bound AND l.sticky_identity = @identity AND l.state = 'released'
	  AND l.node_id = @node AND l.pool_id = @pool AND l.family = @family
	RETURNING l.addr, l.block_cidr, b.router, l.block_id`

// leaseManySQL is leaseSkippingSQL for many requests at once, of nodes,
// pools and families in one space (the arrays, one element per request):
// for each node, pool and family asked, from its oldest block with room that
// no other transaction holds (and the next such block too when the first
// has less room than the requests want: blocksWantedSQL), the first free
// addresses from each block's cursor on, the n-th to the n-th request of
// that node, pool and family in array order, each insert skipped on any
// conflict (an address taken meanwhile, an attachment held already). It
// answers, per address it found, the address (NULL when its insert was
// skipped), the block's CIDR, gateway and id (as scanLeased reads them),
// then the request's number; no row for a request means nothing was
// leased for it.
//
// The address history records each lease with the actor of its node in
// @actors (see ipam_history_context_nodes).
var leaseManySQL = `WITH req AS (
		SELECT *, row_number() OVER (PARTITION BY node_id, pool_id, family ORDER BY n) AS i FROM unnest(
			@nodes::bigint[], @pools::bigint[], @families::smallint[], @states::text[], @containers::text[], @ifaces::text[],
			@networks::text[], @nss::text[], @names::text[], @uids::text[], @expiresAll::timestamptz[], @selectedBys::text[],
			@generations::bigint[], @nows::timestamptz[])
			WITH ORDINALITY AS r (node_id, pool_id, family, state, container_id, interface, network, owner_namespace, owner_name,
				owner_uid, expires_at, selected_by, generation, created_at, n)
	), wanted AS (
		SELECT node_id, pool_id, family, count(*) AS wanted FROM req GROUP BY node_id, pool_id, family
	), b AS (
		SELECT w.wanted, lb.* FROM wanted w CROSS JOIN LATERAL (
			SELECT node_id, pool_id, family, ` + leaseBlockColumns + ` FROM ` + wantedBlocksWithRoomSQL + `
			  AND (SELECT ipam_history_context_nodes(@actors::jsonb, @reason, @at))
			ORDER BY id LIMIT (` + blocksWantedSQL + `) FOR NO KEY UPDATE SKIP LOCKED
		) lb
	), cand AS (
		SELECT b.id, b.node_id, b.pool_id, b.family, b.cidr, b.base, b.first_offset, b.last_offset, c.o,
			row_number() OVER (PARTITION BY b.node_id, b.pool_id, b.family ORDER BY b.id, c.k) AS i
		FROM b, ` + freeOffsetsSQL("@space", "b.wanted") + ` c
	), ins AS (
		INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface,
			owner_namespace, owner_name, owner_uid, created_at, expires_at, selected_by, generation, network)
		SELECT @space, cand.base + cand.o, cand.id, cand.cidr, cand.node_id, cand.pool_id, cand.family, req.state,
			req.container_id, req.interface, req.owner_namespace, req.owner_name, req.owner_uid, req.created_at,
			req.expires_at, req.selected_by, req.generation, req.network
		FROM cand JOIN req USING (node_id, pool_id, family, i)
		ON CONFLICT DO NOTHING
		RETURNING addr
	), used AS (
		SELECT DISTINCT ON (c.id) c.id, count(*) OVER (PARTITION BY c.id) AS took,
			CASE WHEN c.o + 1 > c.last_offset THEN c.first_offset ELSE c.o + 1 END AS next
		FROM cand c JOIN ins ON ins.addr = c.base + c.o
		ORDER BY c.id, c.i DESC
	), upd AS (
		UPDATE blocks SET allocated = allocated + used.took, next_offset = used.next FROM used WHERE blocks.id = used.id
	)
	SELECT ins.addr, b.cidr, b.router, b.id, req.n
	FROM cand JOIN b ON b.id = cand.id
	JOIN req ON (req.node_id, req.pool_id, req.family, req.i) = (cand.node_id, cand.pool_id, cand.family, cand.i)
	LEFT JOIN ins ON ins.addr = cand.base + cand.o`

// blocksWantedSQL is how many blocks leaseManySQL locks for the requests of
// node, pool and family w: the oldest block with room, and the next too when
// the oldest has less room (by its count) than w.wanted. A busy node's batch
// then leases past the end of its block instead of sending the rest of its
// requests down the general path, and the batches of a node with room lock
// and probe one block only. The count ignores locks: a skipped oldest block
// makes the next one first, with the next but one, when counted short.
const blocksWantedSQL = `CASE WHEN (SELECT capacity - allocated FROM ` + wantedBlocksWithRoomSQL + `
			ORDER BY id LIMIT 1) >= w.wanted THEN 1 ELSE 2 END`

// wantedBlocksWithRoomSQL is blocksWithRoomSQL for the node, pool and
// family of w, a row of leaseManySQL's wanted.
const wantedBlocksWithRoomSQL = `blocks WHERE node_id = w.node_id AND pool_id = w.pool_id AND family = w.family AND allocated < capacity`
