// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/testclock"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Migrate) }

// world is a store on a database of its own, an EC2 fake with one
// m5.large, its node registered, and a worker over both (with the
// provider as its Inventory, as in the server).
type world struct {
	st       *store.Store
	fake     *ec2fake.Server
	srv      *httptest.Server
	provider *aws.Provider
	w        *Worker
	clock    *testclock.Clock
	inst     string
	eni0     string
}

func newWorld(t *testing.T, spec alloc.CloudSpec) *world {
	t.Helper()
	return newWorldOf(t, spec, nil)
}

// newWorldOf is newWorld with the pool's IPv6 family v6 (none when nil).
func newWorldOf(t *testing.T, spec alloc.CloudSpec, v6 *alloc.PoolFamily) *world {
	t.Helper()
	return newWorldVia(t, spec, v6, nil)
}

// newWorldVia is newWorldOf with the fake served through via (a fault
// of the network between the SDK and EC2); the fake itself when nil.
func newWorldVia(t *testing.T, spec alloc.CloudSpec, v6 *alloc.PoolFamily, via func(*ec2fake.Server) http.Handler) *world {
	t.Helper()
	return buildWorld(t, "m5.large", netip.MustParsePrefix("10.90.0.0/24"), spec, v6, via)
}

// buildWorld is newWorldVia with node n1 an instance of type typ in a
// subnet, and the pool, of range cidr.
func buildWorld(t *testing.T, typ string, cidr netip.Prefix, spec alloc.CloudSpec, v6 *alloc.PoolFamily, via func(*ec2fake.Server) http.Handler) *world {
	t.Helper()
	ctx := t.Context()
	clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	st, err := store.Open(ctx, pgtest.NewDatabase(t), store.Options{LeaseExpiry: time.Hour, Cooldown: time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	fake := ec2fake.New()
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-0123456789abcdef0", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: cidr})
	inst, eni0, err := fake.AddInstance(typ, "subnet-0123456789abcdef0")
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = fake
	if via != nil {
		h = via(fake)
	}
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{Region: "eu-west-1", BaseEndpoint: sdkaws.String(srv.URL), HTTPClient: aws.SafeBodies(srv.Client()),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		Retryer:     retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts = 1 })})
	provider := aws.New(client, aws.Options{Now: clk.Now, Wait: func(int) time.Duration { return 0 }})
	if _, err := st.CreatePool(ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: "eni",
		Spec: alloc.PoolSpec{IPv4: &alloc.PoolFamily{CIDRs: []netip.Prefix{cidr}, MaskSize: 28},
			IPv6: v6, NodeLocal: alloc.DefaultNodeLocal, Cloud: &spec}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.PutNode(ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "n1", ProviderID: "aws:///eu-west-1a/" + inst}); err != nil {
		t.Fatal(err)
	}
	// As the server's: passes after the first list the network.
	w := &Worker{Store: st, Provider: alloc.CloudAWS, Cloud: provider, Interfaces: provider, Inventory: provider,
		Tags: map[string]string{cloud.TagCluster: "test"}, Now: clk.Now}
	return &world{st: st, fake: fake, srv: srv, provider: provider, w: w, clock: clk, inst: inst, eni0: eni0}
}

