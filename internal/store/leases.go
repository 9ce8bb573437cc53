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
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// leaseColumns read a lease with the names the API shows.
const leaseColumns = `l.space, n.name, p.name, l.family, l.addr, l.block_cidr, b.router, l.network, l.container_id, l.interface,
	l.owner_namespace, l.owner_name, l.owner_uid, l.state, l.created_at, l.expires_at, l.confirmed_at,
	l.released_at, l.cooldown_until, p.skip_masquerade, l.selected_by, l.generation, l.sticky_identity, l.sticky_retention`

const leaseJoins = ` JOIN nodes n ON n.id = l.node_id JOIN pools p ON p.id = l.pool_id JOIN blocks b ON b.id = l.block_id`

func scanLease(r pgx.Row) (alloc.Lease, error) {
	var (
		l                                  alloc.Lease
		fam                                int16
		gw                                 *netip.Addr
		state                              string
		expires, confirmed, released, cool *time.Time
		identity                           *string
		retention                          pgtype.Interval
	)
	err := r.Scan(&l.Space, &l.Node, &l.Pool, &fam, &l.Addr, &l.Block, &gw, &l.Attachment.Network, &l.Attachment.ContainerID, &l.Attachment.Interface,
		&l.Owner.Namespace, &l.Owner.Name, &l.Owner.UID, &state, &l.CreatedAt, &expires, &confirmed, &released, &cool, &l.SkipMasquerade, &l.SelectedBy,
		&l.Generation, &identity, &retention)
	if err != nil {
		return l, err
	}
	if identity != nil {
		l.Sticky = &alloc.Binding{Identity: *identity, Retention: intervalDuration(retention)}
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
		WHERE l.node_id = $1 AND l.network = $4 AND l.container_id = $2 AND l.interface = $3 AND l.state <> 'released'
		ORDER BY l.family`, nodeID, a.ContainerID, a.Interface, a.Network))
}

func allocationOf(node string, a alloc.Attachment, leases []alloc.Lease, created bool) alloc.Allocation {
	out := alloc.Allocation{Node: node, Attachment: a, Leases: leases, Created: created, State: alloc.StateActive}
	for _, l := range leases {
		out.Owner = l.Owner
		out.Generation = max(out.Generation, l.Generation)
		if l.State == alloc.StatePending {
			out.State = alloc.StatePending
			out.ExpiresAt = l.ExpiresAt
		}
	}
	return out
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
	if err := alloc.ValidateNetworkName("network", a.Network); err != nil {
		return alloc.Allocation{}, err
	}
	nodeID, err := s.nodeID(ctx, s.db, space, node)
	if err != nil {
		return alloc.Allocation{}, err
	}
	// In inTx for its retry (and for the history's actor, set in its
	// BEGIN): concurrent duplicates of one confirmation (a CNI plugin
	// retrying across replicas) were seen to fail with a deadlock (40P01),
	// answered 500, in internal/faulttest.
	err = s.inTx(ctx, func(tx querier) error {
		_, err := tx.Exec(ctx, `UPDATE leases SET state = 'active', expires_at = NULL, confirmed_at = @now
			WHERE node_id = @node AND network = @network AND container_id = @container AND interface = @iface AND state = 'pending'`,
			namedArgs{"node": nodeID, "container": a.ContainerID, "iface": a.Interface, "now": s.now(), "network": a.Network})
		return err
	})
	if err != nil {
		return alloc.Allocation{}, err
	}
	return s.GetAttachment(ctx, space, node, a)
}

// releaseSet is the assignment that turns a lease into a cooling address
// at @now, cooling until @until. An address bound to a workload identity
// cools for the longer of the cooldown and its retention: nothing but its
// identity leases it, and no purge deletes it, before then.
const releaseSet = `state = 'released', expires_at = NULL, released_at = @now,
	cooldown_until = CASE WHEN sticky_retention IS NULL THEN @until::timestamptz
		ELSE greatest(@until::timestamptz, @now::timestamptz + sticky_retention) END`

// released releases the leases matching where (named parameters: args)
// for reason.
func (s *Store) released(ctx context.Context, reason, where string, args namedArgs) ([]alloc.Lease, error) {
	s.releaseArgs(ctx, reason, args)
	var out []alloc.Lease
	err := s.writeOne(ctx, "", releasedSQL(where), func(rows pgx.Rows) error {
		var err error
		out, err = collectLeases(rows, nil)
		return err
	}, args)
	return out, err
}

// releaseArgs adds to args what releasedSQL binds besides where's
// parameters: @now, the end of the cooldown @until, and the history's
// @actor, @reason and @at (now).
func (s *Store) releaseArgs(ctx context.Context, reason string, args namedArgs) {
	now := s.now()
	args["now"], args["until"] = now, now.Add(s.opts.Cooldown)
	args["actor"], args["reason"], args["at"] = historyActor(ctx), reason, now
}

// releasedSQL releases the leases matching where, with the parameters of
// releaseArgs and where's own.
func releasedSQL(where string) string {
	return `WITH r AS (
			UPDATE leases l SET ` + releaseSet + ` WHERE l.state <> 'released' AND ` + historyContextSQL + ` AND ` + where + ` RETURNING l.*
		)
		SELECT ` + leaseColumns + ` FROM r l` + leaseJoins + ` ORDER BY l.addr`
}

// ReleaseAttachment releases the attachment's addresses; nothing held is not
// an error. The network must be a CNI network name (KindInvalid
// otherwise): the addresses a node holds for Cilium's agent have no
// attachment a caller can name.
//
// In a batch, the releases of one node asked by one actor share one
// statement (releaseManySQL), as a node's leases do.
func (s *Store) ReleaseAttachment(ctx context.Context, space, node string, a alloc.Attachment) ([]alloc.Lease, error) {
	if err := alloc.ValidateNetworkName("network", a.Network); err != nil {
		return nil, err
	}
	it, m := s.releaseItem(ctx, space, node, a)
	err := s.writeItem(ctx, space+"/"+node, it)
	return m.out, err
}

// releaseItem is the batch write of a ReleaseAttachment, and where its
// outcome lands.
func (s *Store) releaseItem(ctx context.Context, space, node string, a alloc.Attachment) (*batchItem, *mergedRelease) {
	now, actor := s.now(), historyActor(ctx)
	m := &mergedRelease{space: space, node: node, att: a, actor: actor, now: now, until: now.Add(s.opts.Cooldown)}
	args := namedArgs{"now": now, "until": m.until, "space": space, "node": node, "container": a.ContainerID,
		"iface": a.Interface, "network": a.Network, "actor": actor, "reason": reasonReleaseAttachment, "at": now}
	it := &batchItem{sql: releasedSQL(`l.node_id = (SELECT id FROM nodes WHERE space = @space AND name = @node)
		AND l.network = @network AND l.container_id = @container AND l.interface = @iface`), args: []any{args},
		read: func(rows pgx.Rows) error {
			var err error
			m.out, err = collectLeases(rows, nil)
			return err
		}}
	// One statement serves many nodes, but the address history has one
	// actor per node in it.
	it.merge = &merging{group: "release/" + space, combine: combineReleases, payload: m, slot: node, tag: actor}
	return it, m
}

// mergedRelease is one release of a releaseManySQL statement, and what it
// released.
type mergedRelease struct {
	space, node string
	att         alloc.Attachment
	actor       string
	now, until  time.Time
	out         []alloc.Lease
}

// combineReleases makes one releaseManySQL statement of the releases of
// one group (same space; one actor per node, see releaseItem). The
// statement's clock is the first one's.
func combineReleases(group []*batchItem) (string, []any, func(pgx.Rows) error) {
	ms := make([]*mergedRelease, len(group))
	n := len(group)
	nodes, actors := make([]string, n), make([]string, n)
	networks, containers, ifaces := make([]string, n), make([]string, n), make([]string, n)
	for i, it := range group {
		m := it.merge.payload.(*mergedRelease)
		ms[i], m.out = m, nil
		nodes[i], actors[i] = m.node, m.actor
		networks[i], containers[i], ifaces[i] = m.att.Network, m.att.ContainerID, m.att.Interface
	}
	first := ms[0]
	args := namedArgs{"now": first.now, "until": first.until, "space": first.space, "nodes": nodes, "actors": actors,
		"networks": networks, "containers": containers, "ifaces": ifaces, "reason": reasonReleaseAttachment, "at": first.now}
	read := func(rows pgx.Rows) error {
		for _, m := range ms {
			m.out = nil
		}
		for rows.Next() {
			var i int
			l, err := scanLease(rowWithIndex{rows, &i})
			if err != nil {
				return err
			}
			if i >= 1 && i <= len(ms) {
				ms[i-1].out = append(ms[i-1].out, l)
			}
		}
		return rows.Err()
	}
	return releaseManySQL, []any{args}, read
}

// rowWithIndex scans a row whose columns are followed by the number of the
// request it answers (a merged statement's rows).
type rowWithIndex struct {
	rows pgx.Rows
	n    *int
}

func (r rowWithIndex) Scan(dest ...any) error { return r.rows.Scan(append(dest, r.n)...) }

// releaseManySQL releases, at @now until @until, the attachments the
// arrays name (nodes of space @space), each once (the first of
// duplicates), and answers each released lease with the number of its
// request, after its columns. The address history records each release
// with the actor the request names (one per node, see
// ipam_history_context_nodes).
var releaseManySQL = `WITH req AS (
		SELECT DISTINCT ON (r.node, r.network, r.container_id, r.interface) r.*, n.id AS node_id
		FROM unnest(@nodes::text[], @actors::text[], @networks::text[], @containers::text[], @ifaces::text[])
			WITH ORDINALITY AS r (node, actor, network, container_id, interface, n)
		-- LIMIT keeps the join a probe of the node's key per request: as a
		-- plain join the planner may hash every node of the space.
		JOIN LATERAL (SELECT id FROM nodes WHERE space = @space AND name = r.node LIMIT 1) n ON true
		ORDER BY r.node, r.network, r.container_id, r.interface, r.n
	), r AS (
		UPDATE leases l SET ` + releaseSet + `
		FROM req
		WHERE l.state <> 'released'
		  AND (SELECT ipam_history_context_nodes((SELECT jsonb_object_agg(node_id::text, actor) FROM req), @reason, @at))
		  AND l.node_id = req.node_id AND l.network = req.network AND l.container_id = req.container_id
		  AND l.interface = req.interface
		RETURNING l.*, req.n AS request
	)
	SELECT ` + leaseColumns + `, l.request FROM r l` + leaseJoins + `
	ORDER BY l.addr`

// ReleaseAddress releases the lease holding addr; nothing held is not an
// error. An address a node holds for Cilium's agent (crd mode) is refused
// (see refuseNodeAddress).
func (s *Store) ReleaseAddress(ctx context.Context, space string, addr netip.Addr) ([]alloc.Lease, error) {
	released, err := s.released(ctx, reasonReleaseAddress, `l.space = @space AND l.addr = @addr AND l.network <> @cilium`,
		namedArgs{"space": space, "addr": addr, "cilium": alloc.CiliumPoolNetwork})
	if err != nil || len(released) > 0 {
		return released, err
	}
	return nil, s.refuseNodeAddress(ctx, space, addr)
}

// refuseNodeAddress answers a KindInUse error when a node holds addr for
// Cilium's agent (crd mode), reserved or used by a Pod, and nil otherwise.
// Such an address is in the node's CiliumNode (spec.ipam.pool), where the
// agent may hand it to a Pod at any time: released here, it could be
// leased to another while the agent still uses it. It leaves the node only
// through the Cilium operator (its release handshake, or the CiliumNode's
// deletion), or with the node (DeleteNode with force).
func (s *Store) refuseNodeAddress(ctx context.Context, space string, addr netip.Addr) error {
	var node, state, ns, name string
	err := s.db.QueryRow(ctx, `SELECT n.name, l.state, l.owner_namespace, l.owner_name FROM leases l JOIN nodes n ON n.id = l.node_id
		WHERE l.space = $1 AND l.addr = $2 AND l.network = $3 AND l.state <> 'released'`, space, addr, alloc.CiliumPoolNetwork).
		Scan(&node, &state, &ns, &name)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	} else if err != nil {
		return err
	}
	how := "the Cilium operator's release handshake, or with the node's CiliumNode"
	e := &alloc.Error{Kind: alloc.KindInUse, Field: "address",
		Detail:         fmt.Sprintf("address %s is in a node's Cilium pool (crd mode); it leaves the node only through %s", addr, how),
		OperatorDetail: fmt.Sprintf("address %s is in the Cilium pool of node %s (crd mode)", addr, node)}
	if state == string(alloc.StateActive) {
		e.OperatorDetail += fmt.Sprintf(", used by %s/%s", ns, name)
	}
	e.OperatorDetail += "; it leaves the node only through " + how
	return e
}

// Reconcile releases every pending or active lease of the node's
// attachments of network that no valid attachment holds and that was made
// before this call (so an ADD racing with the runtime's GC keeps its
// address). Leases of other networks are kept: a runtime lists the valid
// attachments of one network at a time, as host-local keeps a store per
// network. The valid attachments' Network must be network.
func (s *Store) Reconcile(ctx context.Context, space, node, network string, valid []alloc.Attachment) ([]alloc.Lease, error) {
	return s.reconcile(ctx, space, node, network, valid, nil)
}

// ReconcileUpTo is Reconcile for a valid list that accounts for the leases
// up to generation upTo, the GenerationHighWater read before the list was
// taken (0 when nothing had been leased yet: every lease is kept). The list
// is a snapshot the runtime took some time before this call, so a lease
// made after it is not in it and must survive: leases above upTo are kept,
// and so, whatever upTo, are leases younger than the ReconcileMinAge option
// (which also covers a transaction that took its number before upTo was
// read and committed after).
func (s *Store) ReconcileUpTo(ctx context.Context, space, node, network string, valid []alloc.Attachment, upTo int64) ([]alloc.Lease, error) {
	if err := alloc.ValidateWatermark("generation", upTo); err != nil {
		return nil, err
	}
	return s.reconcile(ctx, space, node, network, valid, &upTo)
}

// reconcile is Reconcile keeping the leases above *upTo, when not nil.
func (s *Store) reconcile(ctx context.Context, space, node, network string, valid []alloc.Attachment, upTo *int64) ([]alloc.Lease, error) {
	if err := alloc.ValidateNetworkName("network", network); err != nil {
		return nil, err
	}
	for i, a := range valid {
		if err := alloc.ValidateAttachment(fmt.Sprintf("attachments[%d].", i), a); err != nil {
			return nil, err
		}
		if a.Network != network {
			return nil, alloc.Invalid(fmt.Sprintf("attachments[%d].network", i), "%q is not the reconciled network %q", a.Network, network)
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
	return s.released(ctx, reasonReconcile, `l.node_id = (SELECT id FROM nodes WHERE space = @space AND name = @node)
		AND l.network = @network AND l.created_at <= @madeBy AND (@upTo::bigint IS NULL OR l.generation <= @upTo)
		AND (l.container_id, l.interface) NOT IN (SELECT * FROM unnest(@containers::text[], @ifaces::text[]))`,
		namedArgs{"space": space, "node": node, "containers": ids, "ifaces": ifaces,
			"madeBy": s.now().Add(-s.opts.ReconcileMinAge), "upTo": upTo, "network": network})
}

// ReconcileKept counts the pending and active leases of the node's network
// that no attachment of valid holds: after a reconcile with that list, the
// leases it kept (younger than ReconcileMinAge, above its generation, or
// made since).
// A node or space the store lacks holds none.
func (s *Store) ReconcileKept(ctx context.Context, space, node, network string, valid []alloc.Attachment) (int64, error) {
	ids, ifaces := make([]string, len(valid)), make([]string, len(valid))
	for i, a := range valid {
		ids[i], ifaces[i] = a.ContainerID, a.Interface
	}
	var n int64
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM leases l
		WHERE l.node_id = (SELECT id FROM nodes WHERE space = @space AND name = @node) AND l.state <> 'released'
		AND l.network = @network AND (l.container_id, l.interface) NOT IN (SELECT * FROM unnest(@containers::text[], @ifaces::text[]))`,
		namedArgs{"space": space, "node": node, "containers": ids, "ifaces": ifaces, "network": network}).Scan(&n)
	return n, err
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
	sc := scopeOf(pageLeases, f.Space, f.Node, f.Pool, f.OwnerNamespace, f.OwnerName, string(f.State))
	after, err := s.decodeContinue(ctx, sc, page.Continue)
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
		WHERE l.space = @space
		  AND (@after::inet IS NULL OR l.addr > @after)
		  AND (@node = '' OR n.name = @node)
		  AND (@pool = '' OR p.name = @pool)
		  AND (@ns = '' OR l.owner_namespace = @ns)
		  AND (@name = '' OR l.owner_name = @name)
		  AND CASE @state
		        WHEN '' THEN l.state <> 'released' OR l.cooldown_until > @now
		        WHEN 'cooling' THEN l.state = 'released' AND l.cooldown_until > @now
		        ELSE l.state = @state END
		ORDER BY l.addr LIMIT @limit`,
		namedArgs{"space": f.Space, "after": afterAddr, "node": f.Node, "pool": f.Pool, "ns": f.OwnerNamespace,
			"name": f.OwnerName, "state": string(f.State), "now": s.now(), "limit": page.Limit + 1}))
	if err != nil {
		return nil, "", err
	}
	return pageOf(ctx, s, sc, items, page.Limit, func(l alloc.Lease) string { return l.Addr.String() })
}

// sameRequest decides whether a request for an attachment that already holds
// leases is a retry of the request that made them: same owner, the families
// it names (if any) held, and each held lease in the pool the request names
// for its family (if any).
func sameRequest(existing []alloc.Lease, r alloc.LeaseRequest) error {
	held := make([]alloc.Family, 0, len(existing))
	for _, l := range existing {
		named := r.Pools[l.Family]
		if named == "" {
			named = r.Pool
		}
		switch {
		case l.Owner != r.Owner:
			return &alloc.Error{Kind: alloc.KindLeaseConflict, Field: "owner",
				Detail: fmt.Sprintf("attachment %s/%s is held by %s/%s", r.Attachment.ContainerID, r.Attachment.Interface, l.Owner.Namespace, l.Owner.Name)}
		case named != "" && l.Pool != named:
			return &alloc.Error{Kind: alloc.KindLeaseConflict, Field: "pool",
				Detail: fmt.Sprintf("attachment holds %s addresses of pool %q", l.Family, l.Pool)}
		case r.Sticky != nil && (l.Sticky == nil || l.Sticky.Identity != r.Sticky.Identity):
			return &alloc.Error{Kind: alloc.KindLeaseConflict, Field: "sticky.identity",
				Detail: fmt.Sprintf("attachment holds %s, which is not bound to %q", l.Addr, r.Sticky.Identity)}
		}
		held = append(held, l.Family)
	}
	if len(r.Families) > 0 && !slices.Equal(held, r.Families) {
		return &alloc.Error{Kind: alloc.KindLeaseConflict, Field: "families",
			Detail: fmt.Sprintf("attachment holds %v, not %v", held, r.Families)}
	}
	return nil
}
