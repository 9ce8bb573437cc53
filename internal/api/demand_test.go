// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// blocksOf answers the node's block CIDRs through the API.
func (e *env) blocksOf(node string) []string {
	var l ipamv1.BlockList
	e.mustDo(200, "GET", "/v1/nodes/"+node+"/blocks", nil, &l)
	var out []string
	for _, b := range l.Items {
		out = append(out, b.Cidr)
	}
	return out
}

func (e *env) rebalance() store.Rebalanced {
	e.t.Helper()
	r, err := e.store.Rebalance(e.t.Context())
	if err != nil {
		e.t.Fatalf("rebalance: %v", err)
	}
	return r
}

func (e *env) lease(node, pool, container string) ipamv1.Allocation {
	e.t.Helper()
	var a ipamv1.Allocation
	body := map[string]any{"owner": map[string]string{"namespace": "ns", "name": container},
		"containerID": container, "interface": "eth0", "expire": false}
	if pool != "" {
		body["pool"] = pool
	}
	e.mustDo(201, "POST", "/v1/nodes/"+node+"/leases", body, &a)
	return a
}

// usageOf answers the node's use of one pool family through the API, and
// fails unless the node lists it.
func (e *env) usageOf(node, pool string, f ipamv1.Family) ipamv1.NodePoolUsage {
	e.t.Helper()
	var u ipamv1.NodeUsage
	e.mustDo(200, "GET", "/v1/nodes/"+node+"/pools", nil, &u)
	for _, it := range u.Items {
		if it.Pool == pool && it.Family == f {
			return it
		}
	}
	e.t.Fatalf("node %s lists no %s %s: %s", node, pool, f, dump(u))
	return ipamv1.NodePoolUsage{}
}

// wantUsage compares the figures of a node pool usage that change as
// Pods come and go.
func (e *env) wantUsage(node, pool string, blocks, capacity, leased, released, needed, available, deficit int64) {
	e.t.Helper()
	u := e.usageOf(node, pool, ipamv1.Ipv4)
	got := []int64{u.Blocks, u.Capacity, u.Leased, u.Released, u.Needed, u.Available, u.Deficit}
	want := []int64{blocks, capacity, leased, released, needed, available, deficit}
	if !slices.Equal(got, want) {
		e.t.Fatalf("node %s pool %s usage [blocks capacity leased released needed available deficit] = %v, want %v",
			node, pool, got, want)
	}
}

