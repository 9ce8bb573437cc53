// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The address history (table address_events, migration 00004; the lease
// triggers' functions as of 00006) is written by triggers on leases,
// blocks and pools, in the transaction of each change. The store only
// tells them who asks and why, in transaction-local settings, folded into
// statements it sends anyway:
//   - every inTx transaction sets them with its BEGIN (pipelinedTx);
//   - the single-statement changes (release, confirm, expiry) call
//     ipam_history_context from their WHERE clause (historyContextSQL).
// A change that sets neither is still recorded, with the database user as
// its actor.

// DefaultHistoryRetention is how long history events are kept.
const DefaultHistoryRetention = 30 * 24 * time.Hour

// Reasons the store records for changes it makes.
const (
	reasonReleaseAttachment = "attachment-released"
	reasonReleaseAddress    = "address-released"
	reasonReconcile         = "reconcile"
	reasonExpired           = "expired" // the triggers record kind "expire" for it
	reasonPurged            = "purged"
	reasonNodeDeleted       = "node-deleted"
	reasonBlockReleased     = "block-released"
	reasonRebalance         = "rebalance"
	reasonRegistration      = "node-registration"
	// Cilium's crd mode (cilium.go): an address appeared in (or left) a
	// node's status.ipam.used, went back to its pool at the end of the
	// release handshake, or with its node (CiliumNode or Node deleted).
	reasonCiliumUsed     = "cilium-used"
	reasonCiliumUnused   = "cilium-unused"
	reasonCiliumReleased = "cilium-released"
	reasonCiliumNodeGone = "cilium-node-deleted"
)

// historyActor is the actor of ctx as the history records it. PostgreSQL
// text cannot hold NUL, which a certificate's CN might, so NULs are dropped
// rather than failing the change.
func historyActor(ctx context.Context) string {
	return strings.ReplaceAll(alloc.ActorFrom(ctx), "\x00", "")
}

// historyContextSQL is a WHERE-clause term that sets the history's actor
// (@actor), reason (@reason) and clock (@at) for a single-statement change.
// As an uncorrelated subquery it runs once, before any row changes; the
// history triggers run after the statement.
const historyContextSQL = `(SELECT ipam_history_context(@actor, @reason, @at))`

const eventColumns = `id, at, kind, space, family, address, block, pool, node, state,
	owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation`

func scanEvent(r pgx.Row) (alloc.Event, error) {
	var (
		e                                alloc.Event
		kind                             string
		fam                              *int16
		addr                             *netip.Addr
		block                            *netip.Prefix
		pool, node, state, ns, name, uid *string
		network, container, iface        *string
		generation                       *int64
	)
	err := r.Scan(&e.ID, &e.At, &kind, &e.Space, &fam, &addr, &block, &pool, &node, &state,
		&ns, &name, &uid, &network, &container, &iface, &e.Actor, &e.Reason, &generation)
	if err != nil {
		return e, err
	}
	e.At = e.At.UTC()
	e.Kind = alloc.EventKind(kind)
	if fam != nil {
		e.Family = alloc.Family(*fam)
	}
	if addr != nil {
		e.Address = *addr
	}
	if block != nil {
		e.Block = *block
	}
	if generation != nil {
		e.Generation = *generation
	}
	for _, x := range []struct {
		src *string
		dst *string
	}{{pool, &e.Pool}, {node, &e.Node}, {state, &e.State}, {ns, &e.Owner.Namespace}, {name, &e.Owner.Name},
		{uid, &e.Owner.UID}, {network, &e.Attachment.Network}, {container, &e.Attachment.ContainerID}, {iface, &e.Attachment.Interface}} {
		if x.src != nil {
			*x.dst = *x.src
		}
	}
	return e, nil
}

func collectEvents(rows pgx.Rows, err error) ([]alloc.Event, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.Event, error) { return scanEvent(r) })
}

// eventCursor is the key of the last event of a page.
type eventCursor struct {
	at time.Time
	id int64
}

func (c eventCursor) String() string {
	return c.at.UTC().Format(time.RFC3339Nano) + "|" + strconv.FormatInt(c.id, 10)
}

