// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

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
	a := &allocation{s: s, req: r, sel: r.Selection(s.opts.DefaultPool), actor: historyActor(ctx)}
	out, err := a.run(ctx)
	s.topUps.note(out, err)
	if e := (*alloc.Error)(nil); errors.As(err, &e) && e.Kind == alloc.KindPoolExhausted && e.Pool != "" {
		s.explainCooling(ctx, r, e)
		s.notePending(ctx, r, e.Pool)
	}
	return out, err
}

// allocation is one Allocate call: the request, its pool selection, and how
// its current attempt leases. Its steps, in the order run takes them:
//
//   - fast: the common case (one family, a registered node, a block with
//     room) in two single statements, a lookup and a lease, the lease
//     sharing its commit with concurrent ones (see batcher);
//   - attempt: the general case in one transaction: lookup, then per family
//     a fresh address, else a cooled one, else "the node needs a block"
//     (answered as data, see blockNeed);
//   - carve: the blocks the node needs, in a short transaction of its own,
//     after which attempt runs again, carving in its own transaction when
//     concurrent allocations took the new block first.
type allocation struct {
	s   *Store
	req alloc.LeaseRequest
	sel alloc.Selection
	// actor is who asks, as the address history records it.
	actor string
	// carveInTx is set once carve ran: an attempt then waits for the
	// node's held blocks and carves in its own transaction when none has
	// room, instead of answering the blocks the node needs.
	carveInTx bool
}

// blockNeed is a block of family of pool that a node needs: the attempt
// found no fresh or cooled address for it.
//
// Carving inside the allocation's transaction would hold the pool's carve
// lock (its CIDR rows) until that transaction commits, so every allocation
// carving in the pool would queue behind the others' whole transactions. So
// the allocation carves in a short transaction of its own, which holds the
// lock for one insert and a commit, and allocates again. Concurrent
// allocations of the node may take the whole new block first (a hot node
// with small blocks); the second attempt then carves in its own
// transaction, which cannot lose its block. A block carved for an
// allocation that then fails is the node's all the same, and Rebalance
// returns it when it stays empty.
type blockNeed struct {
	pool   allocPool
	family alloc.Family
}

// run serves the allocation: fast when it can, else attempts, carving
// between them when the node needs blocks.
func (a *allocation) run(ctx context.Context) (alloc.Allocation, error) {
	if out, ok, err := a.fast(ctx); ok || err != nil {
		return out, err
	}
	out, needs, err := a.attempts(ctx)
	if err != nil || len(needs) == 0 {
		return out, err
	}
	if err := a.carve(ctx, needs); err != nil {
		return out, err
	}
	// The new blocks first, as concurrent allocations would: fast again,
	// then attempts that wait for held blocks and carve in their own
	// transaction, which need no block carved for them.
	a.carveInTx = true
	if out, ok, err := a.fast(ctx); ok || err != nil {
		return out, err
	}
	out, _, err = a.attempts(ctx)
	return out, err
}

// attempts runs attempt until it succeeds, answers the blocks the node
// needs, or fails on anything but a transient conflict.
func (a *allocation) attempts(ctx context.Context) (alloc.Allocation, []blockNeed, error) {
	var out alloc.Allocation
	var needs []blockNeed
	var err error
	try := newTries(ctx)
	try.room = true
	for try.again(err) {
		out, needs, err = a.attempt(ctx)
	}
	if w := (*waitForRoom)(nil); errors.As(err, &w) {
		// Concurrent allocations of the node took the room it had at
		// every attempt, and the pool carves no more for it.
		return out, nil, alloc.Exhausted(w.pool, w.family)
	}
	return out, needs, err
}

