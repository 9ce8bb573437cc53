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

// nodeAddressJSON is how node addresses are kept in the nodes.addresses column.
type nodeAddressJSON struct {
	Type    string     `json:"type"`
	Address netip.Addr `json:"address"`
}

const nodeColumns = `n.space, n.name, n.labels, n.addresses, n.provider_id, n.created_at, n.updated_at,
	(SELECT count(*) FROM blocks b WHERE b.node_id = n.id),
	(SELECT count(*) FROM leases l WHERE l.node_id = n.id AND l.state <> 'released')`

func scanNode(r pgx.Row) (alloc.Node, error) {
	var n alloc.Node
	var addrs []nodeAddressJSON
	err := r.Scan(&n.Space, &n.Name, &n.Labels, &addrs, &n.ProviderID, &n.CreatedAt, &n.UpdatedAt, &n.Blocks, &n.Leases)
	for _, a := range addrs {
		n.Addresses = append(n.Addresses, alloc.NodeAddress{Type: a.Type, Address: a.Address})
	}
	return n, err
}

// PutNode registers a node or replaces its labels, addresses and provider
// ID. CIDRs Kubernetes assigned it (PodCIDRs) are adopted as its blocks in
// the same transaction; then, in transactions of their own (as Cilium's
// operator fills CiliumNode.spec.ipam.podCIDRs after the node appears), it
// gets its one block per family of every enabled cluster-pool pool it
// lacks one of. A full cluster-pool pool does not fail the registration:
// the node's first lease from it answers "allocator full".
func (s *Store) PutNode(ctx context.Context, n alloc.Node) (alloc.Node, bool, error) {
	if err := alloc.ValidateNodeName("node", n.Name); err != nil {
		return alloc.Node{}, false, err
	}
	if err := alloc.ValidateLabels("labels", n.Labels); err != nil {
		return alloc.Node{}, false, err
	}
	if err := validatePodCIDRs(n.PodCIDRs); err != nil {
		return alloc.Node{}, false, err
	}
	addrs := make([]nodeAddressJSON, 0, len(n.Addresses))
	for _, a := range n.Addresses {
		addrs = append(addrs, nodeAddressJSON{Type: a.Type, Address: a.Address})
	}
	var created bool
	var nodeID int64
	err := s.inTx(ctx, func(tx querier) error {
		now := s.now()
		err := tx.QueryRow(ctx, `INSERT INTO nodes AS n (space, name, labels, addresses, provider_id, created_at, updated_at)
			VALUES (@space, @name, @labels, @addresses, @providerID, @now, @now)
			ON CONFLICT (space, name) DO UPDATE SET labels = EXCLUDED.labels, addresses = EXCLUDED.addresses,
				provider_id = EXCLUDED.provider_id, updated_at = EXCLUDED.updated_at
			RETURNING id, (xmax = 0)`, namedArgs{"space": n.Space, "name": n.Name, "labels": labelsOrEmpty(n.Labels),
			"addresses": addrs, "providerID": n.ProviderID, "now": now}).Scan(&nodeID, &created)
		if code, constraint := pgCode(err); code == codeForeignKey && constraint == constraintNodeSpace {
			return alloc.NotFound("space", "address space", n.Space)
		} else if err != nil {
			return err
		}
		return s.adopt(ctx, tx, n.Space, nodeID, n.PodCIDRs, now)
	})
	if err != nil {
		return alloc.Node{}, false, err
	}
	if err := s.ensureClusterPoolBlocks(ctx, n.Space, nodeID); err != nil {
		return alloc.Node{}, false, err
	}
	got, err := s.GetNode(ctx, n.Space, n.Name)
	return got, created, err
}

// validatePodCIDRs checks the CIDRs a registration adopts: at most one list
// of a few, no two overlapping.
func validatePodCIDRs(cidrs []netip.Prefix) error {
	if len(cidrs) > 2*alloc.MaxCIDRsPerFamily {
		return alloc.Invalid("podCIDRs", "lists %d CIDRs; at most %d are allowed", len(cidrs), 2*alloc.MaxCIDRsPerFamily)
	}
	for i, c := range cidrs {
		for j := range i {
			if cidrs[j].Overlaps(c) {
				return &alloc.Error{Kind: alloc.KindOverlap, Field: fmt.Sprintf("podCIDRs[%d]", i),
					Detail: fmt.Sprintf("%s overlaps %s in the same list", c, cidrs[j])}
			}
		}
	}
	return nil
}

