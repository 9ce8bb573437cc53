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
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// VIP pools (CiliumLoadBalancerIPPool). A pool is a row of lb_pools and a
// row of address_ranges per block; the exclusion constraints of
// address_ranges keep VIP blocks off Pod pool CIDRs and unmarked VIP pools
// off one another (migration 00018).
//
// Every write of a space's VIP pools locks the space's row first
// (FOR NO KEY UPDATE, which Pod writes referencing the space do not wait
// for): the conflict marks depend on every pool of the space, so writes of
// one space's VIP pools take turns, and no two settle at once.

// Constraints of address_ranges the store tells apart.
const (
	// A Pod pool CIDR and a VIP block of one space raced.
	constraintRangesPodVIP = "address_ranges_pod_vip"
	// Two creators of one VIP pool raced.
	constraintLBPoolName = "lb_pools_space_name"
)

// lbPoolRow is a VIP pool as stored.
type lbPoolRow struct {
	id int64
	alloc.LBPool
}

// lbBlockJSON is one block as lbPoolColumns reads it.
type lbBlockJSON struct {
	CIDR  netip.Prefix `json:"cidr"`
	First netip.Addr   `json:"first"`
	Last  netip.Addr   `json:"last"`
}

const lbPoolColumns = `p.id, p.space, p.name, p.labels, p.service_selector, p.reserve_first_last, p.disabled,
	coalesce(p.conflict, ''), p.created_at, p.updated_at,
	coalesce((SELECT json_agg(json_build_object('cidr', r.cidr, 'first', host(r.first_addr), 'last', host(r.last_addr))
		ORDER BY r.position) FROM address_ranges r WHERE r.lb_pool_id = p.id), '[]'),
	(SELECT count(*) FILTER (WHERE family(v.addr) = 4) FROM vips v WHERE v.lb_pool_id = p.id),
	(SELECT count(*) FILTER (WHERE family(v.addr) = 6) FROM vips v WHERE v.lb_pool_id = p.id),
	p.reserved_groups,
	coalesce((SELECT array_agg(c.cidr ORDER BY c.cidr) FROM cidr_groups g JOIN cidr_group_cidrs c ON c.group_id = g.id
		WHERE g.space = p.space AND g.name = ANY (p.reserved_groups)), '{}'),
	p.allow_special_purpose, p.source, p.source_uid`

func scanLBPool(r pgx.Row) (lbPoolRow, error) {
	var (
		p            lbPoolRow
		blocks       []lbBlockJSON
		used4, used6 int64
	)
	sp := &p.Spec
	err := r.Scan(&p.id, &p.Space, &p.Name, &p.Labels, &sp.ServiceSelector, &sp.ReserveFirstLast, &sp.Disabled,
		&p.Status.Conflict, &p.CreatedAt, &p.UpdatedAt, &blocks, &used4, &used6, &sp.ReservedGroups, &sp.Reserved,
		&sp.AllowSpecialPurpose, &p.Origin.Source, &p.Origin.UID)
	if err != nil {
		return p, err
	}
	if len(sp.ReservedGroups) == 0 {
		sp.ReservedGroups = nil
	}
	if len(sp.Reserved) == 0 {
		sp.Reserved = nil
	}
	for _, b := range blocks {
		if b.CIDR.IsValid() {
			sp.Blocks = append(sp.Blocks, alloc.LBBlock{CIDR: b.CIDR})
		} else {
			sp.Blocks = append(sp.Blocks, alloc.LBBlock{Start: b.First, Stop: b.Last})
		}
	}
	p.Status.Families = map[alloc.Family]alloc.LBFamilyStatus{}
	for f, n := range sp.Totals() {
		used := used4
		if f == alloc.IPv6 {
			used = used6
		}
		p.Status.Families[f] = alloc.LBFamilyStatus{Total: n, Used: used}
	}
	return p, nil
}

func validateLBPool(name string, labels map[string]string, spec alloc.LBPoolSpec, origin alloc.Origin) error {
	if err := origin.Validate(); err != nil {
		return err
	}
	if err := alloc.ValidateLabelName("name", name); err != nil {
		return err
	}
	if err := alloc.ValidateLabels("labels", labels); err != nil {
		return err
	}
	if origin.Kubernetes() {
		// As Cilium takes a CiliumLoadBalancerIPPool: blocks overlapping
		// one another mark the pool conflicting (SettleLBConflicts).
		return spec.ValidateApplied()
	}
	return spec.Validate()
}

