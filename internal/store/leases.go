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

// allocPool is the part of a pool the allocation path reads: no CIDR list
// (only carving needs it, and carving reads it under its own lock).
type allocPool struct {
	id         int64
	name       string
	masks      [2]*int16 // IPv4, IPv6
	allowFirst bool
	allowLast  bool
	nodeLocal  alloc.NodeLocal
}

func (p allocPool) has(f alloc.Family) bool {
	if f == alloc.IPv4 {
		return p.masks[0] != nil
	}
	return p.masks[1] != nil
}

func (p allocPool) families() []alloc.Family {
	var fs []alloc.Family
	for _, f := range alloc.Families {
		if p.has(f) {
			fs = append(fs, f)
		}
	}
	return fs
}

func (s *Store) allocPool(ctx context.Context, q querier, space, name string) (allocPool, error) {
	p := allocPool{name: name}
	err := q.QueryRow(ctx, `SELECT id, ipv4_mask_size, ipv6_mask_size, allow_first_ip, allow_last_ip,
		reserve_router, reserve_health, reserve_ingress FROM pools WHERE space = $1 AND name = $2`, space, name).
		Scan(&p.id, &p.masks[0], &p.masks[1], &p.allowFirst, &p.allowLast,
			&p.nodeLocal.Router, &p.nodeLocal.Health, &p.nodeLocal.Ingress)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, s.notFoundIn(ctx, q, space, "pool", "pool", name)
	}
	return p, err
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
func (s *Store) ensureNode(ctx context.Context, tx pgx.Tx, space, name string, now time.Time) (int64, error) {
	id, err := s.nodeID(ctx, tx, space, name)
	if err == nil || !s.opts.AutoRegisterNodes || !alloc.IsKind(err, alloc.KindNotFound) {
		return id, err
	}
	if e := (*alloc.Error)(nil); errors.As(err, &e) && e.Field == "space" {
		return 0, err
	}
	err = tx.QueryRow(ctx, `INSERT INTO nodes (space, name, created_at, updated_at) VALUES ($1, $2, $3, $3) RETURNING id`,
		space, name, now).Scan(&id)
	return id, err
}

// leaseColumns read a lease with the names the API shows. $1 is "now", to
// tell cooling rows from rows whose cooldown has ended.
const leaseColumns = `l.space, n.name, p.name, l.family, l.addr, l.block_cidr, b.router, l.container_id, l.interface,
	l.owner_namespace, l.owner_name, l.owner_uid, l.state, l.created_at, l.expires_at, l.confirmed_at,
	l.released_at, l.cooldown_until`

const leaseJoins = ` JOIN nodes n ON n.id = l.node_id JOIN pools p ON p.id = l.pool_id JOIN blocks b ON b.id = l.block_id`

func scanLease(r pgx.Row) (alloc.Lease, error) {
	var (
		l                                  alloc.Lease
		fam                                int16
		gw                                 *netip.Addr
		state                              string
		expires, confirmed, released, cool *time.Time
	)
	err := r.Scan(&l.Space, &l.Node, &l.Pool, &fam, &l.Addr, &l.Block, &gw, &l.Attachment.ContainerID, &l.Attachment.Interface,
		&l.Owner.Namespace, &l.Owner.Name, &l.Owner.UID, &state, &l.CreatedAt, &expires, &confirmed, &released, &cool)
	if err != nil {
		return l, err
	}
	l.Family = alloc.Family(fam)
	if gw != nil {
		l.Gateway = *gw
	}
	l.State = alloc.LeaseState(state)
	if state == "released" {
		l.State = alloc.StateCooling
	}
	for _, t := range []struct {
		src *time.Time
		dst *time.Time
	}{{expires, &l.ExpiresAt}, {confirmed, &l.ConfirmedAt}, {released, &l.ReleasedAt}, {cool, &l.CooldownUntil}} {
		if t.src != nil {
			*t.dst = t.src.UTC()
		}
	}
	l.CreatedAt = l.CreatedAt.UTC()
	return l, nil
}