// adopt makes the node's Kubernetes-assigned CIDRs its blocks. Each must lie
// in a pool CIDR and have its mask. A node that holds other blocks of the
// same pool and family is refused with Cilium's message; a CIDR another node
// holds is an overlap. CIDRs the node already holds are left as they are,
// so registering again is a no-op.
func (s *Store) adopt(ctx context.Context, tx querier, space string, nodeID int64, cidrs []netip.Prefix, now time.Time) error {
	type target struct {
		field    string
		cidr     netip.Prefix
		parentID int64
		parent   netip.Prefix
		pool     string
	}
	var targets []target
	byPool := map[string][]netip.Prefix{} // pool/family -> requested
	adoptChecked := map[string]bool{}     // pool/family whose limit was checked
	for i, c := range cidrs {
		t := target{field: fmt.Sprintf("podCIDRs[%d]", i), cidr: c}
		var mask int16
		err := tx.QueryRow(ctx, `SELECT c.id, c.cidr, c.mask_size, p.name FROM pool_cidrs c JOIN pools p ON p.id = c.pool_id
			WHERE c.space = $1 AND c.cidr >>= $2`, space, c).Scan(&t.parentID, &t.parent, &mask, &t.pool)
		if errors.Is(err, pgx.ErrNoRows) {
			return alloc.Invalid(t.field, "%s lies in no pool CIDR of space %q; create or extend a pool that covers it", c, space)
		} else if err != nil {
			return err
		}
		if int(mask) != c.Bits() {
			return alloc.Invalid(t.field, "%s is a /%d; pool %q carves /%d blocks from %s", c, c.Bits(), t.pool, mask, t.parent)
		}
		targets = append(targets, t)
		key := t.pool + "/" + alloc.FamilyOf(c.Addr()).String()
		byPool[key] = append(byPool[key], c)
	}
	for _, t := range targets {
		f := alloc.FamilyOf(t.cidr.Addr())
		p, err := s.allocPool(ctx, tx, space, t.pool)
		if err != nil {
			return err
		}
		have, err := nodeBlocksOf(ctx, tx, nodeID, p.id, f)
		if err != nil {
			return err
		}
		requested := byPool[t.pool+"/"+f.String()]
		for _, h := range have {
			if !slices.Contains(requested, h) {
				return &alloc.Error{Kind: alloc.KindConflict, Field: t.field,
					Detail: fmt.Sprintf("node has CIDRs allocated (%s) that conflict with requested CIDRs (%s)", joinPrefixes(have), joinPrefixes(requested))}
			}
		}
		if slices.Contains(have, t.cidr) {
			continue
		}
		// Adopted blocks count against the pool's per-node limit as
		// carved ones do (a node certificate may register its own
		// podCIDRs); the first new CIDR of a pool family checks them all,
		// under the carve lock.
		if !adoptChecked[t.pool+"/"+f.String()] {
			adoptChecked[t.pool+"/"+f.String()] = true
			if _, err := tx.Exec(ctx, `SELECT id FROM pool_cidrs WHERE pool_id = $1 AND family = $2 ORDER BY position FOR NO KEY UPDATE`,
				p.id, int16(f)); err != nil {
				return err
			}
			adding := int64(0)
			for _, c := range requested {
				if !slices.Contains(have, c) {
					adding++
				}
			}
			if err := checkBlockLimit(ctx, tx, nodeID, p, f, adding); err != nil {
				return err
			}
		}
		// Check first, so the refusal names the other node; the exclusion
		// constraint still refuses a block inserted concurrently.
		var owner string
		var other netip.Prefix
		err = tx.QueryRow(ctx, `SELECT n.name, b.cidr FROM blocks b JOIN nodes n ON n.id = b.node_id
			WHERE b.space = $1 AND b.cidr && $2 LIMIT 1`, space, t.cidr).Scan(&owner, &other)
		if err == nil {
			return &alloc.Error{Kind: alloc.KindOverlap, Field: t.field, Nodes: []string{owner},
				Detail: fmt.Sprintf("%s overlaps block %s of node %s", t.cidr, other, owner)}
		} else if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		_, err = insertBlock(ctx, tx, space, nodeID, p, f, t.parentID, t.parent, t.cidr, now, blockAdopted)
		if code, _ := pgCode(err); code == codeExclusionViolation {
			return &alloc.Error{Kind: alloc.KindOverlap, Field: t.field, Detail: fmt.Sprintf("%s overlaps a block carved meanwhile", t.cidr)}
		} else if err != nil {
			return err
		}
	}
	return nil
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// ensureClusterPoolBlocks carves the node's one block per family of every
// enabled cluster-pool pool of the space it holds none of, each in its own
// transaction (carving locks the pool's CIDR rows; holding several pools'
// at once would order those locks against other carvers for nothing).
func (s *Store) ensureClusterPoolBlocks(ctx context.Context, space string, nodeID int64) error {
	rows, err := s.db.Query(ctx, `SELECT p.name, f.family FROM pools p
		CROSS JOIN (VALUES (4::smallint), (6::smallint)) f (family)
		WHERE p.space = $1 AND p.mode = 'cluster-pool' AND NOT p.disabled
		  AND CASE f.family WHEN 4 THEN p.ipv4_mask_size IS NOT NULL ELSE p.ipv6_mask_size IS NOT NULL END
		  AND NOT EXISTS (SELECT 1 FROM blocks b WHERE b.node_id = $2 AND b.pool_id = p.id AND b.family = f.family)
		ORDER BY p.name, f.family`, space, nodeID)
	if err != nil {
		return err
	}
	type want struct {
		pool string
		fam  int16
	}
	wants, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (want, error) {
		var w want
		return w, r.Scan(&w.pool, &w.fam)
	})
	if err != nil {
		return err
	}
	for _, w := range wants {
		err := s.inTxWhy(ctx, reasonRegistration, func(tx querier) error {
			p, err := s.allocPool(ctx, tx, space, w.pool)
			if err != nil {
				return err
			}
			_, _, err = carve(ctx, tx, carving{space: space, node: nodeID, pool: p, family: alloc.Family(w.fam), now: s.now()}, carveUnlessRoom)
			return err
		})
		// A full pool, a node at its block limit, or a pool changed or
		// deleted meanwhile, leaves the node without that block; its
		// first lease says why.
		if err != nil && !alloc.IsKind(err, alloc.KindPoolExhausted) && !alloc.IsKind(err, alloc.KindNodeBlockLimit) &&
			!alloc.IsKind(err, alloc.KindNotFound) {
			return err
		}
	}
	return nil
}

