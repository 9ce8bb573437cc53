// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azcloud "github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/azure"
	"github.com/ipam-dev/ipam/internal/cloud/azure/armfake"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/testclock"
)

type staticToken struct{}

func (staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "token", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// azureWorld is a store on a database of its own, an ARM fake with a
// scale set of VMs in one subnet, each VM's node registered in pool nics,
// and a worker over both. requests are every request the fake got.
type azureWorld struct {
	st    *store.Store
	fake  *armfake.Server
	w     *Worker
	clock *testclock.Clock
	vms   []string
	nics  []string

	mu       sync.Mutex
	requests []armRequest
}

type armRequest struct {
	method, path string
	at           time.Time
}

// azureGroup is the nodes' resource group, spelled as AKS's are: the
// nodes' providerIDs spell it lower-cased.
const azureGroup = "MC_rg_cluster_westeurope"

func newAzureWorld(t *testing.T, spec alloc.CloudSpec, vms int, retry policy.RetryOptions) *azureWorld {
	t.Helper()
	return newAzureWorldIn(t, spec, vms, retry, "10.96.0.0/24")
}

// newAzureWorldIn is newAzureWorld with the VMs' subnet cidr.
func newAzureWorldIn(t *testing.T, spec alloc.CloudSpec, vms int, retry policy.RetryOptions, cidr string) *azureWorld {
	t.Helper()
	ctx := t.Context()
	x := &azureWorld{clock: testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))}
	st, err := store.Open(ctx, pgtest.NewDatabase(t), store.Options{LeaseExpiry: time.Hour, Cooldown: time.Second, Now: x.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	x.st, x.fake = st, armfake.New()
	subnet := armfake.SubnetID(azureGroup, "vnet", "nodes")
	x.fake.AddSubnet(subnet, netip.MustParsePrefix(cidr))
	for i := range vms {
		vm, nic, err := x.fake.AddScaleSetVM(azureGroup, "pool1", strconv.Itoa(i), subnet, true)
		if err != nil {
			t.Fatal(err)
		}
		x.vms, x.nics = append(x.vms, vm), append(x.nics, nic)
	}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		x.mu.Lock()
		x.requests = append(x.requests, armRequest{r.Method, r.URL.Path, time.Now()})
		x.mu.Unlock()
		x.fake.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	x.fake.SetBase(srv.URL)
	provider, err := azure.New(armfake.Subscription, staticToken{}, &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Cloud: azcloud.Configuration{ActiveDirectoryAuthorityHost: srv.URL, Services: map[azcloud.ServiceName]azcloud.ServiceConfiguration{
			azcloud.ResourceManager: {Endpoint: srv.URL, Audience: "https://management.core.windows.net/"},
		}},
		Transport: srv.Client(),
		Retry:     retry,
	}})
	if err != nil {
		t.Fatal(err)
	}
	provider.Now = x.clock.Now
	if _, err := st.CreatePool(ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: "nics",
		Spec: alloc.PoolSpec{IPv4: &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}, MaskSize: 28},
			NodeLocal: alloc.DefaultNodeLocal, Cloud: &spec}}); err != nil {
		t.Fatal(err)
	}
	for i, vm := range x.vms {
		// As AKS's kubelets write it: the group lower-cased.
		pid := azure.ProviderIDPrefix + strings.Replace(vm, azureGroup, strings.ToLower(azureGroup), 1)
		if _, _, err := st.PutNode(ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "vmss-" + strconv.Itoa(i), ProviderID: pid}); err != nil {
			t.Fatal(err)
		}
	}
	// As the server's: passes after the first list the resource group.
	x.w = &Worker{Store: st, Provider: alloc.CloudAzure, Cloud: provider, Inventory: provider, Now: x.clock.Now}
	return x
}

// since answers the requests from the n-th on.
func (x *azureWorld) since(n int) []armRequest {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.requests[n:])
}

func (x *azureWorld) count() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.requests)
}

// TestPassAzure: a scale set instance's node, by its Azure providerID,
// gets its pre-allocation as IP configurations of its NIC, recorded as
// blocks it leases from.
func TestPassAzure(t *testing.T) {
	ctx := t.Context()
	x := newAzureWorld(t, alloc.CloudSpec{Provider: alloc.CloudAzure, Watermarks: &alloc.Watermarks{PreAllocate: 3}}, 1, policy.RetryOptions{MaxRetries: -1})
	st, fake, nic := x.st, x.fake, x.nics[0]
	if err := x.w.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	nodes, err := st.CloudNodes(ctx, alloc.DefaultSpace, "nics")
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || len(nodes[0].Blocks) != 3 || nodes[0].Blocks[0].Interface != nic {
		t.Fatalf("cloud nodes %+v", nodes)
	}
	given := map[netip.Addr]bool{}
	for _, a := range fake.Addresses(nic) {
		given[a] = true
	}
	a, err := st.Allocate(ctx, alloc.LeaseRequest{Space: alloc.DefaultSpace, Node: "vmss-0", Pool: "nics",
		Owner: alloc.Owner{Namespace: "ns", Name: "p"}, Attachment: alloc.Attachment{ContainerID: "c1", Interface: "eth0"}})
	if err != nil {
		t.Fatal(err)
	}
	if addr := a.Leases[0].Addr; !given[addr] || addr == netip.MustParseAddr("10.96.0.4") {
		t.Fatalf("leased %v: not a secondary address Azure gave (%v)", addr, given)
	}
}