// fast serves the common case: one family, no workload identity, a
// registered node whose oldest block with room no other allocation holds.
// The lookup reads, in a statement of its own (shared with concurrent
// lookups: lookupShared), the node, the attachment and the pools;
// selection runs here; then one statement locks the block, leases from it
// and commits, alone or in a batch (see batcher). ok is false when the case
// is not the common one, or the block statement found no address: the
// allocation then takes the general path, which looks again in a
// transaction.
func (a *allocation) fast(ctx context.Context) (out alloc.Allocation, ok bool, err error) {
	r := a.req
	if r.Sticky != nil {
		return out, false, nil
	}
	lk, err := a.s.lookupShared(ctx, r, a.sel)
	if err != nil {
		return out, true, err
	}
	if lk.nodeID == 0 {
		// A node to register goes the general path, whose transaction
		// undoes the registration when the allocation fails.
		return out, false, nil
	}
	if lk.held {
		out, err = a.existing(ctx, a.s.db, lk)
		return out, true, err
	}
	choices, pools, err := a.choose(lk)
	if err != nil || len(choices) != 1 {
		return out, err != nil, err
	}
	c := choices[0]
	p := pools[c.Pool]
	if p.mode == alloc.ModeClusterPool || !p.carves() {
		// Those wait for a held block rather than skip it.
		return out, false, nil
	}
	lease := a.newLease(p, c, lk.generation)
	row := a.leaseRow(lk.nodeID, p, lease)
	ok, err = a.s.leaseAlone(ctx, leaseSkippingSQL, row, &lease)
	if retryable(err) {
		// A transient conflict (a deadlock with a node's forced
		// deletion, the node deleted meanwhile): the general path
		// retries.
		return out, false, nil
	}
	if err != nil || !ok {
		// No block with room, or the probe's snapshot did not show its
		// free address: the statement committed nothing (but a
		// generation number); the general path reuses a cooled address,
		// leases with a new snapshot, or carves.
		return out, false, err
	}
	return allocationOf(r.Node, r.Attachment, []alloc.Lease{lease}, true), true, nil
}

// attempt is one transaction of the general path. It answers the blocks
// the node needs when a family has no address and carveInTx is not set;
// it then commits nothing.
func (a *allocation) attempt(ctx context.Context) (alloc.Allocation, []blockNeed, error) {
	tx, err := a.s.beginPipelined(ctx, "")
	if err != nil {
		return alloc.Allocation{}, nil, err
	}
	defer tx.end(ctx)
	r := a.req
	lk, err := a.s.lookup(ctx, tx, r, a.sel)
	if err == nil && lk.nodeID == 0 {
		lk.nodeID, err = a.s.ensureNode(ctx, tx, r.Space, r.Node, a.s.now())
	}
	if err != nil {
		return alloc.Allocation{}, nil, err
	}
	if lk.held {
		out, err := a.existing(ctx, tx, lk)
		if err != nil {
			return out, nil, err
		}
		return out, nil, tx.commit(ctx)
	}
	choices, pools, err := a.choose(lk)
	if err != nil {
		return alloc.Allocation{}, nil, err
	}
	leases := make([]alloc.Lease, 0, len(choices))
	var needs []blockNeed
	for _, c := range choices {
		lease := a.newLease(pools[c.Pool], c, lk.generation)
		row := a.leaseRow(lk.nodeID, pools[c.Pool], lease)
		var need bool
		if r.Sticky != nil {
			need, err = a.leaseSticky(ctx, tx, row, &lease)
		} else {
			need, err = a.lease(ctx, tx, row, &lease)
		}
		if err != nil {
			return alloc.Allocation{}, nil, err
		}
		if need {
			// Every family's need, so that one carving transaction
			// makes all or none of the blocks.
			needs = append(needs, blockNeed{pool: row.pool, family: c.Family})
			continue
		}
		leases = append(leases, lease)
	}
	if len(needs) > 0 {
		return alloc.Allocation{}, needs, nil
	}
	return allocationOf(r.Node, r.Attachment, leases, true), nil, tx.commit(ctx)
}

// existing answers the leases the attachment holds, when the request is a
// retry of the one that made them.
func (a *allocation) existing(ctx context.Context, q querier, lk allocLookup) (alloc.Allocation, error) {
	held, err := attachmentLeases(ctx, q, lk.nodeID, a.req.Attachment)
	if err != nil {
		return alloc.Allocation{}, err
	}
	if err := sameRequest(held, a.req); err != nil {
		return alloc.Allocation{}, err
	}
	return allocationOf(a.req.Node, a.req.Attachment, held, false), nil
}

// choose runs selection over the pools the lookup read.
func (a *allocation) choose(lk allocLookup) ([]alloc.Choice, map[string]allocPool, error) {
	known := map[string]alloc.Candidate{}
	pools := map[string]allocPool{}
	var bySelector []alloc.Candidate
	for _, j := range lk.pools {
		p := j.pool()
		c, err := candidate(p)
		if err != nil {
			return nil, nil, err
		}
		pools[p.name] = p
		known[p.name] = c
		if c.PodSelector != nil || c.NamespaceSelector != nil {
			bySelector = append(bySelector, c)
		}
	}
	choices, err := alloc.Select(a.sel, known, bySelector)
	return choices, pools, err
}

