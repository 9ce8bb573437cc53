// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

func (f *fixture) history(filter alloc.HistoryFilter) []alloc.Event {
	f.t.Helper()
	var all []alloc.Event
	page := alloc.Page{Limit: 1000}
	for {
		items, next, err := f.s.History(f.ctx, filter, page)
		if err != nil {
			f.t.Fatal(err)
		}
		all = append(all, items...)
		if next == "" {
			return all
		}
		page.Continue = next
	}
}

// An actor is whatever a certificate's CN says; it reaches the history
// verbatim, whether it travels in a transaction's BEGIN (allocation) or in
// the changing statement (release), and can never end the quoted string.
func TestHistoryActorIsQuoted(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	for _, actor := range []string{
		`cert:o'brien`,
		`cert:\'); DROP TABLE leases; --`,
		`cert:back\slash E'\x41'`,
		"cert:nul\x00byte",
		`cert:$$dollar$$`,
	} {
		ctx := alloc.WithActor(f.ctx, actor)
		r := req("n1", "c1")
		a, err := f.s.Allocate(ctx, r)
		if err != nil {
			t.Fatalf("allocate as %q: %v", actor, err)
		}
		if _, err := f.s.ReleaseAttachment(ctx, alloc.DefaultSpace, "n1", r.Attachment); err != nil {
			t.Fatalf("release as %q: %v", actor, err)
		}
		events := f.history(alloc.HistoryFilter{Space: alloc.DefaultSpace, Address: a.Leases[0].Addr})
		want := string(stripNUL(actor))
		last := events[len(events)-2:]
		if last[0].Kind != alloc.EventLease || last[1].Kind != alloc.EventRelease || last[0].Actor != want || last[1].Actor != want {
			t.Fatalf("as %q: events %+v", actor, last)
		}
	}
	if n := f.count(`SELECT count(*) FROM leases`); n != 5 {
		t.Fatalf("%d lease rows", n)
	}
}

func stripNUL(s string) []byte {
	var b []byte
	for i := range len(s) {
		if s[i] != 0 {
			b = append(b, s[i])
		}
	}
	return b
}

