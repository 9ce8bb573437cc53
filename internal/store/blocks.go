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

// blockRow identifies a block the allocation path locked or carved.
type blockRow struct {
	id   int64
	cidr netip.Prefix
	// carved is set when carve carved the block (not when it answered a
	// block the node had).
	carved bool
}

// carveRecheck says when carve carves nothing after all.
type carveRecheck int

const (
	// carveAlways carves.
	carveAlways carveRecheck = iota
	// carveUnlessRoom answers the node's oldest block with room, if any.
	carveUnlessRoom
	// carveUnlessFreeRoom answers (and locks) the node's oldest block
	// with room that no other transaction holds, if any: a busy node
	// gets one block more rather than queueing all its allocations on
	// one block, but only while the pool keeps a free block for another
	// node (see carveFair).
	carveUnlessFreeRoom
	// carveFair carves unless the node has a block with room (by the
	// committed counts: held by another transaction, or carved or freed
	// after the caller's snapshot) and the block carved would be the
	// pool's last free one; then it answers errNodeHasRoom. A block more
	// for a busy node spreads its allocations; the pool's last block is
	// kept for a node that has none, and the busy node waits for its own.
	carveFair
)

// errNodeHasRoom is carve's answer when it keeps the pool's last free block
// from a node that still has a block with room (see carveFair): the
// allocation waits for that block, in a new transaction when it holds the
// carve lock.
var errNodeHasRoom = errors.New("the pool's last free block is kept: the node has a block with room")

// carveParent is a pool CIDR as carve reads it, under its lock.
type carveParent struct {
	id     int64
	cidr   netip.Prefix
	mask   int16
	hint   int64
	starts []netip.Addr
	ends   []netip.Addr
}

// carving is what carve carves: a block of family of pool for node, in
// space, at now.
type carving struct {
	space  string
	node   int64
	pool   allocPool
	family alloc.Family
	now    time.Time
}

// blockArgs binds blocksWithRoomSQL's parameters.
func (c carving) blockArgs() namedArgs {
	return namedArgs{"node": c.node, "pool": c.pool.id, "family": int16(c.family)}
}

