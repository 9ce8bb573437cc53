// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go4.org/netipx"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// VIPs (migration 00019). One owner's request is one transaction that
// locks the owner's row first, so two requests of one owner take turns
// and never give it two addresses of a family. Addresses are unique per
// space in vips, which holds whatever the pools' overlaps.
//
// Locks, in this order: the owner's row; the VIP pool a new address is
// searched in (FOR NO KEY UPDATE: the search for the first free address of
// a pool takes turns, as concurrent searches would find the same one), or
// the pool of a named address (FOR SHARE: several named addresses of one
// pool are given at once); the address's row when it is shared or
// released. Pools are taken oldest first, as the conflict settlement
// updates them, and a pool edit waits for the addresses being given from
// it, so no address is given from blocks an edit just removed.

// Constraints of the VIP tables the store tells apart.
const (
	// Two owners raced for one named address; the retry finds it taken.
	constraintVIPAddr = "vips_space_addr"
	// A VIP pool that still has addresses out was deleted.
	constraintVIPPool = "vips_lb_pool_id_fkey"
)

// vipRequestJSON is a request as vip_owners.request keeps it.
type vipRequestJSON struct {
	Labels     map[string]string `json:"labels,omitempty"`
	Families   []alloc.Family    `json:"families,omitempty"`
	Addresses  []netip.Addr      `json:"addresses,omitempty"`
	RequireAll bool              `json:"requireAll,omitempty"`
	Sharing    alloc.VIPSharing  `json:"sharing"`
	Source     string            `json:"source,omitempty"`
}

func (j vipRequestJSON) request(space string, o alloc.VIPOwner) alloc.VIPRequest {
	return alloc.VIPRequest{Space: space, Owner: o, Labels: j.Labels, Families: j.Families, Addresses: j.Addresses,
		RequireAll: j.RequireAll, Sharing: j.Sharing, Source: j.Source}
}

// heldVIP is an address an owner holds, as the store reads it.
type heldVIP struct {
	id         int64
	sharingKey string
	// marked is the holding's stranded mark as stored (vip_holders).
	marked bool
	alloc.VIP
}

// lbOffer is a VIP pool as allocation reads it.
type lbOffer struct {
	id int64
	alloc.LBPoolOffer
}

// AssignVIPs gives the owner what r asks for and answers what it holds.
// Addresses it already holds stay while they still serve the request, and
// stay when a pool edit stranded them (reported in the answer) unless
// r.Reassign; others are released. An owner whose request cannot be
// satisfied keeps what it got and hears why (Reason, Message): that is an
// answer, not an error.
func (s *Store) AssignVIPs(ctx context.Context, r alloc.VIPRequest) (alloc.VIPAssignment, error) {
	if err := r.Validate(); err != nil {
		return alloc.VIPAssignment{}, err
	}
	var out alloc.VIPAssignment
	err := s.inTx(ctx, func(tx querier) error {
		var err error
		out, err = s.assignVIPs(ctx, tx, r)
		return err
	})
	return out, err
}

