// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"net/netip"
	"strconv"
	"sync/atomic"
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
)

// The scenarios of FACTS.md section 6, replayed at the workers' level:
// capacity.Worker against the EC2 fake through the real SDK over TLS,
// and a real PostgreSQL.

var scenTags = map[string]string{cloud.TagCluster: "test"}

// scen is newWorld's one m5.large (3 interfaces of 10 addresses) in a
// /24, its node n1 in pool eni and a worker over both, with the helpers
// the scenarios add.
type scen struct{ *world }

func newScen(t *testing.T, spec alloc.CloudSpec) *scen {
	t.Helper()
	return &scen{newWorld(t, spec)}
}

// worker is a new Worker value over the same store and cloud: what a
// restarted replica starts with (nothing in memory).
func (x *scen) worker() *Worker {
	return &Worker{Store: x.st, Provider: alloc.CloudAWS, Cloud: x.provider, Interfaces: x.provider, Inventory: x.provider, Tags: scenTags, Now: x.clock.Now}
}

// held is every secondary address the node's interfaces hold, and the
// interfaces attached to the instance.
func (x *scen) held() (addrs, ifaces int) {
	for _, f := range x.fake.Interfaces() {
		if f.Instance == x.inst {
			ifaces++
			addrs += len(f.Addresses)
		}
	}
	return addrs, ifaces
}

// calls counts the fake's calls of each action named.
func (x *scen) calls(actions ...string) map[string]int {
	out := map[string]int{}
	for _, a := range actions {
		out[a] = x.fake.Calls(a)
	}
	return out
}

var mutating = []string{"CreateNetworkInterface", "AttachNetworkInterface", "DetachNetworkInterface", "DeleteNetworkInterface",
	"AssignPrivateIpAddresses", "UnassignPrivateIpAddresses"}

// TestScenarioDetachCrashLeavesNoLeak (amazon-vpc-cni-k8s#69, #608): a
// worker that stopped right after DetachInterface leaves an interface
// detaching; the collector touches it neither while it detaches nor
// before its age, deletes it after, and never the attached ones.
func TestScenarioDetachCrashLeavesNoLeak(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 12}})
	for range 3 {
		if err := x.w.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if _, ifaces := x.held(); ifaces != 2 {
		t.Fatalf("%d interfaces attached, want 2 for 12 addresses", ifaces)
	}
	var eni1 string
	for _, f := range x.fake.Interfaces() {
		if f.Instance == x.inst && f.ID != x.eni0 {
			eni1 = f.ID
		}
	}
	// The crash: detach started, the delete never made.
	if err := x.provider.DetachInterface(t.Context(), eni1); err != nil {
		t.Fatal(err)
	}
	collect := func() []string {
		t.Helper()
		got, err := cloud.CollectLeaked(t.Context(), x.provider, scenTags, cloud.DefaultLeakAge, x.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	x.clock.Advance(cloud.DefaultLeakAge)
	if got := collect(); len(got) != 0 {
		t.Fatalf("deleted %v while it detached", got)
	}
	x.fake.FinishDetaches()
	x.clock.Advance(-cloud.DefaultLeakAge + time.Minute)
	if got := collect(); len(got) != 0 {
		t.Fatalf("deleted %v before its age", got)
	}
	x.clock.Advance(cloud.DefaultLeakAge)
	if got := collect(); len(got) != 1 || got[0] != eni1 {
		t.Fatalf("collected %v, want [%s]", got, eni1)
	}
	var available, inUse int
	for _, f := range x.fake.Interfaces() {
		switch f.Status {
		case "available", "detaching":
			available++
		case "in-use":
			inUse++
		}
	}
	if available != 0 || inUse != 1 || x.fake.Calls("DeleteNetworkInterface") != 1 {
		t.Fatalf("%d interfaces left unattached, %d in use, %d deletes; want 0, 1, 1", available, inUse, x.fake.Calls("DeleteNetworkInterface"))
	}
	// The next passes serve the node again with a new interface.
	for range 3 {
		if err := x.w.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if addrs, ifaces := x.held(); ifaces != 2 || addrs < 12 {
		t.Fatalf("after the collection the node has %d interfaces, %d addresses", ifaces, addrs)
	}
}

// TestScenarioTerminatedInstanceNoLoop (cilium#9533, #11088): a
// terminated instance gets no create, attach or delete over passes.
func TestScenarioTerminatedInstanceNoLoop(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 12}})
	x.fake.TerminateInstance(x.inst)
	before := x.calls(mutating...)
	for range 5 {
		if err := x.w.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
		x.clock.Advance(time.Minute)
	}
	after := x.calls(mutating...)
	for _, a := range mutating {
		if after[a] != before[a] {
			t.Errorf("%s: %d calls against a terminated instance over 5 passes, want 0", a, after[a]-before[a])
		}
	}
}