func collectLeases(rows pgx.Rows, err error) ([]alloc.Lease, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.Lease, error) { return scanLease(r) })
}

// attachmentLeases reads the pending and active leases of an attachment.
func attachmentLeases(ctx context.Context, q querier, nodeID int64, a alloc.Attachment) ([]alloc.Lease, error) {
	return collectLeases(q.Query(ctx, `SELECT `+leaseColumns+` FROM leases l`+leaseJoins+`
		WHERE l.node_id = $1 AND l.container_id = $2 AND l.interface = $3 AND l.state <> 'released'
		ORDER BY l.family`, nodeID, a.ContainerID, a.Interface))
}

func allocationOf(node string, a alloc.Attachment, leases []alloc.Lease, created bool) alloc.Allocation {
	out := alloc.Allocation{Node: node, Attachment: a, Leases: leases, Created: created, State: alloc.StateActive}
	for _, l := range leases {
		out.Owner = l.Owner
		if l.State == alloc.StatePending {
			out.State = alloc.StatePending
			out.ExpiresAt = l.ExpiresAt
		}
	}
	return out
}

// Allocate leases one address per family for the attachment, all in one
// transaction. Per family it takes, in order: a fresh address from the
// node's oldest block with room; else an address of the node's blocks whose
// cooldown has ended; else a newly carved block. A retry of the attachment
// answers its existing leases (Created=false) when owner, pool and families
// match, and a KindLeaseConflict error otherwise.
func (s *Store) Allocate(ctx context.Context, r alloc.LeaseRequest) (alloc.Allocation, error) {
	if err := r.Validate(); err != nil {
		return alloc.Allocation{}, err
	}
	var out alloc.Allocation
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		now := s.now()
		nodeID, err := s.ensureNode(ctx, tx, r.Space, r.Node, now)
		if err != nil {
			return err
		}
		existing, err := attachmentLeases(ctx, tx, nodeID, r.Attachment)
		if err != nil {
			return err
		}
		p, err := s.allocPool(ctx, tx, r.Space, r.Pool)
		if err != nil {
			return err
		}
		families := r.Families
		if len(families) == 0 {
			families = p.families()
		}
		for i, f := range families {
			if !p.has(f) {
				return alloc.Invalid(fmt.Sprintf("families[%d]", i), "pool %q has no %s CIDRs", r.Pool, f)
			}
		}
		if len(existing) > 0 {
			if err := sameRequest(existing, r, families); err != nil {
				return err
			}
			out = allocationOf(r.Node, r.Attachment, existing, false)
			return nil
		}
		leases := make([]alloc.Lease, 0, len(families))
		for _, f := range families {
			l, err := s.leaseOne(ctx, tx, nodeID, p, f, r, now)
			if err != nil {
				return err
			}
			leases = append(leases, l)
		}
		out = allocationOf(r.Node, r.Attachment, leases, true)
		return nil
	})
	return out, err
}

// sameRequest decides whether a request for an attachment that already holds
// leases is a retry of the request that made them.
func sameRequest(existing []alloc.Lease, r alloc.LeaseRequest, families []alloc.Family) error {
	held := make([]alloc.Family, 0, len(existing))
	for _, l := range existing {
		switch {
		case l.Owner != r.Owner:
			return &alloc.Error{Kind: alloc.KindLeaseConflict, Field: "owner",
				Detail: fmt.Sprintf("attachment %s/%s is held by %s/%s", r.Attachment.ContainerID, r.Attachment.Interface, l.Owner.Namespace, l.Owner.Name)}
		case l.Pool != r.Pool:
			return &alloc.Error{Kind: alloc.KindLeaseConflict, Field: "pool",
				Detail: fmt.Sprintf("attachment holds addresses of pool %q", l.Pool)}
		}
		held = append(held, l.Family)
	}
	if !slices.Equal(held, families) {
		return &alloc.Error{Kind: alloc.KindLeaseConflict, Field: "families",
			Detail: fmt.Sprintf("attachment holds %v, not %v", held, families)}
	}
	return nil
}