// A change made in the database directly, outside the store, is recorded
// too, with the database user as its actor.
func TestHistoryRecordsDirectChanges(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	a := f.allocate(req("n1", "c1"))
	c, err := pgx.Connect(f.ctx, f.conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(f.ctx)
	var user string
	if err := c.QueryRow(f.ctx, `SELECT session_user`).Scan(&user); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(f.ctx, `UPDATE leases SET state = 'released', expires_at = NULL, released_at = created_at,
		cooldown_until = created_at`); err != nil {
		t.Fatal(err)
	}
	events := f.history(alloc.HistoryFilter{Space: alloc.DefaultSpace, Address: a.Leases[0].Addr})
	if len(events) != 2 || events[1].Kind != alloc.EventRelease || events[1].Actor != "db:"+user || events[0].Actor != alloc.ActorAnonymous {
		t.Fatalf("events %+v", events)
	}
}

// Pruning deletes every event older than the retention, in batches (here
// 2.5 of them), and nothing newer; a zero retention keeps everything.
func TestPruneHistory(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.HistoryRetention = 24 * time.Hour })
	now := f.clock.Now()
	c, err := pgx.Connect(f.ctx, f.conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(f.ctx)
	if _, err := c.Exec(f.ctx, `INSERT INTO address_events (at, kind, space, address, actor)
		SELECT $1::timestamptz - i * interval '1 second', 'lease', 'default', '10.0.0.1', 'test'
		FROM generate_series(0, 2999) i`, now.Add(-24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	// Exactly at the cutoff is kept (pruned: older than it).
	if _, err := c.Exec(f.ctx, `INSERT INTO address_events (at, kind, space, address, actor)
		SELECT $1::timestamptz + i * interval '1 second', 'lease', 'default', '10.0.0.1', 'test'
		FROM generate_series(0, 9) i`, now.Add(-24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	n, err := f.s.PruneHistory(f.ctx)
	if err != nil || n != 2999 {
		t.Fatalf("pruned %d, %v; want 2999", n, err)
	}
	if left := f.count(`SELECT count(*) FROM address_events`); left != 11 {
		t.Fatalf("%d events left, want 11", left)
	}
	if old := f.count(`SELECT count(*) FROM address_events WHERE at < $1`, now.Add(-24*time.Hour)); old != 0 {
		t.Fatalf("%d events older than the retention left", old)
	}
	f.opts.HistoryRetention = 0
	f.reopen()
	f.clock.Advance(365 * 24 * time.Hour)
	if n, err := f.s.PruneHistory(f.ctx); err != nil || n != 0 {
		t.Fatalf("zero retention pruned %d, %v", n, err)
	}
}

// History pages by (at, id): events of one instant are neither lost nor
// repeated across pages, and a token is refused where it is not one.
func TestHistoryPagesWithinOneInstant(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	for i := range 7 { // the clock stands still: 7 leases and 7 releases at one instant
		r := req("n1", "c"+string(rune('a'+i)))
		f.allocate(r)
		if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "n1", r.Attachment); err != nil {
			t.Fatal(err)
		}
	}
	filter := alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: "n1"}
	all := f.history(filter)
	if len(all) != 15 { // the block's carve, then 7 x (lease, release)
		t.Fatalf("%d events", len(all))
	}
	var paged []alloc.Event
	page := alloc.Page{Limit: 2}
	for {
		items, next, err := f.s.History(f.ctx, filter, page)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, items...)
		if next == "" {
			break
		}
		page.Continue = next
	}
	if len(paged) != len(all) {
		t.Fatalf("paged %d events, want %d", len(paged), len(all))
	}
	for i := range all {
		if paged[i].ID != all[i].ID {
			t.Fatalf("event %d: id %d, want %d", i, paged[i].ID, all[i].ID)
		}
	}
	// Tokens this store sealed for this very list, with keys no page ends
	// on, are refused too (a bug, or a leaked secret, cannot reach SQL).
	sealed := func(key string) string {
		tok, err := f.s.encodeContinue(f.ctx, historyScope(filter), key)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	for _, tok := range []string{"!!", sealed("x"), sealed("2030-01-01T00:00:00Z|x"), sealed("2030-01-01T00:00:00Z|-1")} {
		if _, _, err := f.s.History(f.ctx, filter, alloc.Page{Limit: 2, Continue: tok}); !alloc.IsKind(err, alloc.KindInvalid) {
			t.Errorf("token %q: %v", tok, err)
		}
	}
	if _, err := f.s.HolderAt(f.ctx, alloc.DefaultSpace, netip.MustParseAddr("10.9.9.9"), f.clock.Now()); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Errorf("holder of an address never leased: %v", err)
	}
	if _, err := f.s.HolderAt(f.ctx, "nope", netip.MustParseAddr("10.9.9.9"), f.clock.Now()); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Errorf("holder in a missing space: %v", err)
	}
}

// A failed change leaves no event: the history is written in the change's
// transaction.
func TestHistoryRollsBackWithTheChange(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	f.allocate(req("n1", "c1"))
	before := f.count(`SELECT count(*) FROM address_events`)
	// The pool has a block: deleting it is refused after the statement
	// that would record it.
	if _, err := f.s.DeletePool(f.ctx, alloc.DefaultSpace, "default"); !alloc.IsKind(err, alloc.KindInUse) {
		t.Fatalf("delete pool: %v", err)
	}
	err := f.s.inTx(context.Background(), func(tx querier) error {
		if _, err := tx.Exec(f.ctx, `DELETE FROM leases`); err != nil {
			return err
		}
		return errRollback
	})
	if err != errRollback {
		t.Fatal(err)
	}
	if after := f.count(`SELECT count(*) FROM address_events`); after != before {
		t.Fatalf("%d events after failed changes, want %d", after, before)
	}
}

var errRollback = errorString("roll back")

type errorString string

func (e errorString) Error() string { return string(e) }
