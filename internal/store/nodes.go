package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

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

// PutNode registers a node or replaces its labels, addresses and provider ID.
func (s *Store) PutNode(ctx context.Context, n alloc.Node) (alloc.Node, bool, error) {
	if err := alloc.ValidateNodeName("node", n.Name); err != nil {
		return alloc.Node{}, false, err
	}
	if err := alloc.ValidateLabels("labels", n.Labels); err != nil {
		return alloc.Node{}, false, err
	}
	addrs := make([]nodeAddressJSON, 0, len(n.Addresses))
	for _, a := range n.Addresses {
		addrs = append(addrs, nodeAddressJSON{Type: a.Type, Address: a.Address})
	}
	var created bool
	now := s.now()
	err := s.db.QueryRow(ctx, `INSERT INTO nodes AS n (space, name, labels, addresses, provider_id, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $6)
		ON CONFLICT (space, name) DO UPDATE SET labels = EXCLUDED.labels, addresses = EXCLUDED.addresses,
			provider_id = EXCLUDED.provider_id, updated_at = EXCLUDED.updated_at
		RETURNING (xmax = 0)`, n.Space, n.Name, labelsOrEmpty(n.Labels), addrs, n.ProviderID, now).Scan(&created)
	if code, constraint := pgCode(err); code == codeForeignKey && constraint == "nodes_space_fkey" {
		return alloc.Node{}, false, alloc.NotFound("space", "address space", n.Space)
	} else if err != nil {
		return alloc.Node{}, false, err
	}
	got, err := s.GetNode(ctx, n.Space, n.Name)
	return got, created, err
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
	after, err := decodeContinue(page.Continue)
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
	items, next := pageOf(items, page.Limit, func(n alloc.Node) string { return n.Name })
	return items, next, nil
}

// DeleteNode removes a node. With pending or active leases it is refused
// unless force, which deletes the node's leases (cooling ones included) and
// blocks in the same transaction: the node is gone, so its addresses go back
// to the pool with it.
func (s *Store) DeleteNode(ctx context.Context, space, name string, force bool) error {
	return s.inTx(ctx, func(tx pgx.Tx) error {
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
		if _, err := tx.Exec(ctx, `SELECT id FROM pool_cidrs WHERE id IN (SELECT pool_cidr_id FROM blocks WHERE node_id = $1)
			ORDER BY pool_id, family, position FOR NO KEY UPDATE`, id); err != nil {
			return err
		}
		var active int64
		err = tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM leases l WHERE l.node_id = n.id AND l.state <> 'released')
			FROM nodes n WHERE n.id = $1 FOR UPDATE`, id).Scan(&active)
		if errors.Is(err, pgx.ErrNoRows) {
			return alloc.NotFound("node", "node", name) // deleted meanwhile
		} else if err != nil {
			return err
		}
		if active > 0 && !force {
			return &alloc.Error{Kind: alloc.KindInUse, Field: "node", Detail: fmt.Sprintf("node %q holds %d leases; release them or delete with force=true", name, active)}
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