func (s *Store) assignVIPs(ctx context.Context, tx querier, r alloc.VIPRequest) (alloc.VIPAssignment, error) {
	now := s.now()
	req, err := json.Marshal(vipRequestJSON{Labels: r.Labels, Families: r.Families, Addresses: r.Addresses, RequireAll: r.RequireAll,
		Sharing: r.Sharing, Source: r.Source})
	if err != nil {
		return alloc.VIPAssignment{}, err
	}
	var (
		ownerID, generation int64
		prevJSON            []byte // the request before this one; nil for a new owner
	)
	// The subquery of RETURNING reads the statement's snapshot: the row
	// as it was before the update.
	err = tx.QueryRow(ctx, `INSERT INTO vip_owners (space, namespace, name, request, satisfied, reason, created_at, updated_at)
		VALUES (@space, @ns, @name, @request, false, '', @now, @now)
		ON CONFLICT (space, namespace, name) DO UPDATE SET request = EXCLUDED.request, updated_at = EXCLUDED.updated_at
		RETURNING id, generation,
			(SELECT o.request FROM vip_owners o WHERE o.space = @space AND o.namespace = @ns AND o.name = @name)`,
		namedArgs{"space": r.Space, "ns": r.Owner.Namespace, "name": r.Owner.Name, "request": req,
			"now": now}).Scan(&ownerID, &generation, &prevJSON)
	if code, _ := pgCode(err); code == codeForeignKey {
		return alloc.VIPAssignment{}, alloc.NotFound("space", "address space", r.Space)
	} else if err != nil {
		return alloc.VIPAssignment{}, err
	}
	pools, err := lbOffersOf(ctx, tx, r.Space)
	if err != nil {
		return alloc.VIPAssignment{}, err
	}
	held, err := heldVIPs(ctx, tx, ownerID, true)
	if err != nil {
		return alloc.VIPAssignment{}, err
	}
	a := vipAssigner{s: s, tx: tx, r: r, ownerID: ownerID, pools: pools, now: now}
	if prevJSON != nil {
		var prev vipRequestJSON
		if err := json.Unmarshal(prevJSON, &prev); err != nil {
			return alloc.VIPAssignment{}, fmt.Errorf("owner %s: its stored request: %w", r.Owner, err)
		}
		a.prevLabels = prev.Labels
		if a.prevLabels == nil {
			a.prevLabels = map[string]string{}
		}
	}
	if err := a.keepOrRelease(ctx, held); err != nil {
		return alloc.VIPAssignment{}, err
	}
	if err := a.fill(ctx); err != nil {
		return alloc.VIPAssignment{}, err
	}
	if held, err = heldVIPs(ctx, tx, ownerID, false); err != nil {
		return alloc.VIPAssignment{}, err
	}
	out := alloc.VIPAssignment{Owner: r.Owner, Request: r, Generation: generation}
	for _, h := range held {
		h.Stranded = stranded(pools, r, h.Addr)
		if err := markStranded(ctx, tx, h.id, ownerID, h.marked, h.Stranded); err != nil {
			return alloc.VIPAssignment{}, err
		}
		out.Addresses = append(out.Addresses, h.VIP)
	}
	out.Satisfied, out.Reason, out.Message = r.Satisfaction(out.Addresses)
	if !out.Satisfied && out.Reason == "" {
		out.Reason, out.Message = a.reason, a.message
	}
	_, err = tx.Exec(ctx, `UPDATE vip_owners SET satisfied = $2, reason = $3, message = $4 WHERE id = $1`,
		ownerID, out.Satisfied, out.Reason, out.Message)
	return out, err
}

// markStranded stores a holding's stranded mark when it changed; the
// history's trigger records the change.
func markStranded(ctx context.Context, tx querier, vipID, ownerID int64, was, is bool) error {
	if was == is {
		return nil
	}
	_, err := tx.Exec(ctx, `UPDATE vip_holders SET stranded = $3 WHERE vip_id = $1 AND owner_id = $2`, vipID, ownerID, is)
	return err
}

