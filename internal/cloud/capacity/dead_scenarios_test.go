// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// Dead instances and node groups (issue 35): the scenarios on the
// workers' harness, each failing on the workers before the change.

const scenSubnet = "subnet-0123456789abcdef0"

// addNode starts an m5.large in subnet and registers it as node name
// with labels, and answers the instance's id.
func (x *scen) addNode(t *testing.T, name, subnet string, labels map[string]string) string {
	t.Helper()
	inst, _, err := x.fake.AddInstance("m5.large", subnet)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := x.st.PutNode(t.Context(), alloc.Node{Space: alloc.DefaultSpace, Name: name, Labels: labels,
		ProviderID: "aws:///eu-west-1a/" + inst}); err != nil {
		t.Fatal(err)
	}
	return inst
}

// nodeBlocks is the blocks of each node of pool, by node name.
func (x *scen) nodeBlocks(t *testing.T, pool string) map[string][]netip.Prefix {
	t.Helper()
	nodes, err := x.st.CloudNodes(t.Context(), alloc.DefaultSpace, pool)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]netip.Prefix{}
	for _, n := range nodes {
		for _, b := range n.Blocks {
			out[n.Name] = append(out[n.Name], b.Prefix)
		}
	}
	return out
}

// secondaries is every secondary address instance inst's interfaces hold.
func (x *scen) secondaries(inst string) []netip.Addr {
	var out []netip.Addr
	for _, f := range x.fake.Interfaces() {
		if f.Instance == inst {
			out = append(out, f.Addresses...)
		}
	}
	return out
}

