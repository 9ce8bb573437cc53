// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Reasons of a reserve handover in the address history.
const (
	reasonFromReserve = "from-reserve"
	// reasonSuperseded: the attachment's own leases, released because it
	// took over a reserve address instead (an ADD whose answer never
	// reached the plugin, which then served the Pod from its reserve).
	reasonSuperseded = "superseded-by-reserve"
)

// handOver is Allocate for a request with FromReserve: in one transaction
// it moves the active leases of the reserve attachment (same node and
// network) of generation FromReserve.Generation to r.Attachment, with r's
// owner, a new generation, and the state r asks for (pending with Expire).
// The addresses never leave the node: nobody else can lease them in
// between. Leases r.Attachment held already are released first (the
// plugin served the Pod from its reserve, so they are stale).
//
// A retry (the reserve attachment no longer holds that generation, and
// r.Attachment holds leases) answers them with Created=false, when the
// owner matches. A reserve attachment holding another generation is a
// KindStaleGeneration error; holding nothing, with nothing at r.Attachment
// either, KindNotFound. The pools r names must be the reserve leases'
// pools (KindLeaseConflict otherwise); selection rules are not evaluated.
func (s *Store) handOver(ctx context.Context, r alloc.LeaseRequest) (alloc.Allocation, error) {
	var out alloc.Allocation
	var err error
	for try := newTries(ctx); try.again(err); {
		out, err = s.handOverOnce(ctx, r)
	}
	return out, err
}

// handOverOnce is one transaction of handOver.
func (s *Store) handOverOnce(ctx context.Context, r alloc.LeaseRequest) (alloc.Allocation, error) {
	tx, err := s.beginPipelined(ctx, reasonFromReserve)
	if err != nil {
		return alloc.Allocation{}, err
	}
	defer tx.end(ctx)
	out, err := s.handOverIn(ctx, tx, r)
	if err != nil {
		return out, err
	}
	return out, tx.commit(ctx)
}

// handOverIn does handOver's work in tx.
func (s *Store) handOverIn(ctx context.Context, tx querier, r alloc.LeaseRequest) (alloc.Allocation, error) {
	h := r.FromReserve
	slot := alloc.Attachment{Network: r.Attachment.Network, ContainerID: h.ContainerID, Interface: h.Interface}
	var out alloc.Allocation
	err := func() error {
		nodeID, err := s.nodeID(ctx, tx, r.Space, r.Node)
		if err != nil {
			return err
		}
		// Both attachments' rows, locked in address order (the order
		// every multi-row lock of leases here takes).
		rows, err := tx.Query(ctx, `SELECT container_id, interface, addr, generation, state FROM leases
			WHERE node_id = @node AND network = @network AND state <> 'released'
			  AND ((container_id = @slotContainer AND interface = @slotIface) OR (container_id = @container AND interface = @iface))
			ORDER BY addr FOR UPDATE`, namedArgs{"node": nodeID, "network": r.Attachment.Network,
			"slotContainer": h.ContainerID, "slotIface": h.Interface, "container": r.Attachment.ContainerID, "iface": r.Attachment.Interface})
		if err != nil {
			return err
		}
		type held struct {
			cid, iface string
			addr       netip.Addr
			gen        int64
			state      string
		}
		all, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (held, error) {
			var x held
			return x, row.Scan(&x.cid, &x.iface, &x.addr, &x.gen, &x.state)
		})
		if err != nil {
			return err
		}
		var slotAddrs, ownAddrs []netip.Addr
		var slotGen int64
		var slotState string
		for _, x := range all {
			if x.cid == h.ContainerID && x.iface == h.Interface {
				slotAddrs, slotGen, slotState = append(slotAddrs, x.addr), x.gen, x.state
			} else {
				ownAddrs = append(ownAddrs, x.addr)
			}
		}
		what := fmt.Sprintf("reserve attachment %s/%s", h.ContainerID, h.Interface)
		switch {
		case len(slotAddrs) > 0 && slotGen != h.Generation:
			return alloc.StaleGeneration(what, h.Generation, slotGen, leaseState(slotState))
		case len(slotAddrs) > 0 && slotState != string(alloc.StateActive):
			return &alloc.Error{Kind: alloc.KindLeaseConflict, Field: "fromReserve",
				Detail: fmt.Sprintf("%s is %s, not active: it was never the node's reserve", what, slotState)}
		case len(slotAddrs) == 0 && len(ownAddrs) > 0:
			// Handed over already: a retry.
			existing, err := attachmentLeases(ctx, tx, nodeID, r.Attachment)
			if err != nil {
				return err
			}
			if err := sameRequest(existing, r); err != nil {
				return err
			}
			out = allocationOf(r.Node, r.Attachment, existing, false)
			return nil
		case len(slotAddrs) == 0:
			return alloc.NotFound("fromReserve", "leases of "+what, fmt.Sprintf("generation %d", h.Generation))
		}
		slotLeases, err := attachmentLeases(ctx, tx, nodeID, slot)
		if err != nil {
			return err
		}
		check := r
		check.Owner = slotLeases[0].Owner // the owner changes; pools and families must not
		if err := sameRequest(slotLeases, check); err != nil {
			return err
		}
		now := s.now()
		if len(ownAddrs) > 0 {
			if _, err := tx.Exec(ctx, `UPDATE leases SET `+releaseSet+`
				WHERE space = @space AND addr = ANY (@addrs) AND `+historyContextSQL,
				namedArgs{"now": now, "until": now.Add(s.opts.Cooldown), "space": r.Space, "addrs": ownAddrs,
					"actor": historyActor(ctx), "reason": reasonSuperseded, "at": now}); err != nil {
				return err
			}
		}
		state, confirmed := alloc.StateActive, &now
		var expires *time.Time
		if r.Expire {
			e := now.Add(s.opts.LeaseExpiry)
			state, expires, confirmed = alloc.StatePending, &e, nil
		}
		// One new generation for all of them (a CTE runs once).
		if _, err := tx.Exec(ctx, `WITH g AS (SELECT nextval('lease_generations') AS g)
			UPDATE leases SET container_id = @container, interface = @iface, owner_namespace = @ns, owner_name = @name,
				owner_uid = @uid, state = @state, created_at = @now, expires_at = @expires, confirmed_at = @confirmed,
				generation = g.g
			FROM g WHERE space = @space AND addr = ANY (@addrs) AND `+historyContextSQL,
			namedArgs{"space": r.Space, "addrs": slotAddrs, "container": r.Attachment.ContainerID, "iface": r.Attachment.Interface,
				"ns": r.Owner.Namespace, "name": r.Owner.Name, "uid": r.Owner.UID, "state": string(state), "now": now,
				"expires": expires, "confirmed": confirmed, "actor": historyActor(ctx), "reason": reasonFromReserve, "at": now}); err != nil {
			return err
		}
		moved, err := attachmentLeases(ctx, tx, nodeID, r.Attachment)
		if err != nil {
			return err
		}
		out = allocationOf(r.Node, r.Attachment, moved, true)
		return nil
	}()
	return out, err
}