// refreshStranded marks, after a change of the space's VIP pools or CIDR
// groups, every holding no pool selecting its owner offers any more, and
// lifts the mark of those offered again; an owner with a newly stranded
// address is no longer satisfied (lbipam_services_unsatisfied counts it
// at once, not at its next request). Pool edits are rare next to
// requests, so reading every holding of the space then is cheap enough.
func refreshStranded(ctx context.Context, tx querier, space string) error {
	pools, err := lbOffersOf(ctx, tx, space)
	if err != nil {
		return err
	}
	rows, err := tx.Query(ctx, `SELECT h.vip_id, h.owner_id, h.stranded, v.addr, o.namespace, o.name, o.request
		FROM vip_holders h JOIN vips v ON v.id = h.vip_id JOIN vip_owners o ON o.id = h.owner_id
		WHERE v.space = $1 ORDER BY h.owner_id, v.addr`, space)
	if err != nil {
		return err
	}
	type holding struct {
		vipID, ownerID int64
		was            bool
		addr           netip.Addr
		owner          alloc.VIPOwner
		req            vipRequestJSON
	}
	hs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (holding, error) {
		var h holding
		return h, r.Scan(&h.vipID, &h.ownerID, &h.was, &h.addr, &h.owner.Namespace, &h.owner.Name, &h.req)
	})
	if err != nil {
		return err
	}
	for _, h := range hs {
		is := stranded(pools, h.req.request(space, h.owner), h.addr)
		if err := markStranded(ctx, tx, h.vipID, h.ownerID, h.was, is); err != nil {
			return err
		}
		if is && !h.was {
			if _, err := tx.Exec(ctx, `UPDATE vip_owners SET satisfied = false, reason = $2, message = $3 WHERE id = $1`, h.ownerID,
				alloc.ReasonStranded, fmt.Sprintf("%s no longer offered to this owner by an enabled pool; kept until reassigned", h.addr)); err != nil {
				return err
			}
		}
	}
	return nil
}

// stranded reports whether no pool that selects the owner offers a.
func stranded(pools []lbOffer, r alloc.VIPRequest, a netip.Addr) bool {
	return !slices.ContainsFunc(pools, func(p lbOffer) bool { return p.Keeps(r.Owner, r.Labels, a) })
}

// vipAssigner is one owner's request in its transaction.
type vipAssigner struct {
	s       *Store
	tx      querier
	r       alloc.VIPRequest
	ownerID int64
	pools   []lbOffer
	now     time.Time
	// held are the addresses kept, by address.
	held map[netip.Addr]alloc.Family
	// prevLabels are the owner's labels in its previous request; nil for
	// a new owner.
	prevLabels map[string]string
	// reason and message are the first refusal met.
	reason, message string
}

func (a *vipAssigner) refuse(reason, format string, args ...any) {
	if a.reason == "" {
		a.reason, a.message = reason, fmt.Sprintf(format, args...)
	}
}

// keepOrRelease keeps each held address the request still wants (a named
// one, or the first of a wanted family) whose sharing still holds, and
// releases the others, and the stranded ones on Reassign.
func (a *vipAssigner) keepOrRelease(ctx context.Context, held []heldVIP) error {
	a.held = map[netip.Addr]alloc.Family{}
	families := map[alloc.Family]bool{}
	for _, h := range held {
		want := false
		switch {
		case len(a.r.Addresses) > 0:
			want = slices.Contains(a.r.Addresses, h.Addr)
		default:
			want = slices.Contains(a.r.Families, h.Family) && !families[h.Family]
		}
		if want && a.r.Reassign && stranded(a.pools, a.r, h.Addr) {
			want = false
		}
		if want && a.movedByRelabel(h) {
			want = false
		}
		if want && h.Holders > 1 {
			ok, _, err := a.shareable(ctx, h.id)
			if err != nil {
				return err
			}
			want = ok && h.sharingKey == a.r.Sharing.Key
		}
		if !want {
			if err := a.release(ctx, h.id); err != nil {
				return err
			}
			continue
		}
		if h.Holders == 1 && h.sharingKey != a.r.Sharing.Key {
			if _, err := a.tx.Exec(ctx, `UPDATE vips SET sharing_key = $2 WHERE id = $1`, h.id, a.r.Sharing.Key); err != nil {
				return err
			}
		}
		a.held[h.Addr], families[h.Family] = h.Family, true
	}
	return nil
}

// movedByRelabel reports whether the owner's own edit took h out of every
// pool that kept it: no pool keeps it for the owner's labels now, one did
// for its previous labels, and no pool edit had stranded it before. Such
// an address is given up and a new one taken where the owner now
// belongs, as Cilium moves a relabelled Service (TestRemoveServiceLabel);
// an address stranded by an edit of the pools stays (cilium#40358).
func (a *vipAssigner) movedByRelabel(h heldVIP) bool {
	if a.prevLabels == nil || h.marked || !stranded(a.pools, a.r, h.Addr) {
		return false
	}
	before := a.r
	before.Labels = a.prevLabels
	return !stranded(a.pools, before, h.Addr)
}

