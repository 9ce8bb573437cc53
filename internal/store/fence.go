// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The fenced calls (see alloc/fence.go) act only on leases of the
// generation they name. Each runs the ordinary statement with the
// generation as one more condition, so a stale call changes nothing by
// construction; only when it changed nothing does it read why: nothing held
// (or already released: a retry) is success, another generation is
// KindStaleGeneration.
//
// A lease of the named generation that the statement did not see can only
// be one whose transaction committed after the statement's snapshot was
// taken; the call then runs again, a bounded number of times.

// fenceAttempts bounds those runs.
const fenceAttempts = 3

// ReleaseAddressAt releases the lease holding addr if it is of generation
// gen. Nothing held, or a lease of gen already released, is success with
// nothing released.
func (s *Store) ReleaseAddressAt(ctx context.Context, space string, addr netip.Addr, gen int64) ([]alloc.Lease, error) {
	if err := alloc.ValidateGeneration("generation", gen); err != nil {
		return nil, err
	}
	for range fenceAttempts {
		released, err := s.released(ctx, reasonReleaseAddress,
			`l.space = @space AND l.addr = @addr AND l.generation = @generation AND l.network <> @cilium`,
			namedArgs{"space": space, "addr": addr, "generation": gen, "cilium": alloc.CiliumPoolNetwork})
		if err != nil || len(released) > 0 {
			return released, err
		}
		if err := s.refuseNodeAddress(ctx, space, addr); err != nil {
			return nil, err
		}
		var have int64
		var state string
		err = s.db.QueryRow(ctx, `SELECT generation, state FROM leases WHERE space = $1 AND addr = $2`, space, addr).Scan(&have, &state)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil, nil
		case err != nil:
			return nil, err
		case have != gen:
			return nil, alloc.StaleGeneration("address "+addr.String(), gen, have, leaseState(state))
		case state == "released":
			return nil, nil
		}
	}
	return nil, fmt.Errorf("release %s generation %d: the lease kept changing", addr, gen)
}

// ReleaseAttachmentAt releases the attachment's leases if they are of
// generation gen. Nothing held is success with nothing released.
func (s *Store) ReleaseAttachmentAt(ctx context.Context, space, node string, a alloc.Attachment, gen int64) ([]alloc.Lease, error) {
	if err := alloc.ValidateGeneration("generation", gen); err != nil {
		return nil, err
	}
	if err := alloc.ValidateNetworkName("network", a.Network); err != nil {
		return nil, err
	}
	for range fenceAttempts {
		released, err := s.released(ctx, reasonReleaseAttachment, `l.node_id = (SELECT id FROM nodes WHERE space = @space AND name = @node)
			AND l.network = @network AND l.container_id = @container AND l.interface = @iface AND l.generation = @generation`,
			namedArgs{"space": space, "node": node, "container": a.ContainerID, "iface": a.Interface, "generation": gen,
				"network": a.Network})
		if err != nil || len(released) > 0 {
			return released, err
		}
		held, err := heldGenerations(ctx, s.db, space, node, a)
		if err != nil || len(held) == 0 {
			return nil, err
		}
		if err := sameGeneration(a, held, gen); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("release %s/%s generation %d: the leases kept changing", a.ContainerID, a.Interface, gen)
}

// ConfirmAt confirms the attachment's pending leases if they are of
// generation gen, and answers the attachment. Confirming again is a no-op;
// an attachment holding nothing is not found.
func (s *Store) ConfirmAt(ctx context.Context, space, node string, a alloc.Attachment, gen int64) (alloc.Allocation, error) {
	if err := alloc.ValidateGeneration("generation", gen); err != nil {
		return alloc.Allocation{}, err
	}
	if err := alloc.ValidateNetworkName("network", a.Network); err != nil {
		return alloc.Allocation{}, err
	}
	for range fenceAttempts {
		now := s.now()
		if _, err := s.db.Exec(ctx, `UPDATE leases SET state = 'active', expires_at = NULL, confirmed_at = @now
			WHERE node_id = (SELECT id FROM nodes WHERE space = @space AND name = @node)
			  AND network = @network AND container_id = @container AND interface = @iface AND state = 'pending'
			  AND generation = @generation AND `+historyContextSQL,
			namedArgs{"space": space, "node": node, "container": a.ContainerID, "iface": a.Interface, "now": now,
				"generation": gen, "actor": historyActor(ctx), "reason": "", "at": now, "network": a.Network}); err != nil {
			return alloc.Allocation{}, err
		}
		got, err := s.GetAttachment(ctx, space, node, a)
		if err != nil {
			return got, err
		}
		held := make([]heldGeneration, len(got.Leases))
		pending := false
		for i, l := range got.Leases {
			held[i] = heldGeneration{l.Generation, l.State}
			pending = pending || l.State == alloc.StatePending
		}
		if err := sameGeneration(a, held, gen); err != nil {
			return alloc.Allocation{}, err
		}
		if !pending {
			return got, nil
		}
	}
	return alloc.Allocation{}, fmt.Errorf("confirm %s/%s generation %d: the leases kept changing", a.ContainerID, a.Interface, gen)
}

// heldGeneration is the generation and state of one held lease.
type heldGeneration struct {
	gen   int64
	state alloc.LeaseState
}

// heldGenerations reads the generations of the attachment's pending and
// active leases.
func heldGenerations(ctx context.Context, q querier, space, node string, a alloc.Attachment) ([]heldGeneration, error) {
	rows, err := q.Query(ctx, `SELECT generation, state FROM leases
		WHERE node_id = (SELECT id FROM nodes WHERE space = @space AND name = @node)
		  AND network = @network AND container_id = @container AND interface = @iface AND state <> 'released' ORDER BY family`,
		namedArgs{"space": space, "node": node, "container": a.ContainerID, "iface": a.Interface, "network": a.Network})
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (heldGeneration, error) {
		var h heldGeneration
		var state string
		err := r.Scan(&h.gen, &state)
		h.state = leaseState(state)
		return h, err
	})
}

// sameGeneration answers KindStaleGeneration when a held lease of the
// attachment is not of generation gen.
func sameGeneration(a alloc.Attachment, held []heldGeneration, gen int64) error {
	for _, h := range held {
		if h.gen != gen {
			return alloc.StaleGeneration(fmt.Sprintf("attachment %s/%s", a.ContainerID, a.Interface), gen, h.gen, h.state)
		}
	}
	return nil
}

// leaseState is the API's name of a stored state.
func leaseState(s string) alloc.LeaseState {
	if s == "released" {
		return alloc.StateCooling
	}
	return alloc.LeaseState(s)
}

// GenerationHighWater answers the highest lease generation issued so far:
// what a runtime reads before listing its attachments and then names in
// ReconcileUpTo. (A transaction that took a lower number may still be
// running; ReconcileMinAge covers it.)
func (s *Store) GenerationHighWater(ctx context.Context) (int64, error) {
	var g int64
	err := s.db.QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM lease_generations`).Scan(&g)
	return g, err
}
