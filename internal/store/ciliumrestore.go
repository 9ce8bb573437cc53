// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// reasonCiliumRestored is the history's reason for an address a CiliumNode
// listed that the operator occupied for it on taking the lead.
const reasonCiliumRestored = "cilium-restored"

// RestoreNodeAddresses occupies, as the node's reserved addresses (crd
// mode), the addresses its CiliumNode lists (spec.ipam.pool, and
// status.ipam.used) that another operator, or this one before a database
// was restored from an older backup, gave it: the restore before the
// first allocation, so that none of them is reserved for another node. It
// carves nothing but the block an address lies in when no node holds that
// block yet (as the node's, adopted), and takes no address another node
// holds.
//
// Each address is occupied in a transaction of its own, so that one
// refused leaves the others occupied; those the node holds already are
// found in one query and written nowhere. It answers the addresses now the
// node's (occupied now or held already, by address order of addrs) and
// one *alloc.Error per address refused, its field addresses[i]:
// KindInvalid for an address of no pool of the space, of a cloud pool
// whose block the node lacks, or on an offset its block sets aside
// (network, broadcast, router, health, ingress); KindConflict for an
// address the node released that still cools down; KindOverlap, naming the
// other node, for an address whose block or lease another node (or a
// Pod's lease) holds. A duplicate is impossible whatever the order of
// calls: the lease's primary key (space, addr) and the blocks' exclusion
// constraint refuse a second copy, which is then reported as an overlap.
// err is any other failure, which ends the restore.
//
// The node is registered when the store does not know it (with
// nodeLabels) and marked as served in crd mode; labels of a known node
// are left to ReserveNodeAddresses.
func (s *Store) RestoreNodeAddresses(ctx context.Context, space, node string, nodeLabels map[string]string,
	addrs []netip.Addr) (restored []netip.Addr, refused []*alloc.Error, err error) {
	for _, err := range []error{
		alloc.ValidateLabelName("space", space),
		alloc.ValidateNodeName("node", node),
		alloc.ValidateKubernetesLabels("labels", nodeLabels),
	} {
		if err != nil {
			return nil, nil, err
		}
	}
	// What the node holds already costs one query, not a transaction an
	// address: after a failover that is every listed address.
	valid := slices.DeleteFunc(slices.Clone(addrs), func(a netip.Addr) bool { return !a.IsValid() || a.Zone() != "" || a.Is4In6() })
	rows, err := s.db.Query(ctx, `SELECT l.addr FROM nodes n JOIN leases l ON l.node_id = n.id
		WHERE n.space = $1 AND n.name = $2 AND l.network = $3 AND l.state <> 'released' AND l.addr = ANY ($4)`,
		space, node, alloc.CiliumPoolNetwork, valid)
	if err != nil {
		return nil, nil, err
	}
	heldList, err := pgx.CollectRows(rows, pgx.RowTo[netip.Addr])
	if err != nil {
		return nil, nil, err
	}
	held := map[netip.Addr]bool{}
	for _, a := range heldList {
		held[a] = true
	}
	seen := map[netip.Addr]bool{}
	for i, a := range addrs {
		field := fmt.Sprintf("addresses[%d]", i)
		if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
			refused = append(refused, alloc.Invalid(field, "%q is not an IP address without a zone", a))
			continue
		}
		if seen[a] {
			continue
		}
		seen[a] = true
		if held[a] {
			restored = append(restored, a)
			continue
		}
		var why *alloc.Error
		err := s.inTxWhy(ctx, reasonCiliumRestored, func(tx querier) error {
			var err error
			why, err = s.restoreNodeAddressTx(ctx, tx, space, node, nodeLabels, a, field)
			if why != nil {
				// Nothing of this address is kept; the refusal is the
				// answer, not a failure.
				return errRestoreRefused
			}
			return err
		})
		switch {
		case errors.Is(err, errRestoreRefused):
			refused = append(refused, why)
		case err != nil:
			if code, _ := pgCode(err); code == codeUniqueViolation || code == codeExclusionViolation {
				// Taken by another transaction between the check and the
				// insert: the constraint refused the second copy.
				refused = append(refused, &alloc.Error{Kind: alloc.KindOverlap, Field: field,
					Detail: fmt.Sprintf("address %s was taken meanwhile", a)})
				continue
			}
			return restored, refused, err
		default:
			restored = append(restored, a)
		}
	}
	return restored, refused, nil
}