// release drops the owner's holding of the address, and the address with
// its last holder.
func (a *vipAssigner) release(ctx context.Context, vipID int64) error {
	return releaseHolding(ctx, a.tx, vipID, a.ownerID)
}

// Two statements: the history's trigger on the holding, run at the end of
// its statement, still finds the address to name.
func releaseHolding(ctx context.Context, tx querier, vipID, ownerID int64) error {
	if _, err := tx.Exec(ctx, `DELETE FROM vip_holders WHERE vip_id = $1 AND owner_id = $2`, vipID, ownerID); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `DELETE FROM vips v WHERE v.id = $1 AND NOT EXISTS (SELECT 1 FROM vip_holders x WHERE x.vip_id = $1)`, vipID)
	return err
}

// shareable locks the address and reports whether the owner's terms are
// compatible with every other holder's, and why not.
func (a *vipAssigner) shareable(ctx context.Context, vipID int64) (bool, string, error) {
	rows, err := a.tx.Query(ctx, `SELECT o.namespace, o.name, o.request FROM vip_holders h JOIN vip_owners o ON o.id = h.owner_id
		WHERE h.vip_id = $1 AND h.owner_id <> $2 ORDER BY o.namespace, o.name`, vipID, a.ownerID)
	if err != nil {
		return false, "", err
	}
	type other struct {
		owner alloc.VIPOwner
		req   vipRequestJSON
	}
	others, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (other, error) {
		var o other
		return o, r.Scan(&o.owner.Namespace, &o.owner.Name, &o.req)
	})
	if err != nil {
		return false, "", err
	}
	for _, o := range others {
		if ok, why := a.r.Sharing.CompatibleWith(a.r.Owner, o.req.Sharing, o.owner); !ok {
			return false, fmt.Sprintf("%s: %s", o.owner, why), nil
		}
	}
	return true, "", nil
}