// newLease is the lease of family c.Family the request asks for, before it
// has an address.
func (a *allocation) newLease(p allocPool, c alloc.Choice, gen int64) alloc.Lease {
	r, now := a.req, a.s.now()
	lease := alloc.Lease{Space: r.Space, Node: r.Node, Pool: p.name, Family: c.Family, Attachment: r.Attachment,
		Owner: r.Owner, State: alloc.StateActive, CreatedAt: now, SkipMasquerade: p.skipMasquerade, SelectedBy: c.By, Generation: gen}
	if r.Expire {
		lease.State, lease.ExpiresAt = alloc.StatePending, now.Add(a.s.opts.LeaseExpiry)
	}
	return lease
}

// leaseRow is what the lease statements write for lease on node nodeID.
func (a *allocation) leaseRow(nodeID int64, p allocPool, lease alloc.Lease) leaseRow {
	return leaseRow{node: nodeID, pool: p, lease: lease, actor: a.actor}
}

// lease leases a fresh or cooled address for row into lease. need is true
// when the node has neither and carveInTx is not set; with carveInTx it
// carves a block in tx instead.
func (a *allocation) lease(ctx context.Context, tx querier, row leaseRow, lease *alloc.Lease) (need bool, err error) {
	p := row.pool
	// Skip held blocks, and let carve carve one more, when the pool can
	// carve; else, and once carve ran, wait for a held block.
	leaseSQL := leaseSkippingSQL
	if a.carveInTx || p.mode == alloc.ModeClusterPool || !p.carves() {
		leaseSQL = leaseWaitingSQL
	}
	got, err := leaseWith(ctx, tx, leaseSQL, row.args(), lease)
	if err != nil || got.leased {
		return false, err
	}
	if got.block != 0 {
		// The block has room by its count, which the probe's snapshot
		// did not show: look again with a new one, holding the block.
		return false, leaseFromHeld(ctx, tx, row, got.block, lease)
	}
	// No fresh address: reuse one whose cooldown has ended.
	if got, err = leaseWith(ctx, tx, leaseCooledSQL, row.args(), lease); err != nil || got.leased {
		return false, err
	}
	if !a.carveInTx {
		return true, nil
	}
	// Holding the pool's carve lock from here to the commit, never wait
	// for a block row (an allocation holding one may wait for this lock):
	// carve without looking for one with room (leaseWaitingSQL just did),
	// and lease from the new block, this transaction's alone until it
	// commits. The node may have a block with room all the same, carved
	// or freed after this statement's snapshot: when carving it one more
	// would take the pool's last block (or the pool is full), carve
	// answers errNodeHasRoom, and attempts tries again in a new
	// transaction, which waits for that block.
	b, ok, err := carve(ctx, tx, carving{space: a.req.Space, node: row.node, pool: p, family: lease.Family, now: row.lease.CreatedAt}, carveFair)
	if errors.Is(err, errNodeHasRoom) {
		return false, &waitForRoom{pool: p.name, family: lease.Family}
	} else if err != nil {
		return false, err
	} else if !ok {
		return false, alloc.Exhausted(p.name, lease.Family)
	}
	a.s.carves.inline.Add(1)
	return false, leaseFromHeld(ctx, tx, row, b.id, lease)
}

// waitForRoom is lease's errNodeHasRoom: attempts tries again, and answers
// the pool's exhaustion when its attempts run out.
type waitForRoom struct {
	pool   string
	family alloc.Family
}

func (e *waitForRoom) Error() string {
	return fmt.Sprintf("pool %q, %s: %v", e.pool, e.family, errNodeHasRoom)
}

func (e *waitForRoom) Unwrap() error { return errNodeHasRoom }