// errLBPoolExists ends CreateLBPool's transaction when the name is taken.
var errLBPoolExists = errors.New("VIP pool exists")

// CreateLBPool adds a VIP pool owned by p.Origin. A block overlapping a
// Pod pool CIDR of the space is refused (KindOverlap naming the block);
// one overlapping a block of another VIP pool marks the newer pool
// conflicting, as Cilium does, and the answer's status says so. Creating
// a pool that exists with the same labels, spec and origin answers it
// again (a retry); with others, it is a KindConflict (alloc.NotOwner when
// another origin owns the name).
func (s *Store) CreateLBPool(ctx context.Context, p alloc.LBPool, opts ...alloc.WriteOption) (alloc.LBPool, error) {
	if err := validateLBPool(p.Name, p.Labels, p.Spec, p.Origin); err != nil {
		return alloc.LBPool{}, err
	}
	source, uid := p.Origin.Stored()
	var out alloc.LBPool
	err := s.write(ctx, opts, func(tx querier) error {
		if err := lockSpace(ctx, tx, p.Space); err != nil {
			return err
		}
		var taken bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM lb_pools WHERE space = $1 AND name = $2)`, p.Space, p.Name).Scan(&taken); err != nil {
			return err
		} else if taken {
			return errLBPoolExists
		}
		if err := checkPodOverlap(ctx, tx, p.Space, p.Spec); err != nil {
			return err
		}
		pools, err := lbPoolsOf(ctx, tx, p.Space)
		if err != nil {
			return err
		}
		marks := alloc.SettleLBConflicts(append(pools, alloc.LBPoolBlocks{Name: p.Name, Blocks: p.Spec.Blocks}))
		if err := markConflicts(ctx, tx, s, p.Space, pools, marks, true, -1); err != nil {
			return err
		}
		var id int64
		now := s.now()
		if err := lockReservedGroups(ctx, tx, p.Space, p.Spec.ReservedGroups); err != nil {
			return err
		}
		err = tx.QueryRow(ctx, `INSERT INTO lb_pools (space, name, labels, service_selector, reserve_first_last, disabled, conflict, created_at, updated_at,
				reserved_groups, allow_special_purpose, source, source_uid)
			VALUES (@space, @name, @labels, @serviceSelector, @reserveFirstLast, @disabled, nullif(@conflict, ''), @now, @now,
				@reservedGroups, @allowSpecialPurpose, @source, @sourceUID) RETURNING id`,
			namedArgs{"space": p.Space, "name": p.Name, "labels": labelsOrEmpty(p.Labels), "serviceSelector": p.Spec.ServiceSelector,
				"reserveFirstLast": p.Spec.ReserveFirstLast, "disabled": p.Spec.Disabled, "conflict": marks[len(pools)], "now": now,
				"reservedGroups": groupsOrEmpty(p.Spec.ReservedGroups), "allowSpecialPurpose": p.Spec.AllowSpecialPurpose,
				"source": source, "sourceUID": uid}).Scan(&id)
		if code, constraint := pgCode(err); code == codeUniqueViolation && constraint == constraintLBPoolName {
			return errLBPoolExists
		} else if err != nil {
			return err
		}
		if err := insertLBBlocks(ctx, tx, id, p.Space, p.Spec, marks[len(pools)] != ""); err != nil {
			return err
		}
		if err := markConflicts(ctx, tx, s, p.Space, pools, marks, false, -1); err != nil {
			return err
		}
		if err := refreshStranded(ctx, tx, p.Space); err != nil {
			return err
		}
		out, err = readLBPool(ctx, tx, s, p.Space, p.Name)
		return err
	})
	if errors.Is(err, errLBPoolExists) {
		// A retry of the request that created it gets the first answer;
		// another request for the name is a conflict.
		have, gerr := s.GetLBPool(ctx, p.Space, p.Name)
		if gerr != nil {
			return alloc.LBPool{}, gerr
		}
		if have.Origin.Source != source {
			return alloc.LBPool{}, alloc.NotOwner("VIP pool", p.Name, have.Origin, kindLBPoolObject)
		}
		asked := p.Spec
		asked.Reserved = have.Spec.Reserved // resolved by the read, not asked for
		if have.Origin.UID != uid || !maps.Equal(have.Labels, labelsOrEmpty(p.Labels)) || !reflect.DeepEqual(have.Spec, asked) {
			return alloc.LBPool{}, &alloc.Error{Kind: alloc.KindConflict, Field: "name",
				Detail: fmt.Sprintf("VIP pool %q already exists with other labels or spec", p.Name)}
		}
		return have, nil
	}
	return out, err
}

// UpdateLBPool replaces a VIP pool's labels and spec. Its conflict mark
// and those of the other pools of the space are settled again. Only a
// writer of the pool's origin (alloc.AsOrigin) edits it, else
// alloc.NotOwner; a Kubernetes writer takes the pool over for its UID (the
// object re-created under the name while nobody watched).
func (s *Store) UpdateLBPool(ctx context.Context, space, name string, labels map[string]string, spec alloc.LBPoolSpec, opts ...alloc.WriteOption) (alloc.LBPool, error) {
	writer := alloc.ApplyWriteOptions(opts).Origin
	if err := validateLBPool(name, labels, spec, writer); err != nil {
		return alloc.LBPool{}, err
	}
	source, uid := writer.Stored()
	var out alloc.LBPool
	err := s.write(ctx, opts, func(tx querier) error {
		if err := lockSpace(ctx, tx, space); err != nil {
			return err
		}
		prev, err := getLBPool(ctx, tx, s, space, name)
		if err != nil {
			return err
		}
		if prev.Origin.Source != source {
			return alloc.NotOwner("VIP pool", name, prev.Origin, kindLBPoolObject)
		}
		if err := checkPodOverlap(ctx, tx, space, spec); err != nil {
			return err
		}
		pools, err := lbPoolsOf(ctx, tx, space)
		if err != nil {
			return err
		}
		self := -1
		for i := range pools {
			if pools[i].Name == name {
				self = i
			}
		}
		next := append([]alloc.LBPoolBlocks(nil), pools...)
		next[self].Blocks = spec.Blocks
		marks := alloc.SettleLBConflicts(next)
		if _, err := tx.Exec(ctx, `DELETE FROM address_ranges WHERE lb_pool_id = $1`, prev.id); err != nil {
			return err
		}
		if err := markConflicts(ctx, tx, s, space, pools, marks, true, self); err != nil {
			return err
		}
		if err := lockReservedGroups(ctx, tx, space, spec.ReservedGroups); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE lb_pools SET labels = @labels, service_selector = @serviceSelector,
				reserve_first_last = @reserveFirstLast, disabled = @disabled, conflict = nullif(@conflict, ''), updated_at = @now,
				reserved_groups = @reservedGroups, allow_special_purpose = @allowSpecialPurpose, source_uid = @sourceUID WHERE id = @id`,
			namedArgs{"id": prev.id, "labels": labelsOrEmpty(labels), "serviceSelector": spec.ServiceSelector,
				"reserveFirstLast": spec.ReserveFirstLast, "disabled": spec.Disabled, "conflict": marks[self], "now": s.now(),
				"reservedGroups": groupsOrEmpty(spec.ReservedGroups), "allowSpecialPurpose": spec.AllowSpecialPurpose,
				"sourceUID": uid}); err != nil {
			return err
		}
		if err := insertLBBlocks(ctx, tx, prev.id, space, spec, marks[self] != ""); err != nil {
			return err
		}
		if err := markConflicts(ctx, tx, s, space, pools, marks, false, self); err != nil {
			return err
		}
		if err := refreshStranded(ctx, tx, space); err != nil {
			return err
		}
		out, err = readLBPool(ctx, tx, s, space, name)
		return err
	})
	return out, err
}

