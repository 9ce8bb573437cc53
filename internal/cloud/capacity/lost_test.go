// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// Ambiguous outcomes: a give-back whose answer was lost, and readings
// that show the state of a moment ago. Either way no Pod may lease an
// address its interface does not hold (issue 35: the workers restored
// drained blocks blindly after a failed unassign or detach, and a stale
// describe right after an unassign recorded the address again).

// lossy serves the fake through a network that loses answers and a
// cloud that reads stale: the actions in lose have their change made and
// then their answer lost (EC2's 500 InternalError, which the SDK
// retries: the retry meets the changed state); while frozen, every
// describe answers what the same describe answered when it froze, as
// EC2's eventually consistent reads do for a while after a change.
type lossy struct {
	fake   *ec2fake.Server
	mu     sync.Mutex
	lose   map[string]int    // action -> answers still to lose
	last   map[string][]byte // describe (its form) -> its last answer
	frozen map[string][]byte // the answers of last when frozen; nil when reads are fresh
	seen   map[string]int    // action -> requests, the frozen answers' too
}

func newLossy(fake *ec2fake.Server) *lossy {
	return &lossy{fake: fake, lose: map[string]int{}, last: map[string][]byte{}, seen: map[string]int{}}
}

// calls counts the requests of each action named, answered frozen or not.
func (l *lossy) calls(actions ...string) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, a := range actions {
		out[a] = l.seen[a]
	}
	return out
}

func (l *lossy) loseNext(action string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lose[action] = n
}

// freeze makes the describes answer from now on as they last did;
// thaw makes them fresh again.
func (l *lossy) freeze() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.frozen = map[string][]byte{}
	for k, v := range l.last {
		l.frozen[k] = v
	}
}

func (l *lossy) thaw() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.frozen = nil
}

