// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	iputil "github.com/cilium/cilium/pkg/ip"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The cluster-pool to multi-pool migration (migrate.go), Cilium's
// enable-cluster-pool-to-multi-pool-migration.

// migrationPool is the cluster's pool: cluster-pool at first, dual-stack,
// room for 16 nodes.
var migrationPool = alloc.PoolSpec{Mode: alloc.ModeClusterPool,
	IPv4: v4(26, "10.93.0.0/22"), IPv6: v6(122, "fd00:93::/118")}

// clusterPoolCluster runs the cluster-pool operator until every one of
// nodes lists its podCIDRs (one per family), stops it, and answers what
// each node lists.
func (e *crdEnv) clusterPoolCluster(nodes []string) map[string][]string {
	e.t.Helper()
	stop := e.blockOperator(ModeClusterPool, nil)
	for _, n := range nodes {
		e.createNode(n, nil)
	}
	listed := map[string][]string{}
	e.eventually(30*time.Second, "cluster-pool nodes served", func() (bool, string) {
		for _, n := range nodes {
			got := prefixStrings(e.get(n).Spec.IPAM.PodCIDRs)
			if len(got) != 2 {
				return false, fmt.Sprintf("%s lists %v", n, got)
			}
			listed[n] = got
		}
		return true, ""
	})
	stop()
	return listed
}

// podAddresses are n addresses per CIDR a cluster-pool agent would have
// given its Pods (from the second: the first is the network's).
func podAddresses(cidrs []string, n int) []netip.Addr {
	var out []netip.Addr
	for _, c := range cidrs {
		a := netip.MustParsePrefix(c).Addr()
		for range n {
			a = a.Next()
			out = append(out, a)
		}
	}
	return out
}