// GetNode reads one node with its block and lease counts.
func (s *Store) GetNode(ctx context.Context, space, name string) (alloc.Node, error) {
	n, err := scanNode(s.db.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes n WHERE n.space = $1 AND n.name = $2`, space, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return n, s.notFoundIn(ctx, s.db, space, "node", "node", name)
	}
	return n, err
}

// ListNodes pages through the space's nodes by name.
func (s *Store) ListNodes(ctx context.Context, space string, page alloc.Page) ([]alloc.Node, string, error) {
	sc := scopeOf(pageNodes, space)
	after, err := s.decodeContinue(ctx, sc, page.Continue)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.db.Query(ctx, `SELECT `+nodeColumns+` FROM nodes n WHERE n.space = $1 AND n.name > $2 ORDER BY n.name LIMIT $3`,
		space, after, page.Limit+1)
	if err != nil {
		return nil, "", err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.Node, error) { return scanNode(r) })
	if err != nil {
		return nil, "", err
	}
	if err := s.emptyListOf(ctx, space, len(items)); err != nil {
		return nil, "", err
	}
	return pageOf(ctx, s, sc, items, page.Limit, func(n alloc.Node) string { return n.Name })
}

// DeleteNode removes a node. With pending or active leases, addresses it
// holds for Cilium's agent (crd mode, reserved or used by Pods), or
// released addresses still bound to a workload identity, it is refused
// unless force, which deletes the node's leases (cooling ones included) and
// blocks in the same transaction: the node is gone, so its addresses go back
// to the pool with it. (A node whose CiliumNode still exists must not be
// deleted so: its agent may still use the addresses. Deleting the
// CiliumNode makes the operator give them back with their cooldown.)
func (s *Store) DeleteNode(ctx context.Context, space, name string, force bool) error {
	return s.inTxWhy(ctx, reasonNodeDeleted, func(tx querier) error {
		id, err := s.nodeID(ctx, tx, space, name)
		if err != nil {
			return err
		}
		// Lock the node's blocks before the node, in the order allocations
		// lock blocks: an allocation holds its block and then takes a
		// key-share lock on the node (the lease's foreign key), so taking
		// the node first would deadlock with it.
		if _, err := tx.Exec(ctx, `SELECT id FROM blocks WHERE node_id = $1 ORDER BY family, id FOR UPDATE`, id); err != nil {
			return err
		}
		// Then the CIDR rows whose carve cursors the deletion lowers, in the
		// order carving locks them, and only then the node: a carve holds
		// those rows while it takes a key-share lock on its node.
		if err := lockCarveRowsOf(ctx, tx, `node_id = @node`, namedArgs{"node": id}); err != nil {
			return err
		}
		var active, bound, crd int64
		err = tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM leases l WHERE l.node_id = n.id AND l.state <> 'released'),
				(SELECT count(*) FROM leases l WHERE l.node_id = n.id AND l.state = 'released'
				   AND l.sticky_identity IS NOT NULL AND l.cooldown_until > $2),
				(SELECT count(*) FROM leases l WHERE l.node_id = n.id AND l.network = $3 AND l.state <> 'released')
			FROM nodes n WHERE n.id = $1 FOR UPDATE`, id, s.now(), alloc.CiliumPoolNetwork).Scan(&active, &bound, &crd)
		if errors.Is(err, pgx.ErrNoRows) {
			return alloc.NotFound("node", "node", name) // deleted meanwhile
		} else if err != nil {
			return err
		}
		if crd > 0 && !force {
			// The addresses are in the node's CiliumNode: its agent may
			// be handing them to Pods.
			return &alloc.Error{Kind: alloc.KindInUse, Field: "node", Detail: fmt.Sprintf(
				"node %q holds %d addresses for Cilium's agent (crd mode) and %d other leases; delete its CiliumNode (the operator gives the addresses back after the cooldown) or delete with force=true",
				name, crd, active-crd)}
		}
		if active > 0 && !force {
			return &alloc.Error{Kind: alloc.KindInUse, Field: "node", Detail: fmt.Sprintf("node %q holds %d leases; release them or delete with force=true", name, active)}
		}
		// An address bound to a workload identity is promised to it: only
		// force (or unbinding it first) breaks that promise.
		if bound > 0 && !force {
			return &alloc.Error{Kind: alloc.KindInUse, Field: "node", Detail: fmt.Sprintf("node %q holds %d released addresses bound to workload identities; unbind them or delete with force=true", name, bound)}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM leases WHERE block_id IN (SELECT id FROM blocks WHERE node_id = $1)`, id); err != nil {
			return err
		}
		if err := deleteBlocks(ctx, tx, `DELETE FROM blocks WHERE node_id = $1 RETURNING pool_cidr_id, parent_cidr, cidr`, id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM nodes WHERE id = $1`, id)
		return err
	})
}