// leaseSticky leases the address of row's family for a request with a
// workload identity: the address bound to it when alloc.ChooseSticky says
// so, else a fresh one (lease) that the identity is bound to instead.
func (a *allocation) leaseSticky(ctx context.Context, tx querier, row leaseRow, lease *alloc.Lease) (need bool, err error) {
	r, f := a.req, lease.Family
	id := r.Sticky.Identity
	retention := a.s.stickyRetention(r.Sticky)
	bound, err := boundAddress(ctx, tx, r.Space, id, f)
	if err != nil {
		return false, err
	}
	// The bound row is locked: a restricted request's StickyMoves is
	// compared with the row as it is now, whatever the API read before.
	choice, err := alloc.ChooseSticky(*r.Sticky, bound, r.Node, row.pool.name, f, a.s.now())
	if err != nil {
		return false, err
	}
	binding := &alloc.Binding{Identity: id, Retention: retention, Decided: true, Reused: choice.Reuse, Reason: choice.Reason,
		OperatorReason: choice.OperatorReason}
	if choice.Reuse {
		args := row.args()
		args["bound"], args["identity"], args["retention"] = bound.Addr, id, interval(retention)
		got, err := leaseWith(ctx, tx, leaseBoundSQL, args, lease)
		if err == nil && !got.leased { // the row is locked by boundAddress: it cannot have changed
			err = fmt.Errorf("identity %q: bound address %s vanished under its lock", id, bound.Addr)
		}
		lease.Sticky = binding
		return false, err
	}
	if bound != nil {
		// The identity moves: its old address cools and frees as any other.
		if _, err := tx.Exec(ctx, `UPDATE leases SET `+unbindSet+` WHERE space = @space AND addr = @addr`,
			namedArgs{"cooldown": interval(a.s.opts.Cooldown), "space": r.Space, "addr": bound.Addr}); err != nil {
			return false, err
		}
	}
	if need, err = a.lease(ctx, tx, row, lease); err != nil || need {
		return need, err
	}
	if _, err := tx.Exec(ctx, `UPDATE leases SET sticky_identity = $3, sticky_retention = $4 WHERE space = $1 AND addr = $2`,
		r.Space, lease.Addr, id, interval(retention)); err != nil {
		return false, err
	}
	lease.Sticky = binding
	return false, nil
}

// carve carves a block of each pool and family the node needs, all in one
// transaction, except where the node has a block with room again by then,
// or has one that others hold while the pool has one free block left (see
// carveFair). It registers the node when the store auto-registers: the
// attempt that registered it rolled back.
func (a *allocation) carve(ctx context.Context, needs []blockNeed) error {
	var err error
	for try := newTries(ctx); try.again(err); {
		err = a.carveOnce(ctx, needs)
	}
	return err
}

// carveOnce is one transaction of carve.
func (a *allocation) carveOnce(ctx context.Context, needs []blockNeed) error {
	s, space := a.s, a.req.Space
	tx, err := s.beginPipelined(ctx, "")
	if err != nil {
		return err
	}
	defer tx.end(ctx)
	now := s.now()
	nodeID, err := s.ensureNode(ctx, tx, space, a.req.Node, now)
	if err != nil {
		return err
	}
	var carved int64
	for _, n := range needs {
		c := carving{space: space, node: nodeID, pool: n.pool, family: n.family, now: now}
		b, ok, err := carve(ctx, tx, c, carveUnlessFreeRoom)
		if b.carved {
			carved++
		}
		if errors.Is(err, errNodeHasRoom) {
			// The pool's last free block is kept for another node:
			// the next attempt waits for the node's own.
			continue
		}
		if err == nil && !ok {
			err = alloc.Exhausted(n.pool.name, n.family)
		}
		if alloc.IsKind(err, alloc.KindPoolExhausted) || alloc.IsKind(err, alloc.KindNodeBlockLimit) {
			// The pool carves no more (for this node), but the node may
			// have a block with room that others hold: the next attempt
			// waits for it, and says why if there is none.
			var room bool
			if qerr := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+blocksWithRoomSQL+`)`, c.blockArgs()).Scan(&room); qerr != nil {
				return qerr
			} else if room {
				continue
			}
		}
		if err != nil {
			return err
		}
	}
	if err := tx.commit(ctx); err != nil {
		return err
	}
	s.carves.inline.Add(carved)
	return nil
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
		WHERE n.space = @space AND n.name = @node AND p.space = @space AND p.name = @pool AND b.family = @family
		  AND l.state = 'released' AND l.cooldown_until > @now`,
		namedArgs{"space": r.Space, "node": r.Node, "pool": e.Pool, "family": int16(e.Family), "now": now}).
		Scan(&cooling, &firstCooled, &bound, &firstUnbound)
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