// DeleteLBPool removes a VIP pool and settles the marks of the others: a
// pool it alone kept conflicting gives again. It answers the pool as it
// was. Only a writer of the pool's origin (alloc.AsOrigin) deletes it, and
// a Kubernetes writer only the pool of its object's UID (else
// alloc.NotOwner, or KindStaleGeneration for another UID).
//
// A pool of the database with holders is refused (KindInUse naming
// them): the REST API's pools go only once nothing holds them. A pool of
// Kubernetes goes as Cilium's does, its object being gone already: its
// addresses are released, their owners left unsatisfied and announced on
// ipam_lb_changed by name, so that the controller re-homes each Service
// to another pool that selects it or strips it (no_pool).
func (s *Store) DeleteLBPool(ctx context.Context, space, name string, opts ...alloc.WriteOption) (alloc.LBPool, error) {
	writer := alloc.ApplyWriteOptions(opts).Origin
	source, uid := writer.Stored()
	var out alloc.LBPool
	err := s.write(ctx, opts, func(tx querier) error {
		if err := lockSpace(ctx, tx, space); err != nil {
			return err
		}
		p, err := getLBPool(ctx, tx, s, space, name)
		if err != nil {
			return err
		}
		out = p.LBPool
		switch {
		case p.Origin.Source != source:
			return alloc.NotOwner("VIP pool", name, p.Origin, kindLBPoolObject)
		case p.Origin.UID != uid:
			return &alloc.Error{Kind: alloc.KindStaleGeneration, Field: "name",
				Detail: fmt.Sprintf("VIP pool %q was imported from another object of its name (uid %s, not %s)", name, p.Origin.UID, uid)}
		case writer.Kubernetes():
			if err := releaseLBPool(ctx, tx, p.id, name); err != nil {
				return err
			}
		}
		var owners []string
		var n int64
		if err := tx.QueryRow(ctx, `SELECT coalesce((array_agg(o ORDER BY o))[1:`+fmt.Sprint(maxNamedNodes)+`], '{}'), count(*) FROM (
				SELECT DISTINCT w.namespace || '/' || w.name AS o FROM vips v JOIN vip_holders h ON h.vip_id = v.id
				JOIN vip_owners w ON w.id = h.owner_id WHERE v.lb_pool_id = $1) x`, p.id).Scan(&owners, &n); err != nil {
			return err
		}
		if n > 0 {
			return &alloc.Error{Kind: alloc.KindInUse, Field: "pool",
				Detail: fmt.Sprintf("VIP pool %q still has addresses held by %s", name, ownerList(owners, n))}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM lb_pools WHERE id = $1`, p.id); err != nil {
			return err
		}
		pools, err := lbPoolsOf(ctx, tx, space)
		if err != nil {
			return err
		}
		return markConflicts(ctx, tx, s, space, pools, alloc.SettleLBConflicts(pools), false, -1)
	})
	return out, err
}

// releaseLBPool releases every address of the pool (the address history
// records each release under the pool's name), leaves its owners
// unsatisfied (no_pool until they are looked at again) and announces each
// of them on ipam_lb_changed: they are satisfied and nobody waits for
// them, so the space's announcement alone would not bring them back.
func releaseLBPool(ctx context.Context, tx querier, poolID int64, name string) error {
	// The pool's row first: an assignment from it (FOR SHARE) waits, and
	// then finds it gone.
	var one int
	if err := tx.QueryRow(ctx, `SELECT 1 FROM lb_pools WHERE id = $1 FOR UPDATE`, poolID).Scan(&one); err != nil {
		return err
	}
	var ownerIDs []int64
	if err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM (
			SELECT o.id FROM vip_owners o WHERE o.id IN (
				SELECT h.owner_id FROM vip_holders h JOIN vips v ON v.id = h.vip_id WHERE v.lb_pool_id = @pool)
			ORDER BY o.id FOR UPDATE) x`, namedArgs{"pool": poolID}).Scan(&ownerIDs); err != nil {
		return err
	}
	if len(ownerIDs) == 0 {
		return nil
	}
	// Holders before addresses: the history trigger names the address
	// and its owner from their rows.
	if _, err := tx.Exec(ctx, `DELETE FROM vip_holders h USING vips v WHERE v.id = h.vip_id AND v.lb_pool_id = @pool`,
		namedArgs{"pool": poolID}); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM vips WHERE lb_pool_id = @pool`, namedArgs{"pool": poolID}); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `WITH o AS (UPDATE vip_owners SET satisfied = false, reason = @reason, message = @message
			WHERE id = ANY (@owners) RETURNING space, namespace, name)
		SELECT pg_notify(@channel, json_build_object('space', space, 'namespace', namespace, 'name', name)::text) FROM o`,
		namedArgs{"owners": ownerIDs, "reason": alloc.ReasonNoPool, "message": fmt.Sprintf("VIP pool %q was deleted", name),
			"channel": lbChangedChannel})
	return err
}

// kindLBPoolObject and kindCIDRGroupObject are the Kubernetes kinds that
// own imported rows, as refusals name them.
const (
	kindLBPoolObject    = "CiliumLoadBalancerIPPool"
	kindCIDRGroupObject = "CiliumCIDRGroup"
)

// lockReservedGroups checks that every group a pool names exists, and
// keeps it (FOR KEY SHARE) from being deleted until the pool's write
// commits; the deletion then sees the pool naming it and refuses.
func lockReservedGroups(ctx context.Context, tx querier, space string, groups []string) error {
	for i, g := range groups {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM cidr_groups WHERE space = $1 AND name = $2 FOR KEY SHARE`, space, g).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return alloc.NotFound(fmt.Sprintf("spec.reservedCIDRGroups[%d]", i), "CIDR group", g)
		} else if err != nil {
			return err
		}
	}
	return nil
}