func (x *world) pass(t *testing.T) {
	t.Helper()
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func (x *world) lease(t *testing.T, container string) (netip.Addr, error) {
	t.Helper()
	a, err := x.st.Allocate(t.Context(), alloc.LeaseRequest{Space: alloc.DefaultSpace, Node: "n1", Pool: "eni",
		Owner: alloc.Owner{Namespace: "ns", Name: container}, Attachment: alloc.Attachment{ContainerID: container, Interface: "eth0"}})
	if err != nil {
		return netip.Addr{}, err
	}
	return a.Leases[0].Addr, nil
}

func (x *world) blocks(t *testing.T) int {
	t.Helper()
	nodes, err := x.st.CloudNodes(t.Context(), alloc.DefaultSpace, "eni")
	if err != nil {
		t.Fatal(err)
	}
	return len(nodes[0].Blocks)
}

// TestPassAddsAndRecords: a pass gives the node its pre-allocation from
// the cloud, recorded as blocks the node then leases from; the next pass
// adds what the leases used up.
func TestPassAddsAndRecords(t *testing.T) {
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	if _, err := x.lease(t, "c0"); err == nil {
		t.Fatal("a lease before the cloud gave any address")
	}
	x.pass(t)
	held, _ := x.fake.Held(x.eni0)
	if len(held) != 4 || x.blocks(t) != 4 {
		t.Fatalf("the cloud holds %v, the store %d blocks", held, x.blocks(t))
	}
	for i := range 4 {
		a, err := x.lease(t, "c"+string(rune('1'+i)))
		if err != nil {
			t.Fatal(err)
		}
		if !containsAddr(held, a) {
			t.Fatalf("leased %v, not one the cloud gave (%v)", a, held)
		}
	}
	if _, err := x.lease(t, "c5"); err == nil {
		t.Fatal("a fifth lease with four addresses")
	}
	x.pass(t)
	if held, _ := x.fake.Held(x.eni0); len(held) != 8 || x.blocks(t) != 8 {
		t.Fatalf("after the second pass the cloud holds %d, the store %d blocks", len(held), x.blocks(t))
	}
	if _, err := x.lease(t, "c5"); err != nil {
		t.Fatal(err)
	}
}

// TestPassRecordsWhatACrashLeft: addresses the cloud gave but no pass
// recorded (a worker stopped between the two) are recorded by the next.
func TestPassRecordsWhatACrashLeft(t *testing.T) {
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 2}})
	if _, err := x.w.Cloud.Assign(t.Context(), x.eni0, 3, false); err != nil {
		t.Fatal(err)
	}
	x.pass(t)
	if x.blocks(t) != 3 {
		t.Fatalf("%d blocks, want the 3 the cloud holds", x.blocks(t))
	}
	if held, _ := x.fake.Held(x.eni0); len(held) != 3 {
		t.Fatalf("the pass assigned more: %v", held)
	}
}

// TestPassReleasesAfterTheDelay: addresses in excess go back only once
// excess for the pool's delay, never one a lease holds, and a need in
// between starts the delay over.
func TestPassReleasesAfterTheDelay(t *testing.T) {
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 6}, ReleaseDelay: time.Minute})
	x.pass(t)
	a, err := x.lease(t, "c1")
	if err != nil {
		t.Fatal(err)
	}
	// Fewer are needed now: 6 held, 1 used, pre-allocate 2: 3 in excess.
	if _, err := x.st.UpdatePool(t.Context(), alloc.DefaultSpace, "eni", nil, alloc.PoolSpec{
		IPv4: &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.90.0.0/24")}, MaskSize: 28}, NodeLocal: alloc.DefaultNodeLocal,
		Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 2}, ReleaseDelay: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	x.pass(t)
	if held, _ := x.fake.Held(x.eni0); len(held) != 6 {
		t.Fatalf("released before the delay: %v", held)
	}
	x.clock.Advance(time.Minute)
	x.pass(t)
	held, _ := x.fake.Held(x.eni0)
	if len(held) != 3 || !containsAddr(held, a) {
		t.Fatalf("after the delay the cloud holds %v (the lease holds %v)", held, a)
	}
	// What went back stays drained (no Pod leases it) until a fresh
	// reading lacks it: the next listing.
	x.pass(t)
	x.clock.Advance(DefaultResync)
	x.pass(t)
	if x.blocks(t) != 3 {
		t.Fatalf("the store holds %d blocks, the cloud %v", x.blocks(t), held)
	}
	if _, err := x.lease(t, "c2"); err != nil {
		t.Fatalf("a lease from what stayed: %v", err)
	}
}

// TestGiveBackCostsNoDescribes: a give-back the cloud answered is not
// described to be confirmed: what went back stays drained (no Pod can
// lease it) until the next listing lacks it, which drops it at once (a
// stale reading shows an older state, which held it). The workers
// described the node alone after each give-back, and again to confirm
// the lack: 4 calls for nothing.
func TestGiveBackCostsNoDescribes(t *testing.T) {
	spec := alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 6}, ReleaseDelay: time.Minute}
	x := newWorld(t, spec)
	x.pass(t)
	if _, err := x.st.UpdatePool(t.Context(), alloc.DefaultSpace, "eni", nil, alloc.PoolSpec{
		IPv4: &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.90.0.0/24")}, MaskSize: 28}, NodeLocal: alloc.DefaultNodeLocal,
		Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 2}, ReleaseDelay: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	x.pass(t)
	x.clock.Advance(time.Minute)
	x.pass(t) // lists, gives 4 back
	if held, _ := x.fake.Held(x.eni0); len(held) != 2 {
		t.Fatalf("after the delay the cloud holds %v, want 2", held)
	}
	before := x.fake.Calls("DescribeInstances")
	for range 5 {
		x.clock.Advance(10 * time.Second)
		x.pass(t)
	}
	if got := x.fake.Calls("DescribeInstances") - before; got != 0 {
		t.Fatalf("%d DescribeInstances in the 5 passes after a give-back, want 0", got)
	}
	x.clock.Advance(10 * time.Second)
	x.pass(t) // the next listing
	if got := x.fake.Calls("DescribeInstances") - before; got != 1 {
		t.Fatalf("%d DescribeInstances with the next listing, want its 1", got)
	}
	if b := x.blocks(t); b != 2 {
		t.Fatalf("the store holds %d blocks, the cloud 2", b)
	}
}