// leaseOne leases one address of family f; see Allocate for the order.
func (s *Store) leaseOne(ctx context.Context, tx pgx.Tx, nodeID int64, p allocPool, f alloc.Family, r alloc.LeaseRequest, now time.Time) (alloc.Lease, error) {
	state, expires, confirmed := "active", (*time.Time)(nil), (*time.Time)(nil)
	if r.Expire {
		e := now.Add(s.opts.LeaseExpiry)
		state, expires = "pending", &e
	}
	lease := alloc.Lease{Space: r.Space, Node: r.Node, Pool: p.name, Family: f, Attachment: r.Attachment,
		Owner: r.Owner, State: alloc.LeaseState(state), CreatedAt: now}
	if expires != nil {
		lease.ExpiresAt = *expires
	}
	b, ok, err := lockBlockWithRoom(ctx, tx, nodeID, p.id, f)
	if err != nil {
		return lease, err
	}
	if ok {
		if addr, found, err := insertFresh(ctx, tx, r, nodeID, p.id, f, b, state, now, expires, confirmed); err != nil || found {
			return withBlock(lease, addr, b), err
		}
	}
	// No fresh address: reuse one whose cooldown has ended.
	var gw *netip.Addr
	err = tx.QueryRow(ctx, `UPDATE leases l SET state = $5, container_id = $6, interface = $7,
			owner_namespace = $8, owner_name = $9, owner_uid = $10, created_at = $11, expires_at = $12,
			confirmed_at = NULL, released_at = NULL, cooldown_until = NULL
		FROM blocks b
		WHERE b.id = l.block_id AND l.id = (
			SELECT c.id FROM leases c JOIN blocks cb ON cb.id = c.block_id
			WHERE cb.node_id = $1 AND cb.pool_id = $2 AND cb.family = $3 AND c.state = 'released' AND c.cooldown_until <= $4
			ORDER BY c.cooldown_until LIMIT 1 FOR UPDATE OF c SKIP LOCKED)
		RETURNING l.addr, l.block_cidr, b.router`,
		nodeID, p.id, int16(f), now, state, r.Attachment.ContainerID, r.Attachment.Interface,
		r.Owner.Namespace, r.Owner.Name, r.Owner.UID, now, expires).Scan(&lease.Addr, &lease.Block, &gw)
	if err == nil {
		if gw != nil {
			lease.Gateway = *gw
		}
		return lease, nil
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return lease, err
	}
	// Nothing to reuse: carve a block.
	b, ok, err = carve(ctx, tx, r.Space, nodeID, p, f, now, true)
	if err != nil {
		return lease, err
	}
	if !ok {
		return lease, alloc.Exhausted(p.name, f)
	}
	addr, found, err := insertFresh(ctx, tx, r, nodeID, p.id, f, b, state, now, expires, confirmed)
	if err == nil && !found {
		err = fmt.Errorf("block %s has room by count but no free address", b.cidr)
	}
	return withBlock(lease, addr, b), err
}

func withBlock(l alloc.Lease, addr netip.Addr, b blockRow) alloc.Lease {
	l.Addr, l.Block = addr, b.cidr
	if b.router != nil {
		l.Gateway = *b.router
	}
	return l
}

