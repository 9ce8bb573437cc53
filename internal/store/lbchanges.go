// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"encoding/json"
	"strings"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// lbChangedChannel is the channel migration 00027's triggers announce LB
// IPAM changes on.
const lbChangedChannel = "ipam_lb_changed"

// ListenLBChanges calls changed with every change that can serve a
// waiting LoadBalancer Service (a pool created, edited or deleted, a CIDR
// group's CIDRs changed, an address freed, a holder gone; its space, ""
// when the change names none), and every owner whose addresses went with
// a deleted pool (the space and the owner), whichever replica or client
// made it, until ctx ends or the connection is lost; it answers why. It
// calls changed with the zero LBChange once it listens, for the changes
// made before. It holds one connection of
// its own, taken out of the pool: the caller listens again after an error
// (a failover ends the connection).
func (s *Store) ListenLBChanges(ctx context.Context, changed func(alloc.LBChange)) error {
	c, err := s.db.Acquire(ctx)
	if err != nil {
		return err
	}
	// A listening connection must not go back to the pool: hijacked, it
	// is this call's alone, and closed with it.
	conn := c.Hijack()
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+lbChangedChannel); err != nil {
		return err
	}
	changed(alloc.LBChange{})
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		changed(parseLBChange(n.Payload))
	}
}

// parseLBChange reads a payload of ipam_lb_changed: a space (the
// triggers of migration 00027), or a JSON object naming an owner
// (releaseLBPool).
func parseLBChange(payload string) alloc.LBChange {
	if !strings.HasPrefix(payload, "{") {
		return alloc.LBChange{Space: payload}
	}
	var o struct{ Space, Namespace, Name string }
	if err := json.Unmarshal([]byte(payload), &o); err != nil {
		return alloc.LBChange{} // a change of any space: look at all
	}
	return alloc.LBChange{Space: o.Space, Owner: alloc.VIPOwner{Namespace: o.Namespace, Name: o.Name}}
}
