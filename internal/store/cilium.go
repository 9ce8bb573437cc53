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
	"time"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Cilium's crd mode: the service plays Cilium's operator, writing single
// addresses into each node's CiliumNode (spec.ipam.pool) and reading back
// which of them Pods use (status.ipam.used). The database holds every such
// address as a lease row of the node (see alloc/nodepool.go and migration
// 00011): reserved while no Pod uses it, active with the Pod as owner while
// one does, released (cooling) once given back. The methods here are the
// operator's only way to change these rows; every other path refuses to
// (ReleaseAddress, a reconcile or release by attachment cannot name them).
//
// Locks: each method locks the lease rows it changes, in address order as
// the rest of the store does, and ReserveNodeAddresses the node's blocks it
// fills in id order and, when it carves, the pool's CIDR rows of the
// family (as every carve); calls for different nodes share nothing else.

// heldColumns read a held address (HeldAddress) from leases l joined with
// pools p.
const heldColumns = `l.addr, l.family, p.name, l.block_cidr, l.state, l.owner_namespace, l.owner_name, l.owner_uid,
	l.cooldown_until, l.created_at, l.generation`

func scanHeld(r pgx.Row) (alloc.HeldAddress, error) {
	var a alloc.HeldAddress
	var fam int16
	var state string
	var cool *time.Time
	err := r.Scan(&a.Addr, &fam, &a.Pool, &a.Block, &state, &a.Owner.Namespace, &a.Owner.Name, &a.Owner.UID,
		&cool, &a.Since, &a.Generation)
	a.Family, a.State, a.Since = alloc.Family(fam), alloc.LeaseState(state), a.Since.UTC()
	if cool != nil {
		a.CoolUntil = cool.UTC()
	}
	return a, err
}

func collectHeld(rows pgx.Rows, err error) ([]alloc.HeldAddress, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.HeldAddress, error) { return scanHeld(r) })
}

// NodeAddresses answers the single addresses the node holds for Cilium's
// agent (reserved or active), by address. A node the store does not know
// holds none; a space it does not know is KindNotFound.
func (s *Store) NodeAddresses(ctx context.Context, space, node string) ([]alloc.HeldAddress, error) {
	held, err := collectHeld(s.db.Query(ctx, `SELECT `+heldColumns+` FROM nodes n
		JOIN leases l ON l.node_id = n.id JOIN pools p ON p.id = l.pool_id
		WHERE n.space = $1 AND n.name = $2 AND l.network = $3 AND l.state <> 'released'
		ORDER BY l.addr`, space, node, alloc.CiliumPoolNetwork))
	if err != nil {
		return nil, err
	}
	return held, s.emptyListOf(ctx, space, len(held))
}

