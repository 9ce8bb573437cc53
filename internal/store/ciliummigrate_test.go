// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"slices"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// migrationReasons lists, per block, the reasons the node's history
// records for it.
func (f *fixture) migrationReasons(node string) map[string][]string {
	f.t.Helper()
	events, _, err := f.s.History(f.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: node}, alloc.Page{Limit: 100})
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string][]string{}
	for _, ev := range events {
		if ev.Block.IsValid() {
			out[ev.Block.String()] = append(out[ev.Block.String()], ev.Reason)
		}
	}
	return out
}

// A cluster-pool node's blocks become its blocks of the default pool,
// which turns multi-pool in place: the same CIDRs, the same node, every
// block's move in the history, and again is a no-op for the blocks. A node
// refused for one CIDR moves none (all or none), holds what the pool can
// give it, and the refusal names every refused entry.
func TestMigrateClusterPoolNode(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.AutoRegisterNodes = false })
	f.pool("default", alloc.PoolSpec{Mode: alloc.ModeClusterPool, IPv4: fam(26, "10.53.0.0/24"), IPv6: fam(122, "fd00:53::/120")})
	blocks, err := f.s.ClusterPoolBlocks(f.ctx, alloc.DefaultSpace, "a", "default", nil)
	if err != nil || len(blocks) != 2 {
		t.Fatalf("cluster-pool blocks %v: %v", blocks, err)
	}
	for range 2 {
		if err := f.s.MigrateClusterPoolNode(f.ctx, alloc.DefaultSpace, "a", "default", blocks); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.nodeBlockCIDRs("a"); !slices.Equal(got, strs(blocks)) {
		t.Errorf("node a holds %v after the migration; want %v", got, blocks)
	}
	p, err := f.s.GetPool(f.ctx, alloc.DefaultSpace, "default")
	if err != nil || p.Spec.EffectiveMode() != alloc.ModeMultiPool {
		t.Errorf("the default pool after the migration: %+v, %v", p.Spec, err)
	}
	reasons := f.migrationReasons("a")
	for _, b := range blocks {
		if !slices.Contains(reasons[b.String()], reasonCiliumMigrated) {
			t.Errorf("%s's history: %v", b, reasons[b.String()])
		}
	}
	// The multi-pool rounds see the blocks as the agent's.
	st := f.syncAgent("a", agentPools(map[string][]string{"default": strs(blocks)}))
	if got := poolCIDRs(st, "default"); !slices.Equal(got, strs(blocks)) || !st.NextRelease.IsZero() {
		t.Errorf("the multi-pool sync after the migration: %+v", st)
	}

	// Node b lists a free block of the pool and one outside it.
	err = f.s.MigrateClusterPoolNode(f.ctx, alloc.DefaultSpace, "b", "default", prefixes("10.53.0.128/26", "fd00:99::/122", "10.53.0.0/26"))
	e := wantKind(t, err, alloc.KindInvalid)
	if e.Field != "podCIDRs[1]" || !strings.Contains(e.Detail, "podCIDRs[1]: cidr fd00:99::/122") || !strings.Contains(e.Detail, "podCIDRs[2]: 10.53.0.0/26 overlaps block 10.53.0.0/26 of node a") {
		t.Errorf("refusal %+v", e)
	}
	// Held, not migrated: the free block is b's, the history says why.
	if got := f.nodeBlockCIDRs("b"); !slices.Equal(got, []string{"10.53.0.128/26"}) {
		t.Errorf("node b holds %v; want the free block held", got)
	}
	if got := f.migrationReasons("b")["10.53.0.128/26"]; !slices.Equal(got, []string{reasonCiliumMigrationHeld}) {
		t.Errorf("the held block's history: %v", got)
	}
	if got := f.nodeBlockCIDRs("a"); !slices.Equal(got, strs(blocks)) {
		t.Errorf("node a holds %v after b's refusal", got)
	}
	err = f.s.MigrateClusterPoolNode(f.ctx, alloc.DefaultSpace, "c", "missing", prefixes("10.53.0.192/26"))
	if e := wantKind(t, err, alloc.KindNotFound); e.Field != "pool" {
		t.Errorf("no default pool: %+v", e)
	}
	f.checkClean()
}
