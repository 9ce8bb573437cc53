// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// CIDR groups (migration 00020): a row of cidr_groups and a row of
// cidr_group_cidrs per CIDR, in the group's order.

const cidrGroupColumns = `g.space, g.name, g.labels, g.created_at, g.updated_at,
	coalesce((SELECT array_agg(c.cidr ORDER BY c.position) FROM cidr_group_cidrs c WHERE c.group_id = g.id), '{}'),
	g.allow_special_purpose, g.source, g.source_uid`

func scanCIDRGroup(r pgx.Row) (alloc.CIDRGroup, error) {
	var g alloc.CIDRGroup
	err := r.Scan(&g.Space, &g.Name, &g.Labels, &g.CreatedAt, &g.UpdatedAt, &g.CIDRs, &g.AllowSpecialPurpose, &g.Origin.Source, &g.Origin.UID)
	return g, err
}

// errCIDRGroupExists ends CreateCIDRGroup's transaction when the name is
// taken.
var errCIDRGroupExists = errors.New("CIDR group exists")

// CreateCIDRGroup adds a group owned by g.Origin. Creating one that
// exists with the same labels, CIDRs, allowSpecialPurpose and origin
// answers it again (a retry); with others it is a KindConflict
// (alloc.NotOwner when another origin owns the name).
func (s *Store) CreateCIDRGroup(ctx context.Context, g alloc.CIDRGroup, opts ...alloc.WriteOption) (alloc.CIDRGroup, error) {
	if err := errors.Join(g.Validate(), g.Origin.Validate()); err != nil {
		return alloc.CIDRGroup{}, err
	}
	source, uid := g.Origin.Stored()
	var out alloc.CIDRGroup
	err := s.write(ctx, opts, func(tx querier) error {
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO cidr_groups (space, name, labels, created_at, updated_at, allow_special_purpose, source, source_uid)
			VALUES (@space, @name, @labels, @now, @now, @allowSpecialPurpose, @source, @sourceUID)
			ON CONFLICT (space, name) DO NOTHING RETURNING id`, namedArgs{"space": g.Space, "name": g.Name,
			"labels": labelsOrEmpty(g.Labels), "now": s.now(), "allowSpecialPurpose": g.AllowSpecialPurpose,
			"source": source, "sourceUID": uid}).Scan(&id)
		switch code, _ := pgCode(err); {
		case errors.Is(err, pgx.ErrNoRows):
			return errCIDRGroupExists
		case code == codeForeignKey:
			return alloc.NotFound("space", "address space", g.Space)
		case err != nil:
			return err
		}
		if err := insertGroupCIDRs(ctx, tx, id, g); err != nil {
			return err
		}
		out, err = getCIDRGroup(ctx, tx, s, g.Space, g.Name)
		return err
	})
	if errors.Is(err, errCIDRGroupExists) {
		have, gerr := s.GetCIDRGroup(ctx, g.Space, g.Name)
		if gerr != nil {
			return alloc.CIDRGroup{}, gerr
		}
		if have.Origin.Source != source {
			return alloc.CIDRGroup{}, alloc.NotOwner("CIDR group", g.Name, have.Origin, kindCIDRGroupObject)
		}
		if have.Origin.UID != uid || !maps.Equal(have.Labels, labelsOrEmpty(g.Labels)) || !slices.Equal(have.CIDRs, g.CIDRs) || have.AllowSpecialPurpose != g.AllowSpecialPurpose {
			return alloc.CIDRGroup{}, &alloc.Error{Kind: alloc.KindConflict, Field: "name",
				Detail: fmt.Sprintf("CIDR group %q already exists with other labels, CIDRs or allowSpecialPurpose", g.Name)}
		}
		return have, nil
	}
	return out, err
}

func insertGroupCIDRs(ctx context.Context, tx querier, id int64, g alloc.CIDRGroup) error {
	if len(g.CIDRs) == 0 {
		return nil
	}
	positions := make([]int32, len(g.CIDRs))
	for i := range positions {
		positions[i] = int32(i)
	}
	_, err := tx.Exec(ctx, `INSERT INTO cidr_group_cidrs (group_id, space, position, cidr)
		SELECT $1, $2, p, c FROM unnest($3::int[], $4::cidr[]) AS u(p, c)`, id, g.Space, positions, g.CIDRs)
	return err
}

// UpdateCIDRGroup replaces a group's labels, CIDRs and allowSpecialPurpose.
// Only a writer of the group's origin (alloc.AsOrigin) edits it, else
// alloc.NotOwner; a Kubernetes writer takes the group over for its UID.
func (s *Store) UpdateCIDRGroup(ctx context.Context, g alloc.CIDRGroup, opts ...alloc.WriteOption) (alloc.CIDRGroup, error) {
	writer := alloc.ApplyWriteOptions(opts).Origin
	if err := errors.Join(g.Validate(), writer.Validate()); err != nil {
		return alloc.CIDRGroup{}, err
	}
	source, uid := writer.Stored()
	var out alloc.CIDRGroup
	err := s.write(ctx, opts, func(tx querier) error {
		id, owner, err := lockCIDRGroup(ctx, tx, s, g.Space, g.Name)
		if err != nil {
			return err
		}
		if owner.Source != source {
			return alloc.NotOwner("CIDR group", g.Name, owner, kindCIDRGroupObject)
		}
		if _, err := tx.Exec(ctx, `UPDATE cidr_groups SET labels = @labels, updated_at = @now, allow_special_purpose = @allowSpecialPurpose,
				source_uid = @sourceUID WHERE id = @id`, namedArgs{"id": id,
			"labels": labelsOrEmpty(g.Labels), "now": s.now(), "allowSpecialPurpose": g.AllowSpecialPurpose, "sourceUID": uid}); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM cidr_group_cidrs WHERE group_id = $1`, id); err != nil {
			return err
		}
		if err := insertGroupCIDRs(ctx, tx, id, g); err != nil {
			return err
		}
		// A VIP pool reserving the group now keeps other addresses out.
		var named bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM lb_pools WHERE space = $1 AND reserved_groups @> ARRAY[$2]::text[])`,
			g.Space, g.Name).Scan(&named); err != nil {
			return err
		}
		if named {
			if err := refreshStranded(ctx, tx, g.Space); err != nil {
				return err
			}
		}
		out, err = getCIDRGroup(ctx, tx, s, g.Space, g.Name)
		return err
	})
	return out, err
}

// DeleteCIDRGroup removes a group and answers it as it was. Only a writer
// of the group's origin (alloc.AsOrigin) deletes it, and a Kubernetes
// writer only the group of its object's UID (else alloc.NotOwner, or
// KindStaleGeneration for another UID).
func (s *Store) DeleteCIDRGroup(ctx context.Context, space, name string, opts ...alloc.WriteOption) (alloc.CIDRGroup, error) {
	source, uid := alloc.ApplyWriteOptions(opts).Origin.Stored()
	var out alloc.CIDRGroup
	err := s.write(ctx, opts, func(tx querier) error {
		_, owner, err := lockCIDRGroup(ctx, tx, s, space, name)
		if err != nil {
			return err
		}
		switch {
		case owner.Source != source:
			return alloc.NotOwner("CIDR group", name, owner, kindCIDRGroupObject)
		case owner.UID != uid:
			return &alloc.Error{Kind: alloc.KindStaleGeneration, Field: "name",
				Detail: fmt.Sprintf("CIDR group %q was imported from another object of its name (uid %s, not %s)", name, owner.UID, uid)}
		}
		// Locked: no VIP pool can name it from now on without waiting.
		var pools []string
		if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM lb_pools WHERE space = $1 AND reserved_groups @> ARRAY[$2]::text[]`,
			space, name).Scan(&pools); err != nil {
			return err
		}
		if len(pools) > 0 {
			return &alloc.Error{Kind: alloc.KindInUse, Field: "group",
				Detail: fmt.Sprintf("CIDR group %q is reserved by the VIP pools %s", name, strings.Join(pools, ", "))}
		}
		if out, err = getCIDRGroup(ctx, tx, s, space, name); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM cidr_groups WHERE space = $1 AND name = $2`, space, name)
		return err
	})
	return out, err
}

// lockCIDRGroup locks a group's row (FOR UPDATE) and answers its id and
// origin, or KindNotFound.
func lockCIDRGroup(ctx context.Context, tx querier, s *Store, space, name string) (int64, alloc.Origin, error) {
	var id int64
	var o alloc.Origin
	err := tx.QueryRow(ctx, `SELECT id, source, source_uid FROM cidr_groups WHERE space = $1 AND name = $2 FOR UPDATE`, space, name).
		Scan(&id, &o.Source, &o.UID)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, o, s.notFoundIn(ctx, tx, space, "group", "CIDR group", name)
	}
	return id, o, err
}

// GetCIDRGroup reads one group.
func (s *Store) GetCIDRGroup(ctx context.Context, space, name string) (alloc.CIDRGroup, error) {
	return getCIDRGroup(ctx, s.db, s, space, name)
}

func getCIDRGroup(ctx context.Context, q querier, s *Store, space, name string) (alloc.CIDRGroup, error) {
	g, err := scanCIDRGroup(q.QueryRow(ctx, `SELECT `+cidrGroupColumns+` FROM cidr_groups g WHERE g.space = $1 AND g.name = $2`, space, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return g, s.notFoundIn(ctx, q, space, "group", "CIDR group", name)
	}
	return g, err
}

// ListCIDRGroups pages through the space's groups by name.
func (s *Store) ListCIDRGroups(ctx context.Context, space string, page alloc.Page) ([]alloc.CIDRGroup, string, error) {
	sc := scopeOf(pageCIDRGroups, space)
	after, err := s.decodeContinue(ctx, sc, page.Continue)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.db.Query(ctx, `SELECT `+cidrGroupColumns+` FROM cidr_groups g WHERE g.space = $1 AND g.name > $2 ORDER BY g.name LIMIT $3`,
		space, after, page.Limit+1)
	if err != nil {
		return nil, "", err
	}
	groups, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.CIDRGroup, error) { return scanCIDRGroup(r) })
	if err != nil {
		return nil, "", err
	}
	if err := s.emptyListOf(ctx, space, len(groups)); err != nil {
		return nil, "", err
	}
	return pageOf(ctx, s, sc, groups, page.Limit, func(g alloc.CIDRGroup) string { return g.Name })
}

// maxGroupMatches bounds the groups one containment answer names.
const maxGroupMatches = 1000

// CIDRGroupsContaining answers the space's groups holding a, by name,
// each with its longest CIDR that holds a (at most 1,000 groups; more is
// KindInvalid, which no real set of policies reaches).
func (s *Store) CIDRGroupsContaining(ctx context.Context, space string, a netip.Addr) ([]alloc.CIDRGroupMatch, error) {
	rows, err := s.db.Query(ctx, `SELECT DISTINCT ON (g.name) g.name, c.cidr
		FROM cidr_group_cidrs c JOIN cidr_groups g ON g.id = c.group_id
		WHERE c.space = $1 AND c.cidr >>= $2::inet
		ORDER BY g.name, masklen(c.cidr) DESC LIMIT $3`, space, a, maxGroupMatches+1)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.CIDRGroupMatch, error) {
		var m alloc.CIDRGroupMatch
		return m, r.Scan(&m.Group, &m.CIDR)
	})
	if err != nil {
		return nil, err
	}
	if len(out) > maxGroupMatches {
		return nil, alloc.Invalid("contains", "more than %d groups hold %s", maxGroupMatches, a)
	}
	if err := s.emptyListOf(ctx, space, len(out)); err != nil {
		return nil, err
	}
	return out, nil
}
