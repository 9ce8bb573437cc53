// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"net/netip"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Migrate)
}

// TestLoadFill fills in two steps (partial nodes included), then checks
// the rows against the schema's rules and the service's own view, and that
// the service goes on leasing and carving right after the bulk rows.
func TestLoadFill(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDatabase(t)
	st, err := store.Open(ctx, url, store.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	zero := 0
	if _, err := st.CreatePool(ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: fillPool, Spec: alloc.PoolSpec{
		IPv4:      &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix(fillCIDR)}, MaskSize: fillMask},
		NodeLocal: alloc.DefaultNodeLocal, PreAllocate: &zero,
	}}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	const perNode = 10
	for _, step := range []struct{ target, added int }{{25, 25}, {47, 22}, {47, 0}} {
		added, err := loadFill(ctx, conn, alloc.DefaultSpace, fillPool, perNode, step.target)
		if err != nil || added != step.added {
			t.Fatalf("loadFill(%d) = %d, %v; want %d added", step.target, added, err, step.added)
		}
	}
	if _, err := loadFill(ctx, conn, alloc.DefaultSpace, fillPool, perNode, 40); err == nil {
		t.Fatal("loadFill below what the pool holds did not fail")
	}

	// The rows: every lease active and confirmed, 10 per node but the last
	// (7); each block's counter equals its rows and its cursor is one past
	// the last offset leased (router and health take offsets 1 and 2, so
	// leases start at 3); the carve cursor is past the blocks.
	var leases, bad int
	err = conn.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state <> 'active' OR confirmed_at IS NULL OR expires_at IS NOT NULL
		OR addr <> host(block_cidr::inet)::inet + (3 + split_part(container_id, '-', 2)::int % 10))
		FROM leases`).Scan(&leases, &bad)
	if err != nil || leases != 47 || bad != 0 {
		t.Fatalf("leases %d, %d not as the service makes them, %v", leases, bad, err)
	}
	rows, err := conn.Query(ctx, `SELECT n.name, b.cidr::text, b.allocated, b.next_offset, b.capacity, host(b.router), host(b.health),
			(SELECT count(*) FROM leases l WHERE l.block_id = b.id)
		FROM blocks b JOIN nodes n ON n.id = b.node_id ORDER BY n.name`)
	if err != nil {
		t.Fatal(err)
	}
	type blockRow struct {
		node, cidr                string
		allocated, next, capacity int64
		router, health            string
		rows                      int64
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (blockRow, error) {
		var b blockRow
		return b, r.Scan(&b.node, &b.cidr, &b.allocated, &b.next, &b.capacity, &b.router, &b.health, &b.rows)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []blockRow{
		{"fill-node-00000", "100.64.0.0/24", 10, 13, 252, "100.64.0.1", "100.64.0.2", 10},
		{"fill-node-00001", "100.64.1.0/24", 10, 13, 252, "100.64.1.1", "100.64.1.2", 10},
		{"fill-node-00002", "100.64.2.0/24", 10, 13, 252, "100.64.2.1", "100.64.2.2", 10},
		{"fill-node-00003", "100.64.3.0/24", 10, 13, 252, "100.64.3.1", "100.64.3.2", 10},
		{"fill-node-00004", "100.64.4.0/24", 7, 10, 252, "100.64.4.1", "100.64.4.2", 7},
	}
	if len(got) != len(want) {
		t.Fatalf("blocks %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("block %d = %+v; want %+v", i, got[i], want[i])
		}
	}
	var hint int64
	if err := conn.QueryRow(ctx, `SELECT carve_hint FROM pool_cidrs`).Scan(&hint); err != nil || hint != 5 {
		t.Fatalf("carve_hint %d, %v; want 5", hint, err)
	}

	// The service's view: the pool's status counts the leases and blocks.
	p, err := st.GetPool(ctx, alloc.DefaultSpace, fillPool)
	if err != nil {
		t.Fatal(err)
	}
	if s := p.Status[alloc.IPv4]; s.Leased != 47 || s.BlocksCarved != 5 || s.Cooling != 0 || s.AddressesTotal != 5*252 {
		t.Fatalf("pool status %+v", s)
	}
	// The service leases on from the bulk rows: the next offset of a
	// partial node, the next of a full one, and a new node's block after
	// the loaded ones.
	for _, c := range []struct{ node, want string }{
		{"fill-node-00004", "100.64.4.10"},
		{"fill-node-00000", "100.64.0.13"},
		{"another-node", "100.64.5.3"},
	} {
		a, err := st.Allocate(ctx, alloc.LeaseRequest{Space: alloc.DefaultSpace, Node: c.node, Pool: fillPool,
			Owner: alloc.Owner{Namespace: "t", Name: "after-" + c.node}, Attachment: alloc.Attachment{ContainerID: "after-" + c.node, Interface: "eth0"}})
		if err != nil {
			t.Fatalf("allocate on %s after the fill: %v", c.node, err)
		}
		if got := a.Leases[0].Addr.String(); got != c.want {
			t.Errorf("allocate on %s = %s; want %s", c.node, got, c.want)
		}
	}

	if err := dropFill(ctx, conn, alloc.DefaultSpace, fillPool); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM leases) + (SELECT count(*) FROM blocks) + (SELECT count(*) FROM nodes WHERE name LIKE 'fill-node-%')`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("after dropFill %d rows are left, %v", left, err)
	}
}