// insertFresh leases the first address of the locked block b, from its
// round-robin cursor onwards, that has no lease row (held or cooling) and is
// not node-local, and advances the cursor and the block's count in the same
// statement. found is false when every address has a row.
//
// The cursor makes the common case one index probe; a nearly full block
// costs at most one probe per address of the block, never a scan of the
// pool, and addresses are reused as late as possible (like host-local).
func insertFresh(ctx context.Context, tx pgx.Tx, r alloc.LeaseRequest, nodeID, poolID int64, f alloc.Family, b blockRow,
	state string, now time.Time, expires, confirmed *time.Time) (netip.Addr, bool, error) {
	var addr netip.Addr
	err := tx.QueryRow(ctx, `WITH cand AS (
			SELECT o FROM (
				SELECT generate_series($3::bigint, $4::bigint) AS o
				UNION ALL
				SELECT generate_series($5::bigint, $3::bigint - 1)
			) c
			WHERE o <> ALL ($6::bigint[])
			  AND NOT EXISTS (SELECT 1 FROM leases x WHERE x.space = $1 AND x.addr = $2::inet + c.o)
			LIMIT 1
		), ins AS (
			INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface,
				owner_namespace, owner_name, owner_uid, created_at, expires_at, confirmed_at)
			SELECT $1, $2::inet + o, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20 FROM cand
			RETURNING addr
		), upd AS (
			UPDATE blocks SET allocated = allocated + 1,
				next_offset = (SELECT CASE WHEN o + 1 > $4 THEN $5 ELSE o + 1 END FROM cand)
			WHERE id = $7 AND EXISTS (SELECT 1 FROM ins)
		)
		SELECT addr FROM ins`,
		r.Space, b.cidr.Addr(), b.next, b.last, b.first, b.reserved,
		b.id, b.cidr, nodeID, poolID, int16(f), state, r.Attachment.ContainerID, r.Attachment.Interface,
		r.Owner.Namespace, r.Owner.Name, r.Owner.UID, now, expires, confirmed).Scan(&addr)
	if errors.Is(err, pgx.ErrNoRows) {
		return addr, false, nil
	}
	return addr, err == nil, err
}

// GetAttachment answers the pending and active leases of an attachment.
func (s *Store) GetAttachment(ctx context.Context, space, node string, a alloc.Attachment) (alloc.Allocation, error) {
	nodeID, err := s.nodeID(ctx, s.db, space, node)
	if err != nil {
		return alloc.Allocation{}, err
	}
	leases, err := attachmentLeases(ctx, s.db, nodeID, a)
	if err != nil {
		return alloc.Allocation{}, err
	}
	if len(leases) == 0 {
		return alloc.Allocation{}, alloc.NotFound("containerID", "attachment", a.ContainerID+"/"+a.Interface)
	}
	return allocationOf(node, a, leases, false), nil
}

// Confirm makes the attachment's pending leases active: their expiry stops,
// as Cilium stops the timer when the endpoint is created. Confirming active
// leases again is a no-op.
func (s *Store) Confirm(ctx context.Context, space, node string, a alloc.Attachment) (alloc.Allocation, error) {
	nodeID, err := s.nodeID(ctx, s.db, space, node)
	if err != nil {
		return alloc.Allocation{}, err
	}
	if _, err := s.db.Exec(ctx, `UPDATE leases SET state = 'active', expires_at = NULL, confirmed_at = $4
		WHERE node_id = $1 AND container_id = $2 AND interface = $3 AND state = 'pending'`,
		nodeID, a.ContainerID, a.Interface, s.now()); err != nil {
		return alloc.Allocation{}, err
	}
	return s.GetAttachment(ctx, space, node, a)
}

// releaseSet is the assignment that turns a lease into a cooling address;
// $1 is now, $2 the end of the cooldown.
const releaseSet = `state = 'released', expires_at = NULL, released_at = $1, cooldown_until = $2`

func (s *Store) released(ctx context.Context, where string, args ...any) ([]alloc.Lease, error) {
	now := s.now()
	args = append([]any{now, now.Add(s.opts.Cooldown)}, args...)
	return collectLeases(s.db.Query(ctx, `WITH r AS (
			UPDATE leases l SET `+releaseSet+` WHERE l.state <> 'released' AND `+where+` RETURNING l.*
		)
		SELECT `+leaseColumns+` FROM r l`+leaseJoins+` ORDER BY l.addr`, args...))
}

// ReleaseAttachment releases the attachment's addresses; nothing held is not
// an error.
func (s *Store) ReleaseAttachment(ctx context.Context, space, node string, a alloc.Attachment) ([]alloc.Lease, error) {
	return s.released(ctx, `l.node_id = (SELECT id FROM nodes WHERE space = $3 AND name = $4)
		AND l.container_id = $5 AND l.interface = $6`, space, node, a.ContainerID, a.Interface)
}