func TestInstanceID(t *testing.T) {
	for _, c := range []struct {
		provider alloc.CloudProvider
		id, want string
	}{
		{alloc.CloudAWS, "aws:///eu-west-1a/i-0123456789abcdef0", "i-0123456789abcdef0"},
		{alloc.CloudAWS, "aws:///i-0123", "i-0123"},
		{alloc.CloudAWS, "aws://", ""},
		{alloc.CloudAWS, "aws:///eu-west-1a/", ""},
		{alloc.CloudAWS, "gce://p/z/vm", ""},
		{alloc.CloudAzure, "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm",
			"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm"},
		{alloc.CloudAzure, "aws:///z/i-1", ""},
	} {
		if got := InstanceID(c.provider, c.id); got != c.want {
			t.Errorf("InstanceID(%s, %q) = %q, want %q", c.provider, c.id, got, c.want)
		}
	}
}

func containsAddr(as []netip.Addr, a netip.Addr) bool {
	for _, x := range as {
		if x == a {
			return true
		}
	}
	return false
}

// TestPassSecurityGroupTags: a pool naming its interfaces' security
// groups by tags gives a new interface the groups carrying them; tags
// that match no group create no interface and fail the node's round.
func TestPassSecurityGroupTags(t *testing.T) {
	spec := alloc.CloudSpec{Provider: alloc.CloudAWS, FirstInterfaceIndex: 1, Watermarks: &alloc.Watermarks{PreAllocate: 2},
		SecurityGroupTags: map[string]string{"role": "pods"}}
	x := newWorld(t, spec)
	err := x.w.Pass(t.Context())
	if cloud.KindOf(err) != cloud.KindNoSecurityGroup {
		t.Fatalf("a pass with no group tagged answered %v", err)
	}
	if n := x.fake.Calls("CreateNetworkInterface"); n != 0 || len(x.fake.Interfaces()) != 1 {
		t.Fatalf("%d creates, %d interfaces without a group to give them", n, len(x.fake.Interfaces()))
	}
	// A world whose VPC has the group (the provider caches a lookup's
	// answer for minutes, so the first world keeps its empty one).
	x = newWorld(t, spec)
	x.fake.AddSecurityGroup("sg-pods", "vpc-1", map[string]string{"role": "pods"})
	x.fake.AddSecurityGroup("sg-other", "vpc-1", map[string]string{"role": "other"})
	x.pass(t)
	var created []ec2fake.Interface
	for _, f := range x.fake.Interfaces() {
		if f.ID != x.eni0 {
			created = append(created, f)
		}
	}
	if len(created) != 1 || !slices.Equal(created[0].Groups, []string{"sg-pods"}) || x.blocks(t) != 2 {
		t.Fatalf("created %+v, %d blocks; want one interface in sg-pods and 2 blocks", created, x.blocks(t))
	}
}