func groupsOrEmpty(g []string) []string {
	if g == nil {
		return []string{}
	}
	return g
}

func ownerList(names []string, n int64) string {
	s := strings.Join(names, ", ")
	if more := n - int64(len(names)); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

// GetLBPool reads a VIP pool with its status.
func (s *Store) GetLBPool(ctx context.Context, space, name string) (alloc.LBPool, error) {
	return readLBPool(ctx, s.db, s, space, name)
}

func readLBPool(ctx context.Context, q querier, s *Store, space, name string) (alloc.LBPool, error) {
	p, err := getLBPool(ctx, q, s, space, name)
	return p.LBPool, err
}

func getLBPool(ctx context.Context, q querier, s *Store, space, name string) (lbPoolRow, error) {
	p, err := scanLBPool(q.QueryRow(ctx, `SELECT `+lbPoolColumns+` FROM lb_pools p WHERE p.space = $1 AND p.name = $2`, space, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return p, s.notFoundIn(ctx, q, space, "pool", "VIP pool", name)
	}
	return p, err
}

// ListLBPools pages through the space's VIP pools by name, with status.
func (s *Store) ListLBPools(ctx context.Context, space string, page alloc.Page) ([]alloc.LBPool, string, error) {
	sc := scopeOf(pageLBPools, space)
	after, err := s.decodeContinue(ctx, sc, page.Continue)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.db.Query(ctx, `SELECT `+lbPoolColumns+` FROM lb_pools p WHERE p.space = $1 AND p.name > $2 ORDER BY p.name LIMIT $3`,
		space, after, page.Limit+1)
	if err != nil {
		return nil, "", err
	}
	prs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lbPoolRow, error) { return scanLBPool(r) })
	if err != nil {
		return nil, "", err
	}
	if err := s.emptyListOf(ctx, space, len(prs)); err != nil {
		return nil, "", err
	}
	prs, next, err := pageOf(ctx, s, sc, prs, page.Limit, func(p lbPoolRow) string { return p.Name })
	if err != nil {
		return nil, "", err
	}
	out := make([]alloc.LBPool, len(prs))
	for i := range prs {
		out[i] = prs[i].LBPool
	}
	return out, next, nil
}