// CiliumNodes names the nodes of the space that hold single addresses for
// Cilium's agent, by name: those whose CiliumNode the operator serves (or
// served, until ReleaseAllNodeAddresses).
func (s *Store) CiliumNodes(ctx context.Context, space string) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT n.name FROM nodes n WHERE n.space = $1 AND n.cilium_crd
		AND EXISTS (SELECT 1 FROM leases l WHERE l.node_id = n.id AND l.network = $2 AND l.state <> 'released')
		ORDER BY n.name`, space, alloc.CiliumPoolNetwork)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	return names, s.emptyListOf(ctx, space, len(names))
}

// ReserveNodeAddresses gives the node up to n more single addresses of
// family f, reserved (held by the node, used by no Pod), and answers them
// by address. In one transaction it registers the node, or updates its
// labels to nodeLabels (the Kubernetes Node's: they replace what it had;
// Kubernetes' label rules apply, not the API's bound on their number) and
// marks it as served in crd mode; selects its pool from those labels
// (alloc.SelectNodePool; defaultPool, or the store's default pool when
// empty, is the fallback); and takes the addresses as an allocation does:
// fresh ones of the node's blocks of that pool with room (oldest block
// first), then the node's released addresses whose cooldown has ended,
// then blocks it carves (the pool's block limits, cluster-pool and disabled
// pools, and the fair exhaustion of carve apply).
//
// When the pool (or the node's block limit) cannot give all n, the
// addresses it could give are committed and answered all the same, with
// the refusal: a KindPoolExhausted (Cilium's "allocator full") or
// KindNodeBlockLimit *alloc.Error. A pool that lacks f answers nothing and
// no error (the node registered all the same). Selection errors
// (KindPoolMatch for a node two pools select, KindNotFound for a missing
// default pool) change nothing. n <= 0 is a no-op. Whatever the error,
// the addresses answered with it are the node's (committed).
//
// Addresses the node already holds stay where they are: when its labels
// select another pool, only the new ones come from it.
func (s *Store) ReserveNodeAddresses(ctx context.Context, space, node string, nodeLabels map[string]string, defaultPool string,
	f alloc.Family, n int) ([]alloc.HeldAddress, error) {
	if n <= 0 {
		return nil, nil
	}
	if defaultPool == "" {
		defaultPool = s.opts.DefaultPool
	}
	for _, err := range []error{
		alloc.ValidateLabelName("space", space),
		alloc.ValidateNodeName("node", node),
		alloc.ValidateKubernetesLabels("labels", nodeLabels),
		alloc.ValidateLabelName("defaultPool", defaultPool),
	} {
		if err != nil {
			return nil, err
		}
	}
	if f != alloc.IPv4 && f != alloc.IPv6 {
		return nil, alloc.Invalid("family", "unknown family")
	}
	if n > alloc.MaxNodeReserve {
		return nil, alloc.Invalid("n", "asks for %d addresses; at most %d at once", n, alloc.MaxNodeReserve)
	}
	var added []alloc.HeldAddress
	var short error
	for attempt := 0; attempt < maxTxAttempts; attempt++ {
		if attempt > 0 && !retryWait(ctx, attempt) {
			return added, ctx.Err()
		}
		var got []alloc.HeldAddress
		err := s.inTx(ctx, func(tx querier) error {
			var err error
			got, short, err = s.reserveTx(ctx, tx, space, node, nodeLabels, defaultPool, f, n-len(added))
			return err
		})
		if err != nil {
			return added, err
		}
		added = append(added, got...)
		if w := (*waitForRoom)(nil); !errors.As(short, &w) || len(added) >= n {
			break
		}
	}
	if w := (*waitForRoom)(nil); errors.As(short, &w) {
		// The node's blocks with room were held or freed at every
		// attempt, and the pool keeps its last block for another node.
		short = alloc.Exhausted(w.pool, w.family)
	}
	slices.SortFunc(added, func(a, b alloc.HeldAddress) int { return a.Addr.Compare(b.Addr) })
	return added, short
}

// reserveTx is one transaction of ReserveNodeAddresses: it answers the
// addresses reserved and, when fewer than n, why (short); err rolls the
// transaction back.
func (s *Store) reserveTx(ctx context.Context, tx querier, space, node string, nodeLabels map[string]string, defaultPool string,
	f alloc.Family, n int) (got []alloc.HeldAddress, short, err error) {
	now := s.now()
	var nodeID int64
	var stored map[string]string
	var crd bool
	err = tx.QueryRow(ctx, `SELECT id, labels, cilium_crd FROM nodes WHERE space = $1 AND name = $2`, space, node).Scan(&nodeID, &stored, &crd)
	if errors.Is(err, pgx.ErrNoRows) {
		// A concurrent registration fails this insert on
		// nodes_space_name_key, which inTx retries.
		err = tx.QueryRow(ctx, `INSERT INTO nodes (space, name, labels, cilium_crd, created_at, updated_at)
			VALUES ($1, $2, $3, true, $4, $4) RETURNING id`, space, node, labelsOrEmpty(nodeLabels), now).Scan(&nodeID)
		if code, constraint := pgCode(err); code == codeForeignKey && constraint == constraintNodeSpace {
			return nil, nil, alloc.NotFound("space", "address space", space)
		}
		stored, crd = nodeLabels, true
	}
	if err != nil {
		return nil, nil, err
	}
	p, c, ok, err := s.nodePool(ctx, tx, space, node, nodeLabels, defaultPool, f)
	if err != nil {
		return nil, nil, err
	}
	if ok {
		got, short, err = s.reserveFrom(ctx, tx, space, nodeID, p, f, c.By, n, now)
		if err != nil {
			return nil, nil, err
		}
	}
	// Last, so the node's row is locked after its blocks, in the order
	// DeleteNode and the allocation path lock them.
	if !crd || !maps.Equal(stored, nodeLabels) {
		if _, err := tx.Exec(ctx, `UPDATE nodes SET labels = $2, cilium_crd = true, updated_at = $3 WHERE id = $1`,
			nodeID, labelsOrEmpty(nodeLabels), now); err != nil {
			return nil, nil, err
		}
	}
	return got, short, nil
}

// nodePool selects the pool of the node's addresses of family f (see
// alloc.SelectNodePool); ok is false when that pool lacks f.
func (s *Store) nodePool(ctx context.Context, q querier, space, node string, nodeLabels map[string]string, defaultPool string,
	f alloc.Family) (allocPool, alloc.Choice, bool, error) {
	rows, err := q.Query(ctx, `SELECT `+allocPoolJSONSQL+`, p.node_selector FROM pools p
		WHERE p.space = $1 AND (p.name = $2 OR p.node_selector IS NOT NULL)`, space, defaultPool)
	if err != nil {
		return allocPool{}, alloc.Choice{}, false, err
	}
	pools := map[string]allocPool{}
	var cands []alloc.NodePoolCandidate
	var j allocPoolJSON
	var sel *metav1.LabelSelector
	if _, err := pgx.ForEachRow(rows, []any{&j, &sel}, func() error {
		p := j.pool()
		ns, err := alloc.LabelSelector("nodeSelector", sel)
		if err != nil {
			return fmt.Errorf("pool %q: %w", p.name, err) // edited by hand: the API refuses it
		}
		pools[p.name] = p
		cands = append(cands, alloc.NodePoolCandidate{Name: p.name, Families: p.families(), NodeSelector: ns})
		j, sel = allocPoolJSON{}, nil
		return nil
	}); err != nil {
		return allocPool{}, alloc.Choice{}, false, err
	}
	c, ok, err := alloc.SelectNodePool(node, nodeLabels, f, cands, defaultPool)
	return pools[c.Pool], c, ok, err
}

// reserveFrom reserves up to n addresses of family f of pool p for the
// node, in tx: see ReserveNodeAddresses for the order. short says why it
// reserved fewer: the pool's (or the node's block limit's) refusal, or a
// *waitForRoom when the pool keeps its last block from a node that has room
// in a block this transaction could not take (a new one can).
func (s *Store) reserveFrom(ctx context.Context, tx querier, space string, nodeID int64, p allocPool, f alloc.Family,
	by alloc.SelectedBy, n int, now time.Time) (got []alloc.HeldAddress, short, err error) {
	args := func(want int, block int64) namedArgs {
		return namedArgs{"node": nodeID, "pool": p.id, "family": int16(f), "space": space, "now": now,
			"network": alloc.CiliumPoolNetwork, "want": want, "block": block, "iface": alloc.CiliumPoolInterface,
			"selectedBy": string(by)}
	}
	held := func(cidr netip.Prefix, addr netip.Addr, gen int64) alloc.HeldAddress {
		return alloc.HeldAddress{Addr: addr, Family: f, Pool: p.name, Block: cidr, State: alloc.StateReserved, Since: now, Generation: gen}
	}
	// Fresh addresses of the node's blocks with room, waiting for each in
	// id order; a block taken is never waited for again (from), so the
	// transaction's block locks only ascend.
	var from int64
	for len(got) < n {
		block, added, err := s.reserveInBlock(ctx, tx, reserveOldestSQL, args(n-len(got), from), held)
		if err != nil || block == 0 {
			if err != nil {
				return got, nil, err
			}
			break
		}
		if len(added) == 0 {
			// Room by its count that the statement's snapshot did not
			// show (see leaseSkippingSQL): look again with a new one.
			if _, added, err = s.reserveInBlock(ctx, tx, reserveInBlockSQL, args(n-len(got), block), held); err != nil {
				return got, nil, err
			}
			if len(added) == 0 {
				return got, nil, fmt.Errorf("block %d has room by its count but no free address", block)
			}
		}
		got, from = append(got, added...), block
	}
	// Released addresses of the node's blocks whose cooldown has ended.
	if len(got) < n {
		rows, err := tx.Query(ctx, reserveCooledSQL, args(n-len(got), 0)) // @block unused
		if err != nil {
			return got, nil, err
		}
		var addr netip.Addr
		var cidr netip.Prefix
		var gen int64
		if _, err := pgx.ForEachRow(rows, []any{&addr, &cidr, &gen}, func() error {
			got = append(got, held(cidr, addr, gen))
			return nil
		}); err != nil {
			return got, nil, err
		}
	}
	// New blocks. Holding the pool's carve lock from the first carve on,
	// this never waits for a block row (an allocation holding one may wait
	// for the lock): it fills the blocks it carves, which are its own.
	for len(got) < n {
		b, ok, err := carve(ctx, tx, carving{space: space, node: nodeID, pool: p, family: f, now: now}, carveFair)
		switch {
		case errors.Is(err, errNodeHasRoom):
			return got, &waitForRoom{pool: p.name, family: f}, nil
		case alloc.IsKind(err, alloc.KindPoolExhausted) || alloc.IsKind(err, alloc.KindNodeBlockLimit):
			return got, err, nil
		case err != nil:
			return got, nil, err
		case !ok:
			return got, alloc.Exhausted(p.name, f), nil
		}
		_, added, err := s.reserveInBlock(ctx, tx, reserveInBlockSQL, args(n-len(got), b.id), held)
		if err != nil {
			return got, nil, err
		}
		if len(added) == 0 {
			return got, nil, fmt.Errorf("block %s carved with no free address", b.cidr)
		}
		got = append(got, added...)
	}
	return got, nil, nil
}

// reserveInBlock runs reserveOldestSQL or reserveInBlockSQL: it answers
// the block (0 when none had room) and the addresses reserved in it.
func (s *Store) reserveInBlock(ctx context.Context, tx querier, sql string, args namedArgs,
	held func(netip.Prefix, netip.Addr, int64) alloc.HeldAddress) (int64, []alloc.HeldAddress, error) {
	rows, err := tx.Query(ctx, sql, args)
	if err != nil {
		return 0, nil, err
	}
	var block int64
	var out []alloc.HeldAddress
	var id int64
	var cidr netip.Prefix
	var addr *netip.Addr
	var gen *int64
	_, err = pgx.ForEachRow(rows, []any{&id, &cidr, &addr, &gen}, func() error {
		block = id
		if addr != nil {
			out = append(out, held(cidr, *addr, *gen))
		}
		return nil
	})
	return block, out, err
}

// reserveOldestSQL reserves, in the oldest block of node @node, pool @pool
// and family @family whose lease rows leave room, numbered @block or
// above, which it locks (waiting for it), up to @want fresh addresses
// (reserveFromBlockSQL). Its other parameters: @space, @now, @network,
// @iface and the selection rule @selectedBy. It answers one row per
// address reserved (block id, block CIDR, address, generation), one row
// with a NULL address when it reserved none, and no row when no block had
// room.
var reserveOldestSQL = `WITH b AS (
		SELECT ` + reserveBlockColumns + ` FROM blocks
		WHERE node_id = @node AND pool_id = @pool AND family = @family AND allocated < capacity AND id >= @block
		ORDER BY id LIMIT 1 FOR NO KEY UPDATE
	)` + reserveFromBlockSQL

// reserveInBlockSQL is reserveOldestSQL in block @block, which the
// transaction holds (locked by an earlier statement, or carved).
var reserveInBlockSQL = `WITH b AS (
		SELECT ` + reserveBlockColumns + ` FROM blocks WHERE id = @block
	)` + reserveFromBlockSQL

const reserveBlockColumns = leaseBlockColumns + `, capacity - allocated AS room`

// reserveFromBlockSQL is leaseFromBlockSQL for up to @want addresses at
// once, inserted as reserved rows of the node's crd attachment (network
// @network, the address's text as container ID, interface @iface): the
// first free offsets
// from the block's round-robin cursor on, which moves past the last one
// probed (see freeOffsetsSQL).
var reserveFromBlockSQL = `, cand AS (
		SELECT b.id, b.cidr, b.base, c.o, c.k FROM b, ` + freeOffsetsSQL("@space", "least(@want::bigint, b.room)") + ` c
	), ins AS (
		INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, network, container_id, interface,
			owner_namespace, owner_name, owner_uid, created_at, selected_by)
		SELECT @space, base + o, id, cidr, @node, @pool, @family, 'reserved', @network, host(base + o), @iface, '', '', '',
			@now, @selectedBy FROM cand
		ON CONFLICT (space, addr) DO NOTHING
		RETURNING addr, generation
	), last AS (
		SELECT o FROM cand ORDER BY k DESC LIMIT 1
	), upd AS (
		UPDATE blocks SET allocated = allocated + (SELECT count(*) FROM ins),
			next_offset = CASE WHEN last.o + 1 > blocks.last_offset THEN blocks.first_offset ELSE last.o + 1 END
		FROM b, last WHERE blocks.id = b.id
	)
	SELECT b.id, b.cidr, ins.addr, ins.generation FROM b LEFT JOIN ins ON true`

// reserveCooledSQL reserves again, in place, up to @want released
// addresses of the node's blocks (pool @pool, family @family) whose
// cooldown has ended, those that ended longest ago first; SKIP LOCKED
// leaves rows others are taking. Its parameters are reserveOldestSQL's
// but @block. It answers the address, its block CIDR and generation.
const reserveCooledSQL = `UPDATE leases l SET state = 'reserved', network = @network, container_id = host(l.addr), interface = @iface,
		owner_namespace = '', owner_name = '', owner_uid = '', created_at = @now, expires_at = NULL, selected_by = @selectedBy,
		generation = nextval('lease_generations'), sticky_identity = NULL, sticky_retention = NULL,
		confirmed_at = NULL, released_at = NULL, cooldown_until = NULL
	WHERE (l.space, l.addr) IN (
		SELECT c.space, c.addr FROM blocks cb JOIN leases c ON c.block_id = cb.id
		WHERE cb.node_id = @node AND cb.pool_id = @pool AND cb.family = @family AND c.space = @space
		  AND c.state = 'released' AND c.cooldown_until <= @now
		ORDER BY c.cooldown_until LIMIT @want FOR UPDATE OF c SKIP LOCKED)
	RETURNING l.addr, l.block_cidr, l.generation`

// SyncNodeUse records which of the node's addresses Pods use, as the
// agent reports them (status.ipam.used and ipv6-used, owners mapped by
// alloc.CiliumOwner), in one transaction: a reserved address in used
// becomes active with its owner; an active one not in used becomes
// reserved again, owner cleared, and stays with the node for the
// cooldown (ReleaseNodeAddresses refuses it until then); an active one
// with another owner changes hands (a release and a lease in the
// history). Every change takes a new generation. Addresses in used that
// the node does not hold are answered in Unknown and written nowhere:
// nothing is ever taken from another node.
//
// It locks only the rows it changes, in address order, and a call that
// changes nothing writes nothing. A node the store does not know holds
// nothing (every address is Unknown). Owners must pass the lease owner
// validation (KindInvalid naming used[ADDR].owner...).
func (s *Store) SyncNodeUse(ctx context.Context, space, node string, used map[netip.Addr]alloc.Owner) (alloc.NodeUseChange, error) {
	if err := alloc.ValidateLabelName("space", space); err != nil {
		return alloc.NodeUseChange{}, err
	}
	if err := alloc.ValidateNodeName("node", node); err != nil {
		return alloc.NodeUseChange{}, err
	}
	addrs := slices.SortedFunc(maps.Keys(used), netip.Addr.Compare)
	for _, a := range addrs {
		if !a.IsValid() || a.Zone() != "" {
			return alloc.NodeUseChange{}, alloc.Invalid("used", "%q is not an IP address without a zone", a)
		}
		if err := alloc.ValidateOwner(fmt.Sprintf("used[%s].owner.", a), used[a]); err != nil {
			return alloc.NodeUseChange{}, err
		}
	}
	var out alloc.NodeUseChange
	err := s.inTx(ctx, func(tx querier) error {
		out = alloc.NodeUseChange{}
		now := s.now()
		var nodeID int64
		err := tx.QueryRow(ctx, `SELECT id FROM nodes WHERE space = $1 AND name = $2`, space, node).Scan(&nodeID)
		if errors.Is(err, pgx.ErrNoRows) {
			if ok, err := s.spaceExists(ctx, tx, space); err != nil || !ok {
				return cmpErr(err, alloc.NotFound("space", "address space", space))
			}
			out.Unknown = addrs
			return nil
		} else if err != nil {
			return err
		}
		held, err := collectHeld(tx.Query(ctx, `SELECT `+heldColumns+` FROM leases l JOIN pools p ON p.id = l.pool_id
			WHERE l.node_id = $1 AND l.network = $2 AND l.state <> 'released'`, nodeID, alloc.CiliumPoolNetwork))
		if err != nil {
			return err
		}
		changing := useChanges(held, used)
		holds := map[netip.Addr]bool{}
		for _, h := range held {
			holds[h.Addr] = !slices.Contains(changing, h.Addr)
		}
		if len(changing) > 0 {
			// Lock what changes and decide again on the rows as they
			// are now (READ COMMITTED reads a locked row's newest
			// version): one released meanwhile is gone.
			locked, err := collectHeld(tx.Query(ctx, `SELECT `+heldColumns+` FROM leases l JOIN pools p ON p.id = l.pool_id
				WHERE l.space = $1 AND l.addr = ANY ($2) AND l.node_id = $3 AND l.network = $4 AND l.state <> 'released'
				ORDER BY l.addr FOR UPDATE OF l`, space, changing, nodeID, alloc.CiliumPoolNetwork))
			if err != nil {
				return err
			}
			for _, h := range locked {
				holds[h.Addr] = true
			}
			if err := s.applyUse(ctx, tx, space, locked, used, now, &out); err != nil {
				return err
			}
		}
		for _, a := range addrs {
			if !holds[a] {
				out.Unknown = append(out.Unknown, a)
			}
		}
		slices.SortFunc(out.Unknown, netip.Addr.Compare)
		return nil
	})
	return out, err
}

// cmpErr answers err, or alt when err is nil.
func cmpErr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}

// useChanges answers the addresses of held whose state or owner used
// changes, by address.
func useChanges(held []alloc.HeldAddress, used map[netip.Addr]alloc.Owner) []netip.Addr {
	var out []netip.Addr
	for _, h := range held {
		owner, inUse := used[h.Addr]
		switch {
		case h.State == alloc.StateReserved && inUse,
			h.State == alloc.StateActive && !inUse,
			h.State == alloc.StateActive && owner != h.Owner:
			out = append(out, h.Addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// applyUse makes the changes used asks of the locked rows held, and
// records them in out.
func (s *Store) applyUse(ctx context.Context, tx querier, space string, held []alloc.HeldAddress, used map[netip.Addr]alloc.Owner,
	now time.Time, out *alloc.NodeUseChange) error {
	var take, free []netip.Addr
	var ns, names, uids []string
	byAddr := map[netip.Addr]alloc.HeldAddress{}
	for _, h := range held {
		owner, inUse := used[h.Addr]
		switch {
		case inUse && (h.State == alloc.StateReserved || owner != h.Owner):
			take, ns, names, uids = append(take, h.Addr), append(ns, owner.Namespace), append(names, owner.Name), append(uids, owner.UID)
		case !inUse && h.State == alloc.StateActive:
			free = append(free, h.Addr)
		default:
			continue
		}
		byAddr[h.Addr] = h
	}
	actor := historyActor(ctx)
	if len(take) > 0 {
		rows, err := tx.Query(ctx, `UPDATE leases l SET state = 'active', owner_namespace = u.ns, owner_name = u.name,
				owner_uid = u.uid, created_at = @at, cooldown_until = NULL, generation = nextval('lease_generations')
			FROM unnest(@addrs::inet[], @nss::text[], @names::text[], @uids::text[]) AS u (addr, ns, name, uid)
			WHERE l.space = @space AND l.addr = u.addr AND `+historyContextSQL+`
			RETURNING l.addr, l.generation`, namedArgs{"space": space, "at": now, "addrs": take, "nss": ns, "names": names,
			"uids": uids, "actor": actor, "reason": reasonCiliumUsed})
		if err != nil {
			return err
		}
		var addr netip.Addr
		var gen int64
		if _, err := pgx.ForEachRow(rows, []any{&addr, &gen}, func() error {
			h := byAddr[addr]
			was := h.State
			h.State, h.Owner, h.CoolUntil, h.Since, h.Generation = alloc.StateActive, used[addr], time.Time{}, now, gen
			if was == alloc.StateReserved {
				out.Used = append(out.Used, h)
			} else {
				out.OwnerChanged = append(out.OwnerChanged, h)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	if len(free) > 0 {
		cool := now.Add(s.opts.Cooldown)
		rows, err := tx.Query(ctx, `UPDATE leases l SET state = 'reserved', owner_namespace = '', owner_name = '', owner_uid = '',
				created_at = @at, cooldown_until = @until, generation = nextval('lease_generations')
			WHERE l.space = @space AND l.addr = ANY (@addrs) AND `+historyContextSQL+`
			RETURNING l.addr, l.generation`, namedArgs{"space": space, "at": now, "until": cool, "addrs": free,
			"actor": actor, "reason": reasonCiliumUnused})
		if err != nil {
			return err
		}
		var addr netip.Addr
		var gen int64
		if _, err := pgx.ForEachRow(rows, []any{&addr, &gen}, func() error {
			h := byAddr[addr]
			h.State, h.Owner, h.CoolUntil, h.Since, h.Generation = alloc.StateReserved, alloc.Owner{}, cool, now, gen
			out.Unused = append(out.Unused, h)
			return nil
		}); err != nil {
			return err
		}
	}
	for _, l := range []*[]alloc.HeldAddress{&out.Used, &out.Unused, &out.OwnerChanged} {
		slices.SortFunc(*l, func(a, b alloc.HeldAddress) int { return a.Addr.Compare(b.Addr) })
	}
	return nil
}

// ReleaseNodeAddresses gives reserved addresses of the node back to their
// pools, at the end of Cilium's release handshake, atomically: each goes
// to released and cools down as any released address does. It refuses
// (KindInUse naming the address, addresses[i]) when any of them is used by
// a Pod or still in the cooldown a Pod's use left it, and then releases
// none. Addresses the node does not hold (another node's, free, or
// released already: a retry) are skipped. It answers the addresses it
// released, by address.
func (s *Store) ReleaseNodeAddresses(ctx context.Context, space, node string, addrs []netip.Addr) ([]netip.Addr, error) {
	if len(addrs) == 0 {
		return nil, nil
	}
	if len(addrs) > alloc.MaxNodeReserve {
		return nil, alloc.Invalid("addresses", "lists %d addresses; at most %d at once", len(addrs), alloc.MaxNodeReserve)
	}
	index := map[netip.Addr]int{}
	for i, a := range addrs {
		if !a.IsValid() || a.Zone() != "" {
			return nil, alloc.Invalid(fmt.Sprintf("addresses[%d]", i), "%q is not an IP address without a zone", a)
		}
		if _, dup := index[a]; !dup {
			index[a] = i
		}
	}
	var released []netip.Addr
	err := s.inTxWhy(ctx, reasonCiliumReleased, func(tx querier) error {
		released = nil
		now := s.now()
		held, err := collectHeld(tx.Query(ctx, `SELECT `+heldColumns+` FROM nodes n
			JOIN leases l ON l.node_id = n.id JOIN pools p ON p.id = l.pool_id
			WHERE n.space = $1 AND n.name = $2 AND l.space = $1 AND l.addr = ANY ($3) AND l.network = $4 AND l.state <> 'released'
			ORDER BY l.addr FOR UPDATE OF l`, space, node, slices.Collect(maps.Keys(index)), alloc.CiliumPoolNetwork))
		if err != nil {
			return err
		}
		for _, h := range held {
			field := fmt.Sprintf("addresses[%d]", index[h.Addr])
			switch {
			case h.State != alloc.StateReserved:
				return &alloc.Error{Kind: alloc.KindInUse, Field: field,
					Detail: fmt.Sprintf("address %s of node %s is used by %s/%s", h.Addr, node, h.Owner.Namespace, h.Owner.Name)}
			case !h.Releasable(now):
				return &alloc.Error{Kind: alloc.KindInUse, Field: field,
					Detail: fmt.Sprintf("address %s of node %s was used by a Pod until %s; it stays with the node until %s",
						h.Addr, node, h.Since.Format(time.RFC3339), h.CoolUntil.Format(time.RFC3339))}
			}
			released = append(released, h.Addr)
		}
		if len(released) == 0 {
			return nil
		}
		_, err = tx.Exec(ctx, `UPDATE leases SET state = 'released', released_at = $2, cooldown_until = $3
			WHERE space = $1 AND addr = ANY ($4)`, space, now, now.Add(s.opts.Cooldown), released)
		return err
	})
	if err != nil {
		return nil, err
	}
	if len(released) == 0 {
		if ok, err := s.spaceExists(ctx, s.db, space); err != nil || !ok {
			return nil, cmpErr(err, alloc.NotFound("space", "address space", space))
		}
	}
	return released, nil
}

// ReleaseAllNodeAddresses gives every address the node holds for Cilium's
// agent back to its pool, used or not: its CiliumNode (or Node) was
// deleted. They cool down as any released address does; the history
// records each release with reason cilium-node-deleted. It answers how
// many it released; a node the store does not know holds none.
func (s *Store) ReleaseAllNodeAddresses(ctx context.Context, space, node string) (int, error) {
	var n int
	err := s.inTxWhy(ctx, reasonCiliumNodeGone, func(tx querier) error {
		now := s.now()
		tag, err := tx.Exec(ctx, `UPDATE leases l SET state = 'released', released_at = @now, cooldown_until = @until
			WHERE (l.space, l.addr) IN (
				SELECT x.space, x.addr FROM nodes n JOIN leases x ON x.node_id = n.id
				WHERE n.space = @space AND n.name = @node AND x.network = @network AND x.state <> 'released'
				ORDER BY x.addr FOR UPDATE OF x)`, namedArgs{"space": space, "node": node, "now": now,
			"until": now.Add(s.opts.Cooldown), "network": alloc.CiliumPoolNetwork})
		n = int(tag.RowsAffected())
		return err
	})
	if err == nil && n == 0 {
		if ok, serr := s.spaceExists(ctx, s.db, space); serr != nil || !ok {
			err = cmpErr(serr, alloc.NotFound("space", "address space", space))
		}
	}
	return n, err
}
