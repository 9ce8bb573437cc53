// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// Max Pods and prefix delegation by instance type (issue 35): a prefix
// node grows to the VPC CNI's max Pods rather than the secondary
// addresses'; a Xen type gets single addresses; a bare-metal type takes
// prefixes.

// onType is newScen with its node n1 on a new instance of type typ in
// the same subnet (the m5.large newWorld starts stays unused).
func onType(t *testing.T, typ string, spec alloc.CloudSpec) *scen {
	t.Helper()
	x := newScen(t, spec)
	inst, eni0, err := x.fake.AddInstance(typ, "subnet-0123456789abcdef0")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := x.st.PutNode(t.Context(), alloc.Node{Space: alloc.DefaultSpace, Name: "n1", ProviderID: "aws:///eu-west-1a/" + inst}); err != nil {
		t.Fatal(err)
	}
	x.inst, x.eni0 = inst, eni0
	return x
}

// fill runs passes and, after each, leases Pods until the node has none
// free, for want Pods at most: it answers how many Pods got an address.
func (x *scen) fill(t *testing.T, want, passes int) int {
	t.Helper()
	pods := 0
	for range passes {
		x.pass(t)
		for pods < want {
			if _, err := x.lease(t, "c"+strconv.Itoa(pods)); err != nil {
				break
			}
			pods++
		}
	}
	return pods
}

// prefixesHeld counts the /28s the node's interfaces hold, and their
// single secondary addresses.
func (x *scen) prefixesHeld() (prefixes, addrs int) {
	for _, f := range x.fake.Interfaces() {
		if f.Instance == x.inst {
			prefixes += len(f.Prefixes)
			addrs += len(f.Addresses)
		}
	}
	return prefixes, addrs
}

// TestScenarioPrefixNodeGrowsPastSecondaryMaxPods: an m5.large in a
// prefix pool sized by WARM_PREFIX_TARGET=1 serves its 33rd Pod and on,
// up to the VPC CNI's max Pods with prefixes (110: seven /28s), and asks
// no eighth /28; the secondary addresses' 29 stopped it at two.
func TestScenarioPrefixNodeGrowsPastSecondaryMaxPods(t *testing.T) {
	x := onType(t, "m5.large", alloc.CloudSpec{Provider: alloc.CloudAWS, Prefixes: true, WarmTargets: &alloc.WarmTargets{WarmPrefix: 1}})
	if pods := x.fill(t, 120, 10); pods != 112 {
		t.Fatalf("%d Pods got an address; want 112 (seven /28s, the first to reach max Pods 110)", pods)
	}
	if prefixes, addrs := x.prefixesHeld(); prefixes != 7 || addrs != 0 {
		t.Fatalf("the node holds %d /28s and %d addresses; want 7 and 0", prefixes, addrs)
	}
}

// TestScenarioPoolMaxPodsBoundsPrefixNode: the pool's maxPods (a kubelet
// set to 40) bounds the node: three /28s hold 48 >= 40, no fourth.
func TestScenarioPoolMaxPodsBoundsPrefixNode(t *testing.T) {
	x := onType(t, "m5.large", alloc.CloudSpec{Provider: alloc.CloudAWS, Prefixes: true, WarmTargets: &alloc.WarmTargets{WarmPrefix: 1, MaxPods: 40}})
	if pods := x.fill(t, 60, 6); pods != 48 {
		t.Fatalf("%d Pods got an address; want 48 (three /28s, the first to reach the pool's 40)", pods)
	}
	if prefixes, _ := x.prefixesHeld(); prefixes != 3 {
		t.Fatalf("the node holds %d /28s; want 3", prefixes)
	}
}

// TestScenarioXenPrefixPoolGetsSingleAddresses: a prefix pool's node on
// a t2.medium (Xen: EC2 delegates it no prefix) gets single addresses
// and its Pods lease them, as the VPC CNI and Cilium fall back; the
// fallback is logged once, not every pass.
func TestScenarioXenPrefixPoolGetsSingleAddresses(t *testing.T) {
	x := onType(t, "t2.medium", alloc.CloudSpec{Provider: alloc.CloudAWS, Prefixes: true, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	var logs bytes.Buffer
	x.w.Log = slog.New(slog.NewTextHandler(&logs, nil))
	if pods := x.fill(t, 8, 4); pods != 8 {
		t.Fatalf("%d Pods got an address; want 8", pods)
	}
	prefixes, addrs := x.prefixesHeld()
	if prefixes != 0 || addrs < 8 {
		t.Fatalf("the node holds %d /28s and %d addresses; want single addresses only, 8 at least", prefixes, addrs)
	}
	if n := strings.Count(logs.String(), "takes no prefixes"); n != 1 {
		t.Fatalf("the fallback logged %d times over 4 passes; want once:\n%s", n, logs.String())
	}
}

// TestScenarioBareMetalPrefixPoolGetsPrefixes: a prefix pool's node on an
// m5.metal (EC2 names no hypervisor for it; it is Nitro-class) gets
// /28s, and its Pods lease from them.
func TestScenarioBareMetalPrefixPoolGetsPrefixes(t *testing.T) {
	x := onType(t, "m5.metal", alloc.CloudSpec{Provider: alloc.CloudAWS, Prefixes: true, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	if pods := x.fill(t, 20, 3); pods != 20 {
		t.Fatalf("%d Pods got an address; want 20", pods)
	}
	if prefixes, addrs := x.prefixesHeld(); prefixes < 2 || addrs != 0 {
		t.Fatalf("the node holds %d /28s and %d addresses; want /28s only", prefixes, addrs)
	}
}

// TestScenarioNodeMaxPodsBoundsPrefixNode: a pool that sets no maxPods
// takes the Node's (status.capacity.pods, recorded with its providerID):
// a kubelet set to 40 gets three /28s, no fourth.
func TestScenarioNodeMaxPodsBoundsPrefixNode(t *testing.T) {
	x := onType(t, "m5.large", alloc.CloudSpec{Provider: alloc.CloudAWS, Prefixes: true, WarmTargets: &alloc.WarmTargets{WarmPrefix: 1}})
	if _, err := x.st.SetCiliumNodeProviderID(t.Context(), alloc.DefaultSpace, "n1", nil, "eni", "aws:///eu-west-1a/"+x.inst,
		store.PodInterfaces{MaxPods: 40}); err != nil {
		t.Fatal(err)
	}
	if pods := x.fill(t, 60, 6); pods != 48 {
		t.Fatalf("%d Pods got an address; want 48 (three /28s, the first to reach the Node's 40)", pods)
	}
	if prefixes, _ := x.prefixesHeld(); prefixes != 3 {
		t.Fatalf("the node holds %d /28s; want 3", prefixes)
	}
}