// lockSpace takes the space's row for a write of its VIP pools, or
// answers that the space does not exist.
func lockSpace(ctx context.Context, tx querier, space string) error {
	var one int
	err := tx.QueryRow(ctx, `SELECT 1 FROM address_spaces WHERE name = $1 FOR NO KEY UPDATE`, space).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return alloc.NotFound("space", "address space", space)
	}
	return err
}

// checkPodOverlap refuses a block overlapping a Pod pool CIDR of the
// space, naming the block's field and the Pod pool.
func checkPodOverlap(ctx context.Context, tx querier, space string, spec alloc.LBPoolSpec) error {
	for i, b := range spec.Blocks {
		r := b.Range()
		var pool string
		var cidr netip.Prefix
		err := tx.QueryRow(ctx, `SELECT p.name, c.cidr FROM address_ranges r
				JOIN pool_cidrs c ON c.id = r.pool_cidr_id JOIN pools p ON p.id = c.pool_id
			WHERE r.space = $1 AND r.kind = 'pod' AND r.span && inetrange($2::inet, $3::inet, '[]') LIMIT 1`,
			space, r.From(), r.To()).Scan(&pool, &cidr)
		if err == nil {
			return &alloc.Error{Kind: alloc.KindOverlap, Field: fmt.Sprintf("spec.blocks[%d]", i),
				Detail: fmt.Sprintf("%s overlaps %s of Pod pool %q; VIP pools and Pod pools of a space never overlap", b, cidr, pool)}
		} else if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
	}
	return nil
}

