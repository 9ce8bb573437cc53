// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// nodeBlockCIDRs lists a node's blocks in the store (returned ones too).
func (f *fixture) nodeBlockCIDRs(node string) []string {
	f.t.Helper()
	var out []string
	rows, err := f.s.db.Query(f.ctx, `SELECT b.cidr::text FROM blocks b JOIN nodes n ON n.id = b.node_id
		WHERE n.name = $1 ORDER BY b.family, b.cidr`, node)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

func strs(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// Cilium's cluster-pool operator role: every node gets one block per
// family of the cluster pool, and the same ones on every call; a node the
// pool cannot serve gets an "allocator full" exhaustion error, and is
// served once another node's blocks are gone.
func TestClusterPoolBlocks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.AutoRegisterNodes = false }) // the operator registers its nodes itself
	f.pool("cluster", alloc.PoolSpec{Mode: alloc.ModeClusterPool, IPv4: fam(26, "10.50.0.0/25"), IPv6: fam(122, "fd00:50::/120")})
	seen := map[netip.Prefix]string{}
	for _, n := range []string{"a", "b"} {
		got, err := f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, n, "cluster", nil)
		if err != nil {
			t.Fatalf("node %s: %v", n, err)
		}
		if len(got) != 2 || !got[0].Addr().Is4() || !got[1].Addr().Is6() || got[0].Bits() != 26 || got[1].Bits() != 122 {
			t.Fatalf("node %s: blocks %v; want one /26 and one /122, IPv4 first", n, got)
		}
		for _, c := range got {
			if o, dup := seen[c]; dup {
				t.Fatalf("%s given to %s and %s", c, o, n)
			}
			seen[c] = n
		}
		again, err := f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, n, "cluster", got)
		if err != nil || !slices.Equal(again, got) {
			t.Fatalf("node %s again: %v, %v; want %v", n, again, err, got)
		}
	}
	// The IPv4 /25 holds two /26: the third node has no IPv4 block.
	got, err := f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "c", "cluster", nil)
	if e := wantKind(t, err, alloc.KindPoolExhausted); e.Pool != "cluster" || e.Family != alloc.IPv4 {
		t.Fatalf("exhaustion error %+v", e)
	}
	if len(got) != 1 || !got[0].Addr().Is6() {
		t.Fatalf("node c holds %v; want its IPv6 block only", got)
	}
	if err := f.s.DeleteNode(f.ctx, alloc.DefaultSpace, "a", false); err != nil {
		t.Fatal(err)
	}
	got, err = f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "c", "cluster", got)
	if err != nil || len(got) != 2 || seen[got[0]] != "a" {
		t.Fatalf("node c after a left: %v, %v; want a's IPv4 block and its own IPv6 one", got, err)
	}
}

// A node that lists podCIDRs already (given by an operator before this
// one) keeps them when they are free blocks of the cluster pool; other
// lists are refused, naming the field, and change nothing.
func TestClusterPoolBlocksAdoptsListedCIDRs(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("cluster", alloc.PoolSpec{Mode: alloc.ModeClusterPool, IPv4: fam(26, "10.51.0.0/24")})
	f.pool("multi", alloc.PoolSpec{IPv4: fam(26, "10.52.0.0/24")})
	got, err := f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "a", "cluster", prefixes("10.51.0.128/26"))
	if err != nil || !slices.Equal(strs(got), []string{"10.51.0.128/26"}) {
		t.Fatalf("adopting: %v, %v", got, err)
	}
	// Cilium's message for a node listing another block than it holds.
	_, err = f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "a", "cluster", prefixes("10.51.0.0/26"))
	if e := wantKind(t, err, alloc.KindConflict); e.Detail != "node has CIDRs allocated (10.51.0.128/26) that conflict with requested CIDRs (10.51.0.0/26)" {
		t.Fatalf("conflict detail %q", e.Detail)
	}
	_, err = f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "b", "cluster", prefixes("10.51.0.128/26"))
	wantKind(t, err, alloc.KindOverlap)
	_, err = f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "b", "cluster", prefixes("10.52.0.0/26"))
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "podCIDRs[0]" {
		t.Fatalf("field %q", e.Field)
	}
	_, err = f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "b", "cluster", prefixes("10.51.0.0/25"))
	wantKind(t, err, alloc.KindInvalid) // not of the pool's mask
	_, err = f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "b", "multi", nil)
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "pool" {
		t.Fatalf("a multi-pool pool as the cluster pool: %+v", e)
	}
	_, err = f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "b", "none", nil)
	wantKind(t, err, alloc.KindNotFound)
	if got := f.nodeBlockCIDRs("b"); len(got) != 0 {
		t.Fatalf("refused calls left node b with %v", got)
	}
	if got := f.nodeBlockCIDRs("a"); !slices.Equal(got, []string{"10.51.0.128/26"}) {
		t.Fatalf("node a holds %v", got)
	}
}