// ReleaseAddress releases the lease holding addr; nothing held is not an error.
func (s *Store) ReleaseAddress(ctx context.Context, space string, addr netip.Addr) ([]alloc.Lease, error) {
	return s.released(ctx, `l.space = $3 AND l.addr = $4`, space, addr)
}

// Reconcile releases every pending or active lease of the node that no valid
// attachment holds and that was made before this call (so an ADD racing with
// the runtime's GC keeps its address).
func (s *Store) Reconcile(ctx context.Context, space, node string, valid []alloc.Attachment) ([]alloc.Lease, error) {
	for i, a := range valid {
		if err := alloc.ValidateAttachment(fmt.Sprintf("attachments[%d].", i), a); err != nil {
			return nil, err
		}
	}
	if ok, err := s.spaceExists(ctx, s.db, space); err != nil {
		return nil, err
	} else if !ok {
		return nil, alloc.NotFound("space", "address space", space)
	}
	ids, ifaces := make([]string, len(valid)), make([]string, len(valid))
	for i, a := range valid {
		ids[i], ifaces[i] = a.ContainerID, a.Interface
	}
	return s.released(ctx, `l.node_id = (SELECT id FROM nodes WHERE space = $3 AND name = $4)
		AND l.created_at <= $1
		AND (l.container_id, l.interface) NOT IN (SELECT * FROM unnest($5::text[], $6::text[]))`,
		space, node, ids, ifaces)
}

// GetAddress answers the lease holding addr: pending, active or cooling.
func (s *Store) GetAddress(ctx context.Context, space string, addr netip.Addr) (alloc.Lease, error) {
	l, err := scanLease(s.db.QueryRow(ctx, `SELECT `+leaseColumns+` FROM leases l`+leaseJoins+`
		WHERE l.space = $1 AND l.addr = $2 AND (l.state <> 'released' OR l.cooldown_until > $3)`, space, addr, s.now()))
	if errors.Is(err, pgx.ErrNoRows) {
		return l, s.notFoundIn(ctx, s.db, space, "address", "lease of address", addr.String())
	}
	return l, err
}

// ListLeases pages through leases by address. Released addresses whose
// cooldown has ended are free and not listed.
func (s *Store) ListLeases(ctx context.Context, f alloc.LeaseFilter, page alloc.Page) ([]alloc.Lease, string, error) {
	after, err := decodeContinue(page.Continue)
	if err != nil {
		return nil, "", err
	}
	var afterAddr *netip.Addr
	if after != "" {
		a, err := netip.ParseAddr(after)
		if err != nil {
			return nil, "", alloc.Invalid("continue", "not a continue token from this API")
		}
		afterAddr = &a
	}
	if ok, err := s.spaceExists(ctx, s.db, f.Space); err != nil {
		return nil, "", err
	} else if !ok {
		return nil, "", alloc.NotFound("space", "address space", f.Space)
	}
	items, err := collectLeases(s.db.Query(ctx, `SELECT `+leaseColumns+` FROM leases l`+leaseJoins+`
		WHERE l.space = $1
		  AND ($2::inet IS NULL OR l.addr > $2)
		  AND ($3 = '' OR n.name = $3)
		  AND ($4 = '' OR p.name = $4)
		  AND ($5 = '' OR l.owner_namespace = $5)
		  AND ($6 = '' OR l.owner_name = $6)
		  AND CASE $7
		        WHEN '' THEN l.state <> 'released' OR l.cooldown_until > $8
		        WHEN 'cooling' THEN l.state = 'released' AND l.cooldown_until > $8
		        ELSE l.state = $7 END
		ORDER BY l.addr LIMIT $9`,
		f.Space, afterAddr, f.Node, f.Pool, f.OwnerNamespace, f.OwnerName, string(f.State), s.now(), page.Limit+1))
	if err != nil {
		return nil, "", err
	}
	items, next := pageOf(items, page.Limit, func(l alloc.Lease) string { return l.Addr.String() })
	return items, next, nil
}