// carve takes the first free aligned block of the pool's mask for the node,
// trying the pool's CIDRs in their listed order and skipping their reserved
// ranges. It locks the pool's CIDR rows of the family, which serializes
// carving within one pool (rare: once per node and pool) and nothing else.
// With carveUnlessRoom or carveUnlessFreeRoom, it first looks again for a
// block with room (see carveRecheck), which a concurrent transaction may
// have carved for the same node, or freed, while this one waited for the
// lock; it then answers that block. ok is false when the pool is full.
// With carveUnlessFreeRoom or carveFair, it answers errNodeHasRoom instead
// of taking the pool's last free block for a node that has a block with
// room: exhaustion is fair, every node gets a block before one gets a
// second it does not need yet.
//
// A disabled pool carves nothing, and a cluster-pool pool carves a node's
// one block per family only: both answer a KindPoolExhausted error saying
// so. A node holding the pool's per-node limit of blocks of the family
// (maxBlocksPerNode, carved or adopted) gets none: a KindNodeBlockLimit
// error. The count is read under the CIDR rows' lock, which every carve
// of the pool family takes, so concurrent carves cannot pass the limit.
//
// Each CIDR keeps a carve cursor below which every block is taken, so the
// search probes the exclusion constraint's GiST index from the cursor on:
// one probe while the CIDR fills up in order, and the cost never grows with
// the number of blocks already carved.
func carve(ctx context.Context, tx querier, c carving, recheck carveRecheck) (b blockRow, ok bool, err error) {
	space, nodeID, p, f, now := c.space, c.node, c.pool, c.family, c.now
	rows, err := tx.Query(ctx, `SELECT id, cidr, mask_size, carve_hint, reserved_start, reserved_end FROM pool_cidrs
		WHERE pool_id = $1 AND family = $2 ORDER BY position FOR NO KEY UPDATE`, p.id, int16(f))
	if err != nil {
		return blockRow{}, false, err
	}
	parents, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (carveParent, error) {
		var pc carveParent
		return pc, r.Scan(&pc.id, &pc.cidr, &pc.mask, &pc.hint, &pc.starts, &pc.ends)
	})
	if err != nil {
		return blockRow{}, false, err
	}
	if recheck == carveUnlessRoom || recheck == carveUnlessFreeRoom {
		// Another transaction may have carved for this node while this
		// one waited for the lock, or freed room meanwhile: carve only
		// when the node still has no block with room (that nobody
		// holds, with carveUnlessFreeRoom). Holding the pool's CIDR
		// rows, this never waits for a block row: it reads the
		// committed counts, or skips the rows others hold.
		sql := `SELECT id, cidr FROM ` + blocksWithRoomSQL + ` ORDER BY id LIMIT 1`
		if recheck == carveUnlessFreeRoom {
			sql += ` FOR NO KEY UPDATE SKIP LOCKED`
		}
		err := tx.QueryRow(ctx, sql, c.blockArgs()).Scan(&b.id, &b.cidr)
		if err == nil || !errors.Is(err, pgx.ErrNoRows) {
			return b, err == nil, err
		}
	}
	// hasRoom: the block carved would be one more for a node that has a
	// block with room (held by others, or not in the caller's snapshot).
	// It reads the committed counts and waits for no row.
	var hasRoom bool
	if recheck == carveUnlessFreeRoom || recheck == carveFair {
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+blocksWithRoomSQL+`)`, c.blockArgs()).Scan(&hasRoom); err != nil {
			return blockRow{}, false, err
		}
	}
	if p.mode == alloc.ModeClusterPool {
		have, err := nodeBlocksOf(ctx, tx, nodeID, p.id, f)
		if err != nil {
			return blockRow{}, false, err
		}
		if len(have) > 0 {
			return blockRow{}, false, &alloc.Error{Kind: alloc.KindPoolExhausted, Field: "pool", Pool: p.name, Family: f,
				Detail: fmt.Sprintf("node range full: the node's %s block %s of cluster-pool pool %q is fully allocated", f, have[0], p.name)}
		}
	}
	if p.disabled {
		return blockRow{}, false, &alloc.Error{Kind: alloc.KindPoolExhausted, Field: "pool", Pool: p.name, Family: f,
			Detail: fmt.Sprintf("pool %q is disabled: it carves no new %s block", p.name, f)}
	}
	if p.cloud {
		// As the VPC CNI answers an empty warm pool: the runtime starts
		// the Pod again, and the capacity workers add addresses meanwhile.
		return blockRow{}, false, &alloc.Error{Kind: alloc.KindPoolExhausted, Field: "pool", Pool: p.name, Family: f,
			Detail: fmt.Sprintf("every %s address the cloud gave this node for pool %q is in use; the capacity workers add more", f, p.name)}
	}
	if err := checkBlockLimit(ctx, tx, nodeID, p, f, 1); err != nil {
		if hasRoom {
			// At its limit, the node waits for its own block with room
			// rather than failing.
			return blockRow{}, false, errNodeHasRoom
		}
		return blockRow{}, false, err
	}
	for k, pc := range parents {
		i, found, err := firstFreeBlock(ctx, tx, space, f, pc, pc.hint)
		if err != nil {
			return blockRow{}, false, err
		}
		if !found {
			if len(pc.starts) == 0 && pc.hint < alloc.BlockCount(pc.cidr, int(pc.mask)) {
				n := alloc.BlockCount(pc.cidr, int(pc.mask))
				if _, err := tx.Exec(ctx, `UPDATE pool_cidrs SET carve_hint = $2 WHERE id = $1`, pc.id, n); err != nil {
					return blockRow{}, false, err
				}
			}
			continue
		}
		if hasRoom {
			spare, err := anyFreeBlock(ctx, tx, space, f, parents[k:], i+1)
			if err != nil {
				return blockRow{}, false, err
			} else if !spare {
				return blockRow{}, false, errNodeHasRoom
			}
		}
		mask := int(pc.mask)
		b, err := insertBlock(ctx, tx, space, nodeID, p, f, pc.id, pc.cidr, alloc.BlockAt(pc.cidr, mask, i), now, blockCarved)
		if err != nil {
			return blockRow{}, false, err
		}
		b.carved = true
		// Every block below i was taken and i is now. (With reserved
		// ranges, "taken or reserved": changing them resets the cursor.)
		_, err = tx.Exec(ctx, `UPDATE pool_cidrs SET carve_hint = $2 WHERE id = $1`, pc.id, i+1)
		return b, err == nil, err
	}
	if hasRoom {
		return blockRow{}, false, errNodeHasRoom
	}
	return blockRow{}, false, nil
}

