// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
)

// lbChangedChannel is the channel migration 00027's triggers announce LB
// IPAM changes on.
const lbChangedChannel = "ipam_lb_changed"

// ListenLBChanges calls changed with the space of every change that can
// serve a waiting LoadBalancer Service (a pool created, edited or deleted,
// a CIDR group's CIDRs changed, an address freed, a holder gone; "" when
// the change names no space), whichever replica or client made it, until
// ctx ends or the connection is lost; it answers why. It calls changed("")
// once it listens, for the changes made before. It holds one connection of
// its own, taken out of the pool: the caller listens again after an error
// (a failover ends the connection).
func (s *Store) ListenLBChanges(ctx context.Context, changed func(space string)) error {
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
	changed("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		changed(n.Payload)
	}
}