// A node's multi-pool blocks follow its Pods: the pre-allocation is carved
// before the first Pod, demand past two blocks carves a third
// (neededIPCeil(20, 8) = 32 > 2 x 12), and once the Pods are gone and the
// hold-off has passed, the free blocks above the need (8) go back to the
// pool, newest first, keeping the one that covers the need.
func TestDemandBlocksFollowPods(t *testing.T) {
	t.Parallel()
	const holdOff = 3 * time.Minute
	e := newEnvWith(t, nil, func(o *store.Options) { o.BlockReleaseHoldOff = holdOff })
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default",
		"spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.10.0.0/24"}, "maskSize": 28}}}, nil)
	e.mustDo(201, "PUT", "/v1/nodes/n1", map[string]any{}, nil)
	// The node's view shows the pre-allocation it lacks before any block.
	if u := e.usageOf("n1", "default", ipamv1.Ipv4); u.PreAllocate != 8 || u.Mode != ipamv1.MultiPool || u.AtCapacity {
		t.Fatalf("usage %s", dump(u))
	}
	e.wantUsage("n1", "default", 0, 0, 0, 0, 8, 0, 8)

	// Before any Pod: the default pool's pre-allocation of 8 asks one /28
	// (12 leasable addresses: 16 - network, broadcast, router, health).
	if r := e.rebalance(); r.Carved != 1 {
		t.Fatalf("pre-allocation carved %d blocks, want 1", r.Carved)
	}
	if got := e.blocksOf("n1"); !slices.Equal(got, []string{"10.10.0.0/28"}) {
		t.Fatalf("blocks %v", got)
	}
	for i := range 20 {
		e.lease("n1", "", fmt.Sprint("c", i))
	}
	if got := e.blocksOf("n1"); len(got) != 2 {
		t.Fatalf("after 20 leases the lease path carved to %v, want 2 blocks", got)
	}
	e.wantUsage("n1", "default", 2, 24, 20, 0, 32, 4, 8)
	// Demand 20 needs 32: a third block.
	if r := e.rebalance(); r.Carved != 1 || r.Released != 0 {
		t.Fatalf("rebalance at demand 20: %+v, want 1 carved", r)
	}
	if got := e.blocksOf("n1"); len(got) != 3 {
		t.Fatalf("blocks %v, want 3", got)
	}
	e.wantUsage("n1", "default", 3, 36, 20, 0, 32, 16, 0)
	// Balanced: nothing to do.
	if r := e.rebalance(); r != (store.Rebalanced{}) {
		t.Fatalf("second rebalance %+v", r)
	}

	for i := range 20 {
		e.mustDo(204, "DELETE", fmt.Sprintf("/v1/nodes/n1/attachments/c%d/eth0", i), nil, nil)
	}
	// Cooling addresses are still demand.
	e.wantUsage("n1", "default", 3, 36, 0, 20, 32, 16, 0)
	if r := e.rebalance(); r.Released != 0 {
		t.Fatalf("released %d blocks while addresses cool", r.Released)
	}
	e.clock.Advance(testCooldown + time.Second)
	if n, err := e.store.PurgeCooled(t.Context()); err != nil || n != 20 {
		t.Fatalf("purged %d, %v", n, err)
	}
	e.wantUsage("n1", "default", 3, 36, 0, 0, 8, 36, 0)
	// Empty, but not for the hold-off yet.
	if r := e.rebalance(); r.Released != 0 {
		t.Fatalf("released %d blocks before the hold-off", r.Released)
	}
	e.clock.Advance(holdOff)
	if r := e.rebalance(); r.Released != 2 || r.Carved != 0 {
		t.Fatalf("rebalance after the hold-off: %+v, want 2 released", r)
	}
	if got := e.blocksOf("n1"); !slices.Equal(got, []string{"10.10.0.0/28"}) {
		t.Fatalf("blocks %v, want the oldest only", got)
	}
	e.wantUsage("n1", "default", 1, 12, 0, 0, 8, 12, 0)
	// An unknown node is a 404 naming it.
	e.mustDo(404, "GET", "/v1/nodes/n9/pools", nil, nil)
	var p ipamv1.Pool
	e.mustDo(200, "GET", "/v1/pools/default", nil, &p)
	if p.Status.Ipv4.BlocksCarved != 1 {
		t.Fatalf("pool status %+v", p.Status.Ipv4)
	}
}

// A pool with no pre-allocation carves nothing ahead, and a node whose
// Pods left gives every block back.
func TestDemandWithoutPreAllocation(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, nil, func(o *store.Options) { o.BlockReleaseHoldOff = time.Minute })
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "mars",
		"spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.20.0.0/24"}, "maskSize": 28}}}, nil)
	e.mustDo(201, "PUT", "/v1/nodes/n1", map[string]any{}, nil)
	if r := e.rebalance(); r.Carved != 0 {
		t.Fatalf("carved %d with preAllocate 0", r.Carved)
	}
	e.lease("n1", "mars", "c0")
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/c0/eth0", nil, nil)
	e.clock.Advance(testCooldown + time.Second)
	if _, err := e.store.PurgeCooled(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	if r := e.rebalance(); r.Released != 1 {
		t.Fatalf("released %d, want 1", r.Released)
	}
	if got := e.blocksOf("n1"); len(got) != 0 {
		t.Fatalf("blocks %v", got)
	}
}

