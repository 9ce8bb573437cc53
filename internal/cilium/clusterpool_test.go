// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	iputil "github.com/cilium/cilium/pkg/ip"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/kubetest"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
)

// newBlockEnv is a world for the block modes: a real API server with
// Cilium's CRDs, a store on its own database with the given block release
// hold-off (the agents' space is the default one, as the server sets it in
// multi-pool mode), and the pools.
func newBlockEnv(t *testing.T, holdOff time.Duration, pools map[string]alloc.PoolSpec, opts ...kubetest.Option) *crdEnv {
	t.Helper()
	kc := kubetest.Start(t, opts...)
	kc.InstallCiliumCRDs(t)
	dbURL := pgtest.NewDatabase(t)
	st, err := store.Open(t.Context(), dbURL, store.Options{LeaseExpiry: time.Minute, Cooldown: time.Second,
		BlockReleaseHoldOff: holdOff, AgentPoolsSpace: alloc.DefaultSpace})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range pools {
			if !yield(n) {
				return
			}
		}
	}) {
		if _, err := st.CreatePool(t.Context(), alloc.Pool{Space: alloc.DefaultSpace, Name: name, Spec: pools[name]}); err != nil {
			t.Fatal(err)
		}
	}
	client, err := ciliumclient.NewForConfig(kc.Config())
	if err != nil {
		t.Fatal(err)
	}
	return &crdEnv{t: t, kc: kc, st: st, client: client, ctx: t.Context(), dbURL: dbURL}
}

// blockOperator starts an operator replica of the mode.
func (e *crdEnv) blockOperator(mode Mode, tweak func(*Config)) (stop func()) {
	return e.operator("op-"+string(mode), func(c *Config) {
		c.Mode = mode
		if tweak != nil {
			tweak(c)
		}
	})
}

