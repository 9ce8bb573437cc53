// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// CreateSpace adds an address space. A space is its name, so creating one
// that exists answers it again (an idempotent retry).
func (s *Store) CreateSpace(ctx context.Context, name string) (alloc.Space, error) {
	if err := alloc.ValidateLabelName("name", name); err != nil {
		return alloc.Space{}, err
	}
	sp := alloc.Space{Name: name}
	err := s.db.QueryRow(ctx,
		`INSERT INTO address_spaces (name, created_at) VALUES ($1, $2)
		 ON CONFLICT (name) DO NOTHING RETURNING created_at`, name, s.now()).Scan(&sp.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return s.GetSpace(ctx, name)
	}
	return sp, err
}

// GetSpace reads one address space.
func (s *Store) GetSpace(ctx context.Context, name string) (alloc.Space, error) {
	sp := alloc.Space{Name: name}
	err := s.db.QueryRow(ctx, `SELECT created_at FROM address_spaces WHERE name = $1`, name).Scan(&sp.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return alloc.Space{}, alloc.NotFound("space", "address space", name)
	}
	return sp, err
}

// ListSpaces pages through the spaces by name.
func (s *Store) ListSpaces(ctx context.Context, page alloc.Page) ([]alloc.Space, string, error) {
	sc := scopeOf(pageSpaces)
	after, err := s.decodeContinue(ctx, sc, page.Continue)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.db.Query(ctx,
		`SELECT name, created_at FROM address_spaces WHERE name > $1 ORDER BY name LIMIT $2`, after, page.Limit+1)
	if err != nil {
		return nil, "", err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.Space, error) {
		var sp alloc.Space
		return sp, r.Scan(&sp.Name, &sp.CreatedAt)
	})
	if err != nil {
		return nil, "", err
	}
	return pageOf(ctx, s, sc, items, page.Limit, func(sp alloc.Space) string { return sp.Name })
}

// DeleteSpace removes an empty space other than the default one, which
// every request that names no space uses.
func (s *Store) DeleteSpace(ctx context.Context, name string) error {
	if name == alloc.DefaultSpace {
		return &alloc.Error{Kind: alloc.KindInUse, Field: "space", Detail: "the default address space cannot be deleted"}
	}
	return s.inTx(ctx, func(tx querier) error {
		var inUse bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pools WHERE space = $1)
			OR EXISTS (SELECT 1 FROM nodes WHERE space = $1)
			OR EXISTS (SELECT 1 FROM lb_pools WHERE space = $1)
			OR EXISTS (SELECT 1 FROM vip_owners WHERE space = $1)
			OR EXISTS (SELECT 1 FROM cidr_groups WHERE space = $1)
			FROM address_spaces WHERE name = $1 FOR UPDATE`, name).Scan(&inUse)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return alloc.NotFound("space", "address space", name)
		case err != nil:
			return err
		case inUse:
			return &alloc.Error{Kind: alloc.KindInUse, Field: "space", Detail: "address space " + name + " still has pools, VIP pools, VIP owners, CIDR groups or nodes"}
		}
		_, err = tx.Exec(ctx, `DELETE FROM address_spaces WHERE name = $1`, name)
		return err
	})
}
