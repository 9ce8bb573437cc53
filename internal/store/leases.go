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
	id             int64
	name           string
	masks          [2]*int16 // IPv4, IPv6
	allowFirst     bool
	allowLast      bool
	nodeLocal      alloc.NodeLocal
	mode           alloc.PoolMode
	disabled       bool
	skipMasquerade bool
	selectors      [2]*metav1.LabelSelector // pod, namespace
	maxBlocks      *int                     // maxBlocksPerNode; nil: the default
}

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
	SkipMasquerade    bool                  `json:"skipMasq"`
	PodSelector       *metav1.LabelSelector `json:"podSel"`
	NamespaceSelector *metav1.LabelSelector `json:"nsSel"`
	MaxBlocks         *int                  `json:"maxBlocks"`
}

func (j allocPoolJSON) pool() allocPool {
	return allocPool{id: j.ID, name: j.Name, masks: [2]*int16{j.M4, j.M6}, allowFirst: j.AllowFirst, allowLast: j.AllowLast,
		nodeLocal: alloc.NodeLocal{Router: j.Router, Health: j.Health, Ingress: j.Ingress}, mode: j.Mode,
		disabled: j.Disabled, skipMasquerade: j.SkipMasquerade, selectors: [2]*metav1.LabelSelector{j.PodSelector, j.NamespaceSelector},
		maxBlocks: j.MaxBlocks}
}