// createNode creates a CiliumNode as Cilium's agent does at start.
func (e *crdEnv) createNode(name string, mutate func(*ciliumv2.CiliumNode)) {
	e.t.Helper()
	cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if mutate != nil {
		mutate(cn)
	}
	if _, err := e.client.CiliumV2().CiliumNodes().Create(e.ctx, cn, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *crdEnv) deleteNode(name string) {
	e.t.Helper()
	if err := e.client.CiliumV2().CiliumNodes().Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// storeBlocks is the node's blocks in the store (nil once the node is
// gone), IPv4 first.
func (e *crdEnv) storeBlocks(node string) []string {
	e.t.Helper()
	bs, err := e.st.ListBlocks(e.ctx, alloc.DefaultSpace, node)
	if alloc.IsKind(err, alloc.KindNotFound) {
		return nil
	} else if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, b := range bs {
		out = append(out, b.Layout.Prefix.String())
	}
	slices.SortFunc(out, comparePrefixStrings)
	return out
}

func comparePrefixStrings(a, b string) int {
	pa, pb := netip.MustParsePrefix(a), netip.MustParsePrefix(b)
	if pa.Addr().Is4() != pb.Addr().Is4() {
		if pa.Addr().Is4() {
			return -1
		}
		return 1
	}
	return pa.Addr().Compare(pb.Addr())
}

func prefixStrings(ps []iputil.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

var clusterPool = alloc.PoolSpec{Mode: alloc.ModeClusterPool,
	IPv4: v4(26, "10.90.0.0/24"), IPv6: &alloc.PoolFamily{MaskSize: 122, CIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:90::/120")}}}

// Every CiliumNode gets one block per family of the cluster pool in
// spec.ipam.podCIDRs (IPv4 first), no block twice, each the store's; a
// node annotated ipam.cilium.io/ignore is left to someone else.
func TestClusterPoolNodesGetPodCIDRs(t *testing.T) {
	e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{"default": clusterPool})
	e.blockOperator(ModeClusterPool, nil)
	names := []string{"cp-a", "cp-b", "cp-c", "cp-d"}
	for _, n := range names {
		e.createNode(n, nil)
	}
	e.createNode("cp-ignored", func(cn *ciliumv2.CiliumNode) {
		cn.Annotations = map[string]string{AnnotationIgnore: "true"}
	})
	seen := map[string]string{}
	for _, n := range names {
		var cidrs []string
		e.eventually(10*time.Second, n+" podCIDRs", func() (bool, string) {
			cn := e.get(n)
			cidrs = prefixStrings(cn.Spec.IPAM.PodCIDRs)
			return len(cidrs) == 2, fmt.Sprintf("podCIDRs %v, operator-status %q", cidrs, cn.Status.IPAM.OperatorStatus.Error)
		})
		v4, v6 := netip.MustParsePrefix(cidrs[0]), netip.MustParsePrefix(cidrs[1])
		if !v4.Addr().Is4() || v4.Bits() != 26 || !v6.Addr().Is6() || v6.Bits() != 122 {
			t.Errorf("%s: podCIDRs %v; want a /26 then a /122", n, cidrs)
		}
		for _, c := range cidrs {
			if other, dup := seen[c]; dup {
				t.Errorf("%s given to %s and %s", c, other, n)
			}
			seen[c] = n
		}
		if got := e.storeBlocks(n); !slices.Equal(got, cidrs) {
			t.Errorf("%s: podCIDRs %v; the store holds %v", n, cidrs, got)
		}
		if msg := e.get(n).Status.IPAM.OperatorStatus.Error; msg != "" {
			t.Errorf("%s: operator-status.error %q on a served node", n, msg)
		}
	}
	if cn := e.get("cp-ignored"); len(cn.Spec.IPAM.PodCIDRs) != 0 || e.storeBlocks("cp-ignored") != nil {
		t.Errorf("an ignored node got %v (store: %v)", cn.Spec.IPAM.PodCIDRs, e.storeBlocks("cp-ignored"))
	}
}

// A cluster pool without a block for a node: "allocator full" in its
// operator-status, as Cilium's operator writes it; another node's
// deletion gives its blocks back, and the node is served and its error
// cleared.
func TestClusterPoolExhaustionSetAndCleared(t *testing.T) {
	small := alloc.PoolSpec{Mode: alloc.ModeClusterPool, IPv4: v4(26, "10.91.0.0/25")} // two blocks
	e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{"default": small})
	e.blockOperator(ModeClusterPool, nil)
	for _, n := range []string{"full-a", "full-b"} {
		e.createNode(n, nil)
		e.eventually(10*time.Second, n+" served", func() (bool, string) {
			cn := e.get(n)
			return len(cn.Spec.IPAM.PodCIDRs) == 1, fmt.Sprintf("podCIDRs %v", cn.Spec.IPAM.PodCIDRs)
		})
	}
	aBlocks := e.storeBlocks("full-a")
	e.createNode("full-c", nil)
	e.eventually(10*time.Second, "allocator full on full-c", func() (bool, string) {
		cn := e.get("full-c")
		return cn.Status.IPAM.OperatorStatus.Error == ErrAllocatorFull && len(cn.Spec.IPAM.PodCIDRs) == 0,
			fmt.Sprintf("operator-status %q, podCIDRs %v", cn.Status.IPAM.OperatorStatus.Error, cn.Spec.IPAM.PodCIDRs)
	})
	e.deleteNode("full-a")
	e.eventually(10*time.Second, "full-a's block released", func() (bool, string) {
		b := e.storeBlocks("full-a")
		return b == nil, fmt.Sprintf("store holds %v", b)
	})
	e.eventually(20*time.Second, "full-c served, error cleared", func() (bool, string) {
		cn := e.get("full-c")
		return slices.Equal(prefixStrings(cn.Spec.IPAM.PodCIDRs), aBlocks) && cn.Status.IPAM.OperatorStatus.Error == "",
			fmt.Sprintf("podCIDRs %v, operator-status %q", cn.Spec.IPAM.PodCIDRs, cn.Status.IPAM.OperatorStatus.Error)
	})
	events, _, err := e.st.History(e.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: "full-a"}, alloc.Page{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	for _, ev := range events {
		released = released || (ev.Kind == alloc.EventBlockRelease && ev.Block.String() == aBlocks[0])
	}
	if !released {
		t.Errorf("the history of full-a records no release of %s: %+v", aBlocks[0], events)
	}
}

// podCIDRs a node lists already (an operator before this one gave them)
// stay when they are free blocks of the cluster pool; ones that are not
// are left where they are, pulled from under no agent, and operator-status
// says why.
func TestClusterPoolKeepsListedPodCIDRs(t *testing.T) {
	e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{"default": clusterPool})
	e.blockOperator(ModeClusterPool, nil)
	e.createNode("listed", func(cn *ciliumv2.CiliumNode) {
		cn.Spec.IPAM.PodCIDRs = []iputil.Prefix{iputil.PrefixFrom(netip.MustParsePrefix("10.90.0.192/26"))}
	})
	e.eventually(10*time.Second, "listed node served", func() (bool, string) {
		got := prefixStrings(e.get("listed").Spec.IPAM.PodCIDRs)
		return len(got) == 2 && got[0] == "10.90.0.192/26", fmt.Sprintf("podCIDRs %v", got)
	})
	e.createNode("foreign", func(cn *ciliumv2.CiliumNode) {
		cn.Spec.IPAM.PodCIDRs = []iputil.Prefix{iputil.PrefixFrom(netip.MustParsePrefix("192.168.7.0/24"))}
	})
	e.eventually(10*time.Second, "foreign node refused", func() (bool, string) {
		cn := e.get("foreign")
		return strings.Contains(cn.Status.IPAM.OperatorStatus.Error, "192.168.7.0/24 lies in no CIDR of the cluster pool"),
			fmt.Sprintf("operator-status %q", cn.Status.IPAM.OperatorStatus.Error)
	})
	if got := prefixStrings(e.get("foreign").Spec.IPAM.PodCIDRs); !slices.Equal(got, []string{"192.168.7.0/24"}) {
		t.Errorf("the refused node's podCIDRs became %v", got)
	}
}

// Nodes the store serves whose CiliumNode went while no replica led are
// released when one takes the lead; nodes whose CiliumNode exists keep
// their blocks.
func TestClusterPoolReleasesOrphansAtStart(t *testing.T) {
	e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{"default": clusterPool})
	e.createNode("alive", nil)
	for _, n := range []string{"alive", "ghost"} {
		if _, err := e.st.ClusterPoolBlocks(e.ctx, alloc.DefaultSpace, n, "default", nil); err != nil {
			t.Fatal(err)
		}
	}
	alive := e.storeBlocks("alive")
	e.blockOperator(ModeClusterPool, nil)
	e.eventually(10*time.Second, "ghost released", func() (bool, string) {
		b := e.storeBlocks("ghost")
		return b == nil, fmt.Sprintf("ghost holds %v", b)
	})
	e.eventually(10*time.Second, "alive keeps its blocks", func() (bool, string) {
		got := prefixStrings(e.get("alive").Spec.IPAM.PodCIDRs)
		return slices.Equal(got, alive), fmt.Sprintf("podCIDRs %v, store had %v", got, alive)
	})
	if _, err := e.client.CiliumV2().CiliumNodes().Get(e.ctx, "ghost", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("ghost: %v", err)
	}
}
