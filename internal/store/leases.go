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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	mode       alloc.PoolMode
	disabled   bool
	// cloud pools carve nothing: their blocks are the cloud's addresses,
	// recorded by the capacity workers.
	cloud          bool
	skipMasquerade bool
	selectors      [2]*metav1.LabelSelector // pod, namespace
	maxBlocks      *int                     // maxBlocksPerNode; nil: the default
}

// carves reports whether the pool carves blocks: neither disabled nor a
// cloud pool.
func (p allocPool) carves() bool { return !p.disabled && !p.cloud }

// mask is the block mask of family f, nil when the pool lacks f.
func (p allocPool) mask(f alloc.Family) *int16 {
	if f == alloc.IPv6 {
		return p.masks[1]
	}
	return p.masks[0]
}

// blockLimit is the most blocks of f one node may hold of the pool.
func (p allocPool) blockLimit(f alloc.Family) int64 {
	m := p.mask(f)
	if m == nil {
		return 0
	}
	return alloc.BlockLimit(p.maxBlocks, f, int(*m), p.allowFirst, p.allowLast, p.nodeLocal)
}

// capacityLimit is the capacity of the most blocks of f one node may hold
// of the pool.
func (p allocPool) capacityLimit(f alloc.Family) int64 {
	m := p.mask(f)
	if m == nil {
		return 0
	}
	return alloc.NodeCapacityLimit(p.maxBlocks, f, int(*m), p.allowFirst, p.allowLast, p.nodeLocal)
}

func (p allocPool) has(f alloc.Family) bool { return p.mask(f) != nil }

func (p allocPool) families() []alloc.Family {
	var fs []alloc.Family
	for _, f := range alloc.Families {
		if p.has(f) {
			fs = append(fs, f)
		}
	}
	return fs
}

// allocPoolJSON is a pool as the allocation lookup aggregates it.
type allocPoolJSON struct {
	ID                int64                 `json:"id"`
	Name              string                `json:"name"`
	M4                *int16                `json:"m4"`
	M6                *int16                `json:"m6"`
	AllowFirst        bool                  `json:"first"`
	AllowLast         bool                  `json:"last"`
	Router            bool                  `json:"router"`
	Health            bool                  `json:"health"`
	Ingress           bool                  `json:"ingress"`
	Mode              alloc.PoolMode        `json:"mode"`
	Disabled          bool                  `json:"disabled"`
	Cloud             bool                  `json:"cloud"`
	SkipMasquerade    bool                  `json:"skipMasq"`
	PodSelector       *metav1.LabelSelector `json:"podSel"`
	NamespaceSelector *metav1.LabelSelector `json:"nsSel"`
	MaxBlocks         *int                  `json:"maxBlocks"`
}

func (j allocPoolJSON) pool() allocPool {
	return allocPool{id: j.ID, name: j.Name, masks: [2]*int16{j.M4, j.M6}, allowFirst: j.AllowFirst, allowLast: j.AllowLast,
		nodeLocal: alloc.NodeLocal{Router: j.Router, Health: j.Health, Ingress: j.Ingress}, mode: j.Mode,
		disabled: j.Disabled, cloud: j.Cloud, skipMasquerade: j.SkipMasquerade, selectors: [2]*metav1.LabelSelector{j.PodSelector, j.NamespaceSelector},
		maxBlocks: j.MaxBlocks}
}

// allocPoolJSONSQL builds allocPoolJSON from pools p.
const allocPoolJSONSQL = `json_build_object('id', p.id, 'name', p.name, 'm4', p.ipv4_mask_size, 'm6', p.ipv6_mask_size,
	'first', p.allow_first_ip, 'last', p.allow_last_ip, 'router', p.reserve_router, 'health', p.reserve_health,
	'ingress', p.reserve_ingress, 'mode', p.mode, 'disabled', p.disabled, 'cloud', p.cloud IS NOT NULL, 'skipMasq', p.skip_masquerade,
	'podSel', p.pod_selector, 'nsSel', p.namespace_selector, 'maxBlocks', p.max_blocks_per_node)`