// The capacity report agrees with counts taken directly in the database,
// and with a brute-force count of the blocks still free.
func TestPoolCapacityMatchesDatabase(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": map[string]any{
		"ipv4": map[string]any{"cidrs": []string{"10.30.0.0/26", "10.31.0.0/27"}, "maskSize": 29,
			"pool": []map[string]any{{"cidr": "10.31.0.0/27", "reservedRanges": []map[string]string{{"start": "10.31.0.8", "end": "10.31.0.15"}}}}},
		"ipv6": map[string]any{"cidrs": []string{"fd00:30::/120"}, "maskSize": 124},
	}}, nil)
	// 4 leasable per /29 (8 - network, broadcast, router, health); n1
	// takes two blocks.
	for i := range 7 {
		e.lease("n1", "", fmt.Sprint("a", i))
	}
	for i := range 2 {
		e.lease("n2", "", fmt.Sprint("b", i))
	}
	e.mustDo(204, "DELETE", "/v1/nodes/n2/attachments/b1/eth0", nil, nil)

	var c ipamv1.PoolCapacity
	e.mustDo(200, "GET", "/v1/pools/default/capacity", nil, &c)
	for _, fc := range []struct {
		fam string
		got *ipamv1.FamilyCapacity
	}{{"4", c.Ipv4}, {"6", c.Ipv6}} {
		if fc.got == nil {
			t.Fatalf("family %s missing: %+v", fc.fam, c)
		}
		// Each query filters blocks b by family (%[1]s); $1 is now.
		q := func(sql string) int64 {
			var n int64
			if err := e.db.QueryRow(t.Context(), fmt.Sprintf(sql, fc.fam), e.clock.Now()).Scan(&n); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
			return n
		}
		want := ipamv1.FamilyCapacity{
			BlocksCarved:      q(`SELECT count(*) FROM blocks b WHERE b.family = %s AND $1::timestamptz IS NOT NULL`),
			AddressesInBlocks: q(`SELECT coalesce(sum(capacity), 0) FROM blocks b WHERE b.family = %s AND $1::timestamptz IS NOT NULL`),
			Leased:            q(`SELECT count(*) FROM leases l JOIN blocks b ON b.id = l.block_id WHERE b.family = %s AND l.state <> 'released' AND $1::timestamptz IS NOT NULL`),
			Cooling:           q(`SELECT count(*) FROM leases l JOIN blocks b ON b.id = l.block_id WHERE b.family = %s AND l.state = 'released' AND l.cooldown_until > $1`),
			NodesWithBlocks:   q(`SELECT count(DISTINCT node_id) FROM blocks b WHERE b.family = %s AND $1::timestamptz IS NOT NULL`),
			NodesAtCapacity: q(`SELECT count(*) FROM (SELECT b.node_id FROM blocks b WHERE b.family = %s AND $1::timestamptz IS NOT NULL
				GROUP BY b.node_id HAVING bool_and(b.allocated = b.capacity)) x`),
		}
		got := *fc.got
		if got.BlocksCarved != want.BlocksCarved || got.AddressesInBlocks != want.AddressesInBlocks || got.Leased != want.Leased ||
			got.Cooling != want.Cooling || got.NodesWithBlocks != want.NodesWithBlocks || got.NodesAtCapacity != want.NodesAtCapacity ||
			got.Free != got.AddressesInBlocks-got.Leased-got.Cooling {
			t.Errorf("ipv%s: capacity %s, database %s", fc.fam, dump(got), dump(want))
		}
	}
	if c.Ipv4.Leased != 8 || c.Ipv4.Cooling != 1 || c.Ipv4.BlocksPossible != 12 || c.Ipv4.AddressesPossible != 48 {
		t.Errorf("ipv4 %s", dump(c.Ipv4))
	}

	// Free blocks by brute force: every aligned /29 of the CIDRs that no
	// block and no reserved range touches.
	var carved []netip.Prefix
	rows, err := e.db.Query(t.Context(), `SELECT cidr FROM blocks WHERE family = 4`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p netip.Prefix
		if err := rows.Scan(&p); err != nil {
			t.Fatal(err)
		}
		carved = append(carved, p)
	}
	reserved := alloc.AddrRange{Start: netip.MustParseAddr("10.31.0.8"), End: netip.MustParseAddr("10.31.0.15")}
	var free int64
	for _, cidr := range []string{"10.30.0.0/26", "10.31.0.0/27"} {
		parent := netip.MustParsePrefix(cidr)
		for i := range alloc.BlockCount(parent, 29) {
			b := alloc.BlockAt(parent, 29, i)
			if !slices.ContainsFunc(carved, b.Overlaps) && !reserved.Overlaps(b) {
				free++
			}
		}
	}
	if c.Ipv4.FreeBlocks != free {
		t.Errorf("free blocks %d, brute force %d", c.Ipv4.FreeBlocks, free)
	}
	// Blocks went out of 10.30.0.0/26 from its start, so its upper /27 is
	// the largest free prefix.
	if c.Ipv4.LargestFreeBlock == nil || *c.Ipv4.LargestFreeBlock != "10.30.0.32/27" {
		t.Errorf("largest free block %v", c.Ipv4.LargestFreeBlock)
	}

	e.mustDo(400, "GET", "/v1/pools/default/capacity?window=1m", nil, nil)
	e.mustDo(404, "GET", "/v1/pools/nope/capacity", nil, nil)
}

