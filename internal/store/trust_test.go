// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// A node holds at most the pool's maxBlocksPerNode blocks of a family:
// an explicit carve and a lease that needs a block past it answer
// node-block-limit naming pool and family and change nothing; other nodes
// and the other family carve on; lowering the limit keeps the blocks held.
func TestNodeBlockLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	two := 2
	f.pool("default", alloc.PoolSpec{IPv4: fam(30, "10.0.0.0/24"), IPv6: fam(126, "fd00::/120"), MaxBlocksPerNode: &two})
	for _, n := range []string{"a", "b"} {
		if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := f.s.CarveBlock(f.ctx, alloc.DefaultSpace, "a", "default", alloc.IPv4); err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.s.CarveBlock(f.ctx, alloc.DefaultSpace, "a", "default", alloc.IPv4)
	if e := wantKind(t, err, alloc.KindNodeBlockLimit); e.Pool != "default" || e.Family != alloc.IPv4 || e.Field != "pool" {
		t.Fatalf("limit error %+v", e)
	}
	// A /30 leases two addresses: a's four fill its blocks, the fifth
	// would need a third block.
	for i := range 4 {
		f.allocate(req("a", fmt.Sprint("c", i), alloc.IPv4))
	}
	blocks, leases := f.count(`SELECT count(*) FROM blocks`), f.count(`SELECT count(*) FROM leases`)
	_, err = f.s.Allocate(f.ctx, req("a", "c4", alloc.IPv4))
	wantKind(t, err, alloc.KindNodeBlockLimit)
	if b, l := f.count(`SELECT count(*) FROM blocks`), f.count(`SELECT count(*) FROM leases`); b != blocks || l != leases {
		t.Fatalf("a refused lease left %d blocks and %d leases, had %d and %d", b, l, blocks, leases)
	}
	if _, err := f.s.CarveBlock(f.ctx, alloc.DefaultSpace, "b", "default", alloc.IPv4); err != nil {
		t.Fatalf("another node: %v", err)
	}
	if _, err := f.s.CarveBlock(f.ctx, alloc.DefaultSpace, "a", "default", alloc.IPv6); err != nil {
		t.Fatalf("the other family: %v", err)
	}
	one := 1
	if _, err := f.s.UpdatePool(f.ctx, alloc.DefaultSpace, "default", nil, alloc.PoolSpec{IPv4: fam(30, "10.0.0.0/24"),
		IPv6: fam(126, "fd00::/120"), MaxBlocksPerNode: &one}); err != nil {
		t.Fatal(err)
	}
	if n := f.count(`SELECT count(*) FROM blocks b JOIN nodes n ON n.id = b.node_id WHERE n.name = 'a' AND b.family = 4`); n != 2 {
		t.Fatalf("node a holds %d IPv4 blocks after the limit was lowered, want its 2", n)
	}
	f.allocate(req("a", "c0", alloc.IPv4)) // a retry still answers
}

// Without maxBlocksPerNode a node may hold enough blocks for 1,024
// leasable addresses: 5 of /24, 86 of /28 with router and health.
func TestDefaultNodeBlockLimit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		mask int
		nl   alloc.NodeLocal
		want int64
	}{
		{24, alloc.DefaultNodeLocal, 5},
		{28, alloc.DefaultNodeLocal, 86},
		{32, alloc.NodeLocal{}, 1024},
		{16, alloc.DefaultNodeLocal, 1},
	} {
		spec := alloc.PoolSpec{IPv4: fam(c.mask, "10.0.0.0/8"), NodeLocal: c.nl}
		if got := spec.BlockLimit(alloc.IPv4); got != c.want {
			t.Errorf("/%d: default limit %d, want %d", c.mask, got, c.want)
		}
	}
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "a"}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := f.s.CarveBlock(f.ctx, alloc.DefaultSpace, "a", "default", alloc.IPv4); err != nil {
			t.Fatalf("carve %d: %v", i, err)
		}
	}
	_, err := f.s.CarveBlock(f.ctx, alloc.DefaultSpace, "a", "default", alloc.IPv4)
	wantKind(t, err, alloc.KindNodeBlockLimit)
}