// TestScenarioAzureThrottleStorm (cilium#19695, #16206, PR #41555): the
// storms of 429s came from a scale set update per change and from
// subscription-wide listing. Here every request stays inside the nodes'
// resource group; a pass writes each scale set instance at most once,
// and a pass with nothing to change writes nothing; under 429s the SDK
// waits Retry-After before it tries again and adds no write of its own;
// when every write is refused, the next pass after the storm serves every
// node.
func TestScenarioAzureThrottleStorm(t *testing.T) {
	// More retries than refusals in the burst below, so that however the
	// refusals fall among the VMs, each write gets through.
	const vms, retries = 4, 5
	x := newAzureWorld(t, alloc.CloudSpec{Provider: alloc.CloudAzure, Watermarks: &alloc.Watermarks{PreAllocate: 3}}, vms,
		policy.RetryOptions{MaxRetries: retries, RetryDelay: time.Millisecond, MaxRetryDelay: time.Second})
	const retryAfter = 50 * time.Millisecond
	isWrite := func(method string) bool { return method == http.MethodPut || method == http.MethodPatch }
	var refusals atomic.Int64
	refuse := func(n int64) {
		refusals.Store(n)
		x.fake.SetFault(func(method, path string) *armfake.Error {
			if isWrite(method) && refusals.Add(-1) >= 0 {
				e := armfake.Throttled()
				e.RetryAfterMs = int(retryAfter / time.Millisecond)
				return e
			}
			return nil
		})
	}
	writesTo := func(reqs []armRequest) map[string][]time.Time {
		out := map[string][]time.Time{}
		for _, r := range reqs {
			if isWrite(r.method) {
				out[r.path] = append(out[r.path], r.at)
			}
		}
		return out
	}

	// A burst of 429s, as many as VMs.
	refuse(vms)
	start := x.count()
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatalf("the SDK's retries should absorb one 429 per write: %v", err)
	}
	storm := x.since(start)
	writes := writesTo(storm)
	if len(writes) != vms {
		t.Fatalf("writes went to %d resources, want the %d scale set instances: %v", len(writes), vms, writes)
	}
	total := 0
	for path, at := range writes {
		total += len(at)
		if !strings.Contains(strings.ToLower(path), "/virtualmachinescalesets/pool1/virtualmachines/") {
			t.Errorf("a write to %s, not to a scale set instance", path)
		}
		for i := 1; i < len(at); i++ {
			if gap := at[i].Sub(at[i-1]); gap < retryAfter {
				t.Errorf("%s written again %v after a 429 that said Retry-After %v", path, gap, retryAfter)
			}
		}
	}
	if total != 2*vms {
		t.Fatalf("%d writes for %d instances and %d refusals, want %d: a refusal cost more than its one retry", total, vms, vms, 2*vms)
	}
	for i, nic := range x.nics {
		if n := len(x.fake.Addresses(nic)); n != 1+3 {
			t.Fatalf("vm %d: %d IP configurations, want its primary and 3", i, n)
		}
	}

	// Nothing to change: reads only, each inside the resource group.
	start = x.count()
	for range 3 {
		x.clock.Advance(time.Minute)
		if err := x.w.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	steady := x.since(start)
	if w := writesTo(steady); len(w) != 0 {
		t.Fatalf("passes with nothing to change wrote %v", w)
	}
	prefix := strings.ToLower("/subscriptions/" + armfake.Subscription + "/resourceGroups/" + azureGroup + "/")
	for _, r := range append(storm, steady...) {
		if p := strings.ToLower(r.path); !strings.HasPrefix(p, prefix) && !strings.HasPrefix(p, "/operations/") {
			t.Errorf("%s %s: a request outside the nodes' resource group", r.method, r.path)
		}
	}

	// A storm that outlasts the retries: every write refused. The pass
	// fails throttled, each instance written at most 1 + MaxRetries times.
	for i := range vms {
		if _, err := x.st.Allocate(t.Context(), alloc.LeaseRequest{Space: alloc.DefaultSpace, Node: "vmss-" + strconv.Itoa(i), Pool: "nics",
			Owner: alloc.Owner{Namespace: "ns", Name: "p" + strconv.Itoa(i)}, Attachment: alloc.Attachment{ContainerID: "c" + strconv.Itoa(i), Interface: "eth0"}}); err != nil {
			t.Fatal(err)
		}
	}
	refuse(1 << 30)
	start = x.count()
	if err := x.w.Pass(t.Context()); cloud.KindOf(err) != cloud.KindThrottled {
		t.Fatalf("a pass in a storm: %v, want throttled", err)
	}
	for path, at := range writesTo(x.since(start)) {
		if len(at) > 1+retries {
			t.Errorf("%s written %d times in one pass of the storm, want at most %d", path, len(at), 1+retries)
		}
	}
	x.fake.SetFault(nil)
	x.clock.Advance(BackoffMax) // the throttled nodes back off
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	for i, nic := range x.nics {
		if n := len(x.fake.Addresses(nic)); n != 1+4 {
			t.Fatalf("vm %d after the storm: %d IP configurations, want its primary and 4", i, n)
		}
	}
}