// TestScenarioRestartTouchesNothingInUse (amazon-vpc-cni-k8s#1967): a
// new Worker value with empty memory over the same database unassigns,
// detaches and deletes nothing the node uses.
func TestScenarioRestartTouchesNothingInUse(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}, ReleaseDelay: time.Minute})
	for range 4 {
		if err := x.w.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			if _, err := x.lease(t, "c"+strconv.Itoa(x.fake.Calls("AssignPrivateIpAddresses"))+"-"+strconv.Itoa(i)); err != nil {
				break
			}
		}
	}
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	addrs0, ifaces0 := x.held()
	if ifaces0 != 2 {
		t.Fatalf("%d interfaces before the restart, want 2", ifaces0)
	}
	before := x.calls("UnassignPrivateIpAddresses", "DetachNetworkInterface", "DeleteNetworkInterface")
	w := x.worker()
	for range 3 {
		x.clock.Advance(2 * time.Minute)
		if err := w.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	after := x.calls("UnassignPrivateIpAddresses", "DetachNetworkInterface", "DeleteNetworkInterface")
	for a, n := range after {
		if n != before[a] {
			t.Errorf("%s: %d calls after the restart, want 0", a, n-before[a])
		}
	}
	if addrs, ifaces := x.held(); ifaces != ifaces0 || addrs < addrs0 {
		t.Fatalf("after the restart %d interfaces, %d addresses; before %d, %d", ifaces, addrs, ifaces0, addrs0)
	}
}

// TestScenarioLimitsRespected (cilium#9730, #8830): a need beyond the
// type makes no call EC2 refuses: interfaces up to the attachment limit,
// addresses up to each one's.
func TestScenarioLimitsRespected(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 40}})
	var refused []string
	x.fake.SetFault(nil)
	for range 4 {
		if err := x.w.Pass(t.Context()); err != nil {
			refused = append(refused, err.Error())
		}
	}
	addrs, ifaces := x.held()
	if ifaces != 3 || addrs != 27 {
		t.Fatalf("%d interfaces, %d addresses; want the type's 3 and 27", ifaces, addrs)
	}
	c := x.calls("CreateNetworkInterface", "AttachNetworkInterface", "DeleteNetworkInterface")
	if c["CreateNetworkInterface"] != 2 || c["AttachNetworkInterface"] != 2 || c["DeleteNetworkInterface"] != 0 {
		t.Fatalf("calls %v, want 2 creates, 2 attaches, 0 deletes", c)
	}
	for _, f := range x.fake.Interfaces() {
		if len(f.Addresses) > 9 {
			t.Fatalf("%s holds %d secondary addresses, the type allows 9", f.ID, len(f.Addresses))
		}
	}
	t.Logf("pass errors at the limit: %v", refused)
}

// retrying is a worker over the same fake whose SDK retries as the
// server's does (the standard retryer: three attempts), without the
// waits between them.
func (x *scen) retrying() *Worker {
	client := ec2.New(ec2.Options{Region: "eu-west-1", BaseEndpoint: sdkaws.String(x.srv.URL), HTTPClient: aws.SafeBodies(x.srv.Client()),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		})})
	p := aws.New(client, aws.Options{Now: x.clock.Now, Wait: func(int) time.Duration { return 0 }})
	w := x.worker()
	w.Cloud, w.Interfaces, w.Inventory = p, p, p
	return w
}

// release ends the lease of container.
func (x *scen) release(t *testing.T, container string) {
	t.Helper()
	if _, err := x.st.ReleaseAttachment(t.Context(), alloc.DefaultSpace, "n1", alloc.Attachment{ContainerID: container, Interface: "eth0"}); err != nil {
		t.Fatal(err)
	}
}