// parseEventCursor reads a continue token of the history list sc.
func (s *Store) parseEventCursor(ctx context.Context, sc pageScope, tok string) (eventCursor, bool, error) {
	after, err := s.decodeContinue(ctx, sc, tok)
	if err != nil || after == "" {
		return eventCursor{}, false, err
	}
	bad := alloc.Invalid("continue", "not a continue token from this API")
	at, id, ok := strings.Cut(after, "|")
	if !ok {
		return eventCursor{}, false, bad
	}
	var c eventCursor
	if c.at, err = time.Parse(time.RFC3339Nano, at); err != nil {
		return eventCursor{}, false, bad
	}
	if c.id, err = strconv.ParseInt(id, 10, 64); err != nil || c.id < 0 {
		return eventCursor{}, false, bad
	}
	return c, true, nil
}

// timeBound is t, or an infinity when t is zero.
func timeBound(t time.Time, inf pgtype.InfinityModifier) pgtype.Timestamptz {
	if t.IsZero() {
		return pgtype.Timestamptz{InfinityModifier: inf, Valid: true}
	}
	return pgtype.Timestamptz{Time: t, Valid: true}
}

// History pages through the events of one address, owner or node of a
// space in [f.From, f.To), oldest first. Each subject is read through its
// own index; the continue token is the (at, id) of the page's last event.
// An unknown space is not found; a subject without events is an empty list
// (its history may have been pruned, or be yet to come).
func (s *Store) History(ctx context.Context, f alloc.HistoryFilter, page alloc.Page) ([]alloc.Event, string, error) {
	if err := f.Validate(); err != nil {
		return nil, "", err
	}
	if err := page.Validate(); err != nil {
		return nil, "", err
	}
	sc := historyScope(f)
	c, ok, err := s.parseEventCursor(ctx, sc, page.Continue)
	if err != nil {
		return nil, "", err
	}
	// (at, id) > (lower, 0) is at >= lower: ids start at 1.
	lower := timeBound(f.From, pgtype.NegativeInfinity)
	var afterID int64
	if ok {
		lower, afterID = pgtype.Timestamptz{Time: c.at, Valid: true}, c.id
	}
	upper := timeBound(f.To, pgtype.Infinity)
	var where string
	args := namedArgs{"space": f.Space, "lower": lower, "afterID": afterID, "upper": upper, "limit": page.Limit + 1}
	switch {
	case f.Address.IsValid():
		where = `address = @address`
		args["address"] = f.Address
	case f.OwnerName != "":
		where = `owner_namespace = @ns AND owner_name = @name`
		args["ns"], args["name"] = f.OwnerNamespace, f.OwnerName
	default:
		where = `node = @node`
		args["node"] = f.Node
	}
	items, err := collectEvents(s.db.Query(ctx, `SELECT `+eventColumns+` FROM address_events
		WHERE space = @space AND `+where+` AND (at, id) > (@lower, @afterID) AND at < @upper
		ORDER BY at, id LIMIT @limit`, args))
	if err != nil {
		return nil, "", err
	}
	if len(items) == 0 {
		if ok, err := s.spaceExists(ctx, s.db, f.Space); err != nil {
			return nil, "", err
		} else if !ok {
			return nil, "", alloc.NotFound("space", "address space", f.Space)
		}
	}
	return pageOf(ctx, s, sc, items, page.Limit, func(e alloc.Event) string { return eventCursor{e.At, e.ID}.String() })
}

// historyScope is the history list of f's subject and time range.
func historyScope(f alloc.HistoryFilter) pageScope {
	var addr, from, to string
	if f.Address.IsValid() {
		addr = f.Address.String()
	}
	if !f.From.IsZero() {
		from = f.From.UTC().Format(time.RFC3339Nano)
	}
	if !f.To.IsZero() {
		to = f.To.UTC().Format(time.RFC3339Nano)
	}
	return scopeOf(pageHistory, f.Space, addr, f.OwnerNamespace, f.OwnerName, f.Node, from, to)
}

