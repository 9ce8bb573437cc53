// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Reasons of the cluster-pool to multi-pool migration in the history:
// reasonCiliumMigrated for a node's cluster-pool block that became its
// block of the multi-pool default pool (Cilium's
// enable-cluster-pool-to-multi-pool-migration), and for the default pool
// turned from cluster-pool to multi-pool; reasonCiliumMigrationHeld for a
// block held for a node whose migration was refused, so that no other
// node is given the CIDR its agent still uses.
const (
	reasonCiliumMigrated      = "cilium-migrated-to-multi-pool"
	reasonCiliumMigrationHeld = "cilium-migration-refused-held"
)

// MigrateClusterPoolNode makes the CIDRs a CiliumNode lists in
// spec.ipam.podCIDRs (Cilium's cluster-pool mode) the node's blocks of
// the multi-pool pool named pool (the operator's default pool, Cilium's
// ipam-default-ip-pool), before the operator moves them to the node's
// spec.ipam.pools.allocated: the store must hold them there, or the
// multi-pool rounds would see blocks the agent does not list and give them
// back to the pool under the agent's Pods.
//
// A cluster-pool pool of that name first turns multi-pool in place (the
// one-way change UpdatePool allows: every block and lease stays), in a
// transaction of its own. The node's CIDRs are then migrated all or none,
// in one transaction, and each stays the block it was (no address moves,
// none is renumbered):
//   - one the node holds already as a block of pool is kept (the common
//     case: pool is the cluster-pool pool the node's blocks were carved
//     from);
//   - one no node holds is adopted, when it lies in one of pool's CIDRs
//     and has its mask (a database that never served the cluster-pool
//     mode, the node's CIDRs given by Cilium's own operator);
//   - anything else is refused. The answer is then an *alloc.Error whose
//     Field names the first refused podCIDRs entry and whose Detail names
//     them all: KindNotFound (no pool of that name), KindInvalid (a cloud
//     pool; a CIDR of no CIDR of pool, of another mask, or the node's
//     block of another pool: pools never overlap, so pool cannot cover
//     it), KindOverlap naming the node that holds it otherwise.
//
// A refused node's CiliumNode keeps its podCIDRs and its agent goes on
// using them, so what the store can hold of them it still holds, in a
// second transaction: each listed CIDR of pool's mask that no node holds,
// and for one smaller than the mask the block of the mask around it,
// becomes the node's block (reason cilium-migration-refused-held), and no
// other node is carved it. Its migration, once possible, keeps them.
//
// The history records each migrated block with kind block-adopt and
// reason cilium-migrated-to-multi-pool, and the pool turned multi-pool
// with pool-update. A migrated node stops being a cluster-pool node
// (nodes.cilium_cluster_pool), so the multi-pool pre-allocation counts
// it. The node is registered when unknown. Calling it again for a
// migrated node changes nothing but the history.
func (s *Store) MigrateClusterPoolNode(ctx context.Context, space, node, pool string, podCIDRs []netip.Prefix) error {
	if err := validatePodCIDRs(podCIDRs); err != nil {
		return err
	}
	if len(podCIDRs) == 0 {
		return nil
	}
	if err := s.inTxWhy(ctx, reasonCiliumMigrated, func(tx querier) error {
		_, err := tx.Exec(ctx, `UPDATE pools SET mode = @to, updated_at = @now
			WHERE space = @space AND name = @pool AND mode = @from AND cloud IS NULL`,
			namedArgs{"to": string(alloc.ModeMultiPool), "from": string(alloc.ModeClusterPool), "now": s.now(), "space": space, "pool": pool})
		return err
	}); err != nil {
		return err
	}
	var refused []*alloc.Error
	err := s.inTxWhy(ctx, reasonCiliumMigrated, func(tx querier) error {
		refused = nil
		now := s.now()
		nodeID, err := s.registerNode(ctx, tx, space, node, now)
		if err != nil {
			return err
		}
		p, err := s.allocPool(ctx, tx, space, pool)
		if alloc.IsKind(err, alloc.KindNotFound) {
			refused = append(refused, &alloc.Error{Kind: alloc.KindNotFound, Field: "pool", Pool: pool,
				Detail: fmt.Sprintf("the default pool %q does not exist: create it, covering the node's podCIDRs with their mask", pool)})
			return nil
		} else if err != nil {
			return err
		}
		if p.cloud {
			refused = append(refused, &alloc.Error{Kind: alloc.KindInvalid, Field: "pool", Pool: pool,
				Detail: fmt.Sprintf("the default pool %q is a cloud pool, whose blocks are the cloud's", pool)})
			return nil
		}
		var kept []int64
		for i, c := range podCIDRs {
			id, why, err := s.migrateCIDR(ctx, tx, space, nodeID, p, c, now)
			if err != nil {
				return err
			}
			if why != nil {
				why.Field = fmt.Sprintf("podCIDRs[%d]", i)
				refused = append(refused, why)
			} else if id != 0 {
				kept = append(kept, id)
			}
		}
		if len(refused) > 0 {
			return errMigrationRefused
		}
		if len(kept) > 0 {
			// A kept block is the agent's from now on (not one it gave
			// back), and its new standing is in the history: the block
			// trigger records inserts and deletes only.
			args := namedArgs{"blocks": kept, "pool": pool, "node": node, "now": now}
			if _, err := tx.Exec(ctx, `UPDATE blocks SET emptied_at = NULL WHERE id = ANY (@blocks)`, args); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO address_events (at, kind, space, family, block, pool, node, actor, reason)
				SELECT @now, 'block-adopt', b.space, b.family, b.cidr, @pool, @node, ipam_history_actor(), ipam_history_reason()
				FROM blocks b WHERE b.id = ANY (@blocks) ORDER BY b.family, b.cidr`, args); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `UPDATE nodes SET cilium_cluster_pool = false, updated_at = $2 WHERE id = $1 AND cilium_cluster_pool`, nodeID, now)
		return err
	})
	switch {
	case err == nil && len(refused) > 0: // the pool is missing or a cloud pool: nothing to hold
		return refused[0]
	case errors.Is(err, errMigrationRefused):
	default:
		return err
	}
	if err := s.holdRefusedCIDRs(ctx, space, node, pool, podCIDRs); err != nil {
		return err
	}
	details := make([]string, len(refused))
	for i, r := range refused {
		details[i] = r.Field + ": " + r.Detail
	}
	out := *refused[0]
	out.Detail = strings.Join(details, "; ")
	return &out
}

// errMigrationRefused rolls back the migration of a node whose CIDRs the
// store refused.
var errMigrationRefused = errors.New("migration refused")

// holdRefusedCIDRs makes the CIDRs of a refused node that pool can give
// it (at pool's mask) its blocks, in one transaction, skipping the rest.
func (s *Store) holdRefusedCIDRs(ctx context.Context, space, node, pool string, podCIDRs []netip.Prefix) error {
	return s.inTxWhy(ctx, reasonCiliumMigrationHeld, func(tx querier) error {
		now := s.now()
		nodeID, err := s.registerNode(ctx, tx, space, node, now)
		if err != nil {
			return err
		}
		p, err := s.allocPool(ctx, tx, space, pool)
		if alloc.IsKind(err, alloc.KindNotFound) {
			return nil
		} else if err != nil {
			return err
		}
		for _, c := range podCIDRs {
			f := alloc.FamilyOf(c.Addr())
			m := p.mask(f)
			if m == nil || c.Bits() < int(*m) {
				// A CIDR larger than a block would be several blocks; it
				// is left as it is (docs/cilium.md).
				continue
			}
			block := netip.PrefixFrom(c.Addr(), int(*m)).Masked()
			var mine bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM blocks WHERE space = $1 AND node_id = $2 AND cidr >>= $3)`,
				space, nodeID, c).Scan(&mine); err != nil {
				return err
			}
			if mine {
				continue
			}
			err := s.adoptAgentCIDR(ctx, tx, space, nodeID, alloc.PoolCIDR{Pool: pool, CIDR: block}, now)
			var ae *alloc.Error
			if err != nil && !errors.As(err, &ae) {
				return err
			}
		}
		return nil
	})
}