func (x *scen) mustPass(t *testing.T) {
	t.Helper()
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestScenarioTerminatedFreesAddressesForAnotherNode: EC2 frees a
// terminated instance's addresses at once and may hand them to the next
// instance that asks. The node of the terminated instance, confirmed
// gone (EC2 describes it terminated), loses its blocks and its Pod's
// lease, and the other node records the addresses and leases every one
// of them; no pass fails on an overlap.
func TestScenarioTerminatedFreesAddressesForAnotherNode(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	x.mustPass(t)
	held := x.secondaries(x.inst)
	if len(held) != 4 {
		t.Fatalf("n1 holds %v, want 4 addresses", held)
	}
	if _, err := x.lease(t, "c0"); err != nil {
		t.Fatal(err)
	}
	// n2 starts first, so that its primary address is none of n1's.
	inst2 := x.addNode(t, "n2", scenSubnet, nil)
	x.fake.TerminateInstance(x.inst)
	if err := x.fake.AssignAddresses(x.eniOf(t, inst2), held...); err != nil {
		t.Fatal(err)
	}
	// The workers learn of an outside change at the next listing (a
	// resync, Cilium's minute).
	for range 2 {
		x.clock.Advance(DefaultResync)
		x.mustPass(t)
	}
	blocks := x.nodeBlocks(t, "eni")
	if len(blocks["n1"]) != 0 {
		t.Fatalf("n1, terminated, still has blocks %v", blocks["n1"])
	}
	if len(blocks["n2"]) != len(held) {
		t.Fatalf("n2 holds %v in EC2, recorded %v", held, blocks["n2"])
	}
	var leased []netip.Addr
	for i := range held {
		a, err := x.st.Allocate(t.Context(), alloc.LeaseRequest{Space: alloc.DefaultSpace, Node: "n2", Pool: "eni",
			Owner: alloc.Owner{Namespace: "ns", Name: "p"}, Attachment: alloc.Attachment{ContainerID: "d" + string(rune('0'+i)), Interface: "eth0"}})
		if err != nil {
			t.Fatalf("lease %d on n2: %v", i, err)
		}
		leased = append(leased, a.Leases[0].Addr)
	}
	slices.SortFunc(leased, netip.Addr.Compare)
	slices.SortFunc(held, netip.Addr.Compare)
	if !slices.Equal(leased, held) {
		t.Fatalf("n2 leased %v, want every address it holds: %v", leased, held)
	}
}

// TestScenarioGoneOnlyOnceConfirmed: an instance EC2 answers NotFound
// about (as it does for a while about a new one) keeps its node's blocks
// and leases; found again, it starts over. One EC2 no longer shows at
// all (terminated over an hour ago) loses them once it has answered
// NotFound for GoneAfter. Meanwhile another node some of the freed
// addresses went to is served with the others (no overlap fails its
// pass), and records them once they are dropped.
func TestScenarioGoneOnlyOnceConfirmed(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	x.mustPass(t)
	if _, err := x.lease(t, "c0"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		want := len(x.nodeBlocks(t, "eni")["n1"])
		show := x.fake.HideInstance(x.inst)
		x.clock.Advance(DefaultResync) // the next listing
		x.mustPass(t)
		if got := len(x.nodeBlocks(t, "eni")["n1"]); got != want {
			t.Fatalf("after a NotFound n1 has %d blocks, want %d", got, want)
		}
		show()
		x.clock.Advance(DefaultResync)
		x.mustPass(t)
		// Found between the two: the next NotFound starts over.
		x.clock.Advance(GoneAfter)
	}
	if _, err := x.lease(t, "c1"); err != nil {
		t.Fatalf("n1 leases no more after NotFound answers: %v", err)
	}
	held := x.secondaries(x.inst)
	// Another instance, registered as n2, holding two addresses; then n1
	// terminated while the workers did not look, forgotten by EC2, and
	// two of its addresses handed to n2's instance.
	inst2 := x.addNode(t, "n2", scenSubnet, nil)
	eni2 := x.eniOf(t, inst2)
	fresh, err := x.provider.Assign(t.Context(), eni2, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	x.fake.TerminateInstance(x.inst)
	x.fake.ForgetTerminated(x.inst)
	if err := x.fake.AssignAddresses(eni2, held[:2]...); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(fresh.Addresses, netip.Addr.Compare)
	got := append(slices.Clone(fresh.Addresses), held[:2]...)
	x.clock.Advance(DefaultResync)
	x.mustPass(t)
	blocks := x.nodeBlocks(t, "eni")
	if len(blocks["n1"]) != len(held) {
		t.Fatalf("after one NotFound n1 has %v, want its %d blocks", blocks["n1"], len(held))
	}
	if !slices.Equal(blocks["n2"], prefixesOf(fresh.Addresses)) {
		t.Fatalf("n2 recorded %v, want %v", blocks["n2"], fresh.Addresses)
	}
	x.clock.Advance(GoneAfter)
	for range 2 {
		x.mustPass(t)
	}
	blocks = x.nodeBlocks(t, "eni")
	slices.SortFunc(got, netip.Addr.Compare)
	if len(blocks["n1"]) != 0 || !slices.Equal(blocks["n2"], prefixesOf(got)) {
		t.Fatalf("after NotFound for %v: n1 has %v, n2 %v; n2 holds %v", GoneAfter, blocks["n1"], blocks["n2"], got)
	}
}

// prefixesOf is addrs as /32s.
func prefixesOf(addrs []netip.Addr) []netip.Prefix {
	out := make([]netip.Prefix, len(addrs))
	for i, a := range addrs {
		out[i] = netip.PrefixFrom(a, 32)
	}
	return out
}

// eniOf is instance inst's primary interface.
func (x *scen) eniOf(t *testing.T, inst string) string {
	t.Helper()
	for _, f := range x.fake.Interfaces() {
		if f.Instance == inst && f.Device == 0 {
			return f.ID
		}
	}
	t.Fatalf("no interface on %s", inst)
	return ""
}

// TestScenarioTwoNodeGroupsTwoPools: two node groups, each in a subnet
// of its own and a cloud pool of its own that selects its nodes by
// label (the usual layout): each node is served by its own pool alone,
// every pass succeeds, and EC2 gives each node its pre-allocation once.
func TestScenarioTwoNodeGroupsTwoPools(t *testing.T) {
	spec := alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}}
	x := newScen(t, spec)
	ctx := t.Context()
	selectGroup := func(g string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"node-group": g}}
	}
	if _, err := x.st.UpdatePool(ctx, alloc.DefaultSpace, "eni", nil, alloc.PoolSpec{
		IPv4:      &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.90.0.0/24")}, MaskSize: 28},
		NodeLocal: alloc.DefaultNodeLocal, Cloud: &spec, NodeSelector: selectGroup("a")}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := x.st.PutNode(ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "n1", Labels: map[string]string{"node-group": "a"},
		ProviderID: "aws:///eu-west-1a/" + x.inst}); err != nil {
		t.Fatal(err)
	}
	x.fake.AddSubnet(ec2fake.Subnet{ID: "subnet-0b", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("10.91.0.0/24")})
	if _, err := x.st.CreatePool(ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: "eni-b", Spec: alloc.PoolSpec{
		IPv4:      &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.91.0.0/24")}, MaskSize: 28},
		NodeLocal: alloc.DefaultNodeLocal, Cloud: &spec, NodeSelector: selectGroup("b")}}); err != nil {
		t.Fatal(err)
	}
	inst2 := x.addNode(t, "n2", "subnet-0b", map[string]string{"node-group": "b"})
	for range 3 {
		x.mustPass(t)
		x.clock.Advance(10 * time.Second)
	}
	a, b := x.nodeBlocks(t, "eni"), x.nodeBlocks(t, "eni-b")
	if len(a["n2"]) != 0 || len(b["n1"]) != 0 {
		t.Fatalf("a node served by the other group's pool: eni %v, eni-b %v", a, b)
	}
	if h1, h2 := x.secondaries(x.inst), x.secondaries(inst2); len(h1) != 4 || len(h2) != 4 || len(a["n1"]) != 4 || len(b["n2"]) != 4 {
		t.Fatalf("EC2 gave n1 %v and n2 %v; recorded eni %v, eni-b %v; want 4 each", h1, h2, a, b)
	}
}