// errRestoreRefused rolls back the transaction of an address the restore
// refuses.
var errRestoreRefused = errors.New("restore refused")

// restoreNodeAddressTx occupies address a for the node in tx, answering
// why not (why) when it may not.
func (s *Store) restoreNodeAddressTx(ctx context.Context, tx querier, space, node string, nodeLabels map[string]string,
	a netip.Addr, field string) (why *alloc.Error, err error) {
	now := s.now()
	var nodeID int64
	var crd bool
	err = tx.QueryRow(ctx, `SELECT id, cilium_crd FROM nodes WHERE space = $1 AND name = $2`, space, node).Scan(&nodeID, &crd)
	if errors.Is(err, pgx.ErrNoRows) {
		err = tx.QueryRow(ctx, `INSERT INTO nodes (space, name, labels, cilium_crd, created_at, updated_at)
			VALUES ($1, $2, $3, true, $4, $4) RETURNING id`, space, node, labelsOrEmpty(nodeLabels), now).Scan(&nodeID)
		if code, constraint := pgCode(err); code == codeForeignKey && constraint == constraintNodeSpace {
			return nil, alloc.NotFound("space", "address space", space)
		}
		crd = true
	}
	if err != nil {
		return nil, err
	}
	f := alloc.FamilyOf(a)
	host := netip.PrefixFrom(a, a.BitLen())

	// The block a lies in: the node's, locked; another node's refuses it;
	// none is carved for the node from the pool CIDR a lies in.
	var blockID, blockNode, poolID int64
	var holder string
	err = tx.QueryRow(ctx, `SELECT b.id, b.node_id, n.name, b.pool_id FROM blocks b JOIN nodes n ON n.id = b.node_id
		WHERE b.space = $1 AND b.cidr >>= $2 FOR NO KEY UPDATE OF b`, space, host).Scan(&blockID, &blockNode, &holder, &poolID)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		var parentID int64
		var parent netip.Prefix
		var mask int16
		var poolName string
		err = tx.QueryRow(ctx, `SELECT c.id, c.cidr, c.mask_size, p.name FROM pool_cidrs c JOIN pools p ON p.id = c.pool_id
			WHERE c.space = $1 AND c.cidr >>= $2`, space, host).Scan(&parentID, &parent, &mask, &poolName)
		if errors.Is(err, pgx.ErrNoRows) {
			return alloc.Invalid(field, "%s lies in no pool of space %q", a, space), nil
		} else if err != nil {
			return nil, err
		}
		p, err := s.allocPool(ctx, tx, space, poolName)
		if err != nil {
			return nil, err
		}
		if p.cloud {
			return alloc.Invalid(field, "%s lies in cloud pool %q, in no block of the node: a cloud pool's blocks are the cloud's", a, p.name), nil
		}
		prefix := netip.PrefixFrom(a, int(mask)).Masked()
		// The blocks' exclusion constraint refuses a block carved
		// meanwhile that overlaps this one (an overlap, above).
		b, err := insertBlock(ctx, tx, space, nodeID, p, f, parentID, parent, prefix, now, blockAdopted)
		if err != nil {
			return nil, err
		}
		blockID, poolID = b.id, p.id
	case err != nil:
		return nil, err
	case blockNode != nodeID:
		return &alloc.Error{Kind: alloc.KindOverlap, Field: field, Nodes: []string{holder},
			Detail: fmt.Sprintf("%s lies in a block of node %s", a, holder)}, nil
	}

	// Its offset must be one the block leases.
	var usable bool
	err = tx.QueryRow(ctx, `SELECT o BETWEEN first_offset AND last_offset AND o <> ALL (reserved)
		FROM (SELECT $2::inet - set_masklen(cidr::inet, CASE WHEN family = 4 THEN 32 ELSE 128 END) AS o, first_offset, last_offset,
			reserved FROM blocks WHERE id = $1) b`, blockID, a).Scan(&usable)
	if err != nil {
		return nil, err
	}
	if !usable {
		return alloc.Invalid(field, "%s is an address its block sets aside (network, broadcast or node-local)", a), nil
	}

	// Its lease row: the node's already, the node's released one taken
	// back, or none (inserted); any other holder refuses it.
	var leaseNode *int64
	var network, state, ownerNS, ownerName string
	var holderName *string
	var coolUntil *time.Time
	err = tx.QueryRow(ctx, `SELECT l.node_id, n.name, l.network, l.state, l.owner_namespace, l.owner_name, l.cooldown_until
		FROM leases l LEFT JOIN nodes n ON n.id = l.node_id
		WHERE l.space = $1 AND l.addr = $2 FOR UPDATE OF l`, space, a).Scan(&leaseNode, &holderName, &network, &state, &ownerNS, &ownerName, &coolUntil)
	args := namedArgs{"space": space, "addr": a, "block": blockID, "node": nodeID, "pool": poolID, "family": int16(f),
		"network": alloc.CiliumPoolNetwork, "iface": alloc.CiliumPoolInterface, "now": now}
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// A concurrent insert of the address fails on the leases' primary
		// key: never two rows, whatever the race. The pool was chosen by
		// the address, by no selection rule: selected_by stays empty.
		if _, err := tx.Exec(ctx, `INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, network,
				container_id, interface, owner_namespace, owner_name, owner_uid, created_at, selected_by)
			SELECT @space, @addr, b.id, b.cidr, @node, @pool, @family, 'reserved', @network, host(@addr::inet), @iface, '', '', '',
				@now, '' FROM blocks b WHERE b.id = @block`, args); err != nil {
			return nil, err
		}
		if _, err := tx.Exec(ctx, `UPDATE blocks SET allocated = allocated + 1 WHERE id = @block`, args); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	case leaseNode != nil && *leaseNode == nodeID && network == alloc.CiliumPoolNetwork:
		if state == "released" {
			// Released by this node but listed still (the database is
			// older than the CiliumNode): the node's again once its
			// cooldown ended, as when a reservation takes a cooled
			// address back. Before, the database refuses it (a Pod may
			// have used it until the release): so does the restore.
			if coolUntil != nil && coolUntil.After(now) {
				return &alloc.Error{Kind: alloc.KindConflict, Field: field,
					Detail: fmt.Sprintf("%s was released and cools down until %s", a, coolUntil.UTC().Format(time.RFC3339))}, nil
			}
			if _, err := tx.Exec(ctx, `UPDATE leases l SET state = 'reserved', container_id = host(l.addr), interface = @iface,
					owner_namespace = '', owner_name = '', owner_uid = '', created_at = @now, expires_at = NULL, selected_by = '',
					generation = nextval('lease_generations'), sticky_identity = NULL, sticky_retention = NULL,
					confirmed_at = NULL, released_at = NULL, cooldown_until = NULL
				WHERE l.space = @space AND l.addr = @addr`, args); err != nil {
				return nil, err
			}
		}
	default:
		who := "a Pod's lease"
		if ownerName != "" {
			who = fmt.Sprintf("the lease of %s/%s", ownerNS, ownerName)
		}
		e := &alloc.Error{Kind: alloc.KindOverlap, Field: field}
		if holderName != nil && *holderName != node {
			e.Nodes = []string{*holderName}
			who += " on node " + *holderName
		}
		e.Detail = fmt.Sprintf("%s is held by %s", a, who)
		return e, nil
	}
	if !crd {
		if _, err := tx.Exec(ctx, `UPDATE nodes SET cilium_crd = true, updated_at = $2 WHERE id = $1`, nodeID, now); err != nil {
			return nil, err
		}
	}
	return nil, nil
}
