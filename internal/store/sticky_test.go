// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// A node certificate's takeover of a sticky identity (alloc.StickyMoves)
// is decided by the API before the transaction, on the bindings it read
// then; the store compares it with the bound row under that row's lock.
// A binding that changed in between (re-leased and released on its node:
// a new generation) is refused, even when the change commits while the
// takeover waits for the lock; the binding as read moves.
func TestStickyMovesComparedUnderTheLock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.0.3.0/24")})
	const id = "statefulset/authz/web/0"
	sticky := func(node, container string, moves *alloc.StickyMoves) alloc.LeaseRequest {
		r := req(node, container, alloc.IPv4)
		r.Owner = alloc.Owner{Namespace: "authz", Name: "web-0"}
		r.Sticky = &alloc.StickyRequest{Identity: id, Moves: moves}
		return r
	}
	release := func(node, container string) {
		t.Helper()
		if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, node, alloc.Attachment{ContainerID: container, Interface: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
	bound := func() alloc.Lease {
		t.Helper()
		b, err := f.s.Bindings(f.ctx, alloc.DefaultSpace, id)
		if err != nil || len(b) != 1 {
			t.Fatalf("bindings %+v %v", b, err)
		}
		return b[0]
	}
	f.allocate(sticky("node-b", "b1", nil))
	release("node-b", "b1")
	read := bound() // what the API reads before the transaction
	as := func(l alloc.Lease) *alloc.StickyMoves {
		return &alloc.StickyMoves{From: []alloc.BoundLease{{Family: l.Family, Node: l.Node, Generation: l.Generation}}}
	}

	// node-b's Pod comes back and goes again: a new generation.
	f.allocate(sticky("node-b", "b2", nil))
	release("node-b", "b2")
	_, err := f.s.Allocate(f.ctx, sticky("node-a", "a1", as(read)))
	if e := wantKind(t, err, alloc.KindForbidden); e.Field != "sticky.identity" {
		t.Errorf("field %q", e.Field)
	}
	if now := bound(); now.Node != "node-b" || now.Addr != read.Addr {
		t.Fatalf("after the refusal the binding is %+v", now)
	}

	// The same, with the change committing while the takeover waits for
	// the bound row.
	read = bound()
	tx := f.otherTx(t)
	if _, err := tx.Exec(f.ctx, `UPDATE leases SET generation = generation + 1000 WHERE sticky_identity = $1`, id); err != nil {
		t.Fatal(err)
	}
	done := f.allocateAsync(sticky("node-a", "a1", as(read)))
	select {
	case r := <-done:
		t.Fatalf("the takeover did not wait for the bound row's lock: %+v %v", r.a, r.err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	wantKind(t, (<-done).err, alloc.KindForbidden)

	// The binding as it is now moves.
	read = bound()
	moved := f.allocate(sticky("node-a", "a1", as(read)))
	l := moved.Leases[0]
	if l.Sticky == nil || l.Sticky.Reused || l.Sticky.Reason == "" || l.Addr == read.Addr {
		t.Fatalf("moved %+v, want a fresh address bound", l)
	}
	if now := bound(); now.Node != "node-a" || now.Addr != l.Addr {
		t.Fatalf("after the move the binding is %+v", now)
	}
}
