// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"go4.org/netipx"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// poolRow is a pool as stored, with the ids the allocation path needs.
type poolRow struct {
	id int64
	alloc.Pool
}

const poolColumns = `p.id, p.space, p.name, p.labels, p.allow_first_ip, p.allow_last_ip,
	p.reserve_router, p.reserve_health, p.reserve_ingress, p.ipv4_mask_size, p.ipv6_mask_size,
	p.created_at, p.updated_at, p.mode, p.pre_allocate, p.pod_selector, p.namespace_selector,
	p.disabled, p.skip_masquerade, p.max_blocks_per_node, p.allow_special_purpose, p.node_selector, p.cloud,
	coalesce((SELECT array_agg(c.cidr ORDER BY c.position) FROM pool_cidrs c WHERE c.pool_id = p.id AND c.family = 4), '{}'),
	coalesce((SELECT array_agg(c.cidr ORDER BY c.position) FROM pool_cidrs c WHERE c.pool_id = p.id AND c.family = 6), '{}'),
	coalesce((SELECT json_agg(json_build_object('cidr', c.cidr, 'start', c.reserved_start, 'end', c.reserved_end) ORDER BY c.position)
		FROM pool_cidrs c WHERE c.pool_id = p.id AND cardinality(c.reserved_start) > 0), '[]')`

// reservedJSON is one pool CIDR's reserved ranges as poolColumns reads them.
type reservedJSON struct {
	CIDR  netip.Prefix `json:"cidr"`
	Start []netip.Addr `json:"start"`
	End   []netip.Addr `json:"end"`
}

func scanPool(r pgx.Row) (poolRow, error) {
	var (
		p          poolRow
		m4, m6     *int16
		c4, c6     []netip.Prefix
		labels     map[string]string
		nl         alloc.NodeLocal
		first, lst bool
		mode       string
		pre        *int32
		maxBlocks  *int32
		reserved   []reservedJSON
		cloud      []byte
	)
	sp := &p.Spec
	err := r.Scan(&p.id, &p.Space, &p.Name, &labels, &first, &lst,
		&nl.Router, &nl.Health, &nl.Ingress, &m4, &m6, &p.CreatedAt, &p.UpdatedAt,
		&mode, &pre, &sp.PodSelector, &sp.NamespaceSelector, &sp.Disabled, &sp.SkipMasquerade,
		&maxBlocks, &sp.AllowSpecialPurpose, &sp.NodeSelector, &cloud, &c4, &c6, &reserved)
	if err != nil {
		return p, err
	}
	if sp.Cloud, err = cloudSpecOf(cloud); err != nil {
		return p, fmt.Errorf("pool %s: spec.cloud: %w", p.Name, err)
	}
	p.Labels = labels
	sp.AllowFirstIP, sp.AllowLastIP, sp.NodeLocal, sp.Mode = first, lst, nl, alloc.PoolMode(mode)
	if pre != nil {
		v := int(*pre)
		sp.PreAllocate = &v
	}
	if maxBlocks != nil {
		v := int(*maxBlocks)
		sp.MaxBlocksPerNode = &v
	}
	if m4 != nil {
		sp.IPv4 = &alloc.PoolFamily{CIDRs: c4, MaskSize: int(*m4)}
	}
	if m6 != nil {
		sp.IPv6 = &alloc.PoolFamily{CIDRs: c6, MaskSize: int(*m6)}
	}
	for _, rj := range reserved {
		pf := sp.Family(alloc.FamilyOf(rj.CIDR.Addr()))
		if pf == nil {
			continue
		}
		cr := alloc.CIDRReservation{CIDR: rj.CIDR}
		for i := range rj.Start {
			cr.Ranges = append(cr.Ranges, alloc.AddrRange{Start: rj.Start[i], End: rj.End[i]})
		}
		pf.Reserved = append(pf.Reserved, cr)
	}
	return p, nil
}

func preAllocateOf(s alloc.PoolSpec) *int32 { return int32Of(s.PreAllocate) }

func int32Of(p *int) *int32 {
	if p == nil {
		return nil
	}
	v := int32(*p)
	return &v
}

// reservedArrays flattens the reserved ranges of one CIDR for pool_cidrs.
func reservedArrays(pf *alloc.PoolFamily, c netip.Prefix) (starts, ends []netip.Addr) {
	starts, ends = []netip.Addr{}, []netip.Addr{}
	for _, r := range pf.ReservedIn(c) {
		starts, ends = append(starts, r.Start), append(ends, r.End)
	}
	return starts, ends
}

func maskOf(pf *alloc.PoolFamily) *int16 {
	if pf == nil {
		return nil
	}
	m := int16(pf.MaskSize)
	return &m
}