// checkBlockLimit answers a KindNodeBlockLimit error when the node cannot
// take adding more blocks of family f of pool p: it would hold more than
// the pool's per-node limit. The caller holds the pool family's CIDR rows.
func checkBlockLimit(ctx context.Context, q querier, nodeID int64, p allocPool, f alloc.Family, adding int64) error {
	var held int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM blocks WHERE node_id = $1 AND pool_id = $2 AND family = $3`,
		nodeID, p.id, int16(f)).Scan(&held); err != nil {
		return err
	}
	if limit := p.blockLimit(f); held+adding > limit {
		return &alloc.Error{Kind: alloc.KindNodeBlockLimit, Field: "pool", Pool: p.name, Family: f,
			Detail: fmt.Sprintf("node block limit reached: the node holds %d %s blocks of pool %q, and the pool lets one node hold %d (spec.maxBlocksPerNode)",
				held, f, p.name, limit)}
	}
	return nil
}

// firstFreeBlock finds the first free block of pc numbered from from on
// (firstFreeBlockSQL); found is false when there is none.
func firstFreeBlock(ctx context.Context, tx querier, space string, f alloc.Family, pc carveParent, from int64) (i int64, found bool, err error) {
	mask := int(pc.mask)
	n := alloc.BlockCount(pc.cidr, mask)
	if from >= n || coversAll(pc.cidr, pc.starts, pc.ends) {
		return 0, false, nil // full, or retired by a reserved range
	}
	err = tx.QueryRow(ctx, firstFreeBlockSQL, namedArgs{"space": space, "base": pc.cidr.Addr(), "from": from, "to": n - 1,
		"size": alloc.BlockSize(f, mask), "mask": mask, "starts": pc.starts, "ends": pc.ends}).Scan(&i)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return i, err == nil, err
}

// anyFreeBlock reports whether parents hold a free block, numbered from
// from on in the first of them and anywhere in the others.
func anyFreeBlock(ctx context.Context, tx querier, space string, f alloc.Family, parents []carveParent, from int64) (bool, error) {
	for k, pc := range parents {
		if k > 0 {
			from = pc.hint
		}
		_, found, err := firstFreeBlock(ctx, tx, space, f, pc, from)
		if found || err != nil {
			return found, err
		}
	}
	return false, nil
}

// nodeBlocksOf lists the node's blocks of one family of a pool.
func nodeBlocksOf(ctx context.Context, q querier, nodeID, poolID int64, f alloc.Family) ([]netip.Prefix, error) {
	var have []netip.Prefix
	err := q.QueryRow(ctx, `SELECT coalesce(array_agg(cidr ORDER BY cidr), '{}') FROM blocks
		WHERE node_id = $1 AND pool_id = $2 AND family = $3`, nodeID, poolID, int16(f)).Scan(&have)
	return have, err
}

// lockCarveRowsOf locks the pool CIDR rows whose carve cursors deleting
// the blocks matching where (on blocks, with its named parameters in args)
// lowers, in the order carving locks them.
func lockCarveRowsOf(ctx context.Context, tx querier, where string, args namedArgs) error {
	_, err := tx.Exec(ctx, `SELECT id FROM pool_cidrs WHERE id IN (SELECT pool_cidr_id FROM blocks WHERE `+where+`)
		ORDER BY pool_id, family, position FOR NO KEY UPDATE`, args)
	return err
}

// coversAll reports whether one reserved range spans the whole CIDR (a CIDR
// being retired), which spares probing every block of it.
func coversAll(c netip.Prefix, starts, ends []netip.Addr) bool {
	for i := range starts {
		if (alloc.AddrRange{Start: starts[i], End: ends[i]}).Covers(c) {
			return true
		}
	}
	return false
}

// firstFreeBlockSQL finds the lowest block number in [@from, @to] of a pool
// CIDR starting at address @base (blocks of @size addresses, prefix length
// @mask) that overlaps no block of space @space and no reserved range
// [@starts[i], @ends[i]]. The LIMIT inside the lateral keeps each probe a
// single GiST lookup.
//
// The series is a set-returning function in a select list, which streams;
// in FROM, PostgreSQL would materialize all of it (a million rows for a /8
// in /28 blocks) before the first probe.
const firstFreeBlockSQL = `SELECT s.i FROM (SELECT generate_series(@from::bigint, @to::bigint) AS i) s
	LEFT JOIN LATERAL (
		SELECT 1 AS taken FROM blocks b
		WHERE b.space = @space AND b.cidr && set_masklen(@base::inet + s.i * @size::bigint, @mask::int)::cidr
		LIMIT 1
	) t ON true
	WHERE t.taken IS NULL
	  AND NOT EXISTS (SELECT 1 FROM unnest(@starts::inet[], @ends::inet[]) r (first, last)
	                  WHERE r.first <= @base::inet + (s.i * @size::bigint + @size::bigint - 1) AND @base::inet + s.i * @size::bigint <= r.last)
	LIMIT 1`

// lowerCarveHints moves the carve cursors of the CIDRs the released blocks
// came from down to the lowest released block, keeping "every block below
// the cursor is taken" true so the next carve takes the first free one.
func lowerCarveHints(ctx context.Context, tx querier, released []releasedBlock) error {
	lowest := map[int64]int64{}
	for _, r := range released {
		i := alloc.BlockIndex(r.parent, r.cidr)
		if cur, ok := lowest[r.parentID]; !ok || i < cur {
			lowest[r.parentID] = i
		}
	}
	for id, i := range lowest {
		if _, err := tx.Exec(ctx, `UPDATE pool_cidrs SET carve_hint = least(carve_hint, $2) WHERE id = $1`, id, i); err != nil {
			return err
		}
	}
	return nil
}

// releasedBlock is a deleted block as lowerCarveHints needs it.
type releasedBlock struct {
	parentID     int64
	parent, cidr netip.Prefix
}

// deleteBlocks deletes blocks (the statement's RETURNING must
// yield pool_cidr_id, parent_cidr, cidr) and lowers the carve cursors.
func deleteBlocks(ctx context.Context, tx querier, sql string, args ...any) error {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	released, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (releasedBlock, error) {
		var rb releasedBlock
		return rb, r.Scan(&rb.parentID, &rb.parent, &rb.cidr)
	})
	if err != nil {
		return err
	}
	return lowerCarveHints(ctx, tx, released)
}

// Where a block came from (blocks.source).
const (
	blockCarved  = "carved"
	blockAdopted = "adopted"
)

func insertBlock(ctx context.Context, tx querier, space string, nodeID int64, p allocPool, f alloc.Family,
	parentID int64, parentCIDR, prefix netip.Prefix, now time.Time, source string) (blockRow, error) {
	l := alloc.BlockLayout(prefix, p.allowFirst, p.allowLast, p.nodeLocal)
	reserved := l.Reserved
	if reserved == nil {
		reserved = []int64{} // NULL would make "o <> ALL (reserved)" exclude every offset
	}
	b := blockRow{cidr: prefix}
	err := tx.QueryRow(ctx, `INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr,
			first_offset, last_offset, reserved, router, health, ingress, capacity, next_offset, created_at, source)
		VALUES (@space, @pool, @parent, @parentCIDR, @node, @family, @cidr,
			@first, @last, @reserved, @router, @health, @ingress, @capacity, @first, @now, @source) RETURNING id`,
		namedArgs{"space": space, "pool": p.id, "parent": parentID, "parentCIDR": parentCIDR, "node": nodeID,
			"family": int16(f), "cidr": prefix, "first": l.First, "last": l.Last, "reserved": reserved,
			"router": addrOrNil(l.Router), "health": addrOrNil(l.Health), "ingress": addrOrNil(l.Ingress),
			"capacity": l.Capacity, "now": now, "source": source}).Scan(&b.id)
	return b, err
}

func addrOrNil(a netip.Addr) *netip.Addr {
	if !a.IsValid() {
		return nil
	}
	return &a
}

// blockColumns are the columns scanBlock reads, of block b joined to its
// node n and pool p; addresses count as cooling until @now.
const blockColumns = `b.space, n.name, p.name, b.family, b.cidr, b.first_offset, b.last_offset, b.reserved,
	b.router, b.health, b.ingress, b.capacity, b.created_at, b.source,
	(SELECT count(*) FROM leases l WHERE l.block_id = b.id AND l.state <> 'released'),
	(SELECT count(*) FROM leases l WHERE l.block_id = b.id AND l.state = 'released' AND l.cooldown_until > @now)`

func scanBlock(r pgx.Row) (alloc.Block, error) {
	var b alloc.Block
	var fam int16
	var router, health, ingress *netip.Addr
	err := r.Scan(&b.Space, &b.Node, &b.Pool, &fam, &b.Layout.Prefix, &b.Layout.First, &b.Layout.Last, &b.Layout.Reserved,
		&router, &health, &ingress, &b.Layout.Capacity, &b.CreatedAt, &b.Source, &b.Leased, &b.Cooling)
	b.Family = alloc.Family(fam)
	for _, x := range []struct {
		src *netip.Addr
		dst *netip.Addr
	}{{router, &b.Layout.Router}, {health, &b.Layout.Health}, {ingress, &b.Layout.Ingress}} {
		if x.src != nil {
			*x.dst = *x.src
		}
	}
	return b, err
}

// ListBlocks lists the node's blocks by pool, family and CIDR.
func (s *Store) ListBlocks(ctx context.Context, space, node string) ([]alloc.Block, error) {
	nodeID, err := s.nodeID(ctx, s.db, space, node)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT `+blockColumns+`
		FROM blocks b JOIN nodes n ON n.id = b.node_id JOIN pools p ON p.id = b.pool_id
		WHERE b.node_id = @node ORDER BY p.name, b.family, b.cidr`, namedArgs{"node": nodeID, "now": s.now()})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.Block, error) { return scanBlock(r) })
}

