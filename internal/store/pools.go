package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// poolRow is a pool as stored, with the ids the allocation path needs.
type poolRow struct {
	id int64
	alloc.Pool
}

const poolColumns = `p.id, p.space, p.name, p.labels, p.allow_first_ip, p.allow_last_ip,
	p.reserve_router, p.reserve_health, p.reserve_ingress, p.ipv4_mask_size, p.ipv6_mask_size,
	p.created_at, p.updated_at,
	coalesce((SELECT array_agg(c.cidr ORDER BY c.position) FROM pool_cidrs c WHERE c.pool_id = p.id AND c.family = 4), '{}'),
	coalesce((SELECT array_agg(c.cidr ORDER BY c.position) FROM pool_cidrs c WHERE c.pool_id = p.id AND c.family = 6), '{}')`

func scanPool(r pgx.Row) (poolRow, error) {
	var (
		p          poolRow
		m4, m6     *int16
		c4, c6     []netip.Prefix
		labels     map[string]string
		nl         alloc.NodeLocal
		first, lst bool
	)
	err := r.Scan(&p.id, &p.Space, &p.Name, &labels, &first, &lst,
		&nl.Router, &nl.Health, &nl.Ingress, &m4, &m6, &p.CreatedAt, &p.UpdatedAt, &c4, &c6)
	if err != nil {
		return p, err
	}
	p.Labels = labels
	p.Spec = alloc.PoolSpec{AllowFirstIP: first, AllowLastIP: lst, NodeLocal: nl}
	if m4 != nil {
		p.Spec.IPv4 = &alloc.PoolFamily{CIDRs: c4, MaskSize: int(*m4)}
	}
	if m6 != nil {
		p.Spec.IPv6 = &alloc.PoolFamily{CIDRs: c6, MaskSize: int(*m6)}
	}
	return p, nil
}

func maskOf(pf *alloc.PoolFamily) *int16 {
	if pf == nil {
		return nil
	}
	m := int16(pf.MaskSize)
	return &m
}

// CreatePool adds a pool after checking its spec and that none of its CIDRs
// overlaps a pool CIDR of the space. Creating a pool that exists with the
// same labels and spec answers it again (an idempotent retry); with others,
// it is a KindConflict.
func (s *Store) CreatePool(ctx context.Context, p alloc.Pool) (alloc.Pool, error) {
	if err := validatePool(p.Name, p.Labels, p.Spec); err != nil {
		return alloc.Pool{}, err
	}
	var id int64
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		now := s.now()
		err := tx.QueryRow(ctx, `INSERT INTO pools (space, name, labels, allow_first_ip, allow_last_ip,
				reserve_router, reserve_health, reserve_ingress, ipv4_mask_size, ipv6_mask_size, created_at, updated_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11) RETURNING id`,
			p.Space, p.Name, labelsOrEmpty(p.Labels), p.Spec.AllowFirstIP, p.Spec.AllowLastIP,
			p.Spec.NodeLocal.Router, p.Spec.NodeLocal.Health, p.Spec.NodeLocal.Ingress,
			maskOf(p.Spec.IPv4), maskOf(p.Spec.IPv6), now).Scan(&id)
		if code, constraint := pgCode(err); code == codeUniqueViolation {
			return errPoolExists
		} else if code == codeForeignKey && constraint == "pools_space_fkey" {
			return alloc.NotFound("space", "address space", p.Space)
		} else if err != nil {
			return err
		}
		return insertCIDRs(ctx, tx, id, p.Space, p.Spec, nil)
	})
	if errors.Is(err, errPoolExists) {
		// A retry of the request that created it gets the first answer;
		// another request for the name is a conflict.
		have, gerr := s.GetPool(ctx, p.Space, p.Name)
		if gerr != nil {
			return alloc.Pool{}, gerr
		}
		if !maps.Equal(have.Labels, labelsOrEmpty(p.Labels)) || !reflect.DeepEqual(have.Spec, p.Spec) {
			return alloc.Pool{}, &alloc.Error{Kind: alloc.KindConflict, Field: "name",
				Detail: fmt.Sprintf("pool %q already exists with other labels or spec", p.Name)}
		}
		return have, nil
	}
	if err != nil {
		return alloc.Pool{}, err
	}
	return s.GetPool(ctx, p.Space, p.Name)
}

// errPoolExists ends CreatePool's transaction when the name is taken.
var errPoolExists = errors.New("pool exists")

func validatePool(name string, labels map[string]string, spec alloc.PoolSpec) error {
	if err := alloc.ValidateLabelName("name", name); err != nil {
		return err
	}
	if err := alloc.ValidateLabels("labels", labels); err != nil {
		return err
	}
	return spec.Validate()
}