func (s *Store) allocPool(ctx context.Context, q querier, space, name string) (allocPool, error) {
	var j allocPoolJSON
	err := q.QueryRow(ctx, `SELECT `+allocPoolJSONSQL+` FROM pools p WHERE p.space = $1 AND p.name = $2`, space, name).Scan(&j)
	if errors.Is(err, pgx.ErrNoRows) {
		return allocPool{}, s.notFoundIn(ctx, q, space, "pool", "pool", name)
	}
	return j.pool(), err
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

// allocLookup is what the first statement of an allocation learns.
type allocLookup struct {
	// nodeID is 0 when the node is not registered.
	nodeID int64
	held   bool
	// pools the selection may choose from: those the request, the Pod, the
	// namespace or the default name, and those with selectors.
	pools []allocPoolJSON
	// generation is the number the allocation's leases get (taken whether
	// or not they are made: numbers may skip, never repeat).
	generation int64
}

// lookup resolves, in one statement, the node, whether the attachment
// already holds leases, and the pools selection may need. It locks nothing:
// the block is locked by the statement that leases from it (leasesql.go),
// so the lock is held for that statement and the commit only, not for a
// round trip through the server as well.
func (s *Store) lookup(ctx context.Context, q querier, r alloc.LeaseRequest, sel alloc.Selection) (allocLookup, error) {
	return scanLookup(q.QueryRow(ctx, lookupSQL, lookupArgs(r, sel)))
}

// lookupShared is lookup outside a transaction: concurrent lookups share
// one round trip and, of one space, one statement (lookupManySQL), when
// the store batches.
func (s *Store) lookupShared(ctx context.Context, r alloc.LeaseRequest, sel alloc.Selection) (allocLookup, error) {
	if s.lookups == nil {
		return s.lookup(ctx, s.db, r, sel)
	}
	m := &mergedLookup{req: r, named: sel.Named()}
	it := &batchItem{sql: lookupSQL, args: []any{lookupArgs(r, sel)}, read: func(rows pgx.Rows) error {
		var err error
		m.lk, err = scanLookup(rowsRow{rows})
		return err
	}}
	it.merge = &merging{group: "lookup/" + r.Space, combine: combineLookups, payload: m}
	err := s.lookups.write(ctx, "", it)
	return m.lk, err
}

// lookupSQL is lookup's statement: one row, whose node id is NULL when the
// node is not registered.
const lookupSQL = `SELECT n.id,
		EXISTS (SELECT 1 FROM leases l WHERE l.node_id = n.id AND l.network = @network AND l.container_id = @container
		   AND l.interface = @iface AND l.state <> 'released'),
		` + lookupPoolsSQL + `,
		nextval('lease_generations')
	FROM (VALUES (1)) v
	LEFT JOIN nodes n ON n.space = @space AND n.name = @node`

// lookupPoolsSQL is the pools of space @space a selection naming @named
// may choose from (allocPoolJSON): those named, and those with selectors.
const lookupPoolsSQL = `(SELECT coalesce(json_agg(` + allocPoolJSONSQL + `), '[]') FROM pools p WHERE p.space = @space
		   AND (p.name = ANY (@named) OR p.pod_selector IS NOT NULL OR p.namespace_selector IS NOT NULL))`

func lookupArgs(r alloc.LeaseRequest, sel alloc.Selection) namedArgs {
	return namedArgs{"space": r.Space, "node": r.Node, "container": r.Attachment.ContainerID, "iface": r.Attachment.Interface,
		"named": sel.Named(), "network": r.Attachment.Network}
}

func scanLookup(row pgx.Row) (allocLookup, error) {
	var lk allocLookup
	var nid *int64
	err := row.Scan(&nid, &lk.held, &lk.pools, &lk.generation)
	if nid != nil {
		lk.nodeID = *nid
	}
	return lk, err
}

// mergedLookup is one lookup of a lookupManySQL statement, and its answer.
type mergedLookup struct {
	req   alloc.LeaseRequest
	named []string
	lk    allocLookup
}

// combineLookups makes one lookupManySQL statement of lookups of one
// space. The statement reads the pools any of them names once; each lookup
// keeps those its own statement would have read.
func combineLookups(group []*batchItem) (string, []any, func(pgx.Rows) error) {
	ms := make([]*mergedLookup, len(group))
	n := len(group)
	nodes, networks, containers, ifaces := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	var named []string
	for i, it := range group {
		m := it.merge.payload.(*mergedLookup)
		ms[i] = m
		a := m.req.Attachment
		nodes[i], networks[i], containers[i], ifaces[i] = m.req.Node, a.Network, a.ContainerID, a.Interface
		for _, name := range m.named {
			if !slices.Contains(named, name) {
				named = append(named, name)
			}
		}
	}
	args := namedArgs{"space": ms[0].req.Space, "named": named, "nodes": nodes, "networks": networks,
		"containers": containers, "ifaces": ifaces}
	read := func(rows pgx.Rows) error {
		answered := make([]bool, len(ms))
		var pools []allocPoolJSON
		for rows.Next() {
			var i int
			var lk allocLookup
			var nid *int64
			var all *[]allocPoolJSON
			if err := rows.Scan(&i, &nid, &lk.held, &all, &lk.generation); err != nil {
				return err
			}
			if i < 1 || i > len(ms) {
				return fmt.Errorf("lookup answered request %d of %d", i, len(ms))
			}
			if nid != nil {
				lk.nodeID = *nid
			}
			if all != nil {
				pools = *all
			}
			ms[i-1].lk, answered[i-1] = lk, true
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for i, m := range ms {
			if !answered[i] {
				return fmt.Errorf("lookup answered no row for request %d of %d", i+1, len(ms))
			}
			m.lk.pools = poolsNamedOrSelecting(pools, m.named)
		}
		return nil
	}
	return lookupManySQL, []any{args}, read
}

// poolsNamedOrSelecting keeps the pools lookupSQL reads for a request that
// names named: those named, and those with a selector.
func poolsNamedOrSelecting(pools []allocPoolJSON, named []string) []allocPoolJSON {
	out := make([]allocPoolJSON, 0, len(pools))
	for _, p := range pools {
		if p.PodSelector != nil || p.NamespaceSelector != nil || slices.Contains(named, p.Name) {
			out = append(out, p)
		}
	}
	return out
}

// lookupManySQL is lookupSQL for many requests of space @space at once
// (the arrays, one element per request): a row per request, its number
// first, with the pools that any request names (or that select) on the
// first row only.
const lookupManySQL = `SELECT r.n, n.id, h.held IS NOT NULL,
		CASE WHEN r.n = 1 THEN ` + lookupPoolsSQL + ` END,
		nextval('lease_generations')
	FROM unnest(@nodes::text[], @networks::text[], @containers::text[], @ifaces::text[])
		WITH ORDINALITY AS r (node, network, container, iface, n)
	-- LIMIT keeps both joins probes of an index per request: as plain
	-- joins the planner may hash every node of the space, or every
	-- lease held, for the handful of requests.
	LEFT JOIN LATERAL (SELECT id FROM nodes WHERE space = @space AND name = r.node LIMIT 1) n ON true
	LEFT JOIN LATERAL (
		SELECT true AS held FROM leases l WHERE l.node_id = n.id AND l.network = r.network AND l.container_id = r.container
		   AND l.interface = r.iface AND l.state <> 'released' LIMIT 1
	) h ON true`

// leaseColumns read a lease with the names the API shows. $1 is "now", to
// tell cooling rows from rows whose cooldown has ended.
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
		_, err := tx.Exec(ctx, `UPDATE leases SET state = 'active', expires_at = NULL, confirmed_at = $4
			WHERE node_id = $1 AND network = $5 AND container_id = $2 AND interface = $3 AND state = 'pending'`,
			nodeID, a.ContainerID, a.Interface, s.now(), a.Network)
		return err
	})
	if err != nil {
		return alloc.Allocation{}, err
	}
	return s.GetAttachment(ctx, space, node, a)
}