// TestScenarioMovedAddressDoesNotWedge: an address moved outside the
// workers from a live node, where a Pod still leases it, to another
// node's instance overlaps the first node's block on every reading of
// the second. The second node is served all the same with the rest of
// what it holds (its passes succeed, its other addresses are recorded
// and leased); the contested address stays out until the first node's
// Pod lets it go.
func TestScenarioMovedAddressDoesNotWedge(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	inst2 := x.addNode(t, "n2", scenSubnet, nil)
	x.mustPass(t)
	a, err := x.lease(t, "c0")
	if err != nil {
		t.Fatal(err)
	}
	if err := x.provider.Unassign(t.Context(), x.eni0, []netip.Addr{a}, nil); err != nil {
		t.Fatal(err)
	}
	if err := x.fake.AssignAddresses(x.eniOf(t, inst2), a); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		x.mustPass(t)
		x.clock.Advance(10 * time.Second)
	}
	blocks := x.nodeBlocks(t, "eni")
	held := x.secondaries(inst2)
	if slices.Contains(blocks["n2"], netip.PrefixFrom(a, 32)) || len(blocks["n2"]) != len(held)-1 || len(held) < 5 {
		t.Fatalf("n2 holds %v, recorded %v; want all but %v (n1's Pod leases it)", held, blocks["n2"], a)
	}
	if !slices.Contains(blocks["n1"], netip.PrefixFrom(a, 32)) {
		t.Fatalf("n1's leased block %v dropped: %v", a, blocks["n1"])
	}
}

// TestScenarioEndedNodeNotDescribedAgain: the Kubernetes node of a
// terminated instance outlives it for a while. Once EC2 confirmed the
// end and the node's blocks are gone, the passes between listings
// describe nothing (the listing lacks the instance, and there is nothing
// left to read it for: the workers described it every pass, a describe
// per dead node each pass); registered again under the same name with a
// new instance, the node is read and served.
func TestScenarioEndedNodeNotDescribedAgain(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	x.addNode(t, "n2", scenSubnet, nil)
	x.mustPass(t)
	x.fake.TerminateInstance(x.inst)
	x.clock.Advance(DefaultResync) // the next listing lacks n1
	x.mustPass(t)
	if blocks := x.nodeBlocks(t, "eni"); len(blocks["n1"]) != 0 || len(blocks["n2"]) != 4 {
		t.Fatalf("after n1's instance ended: %v", blocks)
	}
	before := x.fake.Calls("DescribeInstances")
	for range 5 {
		x.clock.Advance(10 * time.Second)
		x.mustPass(t)
	}
	if got := x.fake.Calls("DescribeInstances") - before; got != 0 {
		t.Fatalf("%d DescribeInstances in 5 passes between listings, want 0: the ended n1 is described for nothing", got)
	}
	// n1 again, on a new instance: served from the next pass.
	inst, _, err := x.fake.AddInstance("m5.large", scenSubnet)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := x.st.PutNode(t.Context(), alloc.Node{Space: alloc.DefaultSpace, Name: "n1", ProviderID: "aws:///eu-west-1a/" + inst}); err != nil {
		t.Fatal(err)
	}
	x.clock.Advance(10 * time.Second)
	x.mustPass(t)
	if got := len(x.nodeBlocks(t, "eni")["n1"]); got != 4 {
		t.Fatalf("n1 on a new instance has %d blocks, want 4", got)
	}
}