// TestPassRecordsInterfaces: a pass records the node's interfaces as the
// cloud shows them, with what Cilium's agent routes with and what the
// pass's own round added, and a pass over an unchanged node writes
// nothing.
func TestPassRecordsInterfaces(t *testing.T) {
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	read := func() store.CloudInterfaces {
		t.Helper()
		got, err := x.st.CloudInterfaces(t.Context(), alloc.DefaultSpace, "n1")
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	x.pass(t)
	first := read()
	held, _ := x.fake.Held(x.eni0)
	if len(first.Interfaces) != 1 {
		t.Fatalf("after the first pass: %+v", first)
	}
	f := first.Interfaces[0]
	if f.ID != x.eni0 || !slices.Equal(f.Addresses, held) || len(held) != 4 || f.MAC == "" || f.VPC != "vpc-1" || f.Zone != "eu-west-1a" ||
		f.SubnetCIDR != netip.MustParsePrefix("10.90.0.0/24") || f.Gateway != netip.MustParseAddr("10.90.0.1") || !f.Primary.IsValid() {
		t.Fatalf("after the first pass: %+v; the cloud holds %v", first, held)
	}
	x.clock.Advance(time.Minute)
	x.pass(t) // reads the 4 addresses: the same reading
	if second := read(); !second.ReadAt.Equal(first.ReadAt) {
		t.Fatalf("an unchanged reading was written again at %v", second.ReadAt)
	}
}

// TestPassSettlesWithTheCloud: blocks the cloud took back outside the
// workers are dropped once two readings agree, except one a Pod holds;
// a drained block the cloud kept (a pass stopped after the drain) is
// restored.
func TestPassSettlesWithTheCloud(t *testing.T) {
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	x.pass(t)
	held, _ := x.fake.Held(x.eni0)
	if len(held) != 4 {
		t.Fatalf("the cloud holds %v", held)
	}
	leased, err := x.lease(t, "c1")
	if err != nil {
		t.Fatal(err)
	}
	var free netip.Addr
	for _, a := range held {
		if a != leased {
			free = a
			break
		}
	}
	// Someone unassigns two addresses, the leased one among them, and
	// they go to another interface of the subnet.
	if err := x.provider.Unassign(t.Context(), x.eni0, []netip.Addr{leased, free}, nil); err != nil {
		t.Fatal(err)
	}
	x.fake.Take("subnet-0123456789abcdef0", leased)
	x.fake.Take("subnet-0123456789abcdef0", free)
	recorded := func() map[netip.Prefix]bool {
		t.Helper()
		nodes, err := x.st.CloudNodes(t.Context(), alloc.DefaultSpace, "eni")
		if err != nil {
			t.Fatal(err)
		}
		out := map[netip.Prefix]bool{}
		for _, b := range nodes[0].Blocks {
			out[b.Prefix] = true
		}
		return out
	}
	// Outside changes show at the next listing (a resync).
	x.clock.Advance(DefaultResync)
	x.pass(t)
	if r := recorded(); !r[netip.PrefixFrom(free, 32)] || !r[netip.PrefixFrom(leased, 32)] {
		t.Fatalf("dropped after one reading: %v", r)
	}
	x.pass(t)
	if r := recorded(); r[netip.PrefixFrom(free, 32)] || !r[netip.PrefixFrom(leased, 32)] {
		t.Fatalf("after two readings: %v; want %v dropped and the leased %v kept", r, free, leased)
	}
	// Every block recorded is one the cloud holds, but the leased one.
	now, _ := x.fake.Held(x.eni0)
	for b := range recorded() {
		if !containsAddr(now, b.Addr()) && b.Addr() != leased {
			t.Errorf("block %v recorded, the cloud holds %v", b, now)
		}
	}

	// A pass stopped after draining a block it meant to give back.
	some := netip.PrefixFrom(now[len(now)-1], 32)
	if drained, err := x.st.DrainCloudBlocks(t.Context(), alloc.DefaultSpace, "n1", "eni", []netip.Prefix{some}); err != nil || len(drained) != 1 {
		t.Fatalf("drained %v, %v", drained, err)
	}
	// Restored once the worker has read the cloud for its release guard
	// (an earlier leader may have given it back just before).
	x.clock.Advance(DefaultReleaseGuard)
	x.pass(t)
	nodes, err := x.st.CloudNodes(t.Context(), alloc.DefaultSpace, "eni")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range nodes[0].Blocks {
		if b.Prefix == some && b.Drained {
			t.Fatalf("%v still drained after a pass; the cloud holds it", some)
		}
	}
}

// TestPassDelegatesIPv6: a pool with IPv6 CIDRs gets each node one /80
// of its subnet's /64 on the first interface for Pods, its first /96
// recorded as the node's IPv6 block: a Pod leases both families, and the
// next passes ask for no more. A subnet without IPv6 is asked once per
// cooldown, and its IPv4 addresses still come.
func TestPassDelegatesIPv6(t *testing.T) {
	v6 := &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("2600:1f18:aaaa:bb00::/56")}, MaskSize: 96}
	x := newWorldOf(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 2}}, v6)
	// The pass reports the subnet, once per cooldown.
	if err := x.w.Pass(t.Context()); err == nil || !strings.Contains(err.Error(), "does not have an IPv6 CIDR block") {
		t.Fatalf("a pool with IPv6 on a subnet without: %v", err)
	}
	if held, _ := x.fake.Held(x.eni0); len(held) != 2 {
		t.Fatalf("without IPv6 in the subnet, the cloud holds %v", held)
	}
	calls := x.fake.Calls("AssignIpv6Addresses")
	if calls != 1 {
		t.Fatalf("%d AssignIpv6Addresses calls, want 1", calls)
	}
	x.pass(t)
	if got := x.fake.Calls("AssignIpv6Addresses"); got != calls {
		t.Fatalf("a subnet without IPv6 was asked again within its cooldown (%d calls)", got)
	}
	x.fake.AddSubnetIPv6("subnet-0123456789abcdef0", netip.MustParsePrefix("2600:1f18:aaaa:bb01::/64"))
	x.clock.Advance(10 * time.Minute)
	x.pass(t)
	inst, err := x.provider.Instance(t.Context(), x.inst)
	if err != nil {
		t.Fatal(err)
	}
	delegated := netip.MustParsePrefix("2600:1f18:aaaa:bb01:1::/80")
	if !slices.Equal(inst.Interfaces[0].IPv6Prefixes, []netip.Prefix{delegated}) {
		t.Fatalf("the cloud delegated %v to %s, want [%v]", inst.Interfaces[0].IPv6Prefixes, x.eni0, delegated)
	}
	a, err := x.st.Allocate(t.Context(), alloc.LeaseRequest{Space: alloc.DefaultSpace, Node: "n1", Pool: "eni",
		Owner: alloc.Owner{Namespace: "ns", Name: "c1"}, Attachment: alloc.Attachment{ContainerID: "c1", Interface: "eth0"}})
	if err != nil {
		t.Fatal(err)
	}
	families := map[alloc.Family]netip.Addr{}
	for _, l := range a.Leases {
		families[l.Family] = l.Addr
	}
	if !delegated.Contains(families[alloc.IPv6]) || !families[alloc.IPv4].IsValid() {
		t.Fatalf("leased %v; want an IPv4 address and one of %v", families, delegated)
	}
	calls = x.fake.Calls("AssignIpv6Addresses")
	for range 3 {
		x.clock.Advance(time.Minute)
		x.pass(t)
	}
	if got := x.fake.Calls("AssignIpv6Addresses"); got != calls {
		t.Fatalf("%d more AssignIpv6Addresses calls with a prefix held", got-calls)
	}
	nodes, err := x.st.CloudNodes(t.Context(), alloc.DefaultSpace, "eni")
	if err != nil {
		t.Fatal(err)
	}
	var v6blocks []netip.Prefix
	for _, b := range nodes[0].Blocks {
		if b.Prefix.Addr().Is6() {
			v6blocks = append(v6blocks, b.Prefix)
		}
	}
	if want := netip.MustParsePrefix("2600:1f18:aaaa:bb01:1::/96"); !slices.Equal(v6blocks, []netip.Prefix{want}) {
		t.Fatalf("IPv6 blocks %v after settling passes, want [%v]", v6blocks, want)
	}
}