// The forecast follows a synthetic allocation rate: 3 net allocations a
// minute, sampled every minute for an hour, is 180 an hour, and the pool
// is full when its remaining addresses run out at that rate.
func TestPoolCapacityForecast(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default",
		"spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.40.0.0/20"}, "maskSize": 24}}}, nil)
	var c ipamv1.PoolCapacity
	e.mustDo(200, "GET", "/v1/pools/default/capacity", nil, &c)
	if c.Ipv4.Forecast.HoursToFull != nil || c.Ipv4.Forecast.Samples != 0 {
		t.Fatalf("forecast without samples: %s", dump(c.Ipv4.Forecast))
	}
	n := 0
	for minute := 0; minute <= 60; minute++ {
		if _, err := e.store.SampleUsage(t.Context(), time.Minute); err != nil {
			t.Fatal(err)
		}
		for range 4 {
			e.lease(fmt.Sprint("n", n%4), "", fmt.Sprint("c", n))
			n++
		}
		// One of the four leaves: the rate is net.
		e.mustDo(204, "DELETE", fmt.Sprintf("/v1/nodes/n%d/attachments/c%d/eth0", (n-1)%4, n-1), nil, nil)
		e.clock.Advance(time.Minute)
		// The server's maintenance purges cooled addresses every few
		// seconds; until then they are in use.
		if _, err := e.store.PurgeCooled(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	// A second replica's sample a moment later is skipped.
	if got, err := e.store.SampleUsage(t.Context(), time.Minute); err != nil || got == 0 {
		t.Fatalf("sample after a minute: %d, %v", got, err)
	}
	if got, err := e.store.SampleUsage(t.Context(), time.Minute); err != nil || got != 0 {
		t.Fatalf("sample right after another: %d, %v", got, err)
	}
	e.mustDo(200, "GET", "/v1/pools/default/capacity?window=1h", nil, &c)
	f := c.Ipv4.Forecast
	if math.Abs(f.RatePerHour-180) > 180*0.02 {
		t.Fatalf("rate %.2f/h, want 180 (%s)", f.RatePerHour, dump(f))
	}
	// 16 /24 blocks of 252 leasable addresses (256 - 2 - router, health).
	var used int64
	if err := e.db.QueryRow(t.Context(), `SELECT sum(allocated) FROM blocks`).Scan(&used); err != nil {
		t.Fatal(err)
	}
	want := float64(16*252-used) / f.RatePerHour
	if f.HoursToFull == nil || math.Abs(*f.HoursToFull-want) > 0.01*want {
		t.Fatalf("hours to full %v, want %.2f (%s)", f.HoursToFull, want, dump(f))
	}
	if c.Ipv4.AddressesPossible != 16*252 {
		t.Fatalf("possible %d", c.Ipv4.AddressesPossible)
	}
}

// canLeaseOf answers, per "pool/family", the canLease of the node's usage
// of the pools the query names.
func (e *env) canLeaseOf(node, query string) (string, map[string]bool) {
	e.t.Helper()
	var u ipamv1.NodeUsage
	e.mustDo(200, "GET", "/v1/nodes/"+node+"/pools?"+query, nil, &u)
	out := map[string]bool{}
	for _, it := range u.Items {
		out[it.Pool+"/"+string(it.Family)] = it.CanLease
	}
	return u.DefaultPool, out
}

// With ?pool= the node's view lists the named pools whether or not it
// holds blocks of them, and says whether a lease would find an address:
// a free one, a cooled one, or a block to carve; not when the pool is full,
// disabled, or a cluster-pool node range is full. A node not registered yet
// is answered as one without blocks. This is what the CNI STATUS reads.
func TestNodeUsageCanLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	// One /29: 4 leasable addresses (8 - network, broadcast, router, health).
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "tiny",
		"spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.40.0.0/29"}, "maskSize": 29}}}, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default",
		"spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.41.0.0/24"}, "maskSize": 28},
			"ipv6": map[string]any{"cidrs": []string{"fd00:41::/120"}, "maskSize": 124}}}, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "off",
		"spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.42.0.0/24"}, "maskSize": 28}, "disabled": true}}, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "fixed",
		"spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.43.0.0/24"}, "maskSize": 29}, "mode": "cluster-pool"}}, nil)

	def, got := e.canLeaseOf("n1", "pool=tiny&pool=off&defaultPool=true")
	want := map[string]bool{"tiny/ipv4": true, "default/ipv4": true, "default/ipv6": true, "off/ipv4": false}
	if def != "default" || !maps.Equal(got, want) {
		t.Fatalf("unknown node: default %q, canLease %v, want %v", def, got, want)
	}
	for i := range 4 {
		e.lease("n1", "tiny", fmt.Sprint("t", i))
	}
	if _, got := e.canLeaseOf("n1", "pool=tiny"); !maps.Equal(got, map[string]bool{"tiny/ipv4": false}) {
		t.Fatalf("full pool: %v", got)
	}
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/t0/eth0", nil, nil)
	if _, got := e.canLeaseOf("n1", "pool=tiny"); got["tiny/ipv4"] {
		t.Fatal("an address in its cooldown counts as leasable")
	}
	e.clock.Advance(testCooldown + time.Second)
	if _, got := e.canLeaseOf("n1", "pool=tiny"); !got["tiny/ipv4"] {
		t.Fatal("a cooled address does not count as leasable")
	}

	// A cluster-pool node range full, while the pool has free blocks.
	for i := range 4 {
		e.lease("n1", "fixed", fmt.Sprint("f", i))
	}
	if _, got := e.canLeaseOf("n1", "pool=fixed"); got["fixed/ipv4"] {
		t.Fatal("a full cluster-pool node range counts as leasable")
	}
	if _, got := e.canLeaseOf("n2", "pool=fixed"); !got["fixed/ipv4"] {
		t.Fatal("another node's first cluster-pool block does not count")
	}

	// A node at the pool's per-node block limit, while the pool has free
	// blocks: a lease would be refused node-block-limit.
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "capped",
		"spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.44.0.0/24"}, "maskSize": 29}, "maxBlocksPerNode": 1}}, nil)
	for i := range 4 {
		e.lease("n1", "capped", fmt.Sprint("c", i))
	}
	if r := e.do("POST", "/v1/nodes/n1/leases", leaseWith("pool", "capped", "containerID", "c4")); r.status != 409 ||
		!strings.Contains(string(r.body), "node-block-limit") {
		t.Fatalf("a fifth lease of a node at its block limit: %d %s", r.status, r.body)
	}
	if _, got := e.canLeaseOf("n1", "pool=capped"); got["capped/ipv4"] {
		t.Fatal("a node at its block limit counts as leasable")
	}
	if _, got := e.canLeaseOf("n2", "pool=capped"); !got["capped/ipv4"] {
		t.Fatal("another node of the capped pool does not count")
	}

	// Bad names, unknown pools and unknown spaces are refused.
	e.mustDo(404, "GET", "/v1/nodes/n1/pools?pool=none-such", nil, nil)
	e.mustDo(400, "GET", "/v1/nodes/n1/pools?pool=Not_A_Label", nil, nil)
	e.mustDo(400, "GET", "/v1/nodes/n1/pools?pool=a&pool=b&pool=c&pool=d&pool=e&pool=f&pool=g&pool=h&pool=i", nil, nil)
	e.mustDo(404, "GET", "/v1/nodes/n1/pools?pool=tiny&space=nowhere", nil, nil)
}