// ListPoolBlocks lists the pool's blocks of family f (both when f is 0),
// IPv4 before IPv6 and by CIDR, a page at a time.
func (s *Store) ListPoolBlocks(ctx context.Context, space, pool string, f alloc.Family, page alloc.Page) ([]alloc.Block, string, error) {
	sc := scopeOf(pagePoolBlocks, space, pool, strconv.Itoa(int(f)))
	after, err := s.decodeContinue(ctx, sc, page.Continue)
	if err != nil {
		return nil, "", err
	}
	var afterCIDR *netip.Prefix
	if after != "" {
		p, err := netip.ParsePrefix(after)
		if err != nil {
			return nil, "", alloc.Invalid("continue", "not a continue token from this API")
		}
		afterCIDR = &p
	}
	p, err := s.allocPool(ctx, s.db, space, pool)
	if err != nil {
		return nil, "", err
	}
	// inet orders IPv4 before IPv6, so b.cidr alone is the page key. No
	// index serves this order: an index on (pool_id, cidr) made the
	// planner pick it for the cooled-reuse lease statement under a generic
	// plan on stale statistics (TestHotStatementsStayProbesOnStaleStatistics:
	// 142 buffers for one lease instead of at most 80). A viewer's page
	// reading the pool's blocks (thousands of rows) is the cheaper price.
	rows, err := s.db.Query(ctx, `SELECT `+blockColumns+`
		FROM blocks b JOIN nodes n ON n.id = b.node_id JOIN pools p ON p.id = b.pool_id
		WHERE b.pool_id = @pool AND (@family::smallint = 0 OR b.family = @family) AND (@after::cidr IS NULL OR b.cidr > @after)
		ORDER BY b.cidr LIMIT @limit`, namedArgs{"pool": p.id, "now": s.now(), "family": int(f), "after": afterCIDR, "limit": page.Limit + 1})
	if err != nil {
		return nil, "", err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.Block, error) { return scanBlock(r) })
	if err != nil {
		return nil, "", err
	}
	return pageOf(ctx, s, sc, items, page.Limit, func(b alloc.Block) string { return b.Layout.Prefix.String() })
}