// errDryRun rolls back a dry run's transaction once it has its answer.
var errDryRun = errors.New("dry run")

// write runs fn in a transaction, rolled back instead of committed on a
// dry run.
func (s *Store) write(ctx context.Context, opts []alloc.WriteOption, fn func(tx querier) error) error {
	o := alloc.ApplyWriteOptions(opts)
	err := s.inTx(ctx, func(tx querier) error {
		if err := fn(tx); err != nil {
			return err
		}
		if o.DryRun {
			return errDryRun
		}
		return nil
	})
	if errors.Is(err, errDryRun) {
		return nil
	}
	return err
}

// CreatePool adds a pool after checking its spec and that none of its CIDRs
// overlaps a pool CIDR of the space. Creating a pool that exists with the
// same labels and spec answers it again (an idempotent retry); with others,
// it is a KindConflict.
func (s *Store) CreatePool(ctx context.Context, p alloc.Pool, opts ...alloc.WriteOption) (alloc.Pool, error) {
	if err := validatePool(p.Name, p.Labels, p.Spec); err != nil {
		return alloc.Pool{}, err
	}
	p.Spec.Mode = p.Spec.EffectiveMode()
	cloud, err := cloudColumn(p.Spec.Cloud)
	if err != nil {
		return alloc.Pool{}, err
	}
	var out alloc.Pool
	err = s.write(ctx, opts, func(tx querier) error {
		now := s.now()
		var id int64
		sp := p.Spec
		err := tx.QueryRow(ctx, `INSERT INTO pools (space, name, labels, allow_first_ip, allow_last_ip,
				reserve_router, reserve_health, reserve_ingress, ipv4_mask_size, ipv6_mask_size, created_at, updated_at,
				mode, pre_allocate, pod_selector, namespace_selector, disabled, skip_masquerade, max_blocks_per_node, allow_special_purpose,
				node_selector, cloud)
			VALUES (@space, @name, @labels, @allowFirst, @allowLast,
				@router, @health, @ingress, @ipv4Mask, @ipv6Mask, @now, @now,
				@mode, @preAllocate, @podSelector, @namespaceSelector, @disabled, @skipMasquerade, @maxBlocksPerNode, @allowSpecialPurpose,
				@nodeSelector, @cloud) RETURNING id`,
			namedArgs{"space": p.Space, "name": p.Name, "labels": labelsOrEmpty(p.Labels),
				"allowFirst": sp.AllowFirstIP, "allowLast": sp.AllowLastIP,
				"router": sp.NodeLocal.Router, "health": sp.NodeLocal.Health, "ingress": sp.NodeLocal.Ingress,
				"ipv4Mask": maskOf(sp.IPv4), "ipv6Mask": maskOf(sp.IPv6), "now": now, "mode": string(sp.Mode), "preAllocate": preAllocateOf(sp),
				"podSelector": sp.PodSelector, "namespaceSelector": sp.NamespaceSelector, "disabled": sp.Disabled,
				"skipMasquerade": sp.SkipMasquerade, "maxBlocksPerNode": int32Of(sp.MaxBlocksPerNode),
				"allowSpecialPurpose": sp.AllowSpecialPurpose, "nodeSelector": sp.NodeSelector, "cloud": cloud}).Scan(&id)
		if code, constraint := pgCode(err); code == codeUniqueViolation {
			return errPoolExists
		} else if code == codeForeignKey && constraint == constraintPoolSpace {
			return alloc.NotFound("space", "address space", p.Space)
		} else if err != nil {
			return err
		}
		if err := insertCIDRs(ctx, tx, id, p.Space, p.Spec, nil); err != nil {
			return err
		}
		out, err = s.readPool(ctx, tx, p.Space, p.Name)
		return err
	})
	if errors.Is(err, errPoolExists) {
		// A retry of the request that created it gets the first answer;
		// another request for the name is a conflict.
		have, gerr := s.GetPool(ctx, p.Space, p.Name)
		if gerr != nil {
			return alloc.Pool{}, gerr
		}
		if !maps.Equal(have.Labels, labelsOrEmpty(p.Labels)) || !sameSpec(have.Spec, p.Spec) {
			return alloc.Pool{}, &alloc.Error{Kind: alloc.KindConflict, Field: "name",
				Detail: fmt.Sprintf("pool %q already exists with other labels or spec", p.Name)}
		}
		return have, nil
	}
	return out, err
}