// A cluster in cluster-pool mode, 8 dual-stack nodes with Pods, is
// switched to multi-pool mode with the migration: every node then lists
// the same CIDRs under pools.allocated of the default pool and no
// podCIDRs, the store holds the same blocks for the same nodes (the pool
// turned multi-pool in place, each block's move in the history), the
// agents restarted in multi-pool mode keep every Pod's address, new nodes
// get blocks of their own, and the consistency check is clean.
func TestClusterPoolToMultiPoolMigration(t *testing.T) {
	e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{"default": migrationPool})
	var nodes []string
	for i := range 8 {
		nodes = append(nodes, fmt.Sprintf("cp-%d", i))
	}
	listed := e.clusterPoolCluster(nodes)
	before := map[string][]string{}
	for _, n := range nodes {
		before[n] = e.storeBlocks(n)
		if !slices.Equal(before[n], listed[n]) {
			t.Fatalf("cluster-pool: %s lists %v, the store holds %v", n, listed[n], before[n])
		}
	}

	e.blockOperator(ModeMultiPool, func(c *Config) { c.ClusterPoolToMultiPoolMigration = true })
	e.eventually(30*time.Second, "every node migrated", func() (bool, string) {
		for _, n := range nodes {
			cn := e.get(n)
			if len(cn.Spec.IPAM.PodCIDRs) > 0 || len(allocatedCIDRs(cn, "default")) == 0 {
				return false, fmt.Sprintf("%s: podCIDRs %v, pools %+v", n, cn.Spec.IPAM.PodCIDRs, cn.Spec.IPAM.Pools)
			}
		}
		return true, ""
	})
	p, err := e.st.GetPool(e.ctx, alloc.DefaultSpace, "default")
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.EffectiveMode() != alloc.ModeMultiPool {
		t.Errorf("the default pool is %s after the migration", p.Spec.EffectiveMode())
	}
	for _, n := range nodes {
		cn := e.get(n)
		got := allocatedCIDRs(cn, "default")
		slices.SortFunc(got, comparePrefixStrings)
		if !slices.Equal(got, listed[n]) || len(cn.Spec.IPAM.Pools.Allocated) != 1 {
			t.Errorf("%s listed podCIDRs %v; now pools %+v", n, listed[n], cn.Spec.IPAM.Pools.Allocated)
		}
		if msg := cn.Status.IPAM.OperatorStatus.Error; msg != "" {
			t.Errorf("%s: operator-status %q", n, msg)
		}
		if got := e.storeBlocks(n); !slices.Equal(got, before[n]) {
			t.Errorf("%s: the store held %v, now %v", n, before[n], got)
		}
		events, _, err := e.st.History(e.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: n}, alloc.Page{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range listed[n] {
			if !slices.ContainsFunc(events, func(ev alloc.Event) bool {
				return ev.Block.String() == c && ev.Pool == "default" && ev.Reason == "cilium-migrated-to-multi-pool"
			}) {
				t.Errorf("%s's history has no migration of %s: %+v", n, c, events)
			}
		}
	}

	// The agents restart in multi-pool mode, restoring their Pods'
	// addresses: none leaves its pool, and no block goes back.
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var agents []*mpAgent
	for _, n := range nodes {
		a := newMPAgent(t, e.client, n, map[string]int{"default": 8}, alloc.IPv4, alloc.IPv6)
		for _, addr := range podAddresses(listed[n], 5) {
			a.used[addr] = "default"
		}
		agents = append(agents, a)
	}
	// Four new nodes join, as multi-pool agents.
	for i := range 4 {
		a := newMPAgent(t, e.client, fmt.Sprintf("mp-%d", i), map[string]int{"default": 8}, alloc.IPv4, alloc.IPv6)
		if err := a.create(ctx); err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
	}
	for range 3 {
		for _, a := range agents {
			if err := a.sync(ctx); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	e.eventually(30*time.Second, "the new nodes served", func() (bool, string) {
		for _, a := range agents[len(nodes):] {
			if got := allocatedCIDRs(a.refresh(ctx), "default"); len(got) != 2 {
				return false, fmt.Sprintf("%s lists %v", a.name, got)
			}
		}
		return true, ""
	})
	for _, a := range agents {
		a.refresh(ctx)
		if lost := a.lostAddresses(); len(lost) > 0 {
			t.Errorf("%s lost Pod addresses: %v", a.name, lost)
		}
	}
	for _, n := range nodes {
		if got := e.storeBlocks(n); !slices.Equal(got, before[n]) {
			t.Errorf("%s after its agent restarted: the store held %v, now %v", n, before[n], got)
		}
	}
	e.noCIDROnTwoNodes("default")
	e.consistent()
}

// The migration runs before the first allocation: nodes another operator
// gave the pool's lowest blocks in cluster-pool mode (unknown to the
// store, whose default pool is multi-pool already, as Cilium's docs have
// the CiliumPodIPPool made first) keep them, and the new multi-pool nodes
// that waited for the operator with them, as many as the blocks left,
// get the others: none is carved a CIDR a node still listed in podCIDRs.
func TestClusterPoolMigrationBeforeAllocating(t *testing.T) {
	pool := alloc.PoolSpec{IPv4: v4(26, "10.97.0.0/22")} // 16 blocks
	e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{"default": pool})
	listed := map[string]string{}
	var agents []*mpAgent
	for i := range 8 {
		name := fmt.Sprintf("node-%02d", 2*i)
		listed[name] = fmt.Sprintf("10.97.%d.%d/26", i/4, i%4*64)
		e.createNode(name, func(cn *ciliumv2.CiliumNode) {
			cn.Spec.IPAM.PodCIDRs = []iputil.Prefix{iputil.PrefixFrom(netip.MustParsePrefix(listed[name]))}
		})
		a := newMPAgent(t, e.client, fmt.Sprintf("node-%02d", 2*i+1), map[string]int{"default": 8})
		if err := a.create(e.ctx); err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
	}
	e.blockOperator(ModeMultiPool, func(c *Config) { c.ClusterPoolToMultiPoolMigration = true })
	e.eventually(30*time.Second, "every node served", func() (bool, string) {
		for name := range listed {
			if cn := e.get(name); len(cn.Spec.IPAM.PodCIDRs) > 0 {
				return false, fmt.Sprintf("%s: podCIDRs %v, operator-status %q", name, cn.Spec.IPAM.PodCIDRs, cn.Status.IPAM.OperatorStatus.Error)
			}
		}
		for _, a := range agents {
			if got := allocatedCIDRs(a.refresh(e.ctx), "default"); len(got) != 1 {
				return false, fmt.Sprintf("%s lists %v", a.name, got)
			}
		}
		return true, ""
	})
	for name, cidr := range listed {
		cn := e.get(name)
		if got := allocatedCIDRs(cn, "default"); !slices.Equal(got, []string{cidr}) || cn.Status.IPAM.OperatorStatus.Error != "" {
			t.Errorf("%s listed %s; now %v, operator-status %q", name, cidr, got, cn.Status.IPAM.OperatorStatus.Error)
		}
		if got := e.storeBlocks(name); !slices.Equal(got, []string{cidr}) {
			t.Errorf("%s: the store holds %v; want %s", name, got, cidr)
		}
	}
	e.noCIDROnTwoNodes("default")
	e.consistent()
}

// Without the migration flag, multi-pool mode moves nothing, as Cilium's
// operator: the nodes keep their podCIDRs, list no pool, and the store
// keeps the cluster-pool pool and its blocks as they were.
func TestClusterPoolNodesNotMigratedWithoutTheFlag(t *testing.T) {
	e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{"default": migrationPool})
	nodes := []string{"cp-a", "cp-b", "cp-c"}
	listed := e.clusterPoolCluster(nodes)

	e.blockOperator(ModeMultiPool, nil)
	e.eventually(30*time.Second, "the multi-pool operator serving", func() (bool, string) { return e.op.Serving(), "" })
	// Let it reconcile every node.
	time.Sleep(2 * time.Second)
	for _, n := range nodes {
		cn := e.get(n)
		if got := prefixStrings(cn.Spec.IPAM.PodCIDRs); !slices.Equal(got, listed[n]) || len(cn.Spec.IPAM.Pools.Allocated) != 0 {
			t.Errorf("%s listed podCIDRs %v; now %v and pools %+v", n, listed[n], got, cn.Spec.IPAM.Pools.Allocated)
		}
		if got := e.storeBlocks(n); !slices.Equal(got, listed[n]) {
			t.Errorf("%s: the store holds %v; want %v", n, got, listed[n])
		}
		events, _, err := e.st.History(e.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: n}, alloc.Page{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events {
			if ev.Reason == "cilium-migrated-to-multi-pool" {
				t.Errorf("%s migrated without the flag: %+v", n, ev)
			}
		}
	}
	p, err := e.st.GetPool(e.ctx, alloc.DefaultSpace, "default")
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.EffectiveMode() != alloc.ModeClusterPool {
		t.Errorf("the default pool became %s without the flag", p.Spec.EffectiveMode())
	}
	e.consistent()
}

// The nodes the store cannot migrate keep their podCIDRs, untouched, and
// are told why in operator-status, in Cilium's words, every refused CIDR
// named; no refused node is half migrated (a dual-stack node with one
// good CIDR included), what the default pool can hold of a refused node's
// CIDRs is held for it so that a new node is never carved it, no CIDR is
// in two nodes, and each refusal is counted. A refusal fixed by hand (the
// default pool, disabled meanwhile, given the missing CIDR) is migrated on
// the node's next round, without a restart.
func TestClusterPoolMigrationRefusals(t *testing.T) {
	e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{
		"default": {Mode: alloc.ModeClusterPool, IPv4: v4(26, "10.94.0.0/24"), IPv6: v6(122, "fd00:94::/120")},
		// A cluster-pool pool the default pool cannot cover.
		"legacy": {Mode: alloc.ModeClusterPool, IPv4: v4(26, "10.95.0.0/24")},
	})
	// The legacy node's block is the store's, of pool legacy.
	legacyBlocks, err := e.st.ClusterPoolBlocks(e.ctx, alloc.DefaultSpace, "legacy", "legacy", nil)
	if err != nil || len(legacyBlocks) != 1 {
		t.Fatalf("legacy blocks %v: %v", legacyBlocks, err)
	}
	podCIDRs := func(cidrs ...string) func(*ciliumv2.CiliumNode) {
		return func(cn *ciliumv2.CiliumNode) {
			for _, c := range cidrs {
				cn.Spec.IPAM.PodCIDRs = append(cn.Spec.IPAM.PodCIDRs, iputil.PrefixFrom(netip.MustParsePrefix(c)))
			}
		}
	}
	// Listed by another operator, unknown to the store but for legacy's.
	listed := map[string][]string{
		"good":    {"10.94.0.0/26", "fd00:94::/122"},
		"first":   {"10.94.0.64/26"},                   // the older of a colliding pair
		"half":    {"10.94.0.128/26", "fd00:99::/122"}, // its IPv6 CIDR in no pool
		"outside": {"10.99.0.0/26"},
		"legacy":  {legacyBlocks[0].String()},
		"dup":     {"10.94.0.64/26"},
		"badmask": {"10.94.0.192/27", "fd00:98::/122"},
	}
	for _, n := range []string{"good", "first", "half", "outside", "legacy"} {
		e.createNode(n, podCIDRs(listed[n]...))
	}
	time.Sleep(1100 * time.Millisecond) // creation timestamps are in seconds: dup is younger than first
	e.createNode("dup", podCIDRs(listed["dup"]...))
	e.createNode("badmask", podCIDRs(listed["badmask"]...))

	reader := sdkmetric.NewManualReader()
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("test")
	e.blockOperator(ModeMultiPool, func(c *Config) {
		c.ClusterPoolToMultiPoolMigration = true
		c.Meter = meter
	})
	refusals := map[string][]string{ // node -> what its operator-status says
		"half":    {"podCIDRs[1]: cidr fd00:99::/122 is not part of the requested pool"},
		"outside": {"podCIDRs[0]: cidr 10.99.0.0/26 is not part of the requested pool"},
		"legacy":  {`podCIDRs[0]: 10.95.0.0/26 is the node's block of pool "legacy", which the default pool "default" cannot cover`},
		"dup":     {"podCIDRs[0]: 10.94.0.64/26 overlaps block 10.94.0.64/26 of node first"},
		"badmask": {"podCIDRs[0]: cidr 10.94.0.192/27 is a /27; pool default carves /26 blocks",
			"podCIDRs[1]: cidr fd00:98::/122 is not part of the requested pool"},
	}
	// What the store holds for each node: a refused node's CIDRs the
	// default pool can give it, at its mask.
	held := map[string][]string{
		"good": listed["good"], "first": listed["first"], "legacy": listed["legacy"],
		"half": {"10.94.0.128/26"}, "badmask": {"10.94.0.192/26"},
	}
	e.eventually(30*time.Second, "every node migrated or refused", func() (bool, string) {
		for n := range listed {
			cn := e.get(n)
			msg := cn.Status.IPAM.OperatorStatus.Error
			if whys, refused := refusals[n]; refused {
				if !strings.HasPrefix(msg, "migration to multi-pool IPAM failed: ") {
					return false, fmt.Sprintf("%s: operator-status %q", n, msg)
				}
				for _, why := range whys {
					if !strings.Contains(msg, why) {
						return false, fmt.Sprintf("%s: operator-status %q lacks %q", n, msg, why)
					}
				}
			} else if len(cn.Spec.IPAM.PodCIDRs) > 0 {
				return false, fmt.Sprintf("%s still lists podCIDRs; operator-status %q", n, msg)
			}
		}
		return true, ""
	})
	for n, cidrs := range listed {
		cn := e.get(n)
		if got := e.storeBlocks(n); !slices.Equal(got, held[n]) {
			t.Errorf("%s holds %v in the store; want %v", n, got, held[n])
		}
		if _, refused := refusals[n]; refused {
			if got := prefixStrings(cn.Spec.IPAM.PodCIDRs); !slices.Equal(got, cidrs) || len(cn.Spec.IPAM.Pools.Allocated) != 0 {
				t.Errorf("%s, refused, lists podCIDRs %v and pools %+v; want %v untouched", n, got, cn.Spec.IPAM.Pools.Allocated, cidrs)
			}
			continue
		}
		if got := allocatedCIDRs(cn, "default"); !slices.Equal(got, cidrs) {
			t.Errorf("%s listed %v; now pools %+v", n, cidrs, cn.Spec.IPAM.Pools.Allocated)
		}
	}
	if got := refusalCounts(t, reader); len(got) != 2 || got["invalid-input"] != 4 || got["overlap"] != 1 {
		t.Errorf("refusals counted by kind: %v; want invalid-input 4, overlap 1", got)
	}

	// A new node is carved none of what the refused nodes use: the
	// default pool's IPv4 blocks are all held.
	ctx := e.ctx
	fresh := newMPAgent(t, e.client, "fresh", map[string]int{"default": 8}, alloc.IPv4)
	if err := fresh.create(ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the new node told the pool is full", func() (bool, string) {
		cn := fresh.refresh(ctx)
		return cn.Status.IPAM.OperatorStatus.Error != "" && len(cn.Spec.IPAM.Pools.Allocated) == 0,
			fmt.Sprintf("pools %+v, operator-status %q", cn.Spec.IPAM.Pools, cn.Status.IPAM.OperatorStatus.Error)
	})

	// The fix for the outside node: the default pool, disabled so that
	// nothing is carved of it meanwhile, is given the CIDR; the node
	// migrates on its next round; the pool is enabled again and the new
	// node is served from what is left.
	p, err := e.st.GetPool(e.ctx, alloc.DefaultSpace, "default")
	if err != nil {
		t.Fatal(err)
	}
	p.Spec.IPv4.CIDRs = append(p.Spec.IPv4.CIDRs, netip.MustParsePrefix("10.99.0.0/24"))
	p.Spec.Disabled = true
	if _, err := e.st.UpdatePool(e.ctx, alloc.DefaultSpace, "default", p.Labels, p.Spec); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the outside node migrated once its CIDR is the pool's", func() (bool, string) {
		cn := e.get("outside")
		return len(cn.Spec.IPAM.PodCIDRs) == 0 && cn.Status.IPAM.OperatorStatus.Error == "",
			fmt.Sprintf("podCIDRs %v, pools %+v, operator-status %q", cn.Spec.IPAM.PodCIDRs, cn.Spec.IPAM.Pools, cn.Status.IPAM.OperatorStatus.Error)
	})
	if got := allocatedCIDRs(e.get("outside"), "default"); !slices.Equal(got, listed["outside"]) {
		t.Errorf("outside now lists %v", got)
	}
	p.Spec.Disabled = false
	if _, err := e.st.UpdatePool(e.ctx, alloc.DefaultSpace, "default", p.Labels, p.Spec); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the new node served", func() (bool, string) {
		if err := fresh.sync(ctx); err != nil {
			return false, err.Error()
		}
		got := allocatedCIDRs(fresh.refresh(ctx), "default")
		return len(got) == 1, fmt.Sprintf("fresh lists %v", got)
	})
	e.noCIDROnTwoNodes("default")
	e.consistent()
}

// refusalCounts reads ipam_cilium_operator_cluster_pool_migrations of
// outcome refused, by kind.
func refusalCounts(t *testing.T, r *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "ipam_cilium_operator_cluster_pool_migrations" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				if v, _ := dp.Attributes.Value(attribute.Key("outcome")); v.AsString() == "refused" {
					k, _ := dp.Attributes.Value(attribute.Key("kind"))
					out[k.AsString()] += dp.Value
				}
			}
		}
	}
	return out
}
