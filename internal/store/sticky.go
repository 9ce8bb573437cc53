// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Sticky addresses live in the lease rows (migration 00005): a row's
// sticky_identity binds its address to a workload identity, and a released
// bound row cools until the longer of the cooldown and its retention
// (releaseSet). Everything that keeps a cooling row from others therefore
// keeps a bound address: the allocator's reuse and the purge wait for the
// end of the cooldown, a block holding the row is not empty (ReleaseBlock,
// Rebalance), and the cooldown trigger lets only the bound identity lease
// it earlier. Requests without sticky never read a binding.

// stickyRetention is the retention of a request that names none.
func (s *Store) stickyRetention(r *alloc.StickyRequest) time.Duration {
	switch {
	case r.Retention != 0:
		return r.Retention
	case s.opts.StickyRetention != 0:
		return s.opts.StickyRetention
	}
	return alloc.DefaultStickyRetention
}

// interval is d as a PostgreSQL interval (microseconds only, so it adds
// to a timestamp as an exact duration).
func interval(d time.Duration) pgtype.Interval {
	return pgtype.Interval{Microseconds: d.Microseconds(), Valid: true}
}

// intervalDuration is the duration of an interval the store wrote (days
// and months only appear in rows written by hand; they count as 24 h and
// 30 days).
func intervalDuration(i pgtype.Interval) time.Duration {
	if !i.Valid {
		return 0
	}
	return time.Duration(i.Microseconds)*time.Microsecond + time.Duration(i.Days)*24*time.Hour +
		time.Duration(i.Months)*30*24*time.Hour
}

// boundAddress reads, and locks, the address of family f bound to
// identity; nil when none. A released row is answered after its retention
// too, until something clears the binding (the address's next lease). The lock makes concurrent requests of one
// identity take turns: the second sees what the first did.
func boundAddress(ctx context.Context, tx querier, space, identity string, f alloc.Family) (*alloc.BoundAddress, error) {
	var b alloc.BoundAddress
	var until *time.Time // NULL while held
	err := tx.QueryRow(ctx, `SELECT l.addr, l.block_cidr, n.name, p.name, l.state <> 'released', l.network, l.container_id, l.interface, l.generation,
			l.cooldown_until
		FROM leases l JOIN nodes n ON n.id = l.node_id JOIN pools p ON p.id = l.pool_id
		WHERE l.space = $1 AND l.sticky_identity = $2 AND l.family = $3
		FOR UPDATE OF l`, space, identity, int16(f)).
		Scan(&b.Addr, &b.Block, &b.Node, &b.Pool, &b.Held, &b.Attachment.Network, &b.Attachment.ContainerID, &b.Attachment.Interface, &b.Generation,
			&until)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if until != nil {
		b.RetainedUntil = *until
	}
	return &b, nil
}

// unbindSet ends a binding: a released row then cools only for what is
// left of its ordinary cooldown (@cooldown), counted from its release.
const unbindSet = `sticky_identity = NULL, sticky_retention = NULL,
	cooldown_until = CASE WHEN state = 'released' THEN least(cooldown_until, released_at + @cooldown::interval) ELSE cooldown_until END`

// Bindings answers the addresses bound to identity: held by a lease, or
// released and within their retention.
func (s *Store) Bindings(ctx context.Context, space, identity string) ([]alloc.Lease, error) {
	if err := alloc.ValidateIdentity("identity", identity); err != nil {
		return nil, err
	}
	items, err := collectLeases(s.db.Query(ctx, `SELECT `+leaseColumns+` FROM leases l`+leaseJoins+`
		WHERE l.space = $1 AND l.sticky_identity = $2 AND (l.state <> 'released' OR l.cooldown_until > $3)
		ORDER BY l.family`, space, identity, s.now()))
	if err != nil {
		return nil, err
	}
	return items, s.emptyListOf(ctx, space, len(items))
}

// Unbind ends the bindings of identity before their retention: a held
// lease keeps its address, unbound; a released address cools for what is
// left of its ordinary cooldown and then frees. It returns the addresses
// it unbound; none is not an error.
func (s *Store) Unbind(ctx context.Context, space, identity string) ([]alloc.Lease, error) {
	if err := alloc.ValidateIdentity("identity", identity); err != nil {
		return nil, err
	}
	items, err := collectLeases(s.db.Query(ctx, `WITH u AS (
			UPDATE leases SET `+unbindSet+` WHERE space = @space AND sticky_identity = @identity RETURNING *
		)
		SELECT `+leaseColumns+` FROM u l`+leaseJoins+` ORDER BY l.family`,
		namedArgs{"cooldown": interval(s.opts.Cooldown), "space": space, "identity": identity}))
	if err != nil {
		return nil, err
	}
	return items, s.emptyListOf(ctx, space, len(items))
}