// allocPoolJSONSQL builds allocPoolJSON from pools p.
const allocPoolJSONSQL = `json_build_object('id', p.id, 'name', p.name, 'm4', p.ipv4_mask_size, 'm6', p.ipv6_mask_size,
	'first', p.allow_first_ip, 'last', p.allow_last_ip, 'router', p.reserve_router, 'health', p.reserve_health,
	'ingress', p.reserve_ingress, 'mode', p.mode, 'disabled', p.disabled, 'skipMasq', p.skip_masquerade,
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
	nodeID int64
	held   bool
	// pools the selection may choose from: those the request, the Pod, the
	// namespace or the default name, and those with selectors.
	pools []allocPoolJSON
	// generation is the number the allocation's leases get (taken whether
	// or not they are made: numbers may skip, never repeat).
	generation int64
	// registered is true when the lookup registered the node: a failed
	// allocation must not leave it registered.
	registered bool
}

// lookupForAllocate resolves, in one statement, the node, whether the
// attachment already holds leases, and the pools selection may need; it
// registers an unknown node when the store auto-registers. It locks
// nothing: the block is locked by the statement that leases from it
// (leaseSkippingSQL, leaseWaitingSQL), so the lock is held for that
// statement and the commit only, not for a round trip through the server
// as well.
func (s *Store) lookupForAllocate(ctx context.Context, tx querier, r alloc.LeaseRequest, sel alloc.Selection, now time.Time) (allocLookup, error) {
	var lk allocLookup
	var nid *int64
	err := tx.QueryRow(ctx, `SELECT n.id,
			EXISTS (SELECT 1 FROM leases l WHERE l.node_id = n.id AND l.network = $6 AND l.container_id = $3 AND l.interface = $4
			   AND l.state <> 'released'),
			(SELECT coalesce(json_agg(`+allocPoolJSONSQL+`), '[]') FROM pools p WHERE p.space = $1
			   AND (p.name = ANY ($5) OR p.pod_selector IS NOT NULL OR p.namespace_selector IS NOT NULL)),
			nextval('lease_generations')
		FROM (VALUES (1)) v
		LEFT JOIN nodes n ON n.space = $1 AND n.name = $2`,
		r.Space, r.Node, r.Attachment.ContainerID, r.Attachment.Interface, sel.Named(), r.Attachment.Network).
		Scan(&nid, &lk.held, &lk.pools, &lk.generation)
	if err != nil {
		return lk, err
	}
	if nid != nil {
		lk.nodeID = *nid
		return lk, nil
	}
	lk.nodeID, err = s.ensureNode(ctx, tx, r.Space, r.Node, now)
	lk.registered = true
	return lk, err
}

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

// Allocate leases one address per family for the attachment, all in one
// transaction. The pool of each family is chosen by alloc.Select. Per
// family it takes, in order: a fresh address from the node's oldest block
// with room; else an address of the node's blocks whose cooldown has ended;
// else a newly carved block. A retry of the attachment answers its existing
// leases (Created=false) when the owner, the families and any pool the
// request names match, and a KindLeaseConflict error otherwise; the rules
// that read annotations and selectors are not evaluated again (Cilium
// evaluates them once, at allocation). A request with FromReserve takes
// over a reserve attachment's leases instead (see handOver).
//
// A KindPoolExhausted error says how many of the node's released addresses
// of that pool and family are still cooling, and when the first one ends
// its cooldown (RetryAfter): the refusal is then temporary.
func (s *Store) Allocate(ctx context.Context, r alloc.LeaseRequest) (alloc.Allocation, error) {
	if err := r.Validate(); err != nil {
		return alloc.Allocation{}, err
	}
	if r.FromReserve != nil {
		return s.handOver(ctx, r)
	}
	out, err := s.allocate(ctx, r)
	if e := (*alloc.Error)(nil); errors.As(err, &e) && e.Kind == alloc.KindPoolExhausted && e.Pool != "" {
		s.explainCooling(ctx, r, e)
	}
	return out, err
}

func (s *Store) allocate(ctx context.Context, r alloc.LeaseRequest) (alloc.Allocation, error) {
	out, err := s.allocateOnce(ctx, r, false)
	var nb *needBlock
	if !errors.As(err, &nb) {
		return out, err
	}
	if err := s.carveFor(ctx, r.Space, nb); err != nil {
		return out, err
	}
	return s.allocateOnce(ctx, r, true)
}

// explainCooling adds to e, the exhaustion of e.Pool and e.Family for r's
// node, the released addresses of the node's blocks that will become free:
// those cooling, and those bound to a sticky identity, which become free
// when their retention ends unless their workload comes back first. The
// first to become free sets e.RetryAfter (a cooling one, if any). It
// leaves e as it is when the read fails: the refusal stands either way.
func (s *Store) explainCooling(ctx context.Context, r alloc.LeaseRequest, e *alloc.Error) {
	now := s.now()
	var cooling, bound int64
	var firstCooled, firstUnbound *time.Time
	err := s.db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE l.sticky_identity IS NULL),
			min(l.cooldown_until) FILTER (WHERE l.sticky_identity IS NULL),
			count(*) FILTER (WHERE l.sticky_identity IS NOT NULL),
			min(l.cooldown_until) FILTER (WHERE l.sticky_identity IS NOT NULL)
		FROM nodes n
		JOIN blocks b ON b.node_id = n.id
		JOIN pools p ON p.id = b.pool_id
		JOIN leases l ON l.block_id = b.id
		WHERE n.space = $1 AND n.name = $2 AND p.space = $1 AND p.name = $3 AND b.family = $4
		  AND l.state = 'released' AND l.cooldown_until > $5`,
		r.Space, r.Node, e.Pool, int16(e.Family), now).Scan(&cooling, &firstCooled, &bound, &firstUnbound)
	if err != nil {
		return
	}
	if cooling > 0 {
		d := firstCooled.Sub(now)
		e.Detail += fmt.Sprintf("; %d %s cooling, the first free in %d s", cooling, addresses(cooling), ceilSeconds(d))
		e.RetryAfter = d
	}
	if bound > 0 {
		d := firstUnbound.Sub(now)
		e.Detail += fmt.Sprintf("; %d %s bound to sticky identities, the first free in %d s unless its workload comes back",
			bound, addresses(bound), ceilSeconds(d))
		if e.RetryAfter == 0 {
			e.RetryAfter = d
		}
	}
}