// TestPassAzureLists: once a pass has seen the nodes' resource group, a
// pass reads it with three lists (its NICs, its scale sets, the set's
// NICs) instead of one NIC list per node, and serves every node from it.
func TestPassAzureLists(t *testing.T) {
	const vms = 20
	x := newAzureWorld(t, alloc.CloudSpec{Provider: alloc.CloudAzure, Watermarks: &alloc.Watermarks{PreAllocate: 2}}, vms, policy.RetryOptions{MaxRetries: -1})
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, nic := range x.nics {
		if n := len(x.fake.Addresses(nic)); n != 1+2 {
			t.Fatalf("%s has %d configurations after the first pass, want 3", nic, n)
		}
	}
	start := x.count()
	x.clock.Advance(time.Minute)
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	reqs := x.since(start)
	if len(reqs) != 3 {
		t.Fatalf("a steady pass over %d nodes made %d requests, want 3 lists: %v", vms, len(reqs), reqs)
	}
	for _, r := range reqs {
		if r.method != http.MethodGet || !strings.HasSuffix(strings.ToLower(r.path), "networkinterfaces") && !strings.HasSuffix(strings.ToLower(r.path), "virtualmachinescalesets") {
			t.Fatalf("a steady pass made %s %s", r.method, r.path)
		}
	}
	// A node whose addresses ran out is served from the listing too: one
	// write, no read of its own.
	for i := range 2 {
		if _, err := x.st.Allocate(t.Context(), alloc.LeaseRequest{Space: alloc.DefaultSpace, Node: "vmss-7", Pool: "nics",
			Owner: alloc.Owner{Namespace: "ns", Name: "p"}, Attachment: alloc.Attachment{ContainerID: "c" + strconv.Itoa(i), Interface: "eth0"}}); err != nil {
			t.Fatal(err)
		}
	}
	start = x.count()
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(x.fake.Addresses(x.nics[7])); n != 1+4 {
		t.Fatalf("the drained node's NIC has %d configurations, want 5", n)
	}
	// The write reads the instance's model (and polls its operation),
	// but no pass lists a node's NICs alone.
	for _, r := range x.since(start) {
		if strings.HasSuffix(strings.ToLower(r.path), "/virtualmachines/7/networkinterfaces") {
			t.Fatalf("the pass listed the node's NICs alone: %s %s", r.method, r.path)
		}
	}
}

// TestScenarioAzureFullSubnet: Azure ignored subnet free space; every
// write asked a node's whole need, ARM refused it whole (SubnetIsFull),
// and the node was written again, refused again, every pass. Now a write
// asks no more than the subnet's free addresses, as Cilium's Azure IPAM
// does: two nodes each wanting 16 in a subnet with 25 free get 16 and 9
// in the first pass, and while the subnet stays full no pass writes to it
// again (the subnet is read once a minute; the node is reported subnet
// full).
func TestScenarioAzureFullSubnet(t *testing.T) {
	ctx := t.Context()
	// A /27: 32 addresses, 5 reserved, 2 the VMs' primaries: 25 free.
	x := newAzureWorldIn(t, alloc.CloudSpec{Provider: alloc.CloudAzure, Watermarks: &alloc.Watermarks{PreAllocate: 16}}, 2,
		policy.RetryOptions{MaxRetries: -1}, "10.97.0.0/27")
	writes := func() int {
		n := 0
		for _, r := range x.since(0) {
			if r.method == http.MethodPut {
				n++
			}
		}
		return n
	}
	err := x.w.Pass(ctx)
	if err != nil {
		t.Fatalf("the first pass: %v", err)
	}
	got := []int{len(x.fake.Addresses(x.nics[0])) - 1, len(x.fake.Addresses(x.nics[1])) - 1}
	slices.Sort(got)
	if !slices.Equal(got, []int{9, 16}) {
		t.Fatalf("the nodes got %v secondary addresses, want 9 and 16 of the 25 free", got)
	}
	if n := writes(); n != 2 {
		t.Fatalf("%d writes in the first pass, want one a node", n)
	}
	for range 8 {
		x.clock.Advance(10 * time.Second)
		if err := x.w.Pass(ctx); err != nil && cloud.KindOf(err) != cloud.KindSubnetFull {
			t.Fatalf("a pass on a full subnet: %v", err)
		}
	}
	if n := writes(); n != 2 {
		t.Fatalf("%d writes after 8 passes on a full subnet, want still 2", n)
	}
	nodes, err := x.st.CloudNodes(ctx, alloc.DefaultSpace, "nics")
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes[0].Blocks)+len(nodes[1].Blocks) != 25 {
		t.Fatalf("%d and %d blocks recorded, want the 25 Azure gave", len(nodes[0].Blocks), len(nodes[1].Blocks))
	}
}