// migrateCIDR makes c the node's block of pool in tx: it answers the id of
// the block when the node held it already (0 when it was adopted now), or
// why not.
func (s *Store) migrateCIDR(ctx context.Context, tx querier, space string, nodeID int64, p allocPool, c netip.Prefix,
	now time.Time) (kept int64, why *alloc.Error, err error) {
	pool := p.name
	// The mask first: a CIDR of another mask is refused in the same
	// words whatever the store holds around it (a block held for the
	// node after an earlier refusal, say), so the node's operator-status
	// does not change between rounds.
	f := alloc.FamilyOf(c.Addr())
	if m := p.mask(f); m == nil {
		return 0, &alloc.Error{Kind: alloc.KindInvalid, Pool: pool, Family: f,
			Detail: fmt.Sprintf("cidr %s is not part of the requested pool: pool %s has no %s CIDRs", c, pool, f)}, nil
	} else if int(*m) != c.Bits() {
		return 0, &alloc.Error{Kind: alloc.KindInvalid, Pool: pool, Family: f,
			Detail: fmt.Sprintf("cidr %s is a /%d; pool %s carves /%d blocks", c, c.Bits(), pool, *m)}, nil
	}
	rows, err := tx.Query(ctx, `SELECT b.id, b.cidr, b.node_id, n.name, p.name FROM blocks b
		JOIN nodes n ON n.id = b.node_id JOIN pools p ON p.id = b.pool_id
		WHERE b.space = $1 AND b.cidr && $2 ORDER BY b.cidr FOR NO KEY UPDATE OF b`, space, c)
	if err != nil {
		return 0, nil, err
	}
	type holder struct {
		id     int64
		cidr   netip.Prefix
		nodeID int64
		node   string
		pool   string
	}
	held, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (holder, error) {
		var h holder
		return h, r.Scan(&h.id, &h.cidr, &h.nodeID, &h.node, &h.pool)
	})
	if err != nil {
		return 0, nil, err
	}
	for _, h := range held {
		if h.nodeID != nodeID {
			return 0, &alloc.Error{Kind: alloc.KindOverlap, Pool: pool, Nodes: []string{h.node},
				Detail: fmt.Sprintf("%s overlaps block %s of node %s", c, h.cidr, h.node)}, nil
		}
	}
	if len(held) > 0 {
		switch h := held[0]; {
		case len(held) > 1 || h.cidr != c:
			return 0, &alloc.Error{Kind: alloc.KindInvalid, Pool: pool,
				Detail: fmt.Sprintf("%s overlaps the node's block %s of another size", c, h.cidr)}, nil
		case h.pool != pool:
			return 0, &alloc.Error{Kind: alloc.KindInvalid, Pool: pool,
				Detail: fmt.Sprintf("%s is the node's block of pool %q, which the default pool %q cannot cover (pools never overlap): migrate with --default-pool %s", c, h.pool, pool, h.pool)}, nil
		default:
			return h.id, nil, nil
		}
	}
	err = s.adoptAgentCIDR(ctx, tx, space, nodeID, alloc.PoolCIDR{Pool: pool, CIDR: c}, now)
	var ae *alloc.Error
	if errors.As(err, &ae) {
		return 0, ae, nil
	}
	return 0, nil, err
}