func labelsOrEmpty(l map[string]string) map[string]string {
	if l == nil {
		return map[string]string{}
	}
	return l
}

// insertCIDRs adds the spec's CIDRs not in have, first checking each against
// the space's pool CIDRs so the error names the field and the other pool.
// The exclusion constraint still guards against a concurrent creator.
func insertCIDRs(ctx context.Context, tx pgx.Tx, poolID int64, space string, spec alloc.PoolSpec, have map[netip.Prefix]bool) error {
	for _, f := range alloc.Families {
		pf := spec.Family(f)
		if pf == nil {
			continue
		}
		for i, c := range pf.CIDRs {
			field := fmt.Sprintf("spec.%s.cidrs[%d]", f, i)
			if have[c] {
				if _, err := tx.Exec(ctx, `UPDATE pool_cidrs SET position = $3 WHERE pool_id = $1 AND cidr = $2`, poolID, c, i); err != nil {
					return err
				}
				continue
			}
			var other string
			var otherCIDR netip.Prefix
			err := tx.QueryRow(ctx, `SELECT p.name, c.cidr FROM pool_cidrs c JOIN pools p ON p.id = c.pool_id
				WHERE c.space = $1 AND c.cidr && $2 AND c.pool_id <> $3 LIMIT 1`, space, c, poolID).Scan(&other, &otherCIDR)
			if err == nil {
				return &alloc.Error{Kind: alloc.KindOverlap, Field: field, Detail: fmt.Sprintf("%s overlaps %s of pool %q", c, otherCIDR, other)}
			} else if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO pool_cidrs (pool_id, space, family, cidr, mask_size, position)
				VALUES ($1, $2, $3, $4, $5, $6)`, poolID, space, int16(f), c, pf.MaskSize, i)
			if code, _ := pgCode(err); code == codeExclusionViolation {
				return &alloc.Error{Kind: alloc.KindOverlap, Field: field, Detail: fmt.Sprintf("%s overlaps a CIDR of another pool", c)}
			} else if err != nil {
				return err
			}
		}
	}
	return nil
}

// GetPool reads a pool with its status.
func (s *Store) GetPool(ctx context.Context, space, name string) (alloc.Pool, error) {
	p, err := s.getPool(ctx, s.db, space, name, false)
	if err != nil {
		return alloc.Pool{}, err
	}
	if err := s.fillStatus(ctx, &p); err != nil {
		return alloc.Pool{}, err
	}
	return p.Pool, nil
}

func (s *Store) getPool(ctx context.Context, q querier, space, name string, forUpdate bool) (poolRow, error) {
	sql := `SELECT ` + poolColumns + ` FROM pools p WHERE p.space = $1 AND p.name = $2`
	if forUpdate {
		sql += ` FOR NO KEY UPDATE`
	}
	p, err := scanPool(q.QueryRow(ctx, sql, space, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return p, s.notFoundIn(ctx, q, space, "pool", "pool", name)
	}
	return p, err
}

// fillStatus counts blocks and leases of the pool per family. Cooling counts
// released addresses whose cooldown has not ended yet.
func (s *Store) fillStatus(ctx context.Context, p *poolRow) error {
	p.Status = map[alloc.Family]alloc.PoolFamilyStatus{}
	for _, f := range p.Spec.Families() {
		p.Status[f] = alloc.PoolFamilyStatus{BlocksPossible: p.Spec.Family(f).BlocksPossible()}
	}
	rows, err := s.db.Query(ctx, `
		SELECT f.family,
		       (SELECT count(*) FROM blocks b WHERE b.pool_id = $1 AND b.family = f.family),
		       (SELECT coalesce(sum(capacity), 0) FROM blocks b WHERE b.pool_id = $1 AND b.family = f.family),
		       (SELECT count(*) FROM blocks b JOIN leases l ON l.block_id = b.id
		        WHERE b.pool_id = $1 AND b.family = f.family AND l.state <> 'released'),
		       (SELECT count(*) FROM blocks b JOIN leases l ON l.block_id = b.id
		        WHERE b.pool_id = $1 AND b.family = f.family AND l.state = 'released' AND l.cooldown_until > $2)
		FROM (VALUES (4::smallint), (6::smallint)) f(family)`, p.id, s.now())
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var fam int16
		var carved, total, leased, cooling int64
		if err := rows.Scan(&fam, &carved, &total, &leased, &cooling); err != nil {
			return err
		}
		st, ok := p.Status[alloc.Family(fam)]
		if !ok {
			continue
		}
		st.BlocksCarved, st.AddressesTotal, st.Leased, st.Cooling = carved, total, leased, cooling
		p.Status[alloc.Family(fam)] = st
	}
	return rows.Err()
}

// ListPools pages through the space's pools by name, with status.
func (s *Store) ListPools(ctx context.Context, space string, page alloc.Page) ([]alloc.Pool, string, error) {
	after, err := decodeContinue(page.Continue)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.db.Query(ctx, `SELECT `+poolColumns+` FROM pools p WHERE p.space = $1 AND p.name > $2 ORDER BY p.name LIMIT $3`,
		space, after, page.Limit+1)
	if err != nil {
		return nil, "", err
	}
	prs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (poolRow, error) { return scanPool(r) })
	if err != nil {
		return nil, "", err
	}
	if err := s.emptyListOf(ctx, space, len(prs)); err != nil {
		return nil, "", err
	}
	prs, next := pageOf(prs, page.Limit, func(p poolRow) string { return p.Name })
	out := make([]alloc.Pool, 0, len(prs))
	for i := range prs {
		if err := s.fillStatus(ctx, &prs[i]); err != nil {
			return nil, "", err
		}
		out = append(out, prs[i].Pool)
	}
	return out, next, nil
}

// UpdatePool replaces labels and spec. Immutable fields are refused; CIDRs
// and families may be removed only while no block was carved from them.
func (s *Store) UpdatePool(ctx context.Context, space, name string, labels map[string]string, spec alloc.PoolSpec) (alloc.Pool, error) {
	if err := validatePool(name, labels, spec); err != nil {
		return alloc.Pool{}, err
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		prev, err := s.getPool(ctx, tx, space, name, true)
		if err != nil {
			return err
		}
		if err := alloc.ValidateUpdate(prev.Spec, spec); err != nil {
			return err
		}
		have := map[netip.Prefix]bool{}
		for _, f := range alloc.Families {
			pp, np := prev.Spec.Family(f), spec.Family(f)
			if pp == nil {
				continue
			}
			keep := map[netip.Prefix]bool{}
			if np != nil {
				for _, c := range np.CIDRs {
					keep[c] = true
				}
			}
			for _, c := range pp.CIDRs {
				if keep[c] {
					have[c] = true
					continue
				}
				field := "spec." + f.String() + ".cidrs"
				if np == nil {
					field = "spec." + f.String()
				}
				tag, err := tx.Exec(ctx, `DELETE FROM pool_cidrs c WHERE c.pool_id = $1 AND c.cidr = $2
					AND NOT EXISTS (SELECT 1 FROM blocks b WHERE b.pool_cidr_id = c.id)`, prev.id, c)
				if code, _ := pgCode(err); err != nil && code != codeForeignKey {
					return err
				}
				// No row deleted: it has blocks. A foreign-key violation: a
				// block was carved from it while this update waited.
				if err != nil || tag.RowsAffected() == 0 {
					return &alloc.Error{Kind: alloc.KindInUse, Field: field, Detail: fmt.Sprintf("%s still has blocks carved from it", c)}
				}
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE pools SET labels = $2, ipv4_mask_size = $3, ipv6_mask_size = $4, updated_at = $5 WHERE id = $1`,
			prev.id, labelsOrEmpty(labels), maskOf(spec.IPv4), maskOf(spec.IPv6), s.now()); err != nil {
			return err
		}
		return insertCIDRs(ctx, tx, prev.id, space, spec, have)
	})
	if err != nil {
		return alloc.Pool{}, err
	}
	return s.GetPool(ctx, space, name)
}

// DeletePool removes a pool that has no blocks.
func (s *Store) DeletePool(ctx context.Context, space, name string) error {
	return s.inTx(ctx, func(tx pgx.Tx) error {
		p, err := s.getPool(ctx, tx, space, name, true)
		if err != nil {
			return err
		}
		var blocks int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM blocks WHERE pool_id = $1`, p.id).Scan(&blocks); err != nil {
			return err
		}
		if blocks > 0 {
			return &alloc.Error{Kind: alloc.KindInUse, Field: "pool", Detail: fmt.Sprintf("pool %q still has %d blocks carved for nodes", name, blocks)}
		}
		_, err = tx.Exec(ctx, `DELETE FROM pools WHERE id = $1`, p.id)
		if code, _ := pgCode(err); code == codeForeignKey {
			// A block was carved after the count above.
			return &alloc.Error{Kind: alloc.KindInUse, Field: "pool", Detail: fmt.Sprintf("pool %q has blocks carved for nodes", name)}
		}
		return err
	})
}