// releaseSet is the assignment that turns a lease into a cooling address;
// $1 is now, $2 the end of the cooldown (releaseSetOf).
var releaseSet = releaseSetOf("$1", "$2")

// releaseSetOf is the assignment that turns a lease into a cooling address
// at now, cooling until until (both parameters of the statement). An
// address bound to a workload identity cools for the longer of the
// cooldown and its retention: nothing but its identity leases it, and no
// purge deletes it, before then.
func releaseSetOf(now, until string) string {
	return `state = 'released', expires_at = NULL, released_at = ` + now + `,
	cooldown_until = CASE WHEN sticky_retention IS NULL THEN ` + until + `::timestamptz
		ELSE greatest(` + until + `::timestamptz, ` + now + `::timestamptz + sticky_retention) END`
}

// released releases the leases matching where ($3 on: args) for reason.
func (s *Store) released(ctx context.Context, reason, where string, args ...any) ([]alloc.Lease, error) {
	now := s.now()
	args = append([]any{now, now.Add(s.opts.Cooldown)}, args...)
	args = append(args, historyActor(ctx), reason)
	var out []alloc.Lease
	err := s.writeOne(ctx, "", releasedSQL(where, len(args)), func(rows pgx.Rows) error {
		var err error
		out, err = collectLeases(rows, nil)
		return err
	}, args...)
	return out, err
}

// releasedSQL releases the leases matching where, with released's
// parameters: now ($1), the end of the cooldown ($2), where's ($3 on), and
// the history's actor and reason last (n is their count).
func releasedSQL(where string, n int) string {
	return `WITH r AS (
			UPDATE leases l SET ` + releaseSet + ` WHERE l.state <> 'released' AND ` + historyContextSQL(n-1, n, 1) + ` AND ` + where + ` RETURNING l.*
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
	args := []any{now, m.until, space, node, a.ContainerID, a.Interface, a.Network, actor, reasonReleaseAttachment}
	it := &batchItem{sql: releasedSQL(`l.node_id = (SELECT id FROM nodes WHERE space = $3 AND name = $4)
		AND l.network = $7 AND l.container_id = $5 AND l.interface = $6`, len(args)), args: args,
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
		UPDATE leases l SET ` + releaseSetOf("@now", "@until") + `
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
	released, err := s.released(ctx, reasonReleaseAddress, `l.space = $3 AND l.addr = $4 AND l.network <> $5`,
		space, addr, alloc.CiliumPoolNetwork)
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
	return s.released(ctx, reasonReconcile, `l.node_id = (SELECT id FROM nodes WHERE space = $3 AND name = $4)
		AND l.network = $9 AND l.created_at <= $7 AND ($8::bigint IS NULL OR l.generation <= $8)
		AND (l.container_id, l.interface) NOT IN (SELECT * FROM unnest($5::text[], $6::text[]))`,
		space, node, ids, ifaces, s.now().Add(-s.opts.ReconcileMinAge), upTo, network)
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
		WHERE l.node_id = (SELECT id FROM nodes WHERE space = $1 AND name = $2) AND l.state <> 'released'
		AND l.network = $5 AND (l.container_id, l.interface) NOT IN (SELECT * FROM unnest($3::text[], $4::text[]))`,
		space, node, ids, ifaces, network).Scan(&n)
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