// cooledAndPurged moves the clock past the store's cooldown (a second)
// and purges the cooled leases: the addresses of the Pods that went are
// free again, their blocks drainable.
func (w *world) cooledAndPurged(t *testing.T) {
	t.Helper()
	w.clock.Advance(2 * time.Second)
	if _, err := w.st.PurgeCooled(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// unattached counts the interfaces attached to nothing.
func (x *scen) unattached() int {
	n := 0
	for _, f := range x.fake.Interfaces() {
		if f.Instance == "" {
			n++
		}
	}
	return n
}

// TestScenarioThrottlingAbsorbed (amazon-vpc-cni-k8s#123): with one EC2
// call in three refused RequestLimitExceeded, the SDK's retries absorb
// every refusal: each pass succeeds, every Pod gets an address, and the
// node gets the interfaces it needs and not one more.
func TestScenarioThrottlingAbsorbed(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 6}})
	var n atomic.Int64
	x.fake.SetFault(func(string) *ec2fake.APIError {
		if n.Add(1)%3 == 0 {
			return ec2fake.Throttled()
		}
		return nil
	})
	w := x.retrying()
	pods := 0
	for pass := range 8 {
		if err := w.Pass(t.Context()); err != nil {
			t.Fatalf("pass %d: %v", pass, err)
		}
		for range 3 {
			if _, err := x.lease(t, "c"+strconv.Itoa(pods)); err != nil {
				t.Fatalf("pass %d: Pod %d got no address: %v", pass, pods, err)
			}
			pods++
		}
	}
	addrs, ifaces := x.held()
	if ifaces != 3 || addrs < pods || x.unattached() != 0 {
		t.Fatalf("%d Pods: %d interfaces attached, %d addresses, %d unattached; want 3, >= %d, 0", pods, ifaces, addrs, x.unattached(), pods)
	}
	if c := x.fake.Calls("CreateNetworkInterface"); c > 2*3 {
		t.Fatalf("%d creates for 2 interfaces: refused ones retried beyond the SDK's attempts", c)
	}
	if n.Load()/3 == 0 {
		t.Fatal("no call was refused")
	}
}

// TestScenarioThrottledAttachNoRunaway (amazon-vpc-cni-k8s#123): when
// every attach is refused for the rate, past the SDK's retries, a pass
// makes at most one interface for the node and deletes it again; none is
// left attached to nothing, and the node never holds more interfaces
// than it needs once the refusals stop.
func TestScenarioThrottledAttachNoRunaway(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 12}})
	x.fake.SetFault(func(action string) *ec2fake.APIError {
		if action == "AttachNetworkInterface" {
			return ec2fake.Throttled()
		}
		return nil
	})
	const passes = 6
	for range passes {
		if err := x.w.Pass(t.Context()); err != nil && cloud.KindOf(err) != cloud.KindThrottled {
			t.Fatalf("pass: %v, want a throttled refusal", err)
		}
		x.clock.Advance(time.Minute)
	}
	creates, deletes := x.fake.Calls("CreateNetworkInterface"), x.fake.Calls("DeleteNetworkInterface")
	if creates > passes || deletes != creates || x.unattached() != 0 {
		t.Fatalf("%d passes: %d creates, %d deletes, %d left unattached; want at most one create per pass, each deleted", passes, creates, deletes, x.unattached())
	}
	x.fake.SetFault(nil)
	for range 3 {
		x.pass(t)
	}
	if addrs, ifaces := x.held(); ifaces != 2 || addrs < 12 {
		t.Fatalf("after the refusals: %d interfaces, %d addresses; want 2 and 12", ifaces, addrs)
	}
}

// TestScenarioWarmIPChurnMakesNoCalls (amazon-vpc-cni-k8s#730, #2294):
// with WARM_IP_TARGET and MINIMUM_IP_TARGET the node holds what its Pods
// use plus the target, not a whole interface's worth; Pods replaced at a
// steady count (their addresses through the cooldown and back) make no
// EC2 call that changes anything.
func TestScenarioWarmIPChurnMakesNoCalls(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, WarmTargets: &alloc.WarmTargets{WarmIP: 2, MinimumIP: 4}, ReleaseDelay: time.Minute})
	live := []string{}
	next := 0
	start := func() {
		t.Helper()
		c := "c" + strconv.Itoa(next)
		next++
		if _, err := x.lease(t, c); err != nil {
			t.Fatalf("Pod %s: %v", c, err)
		}
		live = append(live, c)
	}
	x.pass(t)
	for range 6 {
		start()
		x.pass(t)
	}
	for range 3 {
		x.clock.Advance(time.Minute)
		x.pass(t)
	}
	if addrs, ifaces := x.held(); addrs != 8 || ifaces != 1 {
		t.Fatalf("6 Pods, WARM_IP_TARGET 2: the node holds %d addresses on %d interfaces, want 8 on 1", addrs, ifaces)
	}
	before := x.calls(mutating...)
	for round := range 20 {
		// Two Pods go, two come: the new ones take what the warm target
		// kept, the old addresses cool down and count as free again.
		for _, c := range live[:2] {
			x.release(t, c)
		}
		live = live[2:]
		start()
		start()
		x.clock.Advance(2 * time.Second)
		if err := x.w.Pass(t.Context()); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	after := x.calls(mutating...)
	for _, a := range mutating {
		if after[a] != before[a] {
			t.Errorf("%s: %d calls over 20 rounds of churn at a steady 6 Pods, want 0", a, after[a]-before[a])
		}
	}
}