// fill gives what the request still lacks. Owners of one sharing key take
// turns on the key (a lock on its hash, for the transaction): two of them
// arriving at once would otherwise both find nothing to share and take an
// address each.
func (a *vipAssigner) fill(ctx context.Context) error {
	if a.r.Sharing.Key != "" {
		if _, err := a.tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('ipam.vip-sharing:' || $1 || '/' || $2, 0))`,
			a.r.Space, a.r.Sharing.Key); err != nil {
			return err
		}
	}
	if len(a.r.Addresses) > 0 {
		for _, addr := range a.r.Addresses {
			if _, ok := a.held[addr]; ok {
				continue
			}
			if err := a.named(ctx, addr); err != nil {
				return err
			}
		}
		return nil
	}
	// Each family on its own: one shared still leaves the others to
	// share or take.
	for _, f := range a.r.Families {
		if slices.Contains(slices.Collect(maps.Values(a.held)), f) {
			continue
		}
		adopted, err := a.adopt(ctx, f)
		if err != nil {
			return err
		}
		if adopted {
			continue
		}
		shared, err := a.share(ctx, f)
		if err != nil {
			return err
		}
		if shared {
			continue
		}
		if err := a.fresh(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// adopt takes the first address of family f of the request's Adopt that
// the owner can have as if it named it; one it cannot have is passed
// over, its refusal unsaid.
func (a *vipAssigner) adopt(ctx context.Context, f alloc.Family) (bool, error) {
	for _, addr := range a.r.Adopt {
		if alloc.FamilyOf(addr) != f {
			continue
		}
		reason, message := a.reason, a.message
		err := a.named(ctx, addr)
		a.reason, a.message = reason, message
		if err != nil {
			return false, err
		}
		if _, ok := a.held[addr]; ok {
			return true, nil
		}
	}
	return false, nil
}

// named gives the owner the address it names, from the oldest pool that
// gives the owner addresses and offers it, or shares it when it is held
// with the owner's sharing key and compatible terms.
func (a *vipAssigner) named(ctx context.Context, addr netip.Addr) error {
	// The refusals are Cilium's (satisfySpecificIPRequests): a disabled
	// or conflicting pool is as good as none, one whose selector passes
	// the owner over is a selector mismatch, and an address the pool
	// keeps out (its first or last under allowFirstLastIPs: No, a
	// reserved CIDR group's) counts as allocated already, as Cilium marks
	// them.
	var pool *lbOffer
	inRange, keptOut := "", ""
	for i := range a.pools {
		p := &a.pools[i]
		if p.Spec.Disabled || p.Conflicting ||
			!slices.ContainsFunc(p.Spec.Blocks, func(b alloc.LBBlock) bool { return b.Range().Contains(addr) }) {
			continue
		}
		inRange = p.Name
		if !p.Gives(a.r.Owner, a.r.Labels) {
			continue
		}
		if !p.Spec.Offers(addr) {
			keptOut = p.Name
			continue
		}
		pool = p
		break
	}
	switch {
	case pool != nil:
	case keptOut != "":
		a.refuse(alloc.ReasonAlreadyAllocated, "The address %s is kept out of pool %q (its first or last address, or a reserved CIDR group's)", addr, keptOut)
		return nil
	case inRange != "":
		a.refuse(alloc.ReasonPoolSelectorMismatch, "The pool %q with a block containing %s does not select this owner", inRange, addr)
		return nil
	default:
		a.refuse(alloc.ReasonNoPool, "No enabled pool exists with a block containing %s", addr)
		return nil
	}
	var one int
	if err := a.tx.QueryRow(ctx, `SELECT 1 FROM lb_pools WHERE id = $1 FOR SHARE`, pool.id).Scan(&one); err != nil {
		return err
	}
	var vipID int64
	var key string
	err := a.tx.QueryRow(ctx, `SELECT id, sharing_key FROM vips WHERE space = $1 AND addr = $2 FOR NO KEY UPDATE`, a.r.Space, addr).Scan(&vipID, &key)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return a.insert(ctx, pool.id, addr)
	case err != nil:
		return err
	case a.r.Sharing.Key == "":
		a.refuse(alloc.ReasonAlreadyAllocated, "The address %s is already held by another owner", addr)
		return nil
	case key != a.r.Sharing.Key:
		a.refuse(alloc.ReasonIncompatibleSharing, "The address %s is held by an owner it cannot share with: different sharing key", addr)
		return nil
	}
	ok, why, err := a.shareable(ctx, vipID)
	if err != nil {
		return err
	}
	if !ok {
		a.refuse(alloc.ReasonIncompatibleSharing, "The address %s is held by an owner it cannot share with: %s", addr, why)
		return nil
	}
	return a.hold(ctx, vipID, addr)
}

// share joins the oldest address of family f held with the owner's
// sharing key whose holders' terms are compatible and that a pool still
// offers the owner.
func (a *vipAssigner) share(ctx context.Context, f alloc.Family) (bool, error) {
	if a.r.Sharing.Key == "" {
		return false, nil
	}
	rows, err := a.tx.Query(ctx, `SELECT id, addr FROM vips WHERE space = $1 AND sharing_key = $2 AND family(addr) = $3 ORDER BY id`,
		a.r.Space, a.r.Sharing.Key, int(f))
	if err != nil {
		return false, err
	}
	type cand struct {
		id   int64
		addr netip.Addr
	}
	cands, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (cand, error) {
		var c cand
		return c, r.Scan(&c.id, &c.addr)
	})
	if err != nil {
		return false, err
	}
	for _, c := range cands {
		if _, ok := a.held[c.addr]; ok || stranded(a.pools, a.r, c.addr) {
			continue
		}
		var id int64
		if err := a.tx.QueryRow(ctx, `SELECT id FROM vips WHERE id = $1 FOR NO KEY UPDATE`, c.id).Scan(&id); errors.Is(err, pgx.ErrNoRows) {
			continue // released since it was read
		} else if err != nil {
			return false, err
		}
		ok, _, err := a.shareable(ctx, c.id)
		if err != nil {
			return false, err
		}
		if ok {
			return true, a.hold(ctx, c.id, c.addr)
		}
	}
	return false, nil
}

// fresh gives a free address of family f from the oldest pool that gives
// the owner one and has one free.
func (a *vipAssigner) fresh(ctx context.Context, f alloc.Family) error {
	matched := false
	for _, p := range a.pools {
		if !p.Gives(a.r.Owner, a.r.Labels) || !slices.ContainsFunc(p.Spec.Blocks, func(b alloc.LBBlock) bool { return alloc.FamilyOf(b.Range().From()) == f }) {
			continue
		}
		matched = true
		// The pool as it is once locked: an edit may have committed since
		// it was read.
		var one int
		if err := a.tx.QueryRow(ctx, `SELECT 1 FROM lb_pools WHERE id = $1 FOR NO KEY UPDATE`, p.id).Scan(&one); errors.Is(err, pgx.ErrNoRows) {
			continue
		} else if err != nil {
			return err
		}
		fresh, err := lbOfferByID(ctx, a.tx, p.id)
		if err != nil {
			return err
		}
		if !fresh.Gives(a.r.Owner, a.r.Labels) {
			continue
		}
		for _, rg := range fresh.Spec.Ranges() {
			if alloc.FamilyOf(rg.From()) != f {
				continue
			}
			addr, ok, err := firstFreeVIP(ctx, a.tx, a.r.Space, rg)
			if err != nil {
				return err
			}
			if ok {
				return a.insert(ctx, p.id, addr)
			}
		}
	}
	if matched {
		a.refuse(alloc.ReasonOutOfIPs, "All enabled VIP pools that give this owner %s addresses ran out of them", f)
	} else {
		a.refuse(alloc.ReasonNoPool, "There are no enabled VIP pools with %s blocks that give this owner addresses", f)
	}
	return nil
}

// firstFreeVIP finds the lowest address of rg no VIP holds: rg's first,
// or the first address after a held one that is not held itself, found
// on the (space, addr) index in as many steps as addresses are held
// below it.
func firstFreeVIP(ctx context.Context, tx querier, space string, rg netipx.IPRange) (netip.Addr, bool, error) {
	var a netip.Addr
	err := tx.QueryRow(ctx, `SELECT x FROM (
			SELECT $2::inet AS x, 0 AS ord WHERE NOT EXISTS (SELECT 1 FROM vips WHERE space = $1 AND addr = $2::inet)
			UNION ALL
			(SELECT v.addr + 1, 1 FROM vips v
			 WHERE v.space = $1 AND v.addr >= $2::inet AND v.addr < $3::inet
			   AND NOT EXISTS (SELECT 1 FROM vips w WHERE w.space = $1 AND w.addr = v.addr + 1)
			 ORDER BY v.addr LIMIT 1)
		) f ORDER BY ord LIMIT 1`, space, rg.From(), rg.To()).Scan(&a)
	if errors.Is(err, pgx.ErrNoRows) {
		return netip.Addr{}, false, nil
	}
	return a, err == nil, err
}

// insert gives a new address from pool poolID.
func (a *vipAssigner) insert(ctx context.Context, poolID int64, addr netip.Addr) error {
	var vipID int64
	err := a.tx.QueryRow(ctx, `INSERT INTO vips (space, addr, lb_pool_id, sharing_key, created_at)
		VALUES (@space, @addr, @pool, @sharingKey, @now) RETURNING id`,
		namedArgs{"space": a.r.Space, "addr": addr, "pool": poolID, "sharingKey": a.r.Sharing.Key, "now": a.now}).Scan(&vipID)
	if err != nil {
		return err
	}
	return a.hold(ctx, vipID, addr)
}

func (a *vipAssigner) hold(ctx context.Context, vipID int64, addr netip.Addr) error {
	if _, err := a.tx.Exec(ctx, `INSERT INTO vip_holders (vip_id, owner_id, created_at) VALUES ($1, $2, $3)`, vipID, a.ownerID, a.now); err != nil {
		return err
	}
	a.held[addr] = alloc.FamilyOf(addr)
	return nil
}

// heldVIPs reads what the owner holds by address, locking the addresses
// when lock is set.
func heldVIPs(ctx context.Context, tx querier, ownerID int64, lock bool) ([]heldVIP, error) {
	sql := `SELECT v.id, v.addr, p.name, v.generation, v.sharing_key,
			(SELECT count(*) FROM vip_holders x WHERE x.vip_id = v.id), h.stranded
		FROM vip_holders h JOIN vips v ON v.id = h.vip_id JOIN lb_pools p ON p.id = v.lb_pool_id
		WHERE h.owner_id = $1 ORDER BY v.addr`
	if lock {
		sql += ` FOR NO KEY UPDATE OF v`
	}
	rows, err := tx.Query(ctx, sql, ownerID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (heldVIP, error) {
		var h heldVIP
		err := r.Scan(&h.id, &h.Addr, &h.Pool, &h.Generation, &h.sharingKey, &h.Holders, &h.marked)
		h.Family = alloc.FamilyOf(h.Addr)
		return h, err
	})
}

// lbOffersOf reads the space's VIP pools oldest first.
func lbOffersOf(ctx context.Context, q querier, space string) ([]lbOffer, error) {
	rows, err := q.Query(ctx, `SELECT `+lbPoolColumns+` FROM lb_pools p WHERE p.space = $1 ORDER BY p.created_at, p.id`, space)
	if err != nil {
		return nil, err
	}
	prs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lbPoolRow, error) { return scanLBPool(r) })
	out := make([]lbOffer, len(prs))
	for i, p := range prs {
		out[i] = lbOffer{id: p.id, LBPoolOffer: alloc.LBPoolOffer{Name: p.Name, Spec: p.Spec, Conflicting: p.Status.Conflicting()}}
	}
	return out, err
}

func lbOfferByID(ctx context.Context, q querier, id int64) (lbOffer, error) {
	p, err := scanLBPool(q.QueryRow(ctx, `SELECT `+lbPoolColumns+` FROM lb_pools p WHERE p.id = $1`, id))
	return lbOffer{id: p.id, LBPoolOffer: alloc.LBPoolOffer{Name: p.Name, Spec: p.Spec, Conflicting: p.Status.Conflicting()}}, err
}

// GetVIPs answers what the owner holds and its last request's outcome,
// with stranded addresses as the pools are now.
func (s *Store) GetVIPs(ctx context.Context, space string, o alloc.VIPOwner) (alloc.VIPAssignment, error) {
	var out alloc.VIPAssignment
	err := s.inTx(ctx, func(tx querier) error {
		var id int64
		var req vipRequestJSON
		err := tx.QueryRow(ctx, `SELECT id, request, satisfied, reason, message, generation FROM vip_owners WHERE space = $1 AND namespace = $2 AND name = $3`,
			space, o.Namespace, o.Name).Scan(&id, &req, &out.Satisfied, &out.Reason, &out.Message, &out.Generation)
		if errors.Is(err, pgx.ErrNoRows) {
			return s.notFoundIn(ctx, tx, space, "owner", "VIP owner", o.String())
		} else if err != nil {
			return err
		}
		out.Owner = o
		out.Request = req.request(space, o)
		return s.fillHeld(ctx, tx, id, &out)
	})
	return out, err
}

// fillHeld reads the owner's addresses into out, marking the stranded ones
// as the pools are now; a newly stranded address makes out unsatisfied.
func (s *Store) fillHeld(ctx context.Context, tx querier, ownerID int64, out *alloc.VIPAssignment) error {
	held, err := heldVIPs(ctx, tx, ownerID, false)
	if err != nil {
		return err
	}
	pools, err := lbOffersOf(ctx, tx, out.Request.Space)
	if err != nil {
		return err
	}
	for _, h := range held {
		h.Stranded = stranded(pools, out.Request, h.Addr)
		out.Addresses = append(out.Addresses, h.VIP)
	}
	if ok, reason, msg := out.Request.Satisfaction(out.Addresses); !ok && reason == alloc.ReasonStranded {
		out.Satisfied, out.Reason, out.Message = false, reason, msg
	}
	return nil
}

// ReleaseVIPs releases everything the owner holds and forgets it; an
// owner that holds nothing is no error (a retry). A generation other than
// 0 that is not the owner's is refused (KindStaleGeneration), releasing
// nothing.
func (s *Store) ReleaseVIPs(ctx context.Context, space string, o alloc.VIPOwner, generation int64) error {
	return s.inTx(ctx, func(tx querier) error {
		var id, have int64
		err := tx.QueryRow(ctx, `SELECT id, generation FROM vip_owners WHERE space = $1 AND namespace = $2 AND name = $3 FOR UPDATE`,
			space, o.Namespace, o.Name).Scan(&id, &have)
		if err == nil && generation != 0 && generation != have {
			return alloc.StaleGeneration("VIP owner "+o.String(), generation, have, "held")
		}
		if errors.Is(err, pgx.ErrNoRows) {
			ok, err := s.spaceExists(ctx, tx, space)
			if err == nil && !ok {
				err = alloc.NotFound("space", "address space", space)
			}
			return err
		} else if err != nil {
			return err
		}
		held, err := heldVIPs(ctx, tx, id, true)
		if err != nil {
			return err
		}
		for _, h := range held {
			if err := releaseHolding(ctx, tx, h.id, id); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `DELETE FROM vip_owners WHERE id = $1`, id)
		return err
	})
}

// ListVIPOwners pages through the space's owners by namespace and name.
func (s *Store) ListVIPOwners(ctx context.Context, space string, page alloc.Page) ([]alloc.VIPAssignment, string, error) {
	sc := scopeOf(pageVIPOwners, space)
	after, err := s.decodeContinue(ctx, sc, page.Continue)
	if err != nil {
		return nil, "", err
	}
	var out []alloc.VIPAssignment
	var next string
	err = s.inTx(ctx, func(tx querier) error {
		rows, err := tx.Query(ctx, `SELECT id, namespace, name, request, satisfied, reason, message, generation FROM vip_owners
			WHERE space = $1 AND namespace || '/' || name > $2 ORDER BY namespace || '/' || name LIMIT $3`, space, after, page.Limit+1)
		if err != nil {
			return err
		}
		type ownerRow struct {
			id int64
			a  alloc.VIPAssignment
		}
		owners, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ownerRow, error) {
			var o ownerRow
			var req vipRequestJSON
			err := r.Scan(&o.id, &o.a.Owner.Namespace, &o.a.Owner.Name, &req, &o.a.Satisfied, &o.a.Reason, &o.a.Message, &o.a.Generation)
			o.a.Request = req.request(space, o.a.Owner)
			return o, err
		})
		if err != nil {
			return err
		}
		if err := s.emptyListOf(ctx, space, len(owners)); err != nil {
			return err
		}
		owners, next, err = pageOf(ctx, s, sc, owners, page.Limit, func(o ownerRow) string { return o.a.Owner.String() })
		if err != nil {
			return err
		}
		out = make([]alloc.VIPAssignment, len(owners))
		for i := range owners {
			if err := s.fillHeld(ctx, tx, owners[i].id, &owners[i].a); err != nil {
				return err
			}
			out[i] = owners[i].a
		}
		return nil
	})
	return out, next, err
}