// nodeAndPool answers the id of registered node and pool's allocation
// settings, or the not-found error naming which is missing.
func (s *Store) nodeAndPool(ctx context.Context, tx querier, space, node, pool string) (int64, allocPool, error) {
	nodeID, err := s.nodeID(ctx, tx, space, node)
	if err != nil {
		return 0, allocPool{}, err
	}
	p, err := s.allocPool(ctx, tx, space, pool)
	return nodeID, p, err
}

// CarveBlock carves a new block for a registered node from the pool.
func (s *Store) CarveBlock(ctx context.Context, space, node, pool string, f alloc.Family) (alloc.Block, error) {
	var cidr netip.Prefix
	err := s.inTx(ctx, func(tx querier) error {
		nodeID, p, err := s.nodeAndPool(ctx, tx, space, node, pool)
		if err != nil {
			return err
		}
		if !p.has(f) {
			return alloc.Invalid("family", "pool %q has no %s CIDRs", pool, f)
		}
		// Unlike allocation, an explicit carve always adds a block.
		b, ok, err := carve(ctx, tx, carving{space: space, node: nodeID, pool: p, family: f, now: s.now()}, carveAlways)
		if err != nil {
			return err
		}
		if !ok {
			return alloc.Exhausted(pool, f)
		}
		cidr = b.cidr
		return nil
	})
	if err != nil {
		return alloc.Block{}, err
	}
	return s.getBlock(ctx, space, cidr)
}