// A node's own word on its interfaces (a CiliumNode's spec.eni) wins
// over its pool's spec.cloud; unset, the pool's stands. Cilium's AWS
// operator reads the node's alone.
func TestNodeOptions(t *testing.T) {
	pool := Options(alloc.CloudSpec{Provider: alloc.CloudAWS, FirstInterfaceIndex: 1, Prefixes: true})
	zero, two := 0, 2
	tags := map[string]string{"no-pods": "true"}
	for _, c := range []struct {
		name      string
		pi        store.PodInterfaces
		wantFirst int
		wantTags  map[string]string
	}{
		{"unset: the pool's", store.PodInterfaces{}, 1, nil},
		{"the node's index, lower than the pool's", store.PodInterfaces{FirstIndex: &zero}, 0, nil},
		{"the node's index, higher", store.PodInterfaces{FirstIndex: &two}, 2, nil},
		{"the node's tags", store.PodInterfaces{ExcludeTags: tags}, 1, tags},
	} {
		got := nodeOptions(pool, c.pi)
		if got.FirstDevice != c.wantFirst || !maps.Equal(got.ExcludeTags, c.wantTags) || !got.Prefixes {
			t.Errorf("%s: first device %d, tags %v, prefixes %v; want %d, %v, the pool's prefixes", c.name, got.FirstDevice, got.ExcludeTags, got.Prefixes, c.wantFirst, c.wantTags)
		}
	}
}