// sameSpec compares specs as stored: nil and empty reservation lists are
// the same.
func sameSpec(a, b alloc.PoolSpec) bool {
	norm := func(s alloc.PoolSpec) alloc.PoolSpec {
		for _, pf := range []**alloc.PoolFamily{&s.IPv4, &s.IPv6} {
			if *pf == nil {
				continue
			}
			c := **pf
			c.Reserved = slices.DeleteFunc(slices.Clone(c.Reserved), func(r alloc.CIDRReservation) bool { return len(r.Ranges) == 0 })
			if len(c.Reserved) == 0 {
				c.Reserved = nil
			}
			*pf = &c
		}
		s.Mode = s.EffectiveMode()
		return s
	}
	return reflect.DeepEqual(norm(a), norm(b))
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
// The exclusion constraint still guards against a concurrent creator. CIDRs
// in have keep their row (and blocks); their position and reserved ranges
// follow the spec, and a change of reserved ranges resets the carve cursor,
// since blocks a range kept out may be free now.
func insertCIDRs(ctx context.Context, tx querier, poolID int64, space string, spec alloc.PoolSpec, have map[netip.Prefix]bool) error {
	for _, f := range alloc.Families {
		pf := spec.Family(f)
		if pf == nil {
			continue
		}
		for i, c := range pf.CIDRs {
			field := fmt.Sprintf("spec.%s.cidrs[%d]", f, i)
			starts, ends := reservedArrays(pf, c)
			if have[c] {
				if _, err := tx.Exec(ctx, `UPDATE pool_cidrs SET position = @position, reserved_start = @starts, reserved_end = @ends,
						carve_hint = CASE WHEN reserved_start = @starts AND reserved_end = @ends THEN carve_hint ELSE 0 END
					WHERE pool_id = @pool AND cidr = @cidr`,
					namedArgs{"pool": poolID, "cidr": c, "position": i, "starts": starts, "ends": ends}); err != nil {
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
			if err := checkVIPOverlap(ctx, tx, space, field, c); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO pool_cidrs (pool_id, space, family, cidr, mask_size, position, reserved_start, reserved_end)
				VALUES (@pool, @space, @family, @cidr, @mask, @position, @starts, @ends)`,
				namedArgs{"pool": poolID, "space": space, "family": int16(f), "cidr": c, "mask": pf.MaskSize, "position": i,
					"starts": starts, "ends": ends})
			if code, _ := pgCode(err); code == codeExclusionViolation {
				return &alloc.Error{Kind: alloc.KindOverlap, Field: field, Detail: fmt.Sprintf("%s overlaps a CIDR of another pool", c)}
			} else if err != nil {
				return err
			}
		}
	}
	return nil
}

// checkVIPOverlap refuses a Pod pool CIDR overlapping a VIP block of the
// space, naming the VIP pool. The exclusion constraint of address_ranges,
// which a trigger on pool_cidrs feeds, still guards against a concurrent
// VIP pool writer.
func checkVIPOverlap(ctx context.Context, tx querier, space, field string, c netip.Prefix) error {
	r := netipx.RangeOfPrefix(c)
	var pool, block string
	err := tx.QueryRow(ctx, `SELECT p.name, coalesce(r.cidr::text, host(r.first_addr) || '-' || host(r.last_addr))
		FROM address_ranges r JOIN lb_pools p ON p.id = r.lb_pool_id
		WHERE r.space = $1 AND r.kind = 'vip' AND r.span && inetrange($2::inet, $3::inet, '[]') LIMIT 1`,
		space, r.From(), r.To()).Scan(&pool, &block)
	if err == nil {
		return &alloc.Error{Kind: alloc.KindOverlap, Field: field,
			Detail: fmt.Sprintf("%s overlaps block %s of VIP pool %q; Pod pools and VIP pools of a space never overlap", c, block, pool)}
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	// A VIP stranded outside every VIP block by a pool edit is still held.
	var addr netip.Addr
	var owner string
	err = tx.QueryRow(ctx, `SELECT v.addr, coalesce((SELECT o.namespace || '/' || o.name FROM vip_holders h JOIN vip_owners o ON o.id = h.owner_id
			WHERE h.vip_id = v.id ORDER BY 1 LIMIT 1), '')
		FROM vips v WHERE v.space = $1 AND v.addr <<= $2 ORDER BY v.addr LIMIT 1`, space, c).Scan(&addr, &owner)
	if err == nil {
		return &alloc.Error{Kind: alloc.KindOverlap, Field: field,
			Detail: fmt.Sprintf("%s holds the VIP %s of %s, kept outside every VIP pool since a pool edit", c, addr, owner)}
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	return nil
}

// GetPool reads a pool with its status.
func (s *Store) GetPool(ctx context.Context, space, name string) (alloc.Pool, error) {
	return s.readPool(ctx, s.db, space, name)
}

func (s *Store) readPool(ctx context.Context, q querier, space, name string) (alloc.Pool, error) {
	p, err := s.getPool(ctx, q, space, name, false)
	if err != nil {
		return alloc.Pool{}, err
	}
	if err := s.fillStatus(ctx, q, &p); err != nil {
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

// fillStatus counts blocks and leases of the pool per family. Cooling
// counts released addresses whose cooldown has not ended yet.
//
// It reads the blocks' lease counters (blocks.allocated: every lease row
// of the block) and the released rows only (the partial index
// leases_cooled), never the pool's active leases: at 550,000 leases a
// count over them would cost a scan of the lease table on every read of a
// pool and every metrics refresh.
func (s *Store) fillStatus(ctx context.Context, q querier, p *poolRow) error {
	p.Status = map[alloc.Family]alloc.PoolFamilyStatus{}
	for _, f := range p.Spec.Families() {
		p.Status[f] = alloc.PoolFamilyStatus{BlocksPossible: p.Spec.Family(f).BlocksPossible()}
	}
	rows, err := q.Query(ctx, `
		SELECT f.family,
		       (SELECT count(*) FROM blocks b WHERE b.pool_id = $1 AND b.family = f.family),
		       (SELECT coalesce(sum(capacity), 0) FROM blocks b WHERE b.pool_id = $1 AND b.family = f.family),
		       (SELECT coalesce(sum(allocated), 0) FROM blocks b WHERE b.pool_id = $1 AND b.family = f.family),
		       (SELECT count(*) FROM leases l WHERE l.state = 'released' AND l.pool_id = $1 AND l.family = f.family),
		       (SELECT count(*) FROM leases l WHERE l.state = 'released' AND l.pool_id = $1 AND l.family = f.family
		          AND l.cooldown_until > $2)
		FROM (VALUES (4::smallint), (6::smallint)) f(family)`, p.id, s.now())
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var fam int16
		var carved, total, rowsHeld, released, cooling int64
		if err := rows.Scan(&fam, &carved, &total, &rowsHeld, &released, &cooling); err != nil {
			return err
		}
		st, ok := p.Status[alloc.Family(fam)]
		if !ok {
			continue
		}
		st.BlocksCarved, st.AddressesTotal, st.Leased, st.Cooling = carved, total, rowsHeld-released, cooling
		p.Status[alloc.Family(fam)] = st
	}
	return rows.Err()
}

// ListPools pages through the space's pools by name, with status.
func (s *Store) ListPools(ctx context.Context, space string, page alloc.Page) ([]alloc.Pool, string, error) {
	sc := scopeOf(pagePools, space)
	after, err := s.decodeContinue(ctx, sc, page.Continue)
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
	prs, next, err := pageOf(ctx, s, sc, prs, page.Limit, func(p poolRow) string { return p.Name })
	if err != nil {
		return nil, "", err
	}
	out := make([]alloc.Pool, 0, len(prs))
	for i := range prs {
		if err := s.fillStatus(ctx, s.db, &prs[i]); err != nil {
			return nil, "", err
		}
		out = append(out, prs[i].Pool)
	}
	return out, next, nil
}

// UpdatePool replaces labels and spec. Immutable fields are refused; CIDRs
// may be appended live, and removed (or a family dropped) only while no node
// holds a block carved from them; the refusal names those nodes. A spec
// without a mode keeps the pool's mode; cluster-pool may become multi-pool
// (the one-way migration: every block and lease stays), never the reverse.
func (s *Store) UpdatePool(ctx context.Context, space, name string, labels map[string]string, spec alloc.PoolSpec, opts ...alloc.WriteOption) (alloc.Pool, error) {
	if err := validatePool(name, labels, spec); err != nil {
		return alloc.Pool{}, err
	}
	var out alloc.Pool
	err := s.write(ctx, opts, func(tx querier) error {
		prev, err := s.getPool(ctx, tx, space, name, true)
		if err != nil {
			return err
		}
		if spec.Mode == "" {
			spec.Mode = prev.Spec.Mode
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
				if err := removeCIDR(ctx, tx, prev, c, field); err != nil {
					return err
				}
			}
		}
		sp := spec
		cloud, err := cloudColumn(sp.Cloud)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE pools SET labels = @labels, ipv4_mask_size = @ipv4Mask, ipv6_mask_size = @ipv6Mask,
				updated_at = @now, mode = @mode, pre_allocate = @preAllocate, pod_selector = @podSelector,
				namespace_selector = @namespaceSelector, disabled = @disabled, skip_masquerade = @skipMasquerade,
				max_blocks_per_node = @maxBlocksPerNode, allow_special_purpose = @allowSpecialPurpose,
				node_selector = @nodeSelector, cloud = @cloud
			WHERE id = @id`,
			namedArgs{"id": prev.id, "labels": labelsOrEmpty(labels), "ipv4Mask": maskOf(sp.IPv4), "ipv6Mask": maskOf(sp.IPv6),
				"now": s.now(), "mode": string(sp.Mode), "preAllocate": preAllocateOf(sp), "podSelector": sp.PodSelector,
				"namespaceSelector": sp.NamespaceSelector, "disabled": sp.Disabled, "skipMasquerade": sp.SkipMasquerade,
				"maxBlocksPerNode": int32Of(sp.MaxBlocksPerNode), "allowSpecialPurpose": sp.AllowSpecialPurpose,
				"nodeSelector": sp.NodeSelector, "cloud": cloud}); err != nil {
			return err
		}
		if err := insertCIDRs(ctx, tx, prev.id, space, spec, have); err != nil {
			return err
		}
		out, err = s.readPool(ctx, tx, space, name)
		return err
	})
	return out, err
}

// removeCIDR deletes a pool CIDR that no block was carved from. The CIDR
// row is locked first, as carving locks it, so no block can be carved from
// it between the check and the delete.
func removeCIDR(ctx context.Context, tx querier, p poolRow, c netip.Prefix, field string) error {
	var id int64
	if err := tx.QueryRow(ctx, `SELECT id FROM pool_cidrs WHERE pool_id = $1 AND cidr = $2 FOR UPDATE`, p.id, c).Scan(&id); err != nil {
		return err
	}
	nodes, n, err := nodesUsing(ctx, tx, `b.pool_cidr_id = @cidr`, namedArgs{"cidr": id})
	if err != nil {
		return err
	}
	if n > 0 {
		return &alloc.Error{Kind: alloc.KindInUse, Field: field, Nodes: nodes,
			Detail: fmt.Sprintf("CIDR %s from pool %q still in use by %s", c, p.Name, nodeList(nodes, n))}
	}
	_, err = tx.Exec(ctx, `DELETE FROM pool_cidrs WHERE id = $1`, id)
	return err
}

// maxNamedNodes bounds the node names an in-use refusal lists.
const maxNamedNodes = 20

// nodesUsing answers the names (up to maxNamedNodes, sorted) and the number
// of the nodes holding blocks that match where (on blocks b, with its named
// parameters in args).
func nodesUsing(ctx context.Context, q querier, where string, args namedArgs) ([]string, int64, error) {
	var names []string
	var n int64
	err := q.QueryRow(ctx, `SELECT coalesce((array_agg(name ORDER BY name))[1:`+fmt.Sprint(maxNamedNodes)+`], '{}'), count(*)
		FROM (SELECT DISTINCT n.name FROM blocks b JOIN nodes n ON n.id = b.node_id WHERE `+where+`) u`, args).Scan(&names, &n)
	return names, n, err
}

func nodeList(names []string, n int64) string {
	s := "node " + names[0]
	if n > 1 {
		s = "nodes " + strings.Join(names, ", ")
	}
	if more := n - int64(len(names)); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

// DeletePool removes a pool that no node holds a block of; the refusal names
// the nodes. It answers the pool as it was.
func (s *Store) DeletePool(ctx context.Context, space, name string, opts ...alloc.WriteOption) (alloc.Pool, error) {
	var out alloc.Pool
	err := s.write(ctx, opts, func(tx querier) error {
		p, err := s.getPool(ctx, tx, space, name, true)
		if err != nil {
			return err
		}
		// Lock the CIDR rows as carving does, so no block appears after
		// the check.
		if _, err := tx.Exec(ctx, `SELECT id FROM pool_cidrs WHERE pool_id = $1 ORDER BY family, position FOR UPDATE`, p.id); err != nil {
			return err
		}
		nodes, n, err := nodesUsing(ctx, tx, `b.pool_id = @pool`, namedArgs{"pool": p.id})
		if err != nil {
			return err
		}
		if n > 0 {
			return &alloc.Error{Kind: alloc.KindInUse, Field: "pool", Nodes: nodes,
				Detail: fmt.Sprintf("pool %q still in use by %s", name, nodeList(nodes, n))}
		}
		if err := s.fillStatus(ctx, tx, &p); err != nil {
			return err
		}
		out = p.Pool
		_, err = tx.Exec(ctx, `DELETE FROM pools WHERE id = $1`, p.id)
		return err
	})
	return out, err
}