// agentPools is a shorthand for an agent's report.
func agentPools(alloced map[string][]string, reqs ...alloc.PoolRequest) alloc.AgentPools {
	r := alloc.AgentPools{Allocated: map[string][]netip.Prefix{}, Requested: reqs}
	for pool, cs := range alloced {
		r.Allocated[pool] = prefixes(cs...)
	}
	return r
}

func (f *fixture) syncAgent(node string, r alloc.AgentPools) alloc.AgentPoolsState {
	f.t.Helper()
	st, err := f.s.SyncAgentPools(f.ctx, alloc.DefaultSpace, node, r)
	if err != nil {
		f.t.Fatalf("SyncAgentPools %s: %v", node, err)
	}
	return st
}

// poolCIDRs is what the answer says the agent lists for pool.
func poolCIDRs(st alloc.AgentPoolsState, pool string) []string {
	for _, p := range st.Pools {
		if p.Pool == pool {
			return strs(p.CIDRs)
		}
	}
	return nil
}

// The node's blocks of a requested pool cover the agent's need, a block
// at a time, counting Cilium's addresses per block (a /27 gives 30); the
// need is per family; a bigger need adds blocks, a smaller one removes
// none (the agent returns blocks itself).
func TestSyncAgentPoolsCoversTheNeed(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.AutoRegisterNodes = false })
	f.pool("default", alloc.PoolSpec{IPv4: fam(27, "10.60.0.0/24"), IPv6: fam(123, "fd00:60::/120"), AllowLastIP: true})
	st := f.syncAgent("a", agentPools(nil, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	if got := poolCIDRs(st, "default"); !slices.Equal(got, []string{"10.60.0.0/27"}) || len(st.Errors) != 0 {
		t.Fatalf("need 8: %v, errors %v", got, st.Errors)
	}
	if len(st.Pools) != 1 || !st.Pools[0].AllowLastIP || st.Pools[0].AllowFirstIP {
		t.Fatalf("pool flags %+v; want allowLastIP only", st.Pools)
	}
	// allowLastIP: a /27 gives 31, so 31 fits one block and 32 takes two.
	st = f.syncAgent("a", agentPools(map[string][]string{"default": {"10.60.0.0/27"}}, alloc.PoolRequest{Pool: "default", IPv4: 31}))
	if got := poolCIDRs(st, "default"); len(got) != 1 {
		t.Fatalf("need 31: %v", got)
	}
	st = f.syncAgent("a", agentPools(map[string][]string{"default": {"10.60.0.0/27"}},
		alloc.PoolRequest{Pool: "default", IPv4: 100, IPv6: 40}))
	if got, want := poolCIDRs(st, "default"), []string{"10.60.0.0/27", "10.60.0.32/27", "10.60.0.64/27", "10.60.0.96/27",
		"fd00:60::/123", "fd00:60::20/123"}; !slices.Equal(got, want) {
		t.Fatalf("need 100 + 40: %v, want %v", got, want)
	}
	all := poolCIDRs(st, "default")
	st = f.syncAgent("a", agentPools(map[string][]string{"default": all}, alloc.PoolRequest{Pool: "default", IPv4: 1}))
	if got := poolCIDRs(st, "default"); !slices.Equal(got, all) {
		t.Fatalf("a smaller need took blocks the agent lists: %v, had %v", got, all)
	}
}

// A block the agent stops listing stays the node's for the hold-off (no
// other node gets it), is taken back when the need grows meanwhile, and
// goes back to its pool once the hold-off has passed.
func TestSyncAgentPoolsReturnedBlocksHoldOff(t *testing.T) {
	t.Parallel()
	const holdOff = 3 * time.Minute
	f := newFixture(t, func(o *Options) { o.BlockReleaseHoldOff = holdOff })
	f.pool("default", alloc.PoolSpec{IPv4: fam(27, "10.61.0.0/26")}) // two blocks
	st := f.syncAgent("a", agentPools(nil, alloc.PoolRequest{Pool: "default", IPv4: 60}))
	both := poolCIDRs(st, "default")
	if len(both) != 2 {
		t.Fatalf("need 60: %v", both)
	}
	// The agent's Pods left: it keeps the first block and returns the second.
	returnedAt := f.clock.Now()
	st = f.syncAgent("a", agentPools(map[string][]string{"default": both[:1]}, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	if got := poolCIDRs(st, "default"); !slices.Equal(got, both[:1]) {
		t.Fatalf("after the return the agent is to list %v; want %v", got, both[:1])
	}
	if !st.NextRelease.Equal(returnedAt.Add(holdOff)) {
		t.Fatalf("NextRelease %v; want %v", st.NextRelease, returnedAt.Add(holdOff))
	}
	if got := f.nodeBlockCIDRs("a"); !slices.Equal(got, both) {
		t.Fatalf("the node holds %v during the hold-off; want both %v", got, both)
	}
	stb := f.syncAgent("b", agentPools(nil, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	if len(stb.Errors) != 1 || stb.Errors[0].Kind != alloc.KindPoolExhausted || len(stb.Pools) != 0 {
		t.Fatalf("node b got %v, errors %v; want nothing, the pool is held", stb.Pools, stb.Errors)
	}
	// Within the hold-off the need grows again: the returned block
	// comes back, no other is carved.
	f.clock.Advance(time.Minute)
	st = f.syncAgent("a", agentPools(map[string][]string{"default": both[:1]}, alloc.PoolRequest{Pool: "default", IPv4: 40}))
	if got := poolCIDRs(st, "default"); !slices.Equal(got, both) || !st.NextRelease.IsZero() || len(st.Errors) != 0 {
		t.Fatalf("need 40 again: %v, next release %v, errors %v; want both blocks back", got, st.NextRelease, st.Errors)
	}
	// Returned again; a second before the hold-off ends it is still held.
	f.clock.Advance(time.Minute)
	returnedAt = f.clock.Now()
	f.syncAgent("a", agentPools(map[string][]string{"default": both[:1]}, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	f.clock.Advance(holdOff - time.Second)
	next, err := f.s.ReleaseReturnedBlocks(f.ctx, alloc.DefaultSpace, "a", prefixes(both[:1]...))
	if got := f.nodeBlockCIDRs("a"); err != nil || len(got) != 2 || !next.Equal(returnedAt.Add(holdOff)) {
		t.Fatalf("a second early: %v; node holds %v, next release %v", err, got, next)
	}
	f.clock.Advance(time.Second)
	st = f.syncAgent("a", agentPools(map[string][]string{"default": both[:1]}, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	if !st.NextRelease.Equal(f.clock.Now()) {
		t.Fatalf("the sync says the next release is at %v; want now, %v", st.NextRelease, f.clock.Now())
	}
	// A fresh read of the CiliumNode listing the block again keeps it.
	if next, err := f.s.ReleaseReturnedBlocks(f.ctx, alloc.DefaultSpace, "a", prefixes(both...)); err != nil || len(f.nodeBlockCIDRs("a")) != 2 || !next.IsZero() {
		t.Fatalf("listed again: %v; node holds %v, next %v", err, f.nodeBlockCIDRs("a"), next)
	}
	next, err = f.s.ReleaseReturnedBlocks(f.ctx, alloc.DefaultSpace, "a", prefixes(both[:1]...))
	if got := f.nodeBlockCIDRs("a"); err != nil || !slices.Equal(got, both[:1]) || !next.IsZero() {
		t.Fatalf("after the hold-off: %v; node holds %v, next release %v; want %v only", err, got, next, both[:1])
	}
	if n := f.count(`SELECT count(*) FROM address_events WHERE kind = 'block-release' AND block = $1`, both[1]); n != 1 {
		t.Fatalf("%d block-release events for %s; want 1", n, both[1])
	}
	stb = f.syncAgent("b", agentPools(nil, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	if got := poolCIDRs(stb, "default"); !slices.Equal(got, both[1:]) || len(stb.Errors) != 0 {
		t.Fatalf("node b: %v, errors %v; want the released %v", got, stb.Errors, both[1])
	}
}

// The agent listing a returned block again makes it its own again (its
// update crossed the return).
func TestSyncAgentPoolsRetakesListedBlocks(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.BlockReleaseHoldOff = 0 })
	f.pool("default", alloc.PoolSpec{IPv4: fam(27, "10.62.0.0/24")})
	st := f.syncAgent("a", agentPools(nil, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	one := poolCIDRs(st, "default")
	// Unlisted and unneeded: returned.
	st = f.syncAgent("a", agentPools(nil))
	if len(st.Pools) != 0 || st.NextRelease.IsZero() {
		t.Fatalf("unlisted: answer %v, next release %v; want it returned", st.Pools, st.NextRelease)
	}
	// Listed again (a copy of the node older than the operator's write
	// of the block looks like a return): the agent's again.
	st = f.syncAgent("a", agentPools(map[string][]string{"default": one}))
	if got := poolCIDRs(st, "default"); !slices.Equal(got, one) || !st.NextRelease.IsZero() {
		t.Fatalf("listed again: %v, next release %v; want %v held", got, st.NextRelease, one)
	}
	// Nothing listed and a need: the need takes the returned block back
	// before the release looks at it, so no other block is carved.
	st = f.syncAgent("a", agentPools(nil, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	if got := poolCIDRs(st, "default"); !slices.Equal(got, one) {
		t.Fatalf("unlisted block with a need: %v, want %v again", got, one)
	}
	// Nothing listed, nothing needed: returned, and without a hold-off
	// due at once; the release (after a fresh read) takes it.
	st = f.syncAgent("a", agentPools(nil))
	if len(st.Pools) != 0 || st.NextRelease.IsZero() || len(f.nodeBlockCIDRs("a")) != 1 {
		t.Fatalf("returned: answer %v, next release %v, node holds %v", st.Pools, st.NextRelease, f.nodeBlockCIDRs("a"))
	}
	if _, err := f.s.ReleaseReturnedBlocks(f.ctx, alloc.DefaultSpace, "a", nil); err != nil || len(f.nodeBlockCIDRs("a")) != 0 {
		t.Fatalf("released: %v; node holds %v", err, f.nodeBlockCIDRs("a"))
	}
	if _, err := f.s.ReleaseReturnedBlocks(f.ctx, alloc.DefaultSpace, "nobody", nil); err != nil {
		t.Fatalf("an unknown node: %v", err)
	}
}

// CIDRs the agent lists that the node does not hold are adopted when they
// are free blocks of their pool; otherwise they are answered as errors in
// Cilium's words, and nothing else of the sync fails.
func TestSyncAgentPoolsAdopts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(27, "10.63.0.0/24")})
	f.pool("other", alloc.PoolSpec{IPv4: fam(27, "10.64.0.0/24")})
	f.pool("cluster", alloc.PoolSpec{Mode: alloc.ModeClusterPool, IPv4: fam(27, "10.65.0.0/24")})
	stb := f.syncAgent("b", agentPools(nil, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	bs := poolCIDRs(stb, "default")
	st := f.syncAgent("a", agentPools(map[string][]string{
		"default": {"10.63.0.96/27", bs[0], "10.64.0.0/27", "10.63.0.128/26"},
		"gone":    {"10.70.0.0/27"},
		"cluster": {"10.65.0.0/27"},
	}, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	if got := poolCIDRs(st, "default"); !slices.Equal(got, []string{"10.63.0.96/27"}) {
		t.Fatalf("adopted %v; want 10.63.0.96/27 only", got)
	}
	kinds := map[string]alloc.Kind{}
	for _, e := range st.Errors {
		kinds[e.Pool+" "+e.Detail] = e.Kind
	}
	want := map[string]alloc.Kind{
		"default cidr " + bs[0] + " has already been allocated (block " + bs[0] + " of node b)": alloc.KindOverlap,
		"default cidr 10.64.0.0/27 is not part of the requested pool":                           alloc.KindInvalid,
		"default cidr 10.63.0.128/26 is a /26; pool default carves /27 blocks":                  alloc.KindInvalid,
		"gone unable to find pool gone, prefix 10.70.0.0/27 is still allocated to the node":     alloc.KindNotFound,
		"cluster cidr 10.65.0.0/27 is listed under pool cluster, which is a cluster-pool pool":  alloc.KindInvalid,
	}
	if len(kinds) != len(want) {
		t.Fatalf("errors %v; want %v", kinds, want)
	}
	for k, v := range want {
		if kinds[k] != v {
			t.Errorf("error %q: kind %q, want %q (all: %v)", k, kinds[k], v, kinds)
		}
	}
	if got := f.nodeBlockCIDRs("b"); !slices.Equal(got, bs) {
		t.Fatalf("node b holds %v after a listed its block; want %v", got, bs)
	}
	if n := f.count(`SELECT count(*) FROM blocks WHERE source = 'adopted'`); n != 1 {
		t.Fatalf("%d adopted blocks", n)
	}
}

// A need the pool cannot meet answers an error naming pool and family,
// with the blocks it could give committed; a pool that does not exist or
// lacks the family says so.
func TestSyncAgentPoolsShort(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("small", alloc.PoolSpec{IPv4: fam(27, "10.66.0.0/26")}) // two blocks, 60 addresses
	st := f.syncAgent("a", agentPools(nil,
		alloc.PoolRequest{Pool: "small", IPv4: 90, IPv6: 8},
		alloc.PoolRequest{Pool: "missing", IPv4: 8}))
	if got := poolCIDRs(st, "small"); len(got) != 2 {
		t.Fatalf("blocks %v; want the pool's two", got)
	}
	got := map[string]alloc.Kind{}
	for _, e := range st.Errors {
		got[e.Pool+"/"+e.Family.String()] = e.Kind
	}
	want := map[string]alloc.Kind{"small/ipv4": alloc.KindPoolExhausted, "small/ipv6": alloc.KindPoolExhausted, "missing/ipv4": alloc.KindNotFound}
	if len(got) != len(want) {
		t.Fatalf("errors %v; want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
}

// Rebalance leaves the space of Cilium's agents alone: it would count no
// lease in their blocks, return them under the agents' Pods, and carve
// pre-allocations nobody asked for. Elsewhere it does both.
func TestRebalanceSkipsAgentPoolsSpace(t *testing.T) {
	t.Parallel()
	for _, agents := range []bool{true, false} {
		f := newFixture(t, func(o *Options) {
			o.BlockReleaseHoldOff = 0
			if agents {
				o.AgentPoolsSpace = alloc.DefaultSpace
			}
		})
		f.pool("default", alloc.PoolSpec{IPv4: fam(27, "10.67.0.0/24")})
		st := f.syncAgent("a", agentPools(nil, alloc.PoolRequest{Pool: "default", IPv4: 100}))
		held := poolCIDRs(st, "default")
		if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "new"}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.s.Rebalance(f.ctx); err != nil {
			t.Fatal(err)
		}
		a, n := f.nodeBlockCIDRs("a"), f.nodeBlockCIDRs("new")
		if agents && (!slices.Equal(a, held) || len(n) != 0) {
			t.Fatalf("agents' space: after Rebalance a holds %v (had %v), new holds %v", a, held, n)
		}
		// Without the option Rebalance takes a's blocks down to its
		// pre-allocation and gives "new" one: what the option prevents.
		if !agents && (len(a) != 1 || len(n) != 1) {
			t.Fatalf("other space: a holds %v, new holds %v; want one block each", a, n)
		}
	}
}

// The nodes of a mode's agents are those holding blocks of such pools and
// no lease.
func TestAgentNodes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(27, "10.68.0.0/24")})
	f.pool("cluster", alloc.PoolSpec{Mode: alloc.ModeClusterPool, IPv4: fam(27, "10.69.0.0/24")})
	f.syncAgent("m1", agentPools(nil, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	f.syncAgent("m2", agentPools(nil, alloc.PoolRequest{Pool: "default", IPv4: 8}))
	if _, err := f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "c1", "cluster", nil); err != nil {
		t.Fatal(err)
	}
	f.allocate(req("leasing", "c0", alloc.IPv4)) // a node of the REST API, holding a default block
	got, err := f.s.AgentNodes(f.ctx, alloc.DefaultSpace, alloc.ModeMultiPool)
	if err != nil || !slices.Equal(got, []string{"m1", "m2"}) {
		t.Fatalf("multi-pool agent nodes %v, %v", got, err)
	}
	got, err = f.s.AgentNodes(f.ctx, alloc.DefaultSpace, alloc.ModeClusterPool)
	if err != nil || !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("cluster-pool agent nodes %v, %v", got, err)
	}
}

// A node Cilium's cluster-pool operator registered (it holds a block of a
// cluster-pool pool) gets no pre-allocation of the space's multi-pool
// pools: its agent allocates only inside its podCIDRs, so such blocks
// would be held for nobody (a /16 default pool of /24s was exhausted by
// 256 cluster-pool nodes). A node of the REST API still gets it.
func TestClusterPoolNodesGetNoMultiPoolPreAllocation(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.DefaultPool = "default" })
	f.pool("default", alloc.PoolSpec{IPv4: fam(27, "10.71.0.0/24")})
	f.pool("cluster", alloc.PoolSpec{Mode: alloc.ModeClusterPool, IPv4: fam(27, "10.72.0.0/24")})
	cp, err := f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "cilium-node", "cluster", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "api-node"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Rebalance(f.ctx); err != nil {
		t.Fatal(err)
	}
	var cpStrings []string
	for _, c := range cp {
		cpStrings = append(cpStrings, c.String())
	}
	if got := f.nodeBlockCIDRs("cilium-node"); !slices.Equal(got, cpStrings) {
		t.Errorf("the cluster-pool node holds %v after Rebalance; want only its podCIDRs %v", got, cpStrings)
	}
	// PutNode gives it its cluster-pool block too; Rebalance adds one of
	// the default pool.
	if got := f.nodeBlockCIDRs("api-node"); len(got) != 2 || !slices.ContainsFunc(got, func(c string) bool { return strings.HasPrefix(c, "10.71.") }) {
		t.Errorf("the REST API's node holds %v after Rebalance; want its pre-allocation of the default pool besides its cluster-pool block", got)
	}
}