// nodeID resolves a registered node.
func (s *Store) nodeID(ctx context.Context, q querier, space, name string) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, `SELECT id FROM nodes WHERE space = $1 AND name = $2`, space, name).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, s.notFoundIn(ctx, q, space, "node", "node", name)
	}
	return id, err
}

// ensureNode resolves the node, registering it when unknown and the store
// auto-registers. A concurrent registration of the same node makes the
// insert fail on nodes_space_name_key, which inTx retries.
func (s *Store) ensureNode(ctx context.Context, tx querier, space, name string, now time.Time) (int64, error) {
	id, err := s.nodeID(ctx, tx, space, name)
	if err == nil || !s.opts.AutoRegisterNodes || !alloc.IsKind(err, alloc.KindNotFound) {
		return id, err
	}
	if e := (*alloc.Error)(nil); errors.As(err, &e) && e.Field == "space" {
		return 0, err
	}
	// ON CONFLICT waits for a concurrent registration of the same node
	// and then reads the winner's row, instead of failing on
	// nodes_space_name_key and retrying the whole transaction (which a
	// node registered and force-deleted again and again by other requests
	// could exhaust). The winner may itself be deleted meanwhile: try again.
	for range 3 {
		err = tx.QueryRow(ctx, `INSERT INTO nodes (space, name, created_at, updated_at) VALUES ($1, $2, $3, $3)
			ON CONFLICT (space, name) DO NOTHING RETURNING id`, space, name, now).Scan(&id)
		if !errors.Is(err, pgx.ErrNoRows) {
			return id, err
		}
		if id, err = s.nodeID(ctx, tx, space, name); !alloc.IsKind(err, alloc.KindNotFound) {
			return id, err
		}
	}
	return id, err
}