// maxHoldingEvents bounds the events read for one holding: a lease, its
// confirmation and its end, with room for oddities.
const maxHoldingEvents = 16

// HolderAt answers who held addr at instant at: the holding whose lease
// event is the last one at or before at and that had not ended by then
// (a holding is [lease, end)). It answers a KindNotFound error when nobody
// held the address at that instant (free, cooling, or before its recorded
// history). It reads one snapshot.
func (s *Store) HolderAt(ctx context.Context, space string, addr netip.Addr, at time.Time) (alloc.Holding, error) {
	var h alloc.Holding
	err := pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		last, err := scanEvent(tx.QueryRow(ctx, `SELECT `+eventColumns+` FROM address_events
			WHERE space = $1 AND address = $2 AND at <= $3 ORDER BY at DESC, id DESC LIMIT 1`, space, addr, at))
		// A Pod's release that leaves the address with its node (crd
		// mode) starts the node's holding.
		toNode := err == nil && last.Kind == alloc.EventRelease && last.State == string(alloc.StateReserved)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && last.Kind.Ends() && !toNode) {
			return s.notFoundIn(ctx, tx, space, "at", "holder of address "+addr.String()+" at", at.UTC().Format(time.RFC3339Nano))
		} else if err != nil {
			return err
		}
		lease := last
		if last.Kind != alloc.EventLease && !toNode {
			lease, err = scanEvent(tx.QueryRow(ctx, `SELECT `+eventColumns+` FROM address_events
				WHERE space = $1 AND address = $2 AND (at, id) <= ($3, $4) AND kind = 'lease'
				ORDER BY at DESC, id DESC LIMIT 1`, space, addr, last.At, last.ID))
			if errors.Is(err, pgx.ErrNoRows) {
				// The lease event was pruned: the holding's start is unknown.
				return s.notFoundIn(ctx, tx, space, "at", "holder of address "+addr.String()+" at", at.UTC().Format(time.RFC3339Nano))
			} else if err != nil {
				return err
			}
		}
		events, err := collectEvents(tx.Query(ctx, `SELECT `+eventColumns+` FROM address_events
			WHERE space = @space AND address = @address AND (at, id) >= (@at, @id) ORDER BY at, id LIMIT @limit`,
			namedArgs{"space": space, "address": addr, "at": lease.At, "id": lease.ID, "limit": maxHoldingEvents}))
		if err != nil {
			return err
		}
		// The node's own holding (state reserved) ends when a Pod leases
		// the address; it has no owner.
		byNode := lease.State == string(alloc.StateReserved)
		h = alloc.Holding{Space: space, Address: addr, Node: lease.Node, Pool: lease.Pool, Owner: lease.Owner,
			Attachment: lease.Attachment, From: lease.At}
		if byNode {
			h.Owner = alloc.Owner{}
		}
		for i, e := range events {
			if i > 0 && e.Kind == alloc.EventLease {
				if byNode {
					h.To = e.At
				}
				break // a later holding (for another than the node, its end was not recorded)
			}
			h.Events = append(h.Events, e)
			if i > 0 && e.Kind.Ends() {
				h.To = e.At
				break
			}
		}
		return nil
	})
	return h, err
}

// PruneHistory deletes history events older than the retention, in
// batches of gcBatch (one short transaction each), and answers how many.
// A zero retention keeps everything. Replicas may prune at once: SKIP
// LOCKED gives each its own rows.
func (s *Store) PruneHistory(ctx context.Context) (int64, error) {
	if s.opts.HistoryRetention == 0 {
		return 0, nil
	}
	cutoff := s.now().Add(-s.opts.HistoryRetention)
	var total int64
	for {
		// No key but the row's location: the table has no primary key
		// (see the migration); address_events_at finds the old rows.
		tag, err := s.db.Exec(ctx, `DELETE FROM address_events WHERE ctid = ANY (ARRAY(
			SELECT ctid FROM address_events WHERE at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`, cutoff, gcBatch)
		if err != nil {
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < gcBatch {
			return total, nil
		}
	}
}