// TestScenarioFragmentedSubnetFallsBack (cilium#29634): a prefix pool on
// a subnet with free addresses but no free aligned /28 gives the node
// single addresses instead of "no more IPs", and its Pods get them.
func TestScenarioFragmentedSubnetFallsBack(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Prefixes: true, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	subnet := netip.MustParsePrefix("10.90.0.0/24")
	for a := subnet.Addr(); subnet.Contains(a); a = a.Next() {
		if a.As4()[3]%16 == 9 {
			x.fake.Take("subnet-0123456789abcdef0", a)
		}
	}
	free := x.fake.FreeAddresses("subnet-0123456789abcdef0")
	for range 2 {
		x.pass(t)
	}
	held, prefixes := x.fake.Held(x.eni0)
	if len(prefixes) != 0 || len(held) < 4 {
		t.Fatalf("the node holds %v and prefixes %v on a subnet with no free /28 (%d addresses free): want single addresses", held, prefixes, free)
	}
	for i := range 4 {
		if _, err := x.lease(t, "c"+strconv.Itoa(i)); err != nil {
			t.Fatalf("Pod %d: %v", i, err)
		}
	}
}

// TestScenarioWarmENIScaleDownGivesBack (amazon-vpc-cni-k8s#2294): sized
// by WARM_ENI_TARGET=1, a node that scaled to three interfaces gives the
// surplus one back once its Pods are gone (after the release delay, and
// once: the cloud detaches asynchronously, and an interface detaching is
// not given back twice), keeping one interface's worth free as the target
// says, so the rest returns to the subnet instead of staying stranded;
// the collector then deletes it.
func TestScenarioWarmENIScaleDownGivesBack(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, WarmTargets: &alloc.WarmTargets{WarmENI: 1}, ReleaseDelay: time.Minute})
	var pods []string
	for range 6 {
		x.pass(t)
		for len(pods) < 14 {
			c := "c" + strconv.Itoa(len(pods))
			if _, err := x.lease(t, c); err != nil {
				break
			}
			pods = append(pods, c)
		}
	}
	addrs0, ifaces0 := x.held()
	if ifaces0 != 3 || addrs0 < 14 || len(pods) != 14 {
		t.Fatalf("%d Pods on %d interfaces with %d addresses, want 14 on 3", len(pods), ifaces0, addrs0)
	}
	free := x.fake.FreeAddresses("subnet-0123456789abcdef0")
	// The first Pod (on the primary interface's addresses) stays; the
	// others go.
	for _, c := range pods[1:] {
		x.release(t, c)
	}
	x.cooledAndPurged(t)
	x.pass(t)
	if _, ifaces := x.held(); ifaces != 3 {
		t.Fatalf("%d interfaces before the release delay, want 3", ifaces)
	}
	for range 4 {
		x.clock.Advance(time.Minute)
		x.pass(t)
	}
	if c := x.fake.Calls("DetachNetworkInterface"); c != 1 {
		t.Fatalf("%d detaches, want 1", c)
	}
	x.fake.FinishDetaches()
	// 1 Pod, 18 held: 17 free, at least one interface's 9; without the
	// second interface 8, fewer.
	addrs, ifaces := x.held()
	if ifaces != 2 || addrs != 18 {
		t.Fatalf("after the scale-down %d interfaces with %d addresses, want 2 with 18", ifaces, addrs)
	}
	if _, err := x.lease(t, "after"); err != nil {
		t.Fatalf("a Pod after the scale-down: %v", err)
	}
	got, err := cloud.CollectLeaked(t.Context(), x.provider, scenTags, cloud.DefaultLeakAge, x.clock.Now().Add(cloud.DefaultLeakAge))
	if err != nil || len(got) != 1 {
		t.Fatalf("collected %v (%v), want the detached interface", got, err)
	}
	// Back: the interface's secondary addresses and its primary.
	if now, want := x.fake.FreeAddresses("subnet-0123456789abcdef0"), free+addrs0-18+1; now != want {
		t.Fatalf("the subnet has %d free addresses, want %d", now, want)
	}
}
