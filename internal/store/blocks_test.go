// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"fmt"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// ListPoolBlocks pages through a dual-stack pool's blocks, IPv4 before
// IPv6 and by CIDR whatever order they were carved in, each with its node
// and fill; a family filter keeps one family; another pool's blocks never
// show; a token is refused for another pool; a missing pool is not-found.
func TestListPoolBlocksPagesByFamilyAndCIDR(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("dual", alloc.PoolSpec{IPv4: fam(28, "10.70.0.0/26"), IPv6: fam(124, "fd00:70::/120"), NodeLocal: alloc.DefaultNodeLocal})
	f.pool("other", alloc.PoolSpec{IPv4: fam(28, "10.71.0.0/26")})
	// Three nodes, carved in the order c, a, b; node c takes two leases.
	for i, node := range []string{"node-c", "node-a", "node-b"} {
		r := req(node, fmt.Sprint("x", i), alloc.IPv4, alloc.IPv6)
		r.Pool = "dual"
		f.allocate(r)
	}
	r := req("node-c", "x9", alloc.IPv4, alloc.IPv6)
	r.Pool = "dual"
	f.allocate(r)
	o := req("node-a", "o1", alloc.IPv4)
	o.Pool = "other"
	f.allocate(o)

	var got []alloc.Block
	next := ""
	pages := 0
	for {
		items, n, err := f.s.ListPoolBlocks(f.ctx, alloc.DefaultSpace, "dual", 0, alloc.Page{Limit: 2, Continue: next})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		got = append(got, items...)
		if n == "" {
			break
		}
		next = n
	}
	want := []string{
		"10.70.0.0/28 node-c 2", "10.70.0.16/28 node-a 1", "10.70.0.32/28 node-b 1",
		"fd00:70::/124 node-c 2", "fd00:70::10/124 node-a 1", "fd00:70::20/124 node-b 1",
	}
	if pages != 3 || len(got) != len(want) {
		t.Fatalf("%d pages, %d blocks %+v; want 3 pages of %d", pages, len(got), got, len(want))
	}
	for i, b := range got {
		if s := fmt.Sprintf("%s %s %d", b.Layout.Prefix, b.Node, b.Leased); s != want[i] || b.Pool != "dual" {
			t.Errorf("block %d: %s of pool %s, want %s", i, s, b.Pool, want[i])
		}
	}

	v6, n, err := f.s.ListPoolBlocks(f.ctx, alloc.DefaultSpace, "dual", alloc.IPv6, alloc.Page{Limit: 100})
	if err != nil || n != "" || len(v6) != 3 || v6[0].Family != alloc.IPv6 {
		t.Fatalf("IPv6 only: %+v next %q err %v", v6, n, err)
	}

	_, tok, err := f.s.ListPoolBlocks(f.ctx, alloc.DefaultSpace, "dual", 0, alloc.Page{Limit: 1})
	if err != nil || tok == "" {
		t.Fatalf("first page: token %q err %v", tok, err)
	}
	_, _, err = f.s.ListPoolBlocks(f.ctx, alloc.DefaultSpace, "other", 0, alloc.Page{Limit: 1, Continue: tok})
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "continue" {
		t.Fatalf("a token of pool dual used for pool other: field %q", e.Field)
	}
	_, _, err = f.s.ListPoolBlocks(f.ctx, alloc.DefaultSpace, "dual", alloc.IPv4, alloc.Page{Limit: 1, Continue: tok})
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "continue" {
		t.Fatalf("a token of both families used for IPv4 only: field %q", e.Field)
	}
	_, _, err = f.s.ListPoolBlocks(f.ctx, alloc.DefaultSpace, "missing", 0, alloc.Page{Limit: 1})
	wantKind(t, err, alloc.KindNotFound)
}
