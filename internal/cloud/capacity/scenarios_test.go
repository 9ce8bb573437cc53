package capacity

import (
	"strconv"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
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
	return &Worker{Store: x.st, Provider: alloc.CloudAWS, Cloud: x.provider, Interfaces: x.provider, Tags: scenTags, Now: x.clock.Now}
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