// Concurrent carves for one node never pass its limit: the count is read
// under the pool family's carve lock.
func TestNodeBlockLimitUnderConcurrency(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	three := 3
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.0.0.0/20"), MaxBlocksPerNode: &three})
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "a"}); err != nil {
		t.Fatal(err)
	}
	const n = 12
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			if i%2 == 0 {
				_, errs[i] = f.s.CarveBlock(f.ctx, alloc.DefaultSpace, "a", "default", alloc.IPv4)
			} else {
				_, errs[i] = f.s.Allocate(f.ctx, req("a", fmt.Sprint("c", i), alloc.IPv4))
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && !alloc.IsKind(err, alloc.KindNodeBlockLimit) {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if b := f.count(`SELECT count(*) FROM blocks`); b != 3 {
		t.Fatalf("%d blocks after %d concurrent carves and leases, want the limit 3", b, n)
	}
}

// The background pre-allocation carves up to the limit and no further:
// the node's need is clamped to the capacity of the blocks it may hold, as
// Cilium clamps its needed addresses to max-allocate, so a node at its
// limit is not in deficit (nor counted so by the usage view and metrics).
func TestRebalanceRespectsNodeBlockLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	two, pre := 2, 100
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.0.0.0/20"), MaxBlocksPerNode: &two, PreAllocate: &pre})
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "a"}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []Rebalanced{{Carved: 2}, {}} {
		r, err := f.s.Rebalance(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if r != want {
			t.Errorf("pass %d: %+v, want %+v", i, r, want)
		}
	}
	if b := f.count(`SELECT count(*) FROM blocks`); b != 2 {
		t.Fatalf("%d blocks pre-allocated, want the limit 2", b)
	}
	u, err := f.s.NodeUsage(f.ctx, alloc.DefaultSpace, "a", alloc.UsageFilter{})
	if err != nil {
		t.Fatal(err)
	}
	// A /28 of this pool (no node-local addresses) leases 14.
	if len(u.Items) != 1 || u.Items[0].Needed() != 28 || u.Items[0].Deficit() != 0 || u.Items[0].Capacity != 28 {
		t.Fatalf("usage %+v, want need 28 (two blocks of 14, not preAllocate 100) and no deficit", u.Items)
	}
}

// Adopted blocks (podCIDRs of a registration) count against the limit.
func TestAdoptionRespectsNodeBlockLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	two := 2
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/16"), MaxBlocksPerNode: &two})
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.0.1.0/24"), netip.MustParsePrefix("10.0.2.0/24"), netip.MustParsePrefix("10.0.3.0/24")}
	_, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "a", PodCIDRs: cidrs})
	wantKind(t, err, alloc.KindNodeBlockLimit)
	if b := f.count(`SELECT count(*) FROM blocks`); b != 0 {
		t.Fatalf("%d blocks after a refused adoption", b)
	}
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "a", PodCIDRs: cidrs[:2]}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "a", PodCIDRs: cidrs[:2]}); err != nil {
		t.Fatalf("registering again: %v", err)
	}
}

// Pools whose CIDRs overlap a special-purpose range are refused unless
// they allow it; migration 00007 marks the pools already there as
// allowing it, so they keep working and keep their spec.
func TestSpecialPurposePoolsAndMigration(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	_, err := f.s.CreatePool(f.ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: "lo", Spec: alloc.PoolSpec{IPv4: fam(24, "127.0.0.0/16")}})
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "spec.ipv4.cidrs[0]" {
		t.Fatalf("field %q", e.Field)
	}
	f.pool("lo", alloc.PoolSpec{IPv4: fam(24, "127.0.0.0/16"), AllowSpecialPurpose: true})

	// A database from before 00007 with such pools, migrated.
	p := migrationProvider(t, f.conn)
	if _, err := p.DownTo(f.ctx, 6); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.db.Exec(f.ctx, `DELETE FROM pools`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, cidr string }{{"lo", "127.0.0.0/16"}, {"ll6", "fe80::/112"}, {"ok", "10.0.0.0/16"}} {
		var id int64
		fml, mask := 4, 24
		if netip.MustParsePrefix(c.cidr).Addr().Is6() {
			fml, mask = 6, 120
		}
		col := fmt.Sprintf("ipv%d_mask_size", fml)
		if err := f.s.db.QueryRow(f.ctx, `INSERT INTO pools (space, name, `+col+`, created_at, updated_at,
				allow_first_ip, allow_last_ip, reserve_router, reserve_health, reserve_ingress)
			VALUES ('default', $1, $2, now(), now(), false, false, true, true, false) RETURNING id`, c.name, mask).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if _, err := f.s.db.Exec(f.ctx, `INSERT INTO pool_cidrs (space, pool_id, family, cidr, mask_size, position)
			VALUES ('default', $1, $2, $3, $4, 0)`, id, fml, c.cidr, mask); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Migrate(f.ctx, f.conn); err != nil {
		t.Fatal(err)
	}
	f.reopen()
	for name, want := range map[string]bool{"lo": true, "ll6": true, "ok": false} {
		got, err := f.s.GetPool(f.ctx, alloc.DefaultSpace, name)
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.AllowSpecialPurpose != want || got.Spec.MaxBlocksPerNode != nil {
			t.Errorf("pool %s after the migration: allowSpecialPurpose %v, maxBlocksPerNode %v", name, got.Spec.AllowSpecialPurpose, got.Spec.MaxBlocksPerNode)
		}
		// Its own spec written back is accepted.
		if _, err := f.s.UpdatePool(f.ctx, alloc.DefaultSpace, name, got.Labels, got.Spec); err != nil {
			t.Errorf("pool %s: writing its spec back: %v", name, err)
		}
	}
	// The loopback pool still leases.
	r := req("n1", "c1", alloc.IPv4)
	r.Pool = "lo"
	if a := f.allocate(r); !netip.MustParsePrefix("127.0.0.0/16").Contains(a.Leases[0].Addr) {
		t.Fatalf("lease %+v", a.Leases[0])
	}
}