func addresses(n int64) string {
	if n == 1 {
		return "address"
	}
	return "addresses"
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// allocateOnce is one transaction of Allocate, retried as inTx retries.
// Without carveInTx, it answers a *needBlock error when a family has no
// address on the node.
func (s *Store) allocateOnce(ctx context.Context, r alloc.LeaseRequest, carveInTx bool) (alloc.Allocation, error) {
	sel := r.Selection(s.opts.DefaultPool)
	try := func(fastPath bool) (alloc.Allocation, error) {
		tx, err := s.beginPipelined(ctx, "")
		if err != nil {
			return alloc.Allocation{}, err
		}
		defer tx.end(ctx)
		return s.allocateTx(ctx, tx, r, sel, carveInTx, fastPath)
	}
	var out alloc.Allocation
	var err error
	for attempt := 0; attempt < maxTxAttempts; attempt++ {
		if attempt > 0 && !retryWait(ctx, attempt) {
			return out, err
		}
		out, err = try(attempt == 0)
		if errors.Is(err, errNoFreshAddress) {
			// Not a collision: at once, on the slow path.
			out, err = try(false)
		}
		if err == nil || !(retryable(err) || errors.Is(err, errNodeHasRoom)) {
			return out, err
		}
	}
	if w := (*waitForRoom)(nil); errors.As(err, &w) {
		// Concurrent allocations of the node took the room it had at
		// every attempt, and the pool carves no more for it.
		return out, alloc.Exhausted(w.pool, w.family)
	}
	return out, err
}

// errNoFreshAddress is the fast path's "no block with room": allocateOnce
// allocates again on the slow path.
var errNoFreshAddress = errors.New("no block with a fresh address")

// allocateTx allocates in tx and commits it. With fastPath, the common case
// (one family, a block with room) is two round trips: the lookup with the
// BEGIN, and the lease with the COMMIT; when no block has room, it answers
// errNoFreshAddress.
func (s *Store) allocateTx(ctx context.Context, tx *pipelinedTx, r alloc.LeaseRequest, sel alloc.Selection, carveInTx, fastPath bool) (alloc.Allocation, error) {
	now := s.now()
	lk, err := s.lookupForAllocate(ctx, tx, r, sel, now)
	if err != nil {
		return alloc.Allocation{}, err
	}
	if lk.held {
		existing, err := attachmentLeases(ctx, tx, lk.nodeID, r.Attachment)
		if err != nil {
			return alloc.Allocation{}, err
		}
		if err := sameRequest(existing, r); err != nil {
			return alloc.Allocation{}, err
		}
		return allocationOf(r.Node, r.Attachment, existing, false), tx.commit(ctx)
	}
	known := map[string]alloc.Candidate{}
	pools := map[string]allocPool{}
	var bySelector []alloc.Candidate
	for _, j := range lk.pools {
		p := j.pool()
		c, err := candidate(p)
		if err != nil {
			return alloc.Allocation{}, err
		}
		pools[p.name] = p
		known[p.name] = c
		if c.PodSelector != nil || c.NamespaceSelector != nil {
			bySelector = append(bySelector, c)
		}
	}
	choices, err := alloc.Select(sel, known, bySelector)
	if err != nil {
		return alloc.Allocation{}, err
	}
	if len(choices) == 1 && r.Sticky == nil && fastPath && !lk.registered {
		// The common case: lock a block with room and lease from it,
		// and commit, in one round trip.
		c := choices[0]
		lease, args := s.newLease(lk.nodeID, pools[c.Pool], c, r, now, lk.generation)
		ok, _, err := scanLeasing(&lease, tx.commitWith(ctx, leaseSkippingSQL, args...))
		if err == nil && !ok {
			// No block with room, or the probe's snapshot did not
			// show its free address: that transaction committed
			// nothing (but a generation number); the slow path
			// reuses a cooled address, leases with a new snapshot or
			// carves.
			err = errNoFreshAddress
		}
		return allocationOf(r.Node, r.Attachment, []alloc.Lease{lease}, true), err
	}
	leases := make([]alloc.Lease, 0, len(choices))
	var need *needBlock
	for _, c := range choices {
		var l alloc.Lease
		if r.Sticky != nil {
			l, err = s.leaseSticky(ctx, tx, lk, pools[c.Pool], c, r, now, carveInTx)
		} else {
			l, err = s.leaseOne(ctx, tx, lk.nodeID, pools[c.Pool], c, r, now, carveInTx, lk.generation)
		}
		// Every family's need, so that one carving transaction makes
		// all or none of the blocks.
		if nb := (*needBlock)(nil); errors.As(err, &nb) {
			need = need.add(nb)
			continue
		}
		if err != nil {
			return alloc.Allocation{}, err
		}
		leases = append(leases, l)
	}
	if need != nil {
		return alloc.Allocation{}, need
	}
	return allocationOf(r.Node, r.Attachment, leases, true), tx.commit(ctx)
}

// candidate is what selection needs of a pool. A selector stored by this
// service always converts; an error here means the row was edited by hand.
func candidate(p allocPool) (alloc.Candidate, error) {
	c := alloc.Candidate{Name: p.name, Families: p.families()}
	var err error
	if c.PodSelector, err = alloc.LabelSelector("podSelector", p.selectors[0]); err != nil {
		return c, fmt.Errorf("pool %q: %w", p.name, err)
	}
	if c.NamespaceSelector, err = alloc.LabelSelector("namespaceSelector", p.selectors[1]); err != nil {
		return c, fmt.Errorf("pool %q: %w", p.name, err)
	}
	return c, nil
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

// leaseOne leases one address of family f; see Allocate for the order.
func (s *Store) leaseOne(ctx context.Context, tx querier, nodeID int64, p allocPool, c alloc.Choice, r alloc.LeaseRequest, now time.Time,
	carveInTx bool, gen int64) (alloc.Lease, error) {
	lease, args := s.newLease(nodeID, p, c, r, now, gen)
	return s.leaseNew(ctx, tx, nodeID, p, c.Family, r, now, carveInTx, lease, args)
}

// newLease is the lease of family c.Family that r asks for, before it has
// an address, and the parameters $1-$15 of the lease statements.
func (s *Store) newLease(nodeID int64, p allocPool, c alloc.Choice, r alloc.LeaseRequest, now time.Time, gen int64) (alloc.Lease, []any) {
	lease := alloc.Lease{Space: r.Space, Node: r.Node, Pool: p.name, Family: c.Family, Attachment: r.Attachment,
		Owner: r.Owner, State: alloc.StateActive, CreatedAt: now, SkipMasquerade: p.skipMasquerade, SelectedBy: c.By, Generation: gen}
	var expires *time.Time
	if r.Expire {
		e := now.Add(s.opts.LeaseExpiry)
		lease.State, lease.ExpiresAt, expires = alloc.StatePending, e, &e
	}
	return lease, []any{nodeID, p.id, int16(c.Family), r.Space, string(lease.State), r.Attachment.ContainerID, r.Attachment.Interface,
		r.Owner.Namespace, r.Owner.Name, r.Owner.UID, now, expires, string(c.By), gen, r.Attachment.Network}
}

// leaseNew leases lease (made by newLease, with its args) a fresh or cooled
// address. When the node has neither, it carves a block in tx when
// carveInTx is set, and otherwise answers a *needBlock error: the
// allocation rolls back and Allocate carves a block in a transaction of its
// own, then allocates again (see needBlock).
func (s *Store) leaseNew(ctx context.Context, tx querier, nodeID int64, p allocPool, f alloc.Family, r alloc.LeaseRequest, now time.Time,
	carveInTx bool, lease alloc.Lease, args []any) (alloc.Lease, error) {
	// Skip held blocks, and let carveFor carve one more, when the pool
	// can carve; else, and once carveFor ran, wait for a held block.
	leaseSQL := leaseSkippingSQL
	if carveInTx || p.mode == alloc.ModeClusterPool || p.disabled {
		leaseSQL = leaseWaitingSQL
	}
	ok, block, err := scanLeasing(&lease, tx.QueryRow(ctx, leaseSQL, args...))
	if err != nil || ok {
		return lease, err
	}
	if block != 0 {
		// The block has room by its count, which the probe's snapshot
		// did not show: look again with a new one, holding the block.
		return lease, s.leaseFromHeld(ctx, tx, &lease, args, block)
	}
	// No fresh address: reuse one whose cooldown has ended.
	if ok, _, err = scanLeasing(&lease, tx.QueryRow(ctx, leaseCooledSQL, args...)); err != nil || ok {
		return lease, err
	}
	if !carveInTx {
		return lease, &needBlock{node: r.Node, pool: p, family: f}
	}
	// Holding the pool's carve lock from here to the commit, never wait
	// for a block row (an allocation holding one may wait for this lock):
	// carve without looking for one with room (leaseWaitingSQL just did),
	// and lease from the new block, this transaction's alone until it
	// commits. The node may have a block with room all the same, carved
	// or freed after this statement's snapshot: when carving it one more
	// would take the pool's last block (or the pool is full), carve
	// answers errNodeHasRoom, and allocateOnce tries again in a new
	// transaction, which waits for that block.
	b, ok, err := carve(ctx, tx, r.Space, nodeID, p, f, now, carveFair)
	if errors.Is(err, errNodeHasRoom) {
		return lease, &waitForRoom{pool: p.name, family: f}
	} else if err != nil {
		return lease, err
	} else if !ok {
		return lease, alloc.Exhausted(p.name, f)
	}
	return lease, s.leaseFromHeld(ctx, tx, &lease, args, b.id)
}

// waitForRoom is leaseNew's errNodeHasRoom: allocateOnce tries again, and
// answers the pool's exhaustion when its attempts run out.
type waitForRoom struct {
	pool   string
	family alloc.Family
}

func (e *waitForRoom) Error() string {
	return fmt.Sprintf("pool %q, %s: %v", e.pool, e.family, errNodeHasRoom)
}

func (e *waitForRoom) Unwrap() error { return errNodeHasRoom }

// leaseFromHeld leases l from block, which tx holds (leaseFreshSQL with
// args). The block has room by its count: an answer without an address
// means the count is wrong.
func (s *Store) leaseFromHeld(ctx context.Context, tx querier, l *alloc.Lease, args []any, block int64) error {
	ok, _, err := scanLeasing(l, tx.QueryRow(ctx, leaseFreshSQL, append(args, block)...))
	if err == nil && !ok {
		err = fmt.Errorf("block %d has room by its count but no free address", block)
	}
	return err
}

// needBlock is the error of an allocation that found no address on its node:
// the node needs a block of family of pool.
//
// Carving inside the allocation's transaction holds the pool's carve lock
// (its CIDR rows) until that transaction commits, so every allocation
// carving in the pool queues behind the others' whole transactions: in the
// benchmark the lock wait was 141 ms on average. So an allocation first
// carves in a short transaction of its own, which holds the lock for one
// insert and a commit, and allocates again. Concurrent allocations of the
// node may take the whole new block first (a hot node with small blocks);
// the second attempt then carves in its own transaction, as before, which
// cannot lose its block. A block carved for an allocation that then fails
// is the node's all the same, and Rebalance returns it when it stays empty.
type needBlock struct {
	node   string
	pool   allocPool
	family alloc.Family
	// more is the need of another family of the same allocation.
	more *needBlock
}

func (e *needBlock) Error() string {
	return fmt.Sprintf("node %q needs a %s block of pool %q", e.node, e.family, e.pool.name)
}

// add answers the needs of e (possibly nil) and then nb.
func (e *needBlock) add(nb *needBlock) *needBlock {
	if e == nil {
		return nb
	}
	last := e
	for last.more != nil {
		last = last.more
	}
	last.more = nb
	return e
}

// carveFor carves a block of each pool and family nb names for its node,
// all in one transaction, except where the node has a block with room again
// by then, or has one that others hold while the pool has one free block
// left (see carveFair). It registers the node when the store
// auto-registers: the allocation that registered it rolled back.
func (s *Store) carveFor(ctx context.Context, space string, nb *needBlock) error {
	return s.inTx(ctx, func(tx pgx.Tx) error {
		now := s.now()
		nodeID, err := s.ensureNode(ctx, tx, space, nb.node, now)
		if err != nil {
			return err
		}
		for n := nb; n != nil; n = n.more {
			_, ok, err := carve(ctx, tx, space, nodeID, n.pool, n.family, now, carveUnlessFreeRoom)
			if errors.Is(err, errNodeHasRoom) {
				// The pool's last free block is kept for another
				// node: the next attempt waits for the node's own.
				continue
			}
			if err == nil && !ok {
				err = alloc.Exhausted(n.pool.name, n.family)
			}
			if alloc.IsKind(err, alloc.KindPoolExhausted) || alloc.IsKind(err, alloc.KindNodeBlockLimit) {
				// The pool carves no more (for this node), but the node
				// may have a block with room that others hold: the next
				// attempt waits for it, and says why if there is none.
				var room bool
				if qerr := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+blocksWithRoomSQL+`)`,
					nodeID, n.pool.id, int16(n.family)).Scan(&room); qerr != nil {
					return qerr
				} else if room {
					continue
				}
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// scanLeasing reads the answer of a lease statement (address, block CIDR,
// gateway, block id): ok when it leased, and else the block it holds, 0
// when none (no block with room, or no row to reuse).
func scanLeasing(l *alloc.Lease, row pgx.Row) (ok bool, block int64, err error) {
	var addr, gw *netip.Addr
	err = row.Scan(&addr, &l.Block, &gw, &block)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, 0, nil
	} else if err != nil || addr == nil {
		return false, block, err
	}
	l.Addr = *addr
	if gw != nil {
		l.Gateway = *gw
	}
	return true, block, nil
}

// leaseFreshSQL leases, in one statement, the first address of block $16,
// which this transaction holds (carved, or locked by an earlier statement),
// from its round-robin cursor onwards that has no lease row (held or
// cooling) and is not node-local; it inserts the lease and advances the
// cursor and the block's count. It answers the address (NULL when every
// address has a row), the block's CIDR, gateway and id (see scanLeasing).
//
// The cursor makes the common case one index probe; a nearly full block
// costs at most one probe per address of the block, never a scan of the
// pool, and addresses are reused as late as possible (like host-local).
//
// Parameters: $1 node, $2 pool, $3 family, $4 space, $5 state, $6 container,
// $7 interface, $8-$10 owner, $11 now, $12 expires (NULL when active),
// $13 the selection rule, $14 the generation, $15 the network, $16 block.
const leaseFreshSQL = `WITH b AS (
		SELECT ` + leaseBlockColumns + ` FROM blocks WHERE id = $16
	)` + leaseFromBlockSQL

// leaseSkippingSQL is leaseFreshSQL from the oldest block of node $1, pool
// $2 and family $3 whose lease rows leave room and that no other
// transaction holds, which it locks: concurrent allocations of a busy node
// spread over its blocks with room. No row: no such block. Parameters
// $1-$15 as leaseFreshSQL, and so is its answer.
//
// The lock serializes allocations within one block only. It is taken by the
// statement that leases, so it is held for that statement and the commit
// (sent with it on the common path), never for a round trip through the
// server as well.
//
// Its probe for a free address reads the statement's snapshot, taken
// before the row was locked, so it misses the leases that the block's
// previous holders committed meanwhile. It cannot pick one of them but on a
// nearly full block: the locked row is its newest version (READ COMMITTED
// re-reads a row it locks), so the probe starts at the cursor those holders
// advanced, and each of them leased the first free address from the cursor
// of its time, all behind the cursor now. Only a probe that wraps around the
// whole block can reach them: when the snapshot still shows rows that a
// purge deleted meanwhile, the free addresses are those the snapshot cannot
// see. The insert then skips the address it found taken (ON CONFLICT), and
// the answer has no address but the locked block: leaseFreshSQL, a new
// statement with a new snapshot, leases from it.
const leaseSkippingSQL = `WITH b AS (` + lockOldestWithRoomSQL + ` SKIP LOCKED)` + leaseFromBlockSQL

// leaseWaitingSQL is leaseSkippingSQL waiting for the oldest block with
// room when others hold it.
//
// A transaction uses one of the two, never both: a row locked and then
// found full (READ COMMITTED re-checks a row it locked) stays locked, and a
// statement that skipped a held block and then waited for it while holding
// such a row deadlocked with another doing the reverse (seen with 32 clients
// on one node). Waiting in id order only, a transaction holds lower blocks
// than the one it waits for, so the waits cannot form a cycle; skipping, it
// never waits.
const leaseWaitingSQL = `WITH b AS (` + lockOldestWithRoomSQL + `)` + leaseFromBlockSQL

// lockOldestWithRoomSQL locks the oldest block with room of node $1, pool
// $2 and family $3 (blocksWithRoomSQL), with leaseBlockColumns.
const lockOldestWithRoomSQL = `SELECT ` + leaseBlockColumns + ` FROM ` + blocksWithRoomSQL + `
		ORDER BY id LIMIT 1 FOR NO KEY UPDATE`

// blocksWithRoomSQL are the blocks of node $1, pool $2 and family $3 whose
// lease rows (held or cooling) leave room.
const blocksWithRoomSQL = `blocks WHERE node_id = $1 AND pool_id = $2 AND family = $3 AND allocated < capacity`

// leaseBlockColumns are the columns of a block row that leaseFromBlockSQL reads.
const leaseBlockColumns = `id, cidr, set_masklen(cidr::inet, CASE WHEN family = 4 THEN 32 ELSE 128 END) AS base,
		first_offset, last_offset, reserved, next_offset, router`

// leaseFromBlockSQL is the rest of leaseFreshSQL, leaseSkippingSQL and leaseWaitingSQL after
// the CTE b, which names the locked block.
const leaseFromBlockSQL = `, cand AS (
		SELECT b.*, c.o FROM b, LATERAL (
			SELECT s.o FROM (
				SELECT generate_series(b.next_offset, b.last_offset) AS o
				UNION ALL
				SELECT generate_series(b.first_offset, b.next_offset - 1)
			) s
			LEFT JOIN LATERAL (
				-- LIMIT keeps this a per-offset probe of the (space, addr)
				-- index; as a plain NOT EXISTS the planner may anti-join
				-- against every lease of the space.
				SELECT 1 AS held FROM leases x WHERE x.space = $4 AND x.addr = b.base + s.o LIMIT 1
			) h ON true
			WHERE s.o <> ALL (b.reserved) AND h.held IS NULL
			LIMIT 1
		) c
	), ins AS (
		INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface,
			owner_namespace, owner_name, owner_uid, created_at, expires_at, selected_by, generation, network)
		SELECT $4, base + o, id, cidr, $1, $2, $3, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15 FROM cand
		ON CONFLICT (space, addr) DO NOTHING
		RETURNING addr
	), upd AS (
		UPDATE blocks SET allocated = allocated + 1,
			next_offset = CASE WHEN cand.o + 1 > cand.last_offset THEN cand.first_offset ELSE cand.o + 1 END
		FROM cand, ins WHERE blocks.id = cand.id
	)
	SELECT ins.addr, b.cidr, b.router, b.id FROM b LEFT JOIN ins ON true`

// leaseCooledSQL re-leases, in place, the address of the node's blocks
// (pool $2, family $3) whose cooldown ended longest ago. SKIP LOCKED lets
// concurrent requests take different rows. Parameters as leaseFreshSQL. A
// binding whose retention ended goes with the row's old lease.
const leaseCooledSQL = `UPDATE leases l SET state = $5, network = $15, container_id = $6, interface = $7,
		owner_namespace = $8, owner_name = $9, owner_uid = $10, created_at = $11, expires_at = $12, selected_by = $13,
		generation = $14, sticky_identity = NULL, sticky_retention = NULL,
		confirmed_at = NULL, released_at = NULL, cooldown_until = NULL
	FROM blocks b
	WHERE b.id = l.block_id AND l.space = $4 AND l.addr = (
		SELECT c.addr FROM blocks cb, LATERAL (
			SELECT c.addr, c.cooldown_until FROM leases c
			WHERE c.block_id = cb.id AND c.state = 'released' AND c.cooldown_until <= $11
			ORDER BY c.cooldown_until LIMIT 1 FOR UPDATE SKIP LOCKED
		) c
		WHERE cb.node_id = $1 AND cb.pool_id = $2 AND cb.family = $3
		ORDER BY c.cooldown_until LIMIT 1)
	RETURNING l.addr, l.block_cidr, b.router, l.block_id`

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
	err = s.inTx(ctx, func(tx pgx.Tx) error {
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
// $1 is now, $2 the end of the cooldown. An address bound to a workload
// identity cools for the longer of the cooldown and its retention: nothing
// but its identity leases it, and no purge deletes it, before then.
const releaseSet = `state = 'released', expires_at = NULL, released_at = $1,
	cooldown_until = CASE WHEN sticky_retention IS NULL THEN $2 ELSE greatest($2::timestamptz, $1::timestamptz + sticky_retention) END`

// released releases the leases matching where ($3 on: args) for reason.
func (s *Store) released(ctx context.Context, reason, where string, args ...any) ([]alloc.Lease, error) {
	now := s.now()
	args = append([]any{now, now.Add(s.opts.Cooldown)}, args...)
	args = append(args, historyActor(ctx), reason)
	history := historyContextSQL(len(args)-1, len(args), 1)
	return collectLeases(s.db.Query(ctx, `WITH r AS (
			UPDATE leases l SET `+releaseSet+` WHERE l.state <> 'released' AND `+history+` AND `+where+` RETURNING l.*
		)
		SELECT `+leaseColumns+` FROM r l`+leaseJoins+` ORDER BY l.addr`, args...))
}

// ReleaseAttachment releases the attachment's addresses; nothing held is not
// an error. The network must be a CNI network name (KindInvalid
// otherwise): the addresses a node holds for Cilium's agent have no
// attachment a caller can name.
func (s *Store) ReleaseAttachment(ctx context.Context, space, node string, a alloc.Attachment) ([]alloc.Lease, error) {
	if err := alloc.ValidateNetworkName("network", a.Network); err != nil {
		return nil, err
	}
	return s.released(ctx, reasonReleaseAttachment, `l.node_id = (SELECT id FROM nodes WHERE space = $3 AND name = $4)
		AND l.network = $7 AND l.container_id = $5 AND l.interface = $6`, space, node, a.ContainerID, a.Interface, a.Network)
}

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