// lbPoolsOf reads the space's VIP pools oldest first, as the conflict
// settlement wants them.
func lbPoolsOf(ctx context.Context, tx querier, space string) ([]alloc.LBPoolBlocks, error) {
	rows, err := tx.Query(ctx, `SELECT `+lbPoolColumns+` FROM lb_pools p WHERE p.space = $1 ORDER BY p.created_at, p.id`, space)
	if err != nil {
		return nil, err
	}
	prs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lbPoolRow, error) { return scanLBPool(r) })
	out := make([]alloc.LBPoolBlocks, len(prs))
	for i, p := range prs {
		out[i] = alloc.LBPoolBlocks{Name: p.Name, Blocks: p.Spec.Blocks, Conflict: p.Status.Conflict}
	}
	return out, err
}

// markConflicts writes the marks that changed for pools (marks[i] is
// pools[i]'s), leaving out pools[skip] (the pool being written). It writes new marks when
// marking, or the lifted ones otherwise: marking before the written pool's
// blocks go in and lifting after keeps the unmarked pools apart at every
// statement, as the exclusion constraint checks them.
func markConflicts(ctx context.Context, tx querier, s *Store, space string, pools []alloc.LBPoolBlocks, marks []string, marking bool, skip int) error {
	for i, p := range pools {
		if marks[i] == p.Conflict || (marks[i] != "") != marking || i == skip {
			continue
		}
		if _, err := tx.Exec(ctx, `WITH p AS (UPDATE lb_pools SET conflict = nullif($3, ''), updated_at = $4
				WHERE space = $1 AND name = $2 RETURNING id)
			UPDATE address_ranges SET conflicting = $3 <> '' WHERE lb_pool_id = (SELECT id FROM p)`,
			space, p.Name, marks[i], s.now()); err != nil {
			return err
		}
	}
	return nil
}

// insertLBBlocks writes the pool's blocks. A concurrent Pod pool CIDR
// that got past checkPodOverlap still meets the exclusion constraint.
func insertLBBlocks(ctx context.Context, tx querier, poolID int64, space string, spec alloc.LBPoolSpec, conflicting bool) error {
	for i, b := range spec.Blocks {
		r := b.Range()
		var cidr *netip.Prefix
		if b.CIDR.IsValid() {
			cidr = &b.CIDR
		}
		_, err := tx.Exec(ctx, `INSERT INTO address_ranges (space, kind, first_addr, last_addr, lb_pool_id, position, cidr, conflicting)
			VALUES (@space, 'vip', @first, @last, @pool, @position, @cidr, @conflicting)`,
			namedArgs{"space": space, "first": r.From(), "last": r.To(), "pool": poolID, "position": i, "cidr": cidr,
				"conflicting": conflicting})
		if code, constraint := pgCode(err); code == codeExclusionViolation && constraint == constraintRangesPodVIP {
			return &alloc.Error{Kind: alloc.KindOverlap, Field: fmt.Sprintf("spec.blocks[%d]", i),
				Detail: fmt.Sprintf("%s overlaps a Pod pool CIDR", b)}
		} else if err != nil {
			return err
		}
	}
	return nil
}