func (l *lossy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	action := r.PostForm.Get("Action")
	key := r.PostForm.Encode()
	describe := len(action) > 8 && action[:8] == "Describe"
	l.mu.Lock()
	l.seen[action]++
	if old, ok := l.frozen[key]; ok && describe {
		l.mu.Unlock()
		w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
		_, _ = w.Write(old)
		return
	}
	lost := l.lose[action] > 0
	if lost {
		l.lose[action]--
	}
	l.mu.Unlock()
	rec := httptest.NewRecorder()
	l.fake.ServeHTTP(rec, r)
	if lost {
		w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>InternalError</Code>` +
			`<Message>An internal error has occurred.</Message></Error></Errors><RequestID>lost</RequestID></Response>`))
		return
	}
	body := rec.Body.Bytes()
	if describe && rec.Code == http.StatusOK {
		l.mu.Lock()
		l.last[key] = bytes.Clone(body)
		l.mu.Unlock()
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(body)
}

// lossyScen is a scenario whose fake is served through a lossy network,
// with a worker whose SDK retries as the server's does.
func lossyScen(t *testing.T, spec alloc.CloudSpec) (*scen, *lossy, *Worker) {
	t.Helper()
	var l *lossy
	x := &scen{newWorldVia(t, spec, nil, func(f *ec2fake.Server) http.Handler { l = newLossy(f); return l })}
	return x, l, x.retrying()
}

// leasableNotHeld answers the node's blocks a Pod could lease (recorded,
// not drained) that no interface of its instance holds in the fake's
// truth.
func (x *world) leasableNotHeld(t *testing.T) []netip.Prefix {
	t.Helper()
	held := map[netip.Prefix]bool{}
	for _, f := range x.fake.Interfaces() {
		if f.Instance != x.inst || f.Status == "detaching" {
			continue
		}
		for _, a := range f.Addresses {
			held[netip.PrefixFrom(a, 32)] = true
		}
		for _, p := range f.Prefixes {
			held[p] = true
		}
	}
	nodes, err := x.st.CloudNodes(t.Context(), alloc.DefaultSpace, "eni")
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Prefix
	for _, b := range nodes[0].Blocks {
		if !b.Drained && !held[b.Prefix] {
			out = append(out, b.Prefix)
		}
	}
	return out
}

// shrink sets the pool's pre-allocation to pre, keeping its release
// delay of a minute.
func (x *scen) shrink(t *testing.T, spec alloc.CloudSpec) {
	t.Helper()
	if _, err := x.st.UpdatePool(t.Context(), alloc.DefaultSpace, "eni", nil, alloc.PoolSpec{
		IPv4:      &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.90.0.0/24")}, MaskSize: 28},
		NodeLocal: alloc.DefaultNodeLocal, Cloud: &spec}); err != nil {
		t.Fatal(err)
	}
}

// passChecked runs a pass of w (its error logged: faults make some
// fail) and fails the test if afterwards a Pod could lease an address
// its interface does not hold.
func (x *scen) passChecked(t *testing.T, w *Worker) {
	t.Helper()
	if err := w.Pass(t.Context()); err != nil {
		t.Logf("pass: %v", err)
	}
	if bad := x.leasableNotHeld(t); len(bad) > 0 {
		t.Fatalf("leasable blocks the interface does not hold: %v", bad)
	}
}

// excessDue is a lossy scenario whose node holds 6 addresses of which 4
// are excess (the pool shrank to a pre-allocation of 2) for its release
// delay: the next pass gives them back.
func excessDue(t *testing.T) (*scen, *lossy, *Worker) {
	t.Helper()
	spec := alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 6}, ReleaseDelay: time.Minute}
	x, l, w := lossyScen(t, spec)
	x.passChecked(t, w)
	spec.Watermarks = &alloc.Watermarks{PreAllocate: 2}
	x.shrink(t, spec)
	x.passChecked(t, w)
	x.clock.Advance(time.Minute)
	return x, l, w
}

// TestLostUnassignAnswerNeverLeasable: the unassign of the excess
// happens but its answer is lost; the SDK's retry hears "not assigned".
// The blocks stay unleasable, and go once the readings agree.
func TestLostUnassignAnswerNeverLeasable(t *testing.T) {
	spec := alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 6}, ReleaseDelay: time.Minute}
	x, l, w := lossyScen(t, spec)
	x.passChecked(t, w)
	if _, err := x.lease(t, "c1"); err != nil {
		t.Fatal(err)
	}
	spec.Watermarks = &alloc.Watermarks{PreAllocate: 2}
	x.shrink(t, spec)
	x.passChecked(t, w)
	x.clock.Advance(time.Minute)
	l.loseNext("UnassignPrivateIpAddresses", 1)
	x.passChecked(t, w)
	if held, _ := x.fake.Held(x.eni0); len(held) != 3 {
		t.Fatalf("the cloud holds %v after the unassign, want 3", held)
	}
	for i := range 5 {
		x.clock.Advance(10 * time.Second)
		x.passChecked(t, w)
		if _, err := x.lease(t, "p"+strconv.Itoa(i)); err != nil {
			t.Logf("lease: %v", err)
		}
		x.release(t, "p"+strconv.Itoa(i))
	}
	if b := x.blocks(t); b != 3 {
		t.Fatalf("%d blocks recorded after the readings settled, want the 3 the cloud holds", b)
	}
}

// TestLostUnassignRefusedIsRestored: an unassign the cloud truly
// refused (every attempt throttled) leaves the addresses on the
// interface: they come back to the node once the release guard says the
// readings are settled, not before.
func TestLostUnassignRefusedIsRestored(t *testing.T) {
	x, _, w := excessDue(t)
	x.fake.SetFault(func(action string) *ec2fake.APIError {
		if action == "UnassignPrivateIpAddresses" {
			return ec2fake.Throttled()
		}
		return nil
	})
	x.passChecked(t, w)
	x.fake.SetFault(nil)
	if held, _ := x.fake.Held(x.eni0); len(held) != 6 {
		t.Fatalf("the cloud holds %v after a refused unassign, want 6", held)
	}
	live := func() int {
		nodes, err := x.st.CloudNodes(t.Context(), alloc.DefaultSpace, "eni")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, b := range nodes[0].Blocks {
			if !b.Drained {
				n++
			}
		}
		return n
	}
	for range 5 {
		x.clock.Advance(10 * time.Second)
		x.passChecked(t, w)
		if n := live(); n != 2 {
			t.Fatalf("%d leasable blocks within the release guard, want 2", n)
		}
	}
	// The guard ends: the readings say the interface kept them.
	x.clock.Advance(10 * time.Second)
	x.passChecked(t, w)
	if n := live(); n != 6 {
		t.Fatalf("%d leasable blocks after the release guard, want the 6 the cloud kept", n)
	}
}

// TestStaleReadAfterUnassignNotRecorded: the unassign succeeds, and the
// describes after it still show the addresses (EC2's eventual
// consistency): they are not recorded again (the VPC CNI's cooldown of
// recently freed addresses).
func TestStaleReadAfterUnassignNotRecorded(t *testing.T) {
	x, l, w := excessDue(t)
	// The node's own describe too answers as now when frozen (the worker
	// describes a node alone after it changed it): not as at the first
	// pass, before anything was assigned.
	if _, err := x.provider.Instance(t.Context(), x.inst); err != nil {
		t.Fatal(err)
	}
	// So does the network's listing.
	if _, err := x.provider.Instances(t.Context(), "vpc-1"); err != nil {
		t.Fatal(err)
	}
	l.freeze()
	x.passChecked(t, w)
	if held, _ := x.fake.Held(x.eni0); len(held) != 2 {
		t.Fatalf("the cloud holds %v, want 2", held)
	}
	for range 4 {
		x.clock.Advance(10 * time.Second)
		x.passChecked(t, w)
	}
	l.thaw()
	for range 3 {
		x.clock.Advance(10 * time.Second)
		x.passChecked(t, w)
	}
	if b := x.blocks(t); b != 2 {
		t.Fatalf("%d blocks, want the 2 the cloud holds", b)
	}
}

// TestLostDetachAnswerNeverLeasable: the detach of an interface in
// surplus happens but its answer is lost: its addresses never become
// leasable again, it is not detached twice, and its blocks go once the
// readings show it detaching.
func TestLostDetachAnswerNeverLeasable(t *testing.T) {
	spec := alloc.CloudSpec{Provider: alloc.CloudAWS, WarmTargets: &alloc.WarmTargets{WarmENI: 1}, ReleaseDelay: time.Minute}
	x, l, w := lossyScen(t, spec)
	var pods []string
	for range 6 {
		x.passChecked(t, w)
		for len(pods) < 14 {
			c := "c" + strconv.Itoa(len(pods))
			if _, err := x.lease(t, c); err != nil {
				break
			}
			pods = append(pods, c)
		}
	}
	if _, ifaces := x.held(); ifaces != 3 {
		t.Fatalf("%d interfaces, want 3", ifaces)
	}
	for _, c := range pods[1:] {
		x.release(t, c)
	}
	x.cooledAndPurged(t)
	x.passChecked(t, w)
	// Every attempt of the SDK loses its answer: the call fails, though
	// the first attempt detached.
	l.loseNext("DetachNetworkInterface", 3)
	for range 6 {
		x.clock.Advance(30 * time.Second)
		x.passChecked(t, w)
		if _, err := x.lease(t, "probe"); err == nil {
			x.release(t, "probe")
		}
	}
	if c := x.fake.Calls("DetachNetworkInterface"); c != 3 {
		t.Fatalf("%d detach requests, want 3 (one call and the SDK's retries)", c)
	}
}

// TestStaleListingAfterAddAsksNoMore: EC2's describes are eventually
// consistent, so a listing made seconds after a round's answer may lack
// what the round added. Within the release guard the answer is the
// cloud's word on what the interface holds: the node neither looks
// short (the workers asked for the same addresses again, given back
// minutes later) nor looks robbed of its blocks (described alone to
// confirm, a describe herd under load), and no Pod can lease an address
// the interface lacks.
func TestStaleListingAfterAddAsksNoMore(t *testing.T) {
	x, l, w := lossyScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	w.Resync = 20 * time.Second
	x.passChecked(t, w) // lists, then adds 4
	if held, _ := x.fake.Held(x.eni0); len(held) != 4 {
		t.Fatalf("the cloud holds %v, want 4", held)
	}
	// Every describe answers as before the add: the listing of the next
	// pass, and any describe of the node alone.
	l.freeze()
	before := l.calls("AssignPrivateIpAddresses", "DescribeInstances", "DescribeNetworkInterfaces")
	for range 3 {
		x.clock.Advance(10 * time.Second)
		x.passChecked(t, w)
	}
	after := l.calls("AssignPrivateIpAddresses", "DescribeInstances", "DescribeNetworkInterfaces")
	if got := after["AssignPrivateIpAddresses"] - before["AssignPrivateIpAddresses"]; got != 0 {
		held, _ := x.fake.Held(x.eni0)
		t.Fatalf("%d assigns on stale listings (the cloud holds %v): want 0", got, held)
	}
	// One listing (instances and interfaces) in 30 s of a 20 s resync,
	// and no describe of the node alone.
	if di, dni := after["DescribeInstances"]-before["DescribeInstances"], after["DescribeNetworkInterfaces"]-before["DescribeNetworkInterfaces"]; di != 1 || dni != 1 {
		t.Fatalf("%d DescribeInstances and %d DescribeNetworkInterfaces in 3 passes, want one listing", di, dni)
	}
	if b := x.blocks(t); b != 4 {
		t.Fatalf("%d blocks, want the 4 the cloud holds", b)
	}
	l.thaw()
	for range 2 {
		x.clock.Advance(10 * time.Second)
		x.passChecked(t, w)
	}
	if b := x.blocks(t); b != 4 {
		t.Fatalf("%d blocks after fresh readings, want the 4 the cloud holds", b)
	}
}
