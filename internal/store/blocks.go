package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// blockRow identifies a block the allocation path locked or carved.
type blockRow struct {
	id   int64
	cidr netip.Prefix
}

// lockBlockWithRoom locks the node's oldest block of the pool and family
// whose lease rows (held or cooling) leave room, and returns ok=false when
// there is none. The row lock serializes allocations within one block only.
func lockBlockWithRoom(ctx context.Context, tx pgx.Tx, nodeID, poolID int64, f alloc.Family) (blockRow, bool, error) {
	var b blockRow
	err := tx.QueryRow(ctx, `SELECT id, cidr FROM blocks WHERE node_id = $1 AND pool_id = $2 AND family = $3 AND allocated < capacity
		ORDER BY id LIMIT 1 FOR NO KEY UPDATE`, nodeID, poolID, int16(f)).Scan(&b.id, &b.cidr)
	if errors.Is(err, pgx.ErrNoRows) {
		return b, false, nil
	}
	return b, err == nil, err
}

// carve takes the first free aligned block of the pool's mask for the node,
// trying the pool's CIDRs in their listed order. It locks the pool's CIDR
// rows of the family, which serializes carving within one pool (rare: once
// per node and pool) and nothing else. With recheck, it first looks again for
// a block with room, which a concurrent allocation for the same node may
// have carved while this one waited for the lock. ok is false when the pool
// is full.
func carve(ctx context.Context, tx pgx.Tx, space string, nodeID int64, p allocPool, f alloc.Family, now time.Time, recheck bool) (blockRow, bool, error) {
	type parent struct {
		id   int64
		cidr netip.Prefix
		mask int16
	}
	rows, err := tx.Query(ctx, `SELECT id, cidr, mask_size FROM pool_cidrs WHERE pool_id = $1 AND family = $2
		ORDER BY position FOR NO KEY UPDATE`, p.id, int16(f))
	if err != nil {
		return blockRow{}, false, err
	}
	parents, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (parent, error) {
		var pc parent
		return pc, r.Scan(&pc.id, &pc.cidr, &pc.mask)
	})
	if err != nil {
		return blockRow{}, false, err
	}
	if recheck {
		if b, ok, err := lockBlockWithRoom(ctx, tx, nodeID, p.id, f); ok || err != nil {
			return b, ok, err
		}
	}
	for _, pc := range parents {
		rows, err := tx.Query(ctx, `SELECT cidr FROM blocks WHERE space = $1 AND cidr && $2`, space, pc.cidr)
		if err != nil {
			return blockRow{}, false, err
		}
		taken, err := pgx.CollectRows(rows, pgx.RowTo[netip.Prefix])
		if err != nil {
			return blockRow{}, false, err
		}
		if prefix, ok := alloc.FirstFreeBlock(pc.cidr, int(pc.mask), taken); ok {
			b, err := insertBlock(ctx, tx, space, nodeID, p, f, pc.id, pc.cidr, prefix, now)
			return b, err == nil, err
		}
	}
	return blockRow{}, false, nil
}

func insertBlock(ctx context.Context, tx pgx.Tx, space string, nodeID int64, p allocPool, f alloc.Family,
	parentID int64, parentCIDR, prefix netip.Prefix, now time.Time) (blockRow, error) {
	l := alloc.BlockLayout(prefix, p.allowFirst, p.allowLast, p.nodeLocal)
	reserved := l.Reserved
	if reserved == nil {
		reserved = []int64{} // NULL would make "o <> ALL (reserved)" exclude every offset
	}
	b := blockRow{cidr: prefix}
	err := tx.QueryRow(ctx, `INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr,
			first_offset, last_offset, reserved, router, health, ingress, capacity, next_offset, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $8, $15) RETURNING id`,
		space, p.id, parentID, parentCIDR, nodeID, int16(f), prefix, l.First, l.Last, reserved,
		addrOrNil(l.Router), addrOrNil(l.Health), addrOrNil(l.Ingress), l.Capacity, now).Scan(&b.id)
	return b, err
}

func addrOrNil(a netip.Addr) *netip.Addr {
	if !a.IsValid() {
		return nil
	}
	return &a
}

const blockColumns = `b.space, n.name, p.name, b.family, b.cidr, b.first_offset, b.last_offset, b.reserved,
	b.router, b.health, b.ingress, b.capacity, b.created_at,
	(SELECT count(*) FROM leases l WHERE l.block_id = b.id AND l.state <> 'released'),
	(SELECT count(*) FROM leases l WHERE l.block_id = b.id AND l.state = 'released' AND l.cooldown_until > $%d)`

func scanBlock(r pgx.Row) (alloc.Block, error) {
	var b alloc.Block
	var fam int16
	var router, health, ingress *netip.Addr
	err := r.Scan(&b.Space, &b.Node, &b.Pool, &fam, &b.Layout.Prefix, &b.Layout.First, &b.Layout.Last, &b.Layout.Reserved,
		&router, &health, &ingress, &b.Layout.Capacity, &b.CreatedAt, &b.Leased, &b.Cooling)
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
	rows, err := s.db.Query(ctx, `SELECT `+fmt.Sprintf(blockColumns, 2)+`
		FROM blocks b JOIN nodes n ON n.id = b.node_id JOIN pools p ON p.id = b.pool_id
		WHERE b.node_id = $1 ORDER BY p.name, b.family, b.cidr`, nodeID, s.now())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.Block, error) { return scanBlock(r) })
}

// CarveBlock carves a new block for a registered node from the pool.
func (s *Store) CarveBlock(ctx context.Context, space, node, pool string, f alloc.Family) (alloc.Block, error) {
	var cidr netip.Prefix
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		nodeID, err := s.nodeID(ctx, tx, space, node)
		if err != nil {
			return err
		}
		p, err := s.allocPool(ctx, tx, space, pool)
		if err != nil {
			return err
		}
		if !p.has(f) {
			return alloc.Invalid("family", "pool %q has no %s CIDRs", pool, f)
		}
		// Unlike allocation, an explicit carve always adds a block.
		b, ok, err := carve(ctx, tx, space, nodeID, p, f, s.now(), false)
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
	return scanBlock(s.db.QueryRow(ctx, `SELECT `+fmt.Sprintf(blockColumns, 3)+`
		FROM blocks b JOIN nodes n ON n.id = b.node_id JOIN pools p ON p.id = b.pool_id
		WHERE b.space = $1 AND b.cidr = $2`, space, cidr, s.now()))
}

// ReleaseBlock returns an empty block to its pool. A block whose addresses
// are leased or still cooling is in use.
func (s *Store) ReleaseBlock(ctx context.Context, space, node string, cidr netip.Prefix) error {
	return s.inTx(ctx, func(tx pgx.Tx) error {
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
		_, err = tx.Exec(ctx, `DELETE FROM blocks WHERE id = $1`, id)
		return err
	})
}