func (s *Store) getBlock(ctx context.Context, space string, cidr netip.Prefix) (alloc.Block, error) {
	return scanBlock(s.db.QueryRow(ctx, `SELECT `+blockColumns+`
		FROM blocks b JOIN nodes n ON n.id = b.node_id JOIN pools p ON p.id = b.pool_id
		WHERE b.space = @space AND b.cidr = @cidr`, namedArgs{"space": space, "cidr": cidr, "now": s.now()}))
}

// ReleaseBlock returns an empty block to its pool. A block whose addresses
// are leased or still cooling is in use.
func (s *Store) ReleaseBlock(ctx context.Context, space, node string, cidr netip.Prefix) error {
	return s.inTxWhy(ctx, reasonBlockReleased, func(tx querier) error {
		nodeID, err := s.nodeID(ctx, tx, space, node)
		if err != nil {
			return err
		}
		var id int64
		err = tx.QueryRow(ctx, `SELECT id FROM blocks WHERE node_id = $1 AND cidr = $2 FOR UPDATE`, nodeID, cidr).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return alloc.NotFound("cidr", "block", cidr.String()+" of node "+node)
		} else if err != nil {
			return err
		}
		var busy int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM leases WHERE block_id = $1
			AND (state <> 'released' OR cooldown_until > $2)`, id, s.now()).Scan(&busy); err != nil {
			return err
		}
		if busy > 0 {
			return &alloc.Error{Kind: alloc.KindInUse, Field: "cidr", Detail: fmt.Sprintf("block %s has %d leased or cooling addresses", cidr, busy)}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM leases WHERE block_id = $1`, id); err != nil {
			return err
		}
		return deleteBlocks(ctx, tx, `DELETE FROM blocks WHERE id = $1 RETURNING pool_cidr_id, parent_cidr, cidr`, id)
	})
}
