// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// onePool creates the default pool of one /30 block with the router
// reserved: one leasable address, 10.9.0.2, so reuse is forced.
func onePool(e *env) {
	e.t.Helper()
	e.mustDo(201, "POST", "/v1/pools", map[string]any{
		"name": "default",
		"spec": map[string]any{
			"ipv4":      map[string]any{"cidrs": []string{"10.9.0.0/30"}, "maskSize": 30},
			"nodeLocal": map[string]any{"health": false},
		},
	}, nil)
}

// wantProblem fails unless res is a problem of status, type kind and field.
func wantProblem(t *testing.T, what string, res response, status int, kind, field string) ipamv1.Problem {
	t.Helper()
	p := res.problem(t)
	if res.status != status || p.Type != "urn:ipam:problem:"+kind || deref(p.Field, "") != field {
		t.Fatalf("%s: %d %s, want %d %s field %q", what, res.status, res.body, status, kind, field)
	}
	return p
}

// attachment reads an attachment's allocation (200) or fails.
func (e *env) attachment(node, cid string) ipamv1.Allocation {
	e.t.Helper()
	var a ipamv1.Allocation
	e.mustDo(200, "GET", "/v1/nodes/"+node+"/attachments/"+cid+"/eth0", nil, &a)
	return a
}

// A release or confirm naming an old generation, after the address or the
// attachment key was leased again, changes nothing and answers 409; calls
// naming the current generation work and stay idempotent when repeated.
func TestStaleGenerationChangesNothing(t *testing.T) {
	e := newEnv(t, nil)
	onePool(e)
	var first ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p1"), &first)
	g1 := first.Generation
	if g1 < 1 || first.Addresses[0].Generation == nil || *first.Addresses[0].Generation != g1 {
		t.Fatalf("allocation generation %s", dump(first))
	}
	// Retries of ADD answer the same generation.
	var retry ipamv1.Allocation
	e.mustDo(200, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p1"), &retry)
	if retry.Generation != g1 {
		t.Fatalf("retry generation %d, want %d", retry.Generation, g1)
	}
	// Release with the right generation, twice: the second is a no-op.
	e.mustDo(204, "DELETE", fmt.Sprintf("/v1/addresses/10.9.0.2?generation=%d", g1), nil, nil)
	before := e.snapshot()
	e.mustDo(204, "DELETE", fmt.Sprintf("/v1/addresses/10.9.0.2?generation=%d", g1), nil, nil)
	e.mustDo(204, "DELETE", fmt.Sprintf("/v1/nodes/n1/attachments/c1/eth0?generation=%d", g1), nil, nil)
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("repeated release changed the database:\n%v\n%v", before, after)
	}

	// The address is reused by another Pod after the cooldown.
	e.clock.Advance(testCooldown)
	var second ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c2", "eth0", "p2"), &second)
	g2 := second.Generation
	if second.Addresses[0].Address != "10.9.0.2/30" || g2 <= g1 {
		t.Fatalf("reuse %s after generation %d", dump(second), g1)
	}
	// A stale release of the old generation frees nothing.
	before = e.snapshot()
	p := wantProblem(t, "stale release by address", e.do("DELETE", fmt.Sprintf("/v1/addresses/10.9.0.2?generation=%d", g1), nil),
		409, "stale-generation", "generation")
	if !strings.Contains(deref(p.Detail, ""), fmt.Sprint(g2)) {
		t.Errorf("detail %q does not name the current generation %d", deref(p.Detail, ""), g2)
	}
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("stale release changed the database")
	}
	if a := e.attachment("n1", "c2"); a.State != ipamv1.Pending || a.Generation != g2 || a.Addresses[0].Address != "10.9.0.2/30" {
		t.Fatalf("the new holder lost its address: %s", dump(a))
	}
	// A future generation is stale too.
	wantProblem(t, "future generation", e.do("DELETE", fmt.Sprintf("/v1/addresses/10.9.0.2?generation=%d", g2+100), nil),
		409, "stale-generation", "generation")

	// The attachment key c2 is released and leased again (a late
	// duplicate ADD): late duplicates of confirm and DEL of the old
	// generation must not touch the new lease.
	e.mustDo(204, "DELETE", fmt.Sprintf("/v1/nodes/n1/attachments/c2/eth0?generation=%d", g2), nil, nil)
	e.clock.Advance(testCooldown)
	var third ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c2", "eth0", "p2"), &third)
	g3 := third.Generation
	if g3 <= g2 {
		t.Fatalf("generation %d after %d", g3, g2)
	}
	before = e.snapshot()
	wantProblem(t, "stale confirm", e.do("POST", fmt.Sprintf("/v1/nodes/n1/attachments/c2/eth0/confirm?generation=%d", g2), nil),
		409, "stale-generation", "generation")
	wantProblem(t, "stale DEL", e.do("DELETE", fmt.Sprintf("/v1/nodes/n1/attachments/c2/eth0?generation=%d", g2), nil),
		409, "stale-generation", "generation")
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("stale confirm or DEL changed the database")
	}
	// Confirm with the right generation, twice.
	var conf ipamv1.Allocation
	e.mustDo(200, "POST", fmt.Sprintf("/v1/nodes/n1/attachments/c2/eth0/confirm?generation=%d", g3), nil, &conf)
	if conf.State != ipamv1.Active || conf.Generation != g3 {
		t.Fatalf("confirmed %s", dump(conf))
	}
	before = e.snapshot()
	e.mustDo(200, "POST", fmt.Sprintf("/v1/nodes/n1/attachments/c2/eth0/confirm?generation=%d", g3), nil, &conf)
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) || conf.State != ipamv1.Active {
		t.Fatalf("second confirm changed the database or answered %s", dump(conf))
	}
	// Confirming an attachment that holds nothing is not found, with or
	// without a generation.
	wantProblem(t, "confirm of nothing", e.do("POST", fmt.Sprintf("/v1/nodes/n1/attachments/c9/eth0/confirm?generation=%d", g3), nil),
		404, "not-found", "containerID")
	// Listing and reading by address show the generation.
	var l ipamv1.Lease
	e.mustDo(200, "GET", "/v1/addresses/10.9.0.2", nil, &l)
	if l.Generation != g3 {
		t.Errorf("lease generation %d, want %d", l.Generation, g3)
	}
}

// Dual-stack leases of one allocation share a generation, and a fenced
// DEL releases both.
func TestGenerationDualStack(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": map[string]any{
		"ipv4": map[string]any{"cidrs": []string{"10.0.0.0/16"}, "maskSize": 24},
		"ipv6": map[string]any{"cidrs": []string{"fd00::/104"}, "maskSize": 120},
	}}, nil)
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p1"), &a)
	if len(a.Addresses) != 2 || *a.Addresses[0].Generation != a.Generation || *a.Addresses[1].Generation != a.Generation {
		t.Fatalf("dual-stack generations %s", dump(a))
	}
	e.mustDo(204, "DELETE", fmt.Sprintf("/v1/nodes/n1/attachments/c1/eth0?generation=%d", a.Generation), nil, nil)
	if res := e.do("GET", "/v1/nodes/n1/attachments/c1/eth0", nil); res.status != 404 {
		t.Fatalf("after fenced DEL: %d %s", res.status, res.body)
	}
}

// A reconcile never releases a lease made after its list was taken: not one
// above the generation it names, and not one younger than the minimum age.
func TestReconcileKeepsLaterLeases(t *testing.T) {
	e := newEnvWith(t, nil, func(o *store.Options) { o.ReconcileMinAge = time.Minute })
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	var old, later ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("old", "eth0", "old"), &old)
	e.clock.Advance(2 * time.Minute)

	// The runtime reads the watermark, then lists (empty: "old" is gone),
	// and meanwhile an ADD leases "later".
	var w ipamv1.ReconcileWatermark
	e.mustDo(200, "GET", "/v1/nodes/n1/reconcile", nil, &w)
	if w.Generation < old.Generation {
		t.Fatalf("watermark %d below an issued generation %d", w.Generation, old.Generation)
	}
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("later", "eth0", "later"), &later)
	if later.Generation <= w.Generation {
		t.Fatalf("generation %d not above the watermark %d", later.Generation, w.Generation)
	}
	// Even once "later" is older than the minimum age, the watermark keeps it.
	e.clock.Advance(2 * time.Minute)
	var res ipamv1.ReconcileResult
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []string{}, "generation": w.Generation}, &res)
	if len(res.Released) != 1 || res.Released[0].ContainerID != "old" || res.Kept != 1 {
		t.Fatalf("reconcile up to %d released %s and kept %d, want later kept", w.Generation, dump(res.Released), res.Kept)
	}
	e.attachment("n1", "later")

	// Without a watermark, the minimum age alone keeps a young lease.
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("young", "eth0", "young"), nil)
	e.clock.Advance(30 * time.Second)
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []string{}}, &res)
	if len(res.Released) != 1 || res.Released[0].ContainerID != "later" || res.Kept != 1 {
		t.Fatalf("reconcile released %s and kept %d, want later only, young kept", dump(res.Released), res.Kept)
	}
	e.attachment("n1", "young")
	e.clock.Advance(30 * time.Second)
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []string{}}, &res)
	if len(res.Released) != 1 || res.Released[0].ContainerID != "young" || res.Kept != 0 {
		t.Fatalf("reconcile after the minimum age released %s", dump(res.Released))
	}
}

// The watermark of a database that has leased nothing is 0, and a
// reconcile naming it keeps every lease (each is above 0): the spec allows
// 0, and so does the server. Watermarks past int4 (2^31 and up to 2^63-1)
// are bigints all the way to the statement.
func TestReconcileWatermarkBounds(t *testing.T) {
	e := newEnvWith(t, nil, func(o *store.Options) { o.ReconcileMinAge = time.Minute })
	var w ipamv1.ReconcileWatermark
	e.mustDo(200, "GET", "/v1/nodes/n1/reconcile", nil, &w)
	if w.Generation != 0 {
		t.Fatalf("watermark of an empty database: %d", w.Generation)
	}
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("a", "eth0", "a"), nil)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("b", "eth0", "b"), nil)
	e.clock.Advance(2 * time.Minute)

	var res ipamv1.ReconcileResult
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", `{"attachments": [], "generation": 0}`, &res)
	if len(res.Released) != 0 {
		t.Fatalf("reconcile up to 0 released %s", dump(res.Released))
	}
	e.attachment("n1", "a")
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", `{"attachments": [{"containerID": "b", "interface": "eth0"}], "generation": 2147483648}`, &res)
	if len(res.Released) != 1 || res.Released[0].ContainerID != "a" {
		t.Fatalf("reconcile up to 2^31 released %s", dump(res.Released))
	}
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", `{"attachments": [], "generation": 9223372036854775807}`, &res)
	if len(res.Released) != 1 || res.Released[0].ContainerID != "b" {
		t.Fatalf("reconcile up to 2^63-1 released %s", dump(res.Released))
	}
	before := e.snapshot()
	for _, g := range []string{"-1", "-9223372036854775808", "9223372036854775808", "1e30", "1.5", `"1"`} {
		wantProblem(t, "generation "+g, e.do("POST", "/v1/nodes/n1/reconcile", `{"attachments": [], "generation": `+g+`}`),
			400, "invalid-input", "generation")
	}
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("refused reconciles changed the database")
	}
}

// Bad generations, identities and retentions are 400s naming the field,
// and change nothing.
func TestFenceAndStickyBadInput(t *testing.T) {
	e := newEnv(t, nil)
	onePool(e)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p1"), nil)
	sticky := func(s map[string]any) map[string]any { return leaseWith("sticky", s) }
	cases := []struct {
		name, method, path string
		body               any
		field              string
	}{
		{"zero generation", "DELETE", "/v1/addresses/10.9.0.2?generation=0", nil, "generation"},
		{"negative generation", "DELETE", "/v1/nodes/n1/attachments/c1/eth0?generation=-3", nil, "generation"},
		{"generation not a number", "POST", "/v1/nodes/n1/attachments/c1/eth0/confirm?generation=x", nil, "generation"},
		{"negative reconcile generation", "POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []string{}, "generation": -1}, "generation"},
		{"reconcile generation not a number", "POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []string{}, "generation": "x"}, "generation"},
		{"empty identity", "POST", "/v1/nodes/n1/leases", sticky(map[string]any{"identity": ""}), "sticky.identity"},
		{"identity with a space", "POST", "/v1/nodes/n1/leases", sticky(map[string]any{"identity": "web 0"}), "sticky.identity"},
		{"identity ending in a slash", "POST", "/v1/nodes/n1/leases", sticky(map[string]any{"identity": "statefulset/ns/web/"}), "sticky.identity"},
		{"identity too long", "POST", "/v1/nodes/n1/leases", sticky(map[string]any{"identity": strings.Repeat("a", 254)}), "sticky.identity"},
		{"identity not a string", "POST", "/v1/nodes/n1/leases", sticky(map[string]any{"identity": 7}), "sticky.identity"},
		{"retention not a duration", "POST", "/v1/nodes/n1/leases", sticky(map[string]any{"identity": "vm/a", "retention": "soon"}), "sticky.retention"},
		{"retention too long", "POST", "/v1/nodes/n1/leases", sticky(map[string]any{"identity": "vm/a", "retention": "721h"}), "sticky.retention"},
		{"retention below a second", "POST", "/v1/nodes/n1/leases", sticky(map[string]any{"identity": "vm/a", "retention": "10ms"}), "sticky.retention"},
		{"binding query without identity", "GET", "/v1/sticky-bindings", nil, "identity"},
		{"binding identity with a space", "DELETE", "/v1/sticky-bindings?identity=" + url.QueryEscape("a b"), nil, "identity"},
	}
	before := e.snapshot()
	for _, c := range cases {
		wantProblem(t, c.name, e.do(c.method, c.path, c.body), 400, "invalid-input", c.field)
	}
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("bad input changed the database")
	}
}

// stickyLease is a lease request bound to identity.
func stickyLease(cid, pod, identity string, extra map[string]any) map[string]any {
	s := map[string]any{"identity": identity}
	for k, v := range extra {
		s[k] = v
	}
	b := lease(cid, "eth0", pod)
	b["sticky"] = s
	return b
}

// bindingsOf reads the addresses bound to identity.
func (e *env) bindingsOf(identity string) []ipamv1.Lease {
	e.t.Helper()
	var l ipamv1.LeaseList
	e.mustDo(200, "GET", "/v1/sticky-bindings?identity="+url.QueryEscape(identity), nil, &l)
	return l.Items
}

// A Pod recreated with its identity on the same node gets its address back
// during and after the cooldown; nobody else gets it meanwhile; a bound
// block is not empty and a node holding a binding is not deleted unforced.
func TestStickySameNode(t *testing.T) {
	e := newEnvWith(t, nil, func(o *store.Options) { o.BlockReleaseHoldOff = 0 })
	// One /29 block: six addresses, the router takes one.
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": map[string]any{
		"ipv4":      map[string]any{"cidrs": []string{"10.9.0.0/29"}, "maskSize": 29},
		"nodeLocal": map[string]any{"health": false},
	}}, nil)
	const id = "statefulset/ns/web/0"
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", stickyLease("web-a", "web-0", id, map[string]any{"retention": "1h"}), &a)
	bound := a.Addresses[0].Address
	if s := a.Addresses[0].Sticky; s == nil || s.Identity != id || s.Retention != "1h0m0s" || s.Reused == nil || *s.Reused || s.Reason != nil {
		t.Fatalf("sticky status %s", dump(a.Addresses[0]))
	}
	// A retry is the same lease.
	var retry ipamv1.Allocation
	e.mustDo(200, "POST", "/v1/nodes/n1/leases", stickyLease("web-a", "web-0", id, map[string]any{"retention": "1h"}), &retry)
	// (The retry reads the stored lease: whether it was a reuse is only in
	// the first answer.)
	if retry.Addresses[0].Address != bound || retry.Generation != a.Generation || retry.Addresses[0].Sticky.Reused != nil {
		t.Fatalf("retry %s", dump(retry))
	}
	// While the Pod holds it, another Pod claiming the identity is refused.
	wantProblem(t, "identity held", e.do("POST", "/v1/nodes/n1/leases", stickyLease("web-b", "web-0", id, nil)), 409, "lease-conflict", "sticky.identity")

	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/web-a/eth0", nil, nil)
	if b := e.bindingsOf(id); len(b) != 1 || b[0].State != ipamv1.Cooling || b[0].Address != bound {
		t.Fatalf("bindings after release %s", dump(b))
	}
	// Other Pods fill the block and never get the bound address, even
	// after the cooldown.
	e.clock.Advance(testCooldown + time.Second)
	for i := range 4 {
		var o ipamv1.Allocation
		e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease(fmt.Sprint("other-", i), "eth0", "other"), &o)
		if o.Addresses[0].Address == bound {
			t.Fatalf("the bound address went to another Pod")
		}
	}
	wantProblem(t, "block full but for the bound address", e.do("POST", "/v1/nodes/n1/leases", lease("other-4", "eth0", "other")),
		409, "pool-exhausted", "pool")

	// Recreated after the cooldown: the same address, a new generation.
	var back ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", stickyLease("web-c", "web-0", id, nil), &back)
	if back.Addresses[0].Address != bound || back.Generation <= a.Generation ||
		back.Addresses[0].Sticky == nil || !deref(back.Addresses[0].Sticky.Reused, false) {
		t.Fatalf("after the cooldown %s", dump(back))
	}
	// Recreated at once, within the cooldown: the same address again.
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/web-c/eth0", nil, nil)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", stickyLease("web-d", "web-0", id, nil), &back)
	if back.Addresses[0].Address != bound || !deref(back.Addresses[0].Sticky.Reused, false) {
		t.Fatalf("within the cooldown %s", dump(back))
	}

	// A bound released address keeps its block and its node.
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/web-d/eth0", nil, nil)
	for i := range 4 {
		e.mustDo(204, "DELETE", fmt.Sprintf("/v1/nodes/n1/attachments/other-%d/eth0", i), nil, nil)
	}
	e.clock.Advance(time.Minute)
	if _, err := e.store.PurgeCooled(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Rebalance(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, "release of a bound block", e.do("DELETE", "/v1/nodes/n1/blocks?cidr=10.9.0.0/29", nil), 409, "in-use", "cidr")
	wantProblem(t, "unforced node deletion", e.do("DELETE", "/v1/nodes/n1", nil), 409, "in-use", "node")
	var blocks ipamv1.BlockList
	e.mustDo(200, "GET", "/v1/nodes/n1/blocks", nil, &blocks)
	if len(blocks.Items) != 1 {
		t.Fatalf("blocks %s", dump(blocks))
	}
	if b := e.bindingsOf(id); len(b) != 1 || b[0].Address != bound {
		t.Fatalf("bindings after the purge %s", dump(b))
	}
}

// Recreated on a node without the address's block, a Pod gets a fresh
// address and the answer says why (or, when it requires the old one, a
// 409 that says why and changes nothing); the identity moves with it and
// the old address cools and frees as any other.
func TestStickyOtherNode(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 28, "10.0.3.0/24"), nil)
	const id = "vm/ns/db"
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", stickyLease("c1", "db", id, nil), &a)
	old := strings.TrimSuffix(a.Addresses[0].Address, "/28")
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/c1/eth0", nil, nil)

	before := e.snapshot()
	p := wantProblem(t, "required on another node", e.do("POST", "/v1/nodes/n2/leases", stickyLease("c2", "db", id, map[string]any{"require": true})),
		409, "sticky-unavailable", "sticky.identity")
	want := fmt.Sprintf("%s is in block %s of node n1, not of n2", old, a.Addresses[0].Block)
	if !strings.Contains(deref(p.Detail, ""), want) {
		t.Errorf("detail %q, want it to say %q", deref(p.Detail, ""), want)
	}
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("a refused sticky request changed the database")
	}

	var moved ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n2/leases", stickyLease("c2", "db", id, nil), &moved)
	s := moved.Addresses[0].Sticky
	if s == nil || deref(s.Reused, true) || deref(s.Reason, "") != want || strings.HasPrefix(moved.Addresses[0].Address, old+"/") {
		t.Fatalf("moved %s, want a fresh address and the reason %q", dump(moved), want)
	}
	if b := e.bindingsOf(id); len(b) != 1 || b[0].Node != "n2" || b[0].Address != moved.Addresses[0].Address {
		t.Fatalf("binding after the move %s", dump(b))
	}
	// The old address is unbound: it frees at the end of its cooldown.
	var l ipamv1.Lease
	e.mustDo(200, "GET", "/v1/addresses/"+old, nil, &l)
	if l.Sticky != nil || l.State != ipamv1.Cooling {
		t.Fatalf("old address %s", dump(l))
	}
	e.clock.Advance(testCooldown)
	if res := e.do("GET", "/v1/addresses/"+old, nil); res.status != 404 {
		t.Fatalf("old address after its cooldown: %d %s", res.status, res.body)
	}
	// Back on n1, the identity's address is now on n2.
	e.mustDo(204, "DELETE", "/v1/nodes/n2/attachments/c2/eth0", nil, nil)
	var back ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", stickyLease("c3", "db", id, nil), &back)
	if r := deref(back.Addresses[0].Sticky.Reason, ""); !strings.Contains(r, "of node n2, not of n1") {
		t.Errorf("reason %q", r)
	}
}

// A binding ends at the end of its retention or when deleted; the address
// then frees as any other.
func TestStickyExpiryAndUnbind(t *testing.T) {
	e := newEnv(t, nil)
	onePool(e)
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", stickyLease("c1", "p1", "vm/one", map[string]any{"retention": "2m"}), &a)
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/c1/eth0", nil, nil)
	e.clock.Advance(time.Minute)
	wantProblem(t, "bound, after the cooldown", e.do("POST", "/v1/nodes/n1/leases", lease("c2", "eth0", "p2")), 409, "pool-exhausted", "pool")
	e.clock.Advance(time.Minute)
	if b := e.bindingsOf("vm/one"); len(b) != 0 {
		t.Fatalf("binding after its retention %s", dump(b))
	}
	var other ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c2", "eth0", "p2"), &other)
	if other.Addresses[0].Address != "10.9.0.2/30" || other.Addresses[0].Sticky != nil {
		t.Fatalf("after the retention %s", dump(other))
	}
	// The old identity now finds its address taken, unbound: it is refused
	// (the pool has no other), and nothing is bound to it.
	wantProblem(t, "identity after expiry", e.do("POST", "/v1/nodes/n1/leases", stickyLease("c3", "p1", "vm/one", nil)), 409, "pool-exhausted", "pool")

	// Unbinding ends a binding early; the address still cools from its
	// release.
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/c2/eth0", nil, nil)
	e.clock.Advance(testCooldown)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", stickyLease("c4", "p4", "vm/two", nil), nil)
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/c4/eth0", nil, nil)
	var unbound ipamv1.LeaseList
	e.mustDo(200, "DELETE", "/v1/sticky-bindings?identity=vm/two", nil, &unbound)
	if len(unbound.Items) != 1 || unbound.Items[0].Sticky != nil {
		t.Fatalf("unbound %s", dump(unbound))
	}
	e.mustDo(200, "DELETE", "/v1/sticky-bindings?identity=vm/two", nil, &unbound)
	if len(unbound.Items) != 0 {
		t.Fatalf("second unbind %s", dump(unbound))
	}
	wantProblem(t, "unbound, cooling", e.do("POST", "/v1/nodes/n1/leases", lease("c5", "eth0", "p5")), 409, "pool-exhausted", "pool")
	e.clock.Advance(testCooldown)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c5", "eth0", "p5"), &other)
	if other.Addresses[0].Address != "10.9.0.2/30" {
		t.Fatalf("after unbinding %s", dump(other))
	}
}

// Requests of one identity at once, from different attachments, get one
// address between them: one is leased, the others are refused.
func TestStickyConcurrent(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	const id = "statefulset/ns/db/0"
	round := func(name string) string {
		t.Helper()
		const n = 8
		var wg sync.WaitGroup
		res := make([]response, n)
		for i := range n {
			wg.Go(func() {
				res[i] = e.do("POST", "/v1/nodes/n1/leases", stickyLease(fmt.Sprintf("%s-%d", name, i), "db-0", id, nil))
			})
		}
		wg.Wait()
		var winner string
		for i, r := range res {
			switch r.status {
			case 201:
				if winner != "" {
					t.Fatalf("%s: two leases for one identity", name)
				}
				winner = fmt.Sprintf("%s-%d", name, i)
			case 409:
				wantProblem(t, name, r, 409, "lease-conflict", "sticky.identity")
			default:
				t.Fatalf("%s: %d %s\n%s", name, r.status, r.body, e.logs)
			}
		}
		if winner == "" {
			t.Fatalf("%s: nobody got the identity", name)
		}
		return winner
	}
	w := round("first")
	addr := e.attachment("n1", w).Addresses[0].Address
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/"+w+"/eth0", nil, nil)
	w = round("again")
	if got := e.attachment("n1", w).Addresses[0].Address; got != addr {
		t.Fatalf("recreated at %s, bound to %s", got, addr)
	}
	var held int
	if err := e.db.QueryRow(t.Context(), `SELECT count(*) FROM leases WHERE sticky_identity = $1`, id).Scan(&held); err != nil || held != 1 {
		t.Fatalf("%d rows bound to the identity (%v)", held, err)
	}
}

// Duplicated and late calls, all at once, keep one address per attachment:
// duplicates of ADD answer one generation; duplicates of confirm and DEL
// naming it are idempotent; and late duplicates of the old generation,
// after the attachment was leased again, never free or confirm the new
// lease.
func TestDuplicatedCallsKeepOneLeasePerAttachment(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	const attachments, dups = 6, 4
	cid := func(i int) string { return fmt.Sprint("dup-", i) }
	// all runs one call per (attachment, duplicate) at once.
	all := func(call func(i, d int) response) [][]response {
		out := make([][]response, attachments)
		var wg sync.WaitGroup
		for i := range attachments {
			out[i] = make([]response, dups)
			for d := range dups {
				wg.Go(func() { out[i][d] = call(i, d) })
			}
		}
		wg.Wait()
		return out
	}
	decode := func(r response) ipamv1.Allocation {
		var a ipamv1.Allocation
		if err := json.Unmarshal(r.body, &a); err != nil {
			t.Fatalf("%s: %v", r.body, err)
		}
		return a
	}

	gens := make([]int64, attachments)
	for i, rs := range all(func(i, _ int) response { return e.do("POST", "/v1/nodes/n1/leases", lease(cid(i), "eth0", cid(i))) }) {
		created := 0
		for _, r := range rs {
			if r.status != 201 && r.status != 200 {
				t.Fatalf("duplicate ADD: %d %s", r.status, r.body)
			}
			if r.status == 201 {
				created++
			}
			if g := decode(r).Generation; gens[i] == 0 {
				gens[i] = g
			} else if g != gens[i] {
				t.Fatalf("duplicates of one ADD answered generations %d and %d", gens[i], g)
			}
		}
		if created != 1 {
			t.Fatalf("%d duplicates of one ADD answered 201", created)
		}
	}
	for _, rs := range all(func(i, _ int) response {
		return e.do("POST", fmt.Sprintf("/v1/nodes/n1/attachments/%s/eth0/confirm?generation=%d", cid(i), gens[i]), nil)
	}) {
		for _, r := range rs {
			if r.status != 200 || decode(r).State != ipamv1.Active {
				t.Fatalf("duplicate confirm: %d %s", r.status, r.body)
			}
		}
	}
	for _, rs := range all(func(i, _ int) response {
		return e.do("DELETE", fmt.Sprintf("/v1/nodes/n1/attachments/%s/eth0?generation=%d", cid(i), gens[i]), nil)
	}) {
		for _, r := range rs {
			if r.status != 204 {
				t.Fatalf("duplicate DEL: %d %s", r.status, r.body)
			}
		}
	}

	// Each attachment is leased again; then late duplicates of the old
	// generation's DEL and confirm arrive, all at once.
	next := make([]int64, attachments)
	for i, rs := range all(func(i, d int) response {
		if d > 0 {
			return response{status: 201}
		}
		return e.do("POST", "/v1/nodes/n1/leases", lease(cid(i), "eth0", cid(i)))
	}) {
		if rs[0].status != 201 {
			t.Fatalf("next ADD: %d %s", rs[0].status, rs[0].body)
		}
		next[i] = decode(rs[0]).Generation
	}
	all(func(i, d int) response {
		var r response
		if d%2 == 0 {
			r = e.do("DELETE", fmt.Sprintf("/v1/nodes/n1/attachments/%s/eth0?generation=%d", cid(i), gens[i]), nil)
		} else {
			r = e.do("POST", fmt.Sprintf("/v1/nodes/n1/attachments/%s/eth0/confirm?generation=%d", cid(i), gens[i]), nil)
		}
		if r.status != 409 {
			t.Errorf("late call of generation %d: %d %s", gens[i], r.status, r.body)
		}
		return r
	})
	if t.Failed() {
		t.FailNow()
	}
	addrs := map[string]bool{}
	for i := range attachments {
		a := e.attachment("n1", cid(i))
		if a.Generation != next[i] || next[i] <= gens[i] || a.State != ipamv1.Pending || len(a.Addresses) != 1 {
			t.Errorf("%s after the late calls: %s, want pending at generation %d", cid(i), dump(a), next[i])
		}
		if addrs[a.Addresses[0].Address] {
			t.Errorf("%s shared", a.Addresses[0].Address)
		}
		addrs[a.Addresses[0].Address] = true
	}
}

// What a node certificate learns of a sticky identity bound on another
// node: that it is held, or bound, elsewhere, never where (node, block,
// address, attachment, generation), whether it is refused the address
// (require), refused the takeover (forbidden) or, once the retention has
// ended, given a fresh address. An operator, through the same requests,
// still gets the whole story.
func TestStickyDetailIsTheCallers(t *testing.T) {
	e := newEnv(t, nil)
	s := newAuthServer(t, e, Options{})
	op := s.operatorCaller()
	n1 := s.nodeCaller("n1")
	n2 := s.nodeCaller("n2")
	body := func(v any) string { return jsonBody(t, v) }
	if r := op.do(t, "POST", "/v1/pools", body(pool4("default", 28, "10.0.3.0/24"))); r.status != 201 {
		t.Fatalf("pool: %d %s", r.status, r.body)
	}
	const id = "statefulset/ns/db/0"
	r := n1.do(t, "POST", "/v1/nodes/n1/leases", body(stickyLease("c1", "db-0", id, nil)))
	var a ipamv1.Allocation
	if r.status != 201 || json.Unmarshal(r.body, &a) != nil {
		t.Fatalf("n1 leases: %d %s", r.status, r.body)
	}
	addr, block := strings.TrimSuffix(a.Addresses[0].Address, "/28"), a.Addresses[0].Block
	secrets := []string{"n1", addr, block, "c1", "generation"}
	leak := func(what, text string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s names %q: %s", what, s, text)
			}
		}
	}

	// Held on n1: n2 learns it is held on another node.
	for _, c := range []struct {
		who     caller
		node    string
		private bool
	}{{n2, "n2", false}, {op, "n2", true}} {
		res := c.who.do(t, "POST", "/v1/nodes/"+c.node+"/leases", body(stickyLease("c2", "db-0", id, nil)))
		p := wantProblem(t, c.who.name+" while held", res, 409, "lease-conflict", "sticky.identity")
		d := deref(p.Detail, "")
		full := fmt.Sprintf("holds %s through attachment c1/eth0 on node n1 (generation %d)", addr, a.Generation)
		switch {
		case c.private && !strings.Contains(d, full):
			t.Errorf("operator: detail %q, want it to say %q", d, full)
		case !c.private:
			leak("the 409 to n2", string(res.body))
			if !strings.Contains(d, "held by a lease on another node") {
				t.Errorf("n2: detail %q", d)
			}
		}
	}
	// n1 itself may see its own attachment.
	res := n1.do(t, "POST", "/v1/nodes/n1/leases", body(stickyLease("c9", "db-0", id, nil)))
	if p := wantProblem(t, "n1 while held", res, 409, "lease-conflict", "sticky.identity"); !strings.Contains(deref(p.Detail, ""), "c1/eth0 on node n1") {
		t.Errorf("n1: detail %q", deref(p.Detail, ""))
	}

	// Released and bound on n1: require on n2 is refused without saying
	// where; without require n2 gets a fresh address and a reason that
	// does not say where either.
	if r := n1.do(t, "DELETE", "/v1/nodes/n1/attachments/c1/eth0", ""); r.status != 204 {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	res = n2.do(t, "POST", "/v1/nodes/n2/leases", body(stickyLease("c2", "db-0", id, map[string]any{"require": true})))
	wantProblem(t, "n2 requires", res, 409, "sticky-unavailable", "sticky.identity")
	leak("the sticky-unavailable to n2", string(res.body))
	res = op.do(t, "POST", "/v1/nodes/n2/leases", body(stickyLease("c2", "db-0", id, map[string]any{"require": true})))
	want := fmt.Sprintf("%s is in block %s of node n1, not of n2", addr, block)
	if p := wantProblem(t, "operator requires", res, 409, "sticky-unavailable", "sticky.identity"); !strings.Contains(deref(p.Detail, ""), want) {
		t.Errorf("operator: detail %q, want %q", deref(p.Detail, ""), want)
	}
	// Without require, a node may not take the identity from n1 (this
	// server has no Kubernetes to say its Pod left n1: placement.go), and
	// the refusal does not say where it is either.
	before := e.snapshot()
	res = n2.do(t, "POST", "/v1/nodes/n2/leases", body(stickyLease("c2", "db-0", id, nil)))
	wantProblem(t, "n2 takes over", res, 403, "forbidden", "sticky.identity")
	leak("the forbidden to n2", string(res.body))
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatal("a refused takeover changed the database")
	}
	// Once the binding's retention (the server's default) has ended, n2
	// gets a fresh address, and a reason that does not say where either.
	e.clock.Advance(alloc.DefaultStickyRetention)
	res = n2.do(t, "POST", "/v1/nodes/n2/leases", body(stickyLease("c2", "db-0", id, nil)))
	var moved ipamv1.Allocation
	if res.status != 201 || json.Unmarshal(res.body, &moved) != nil {
		t.Fatalf("n2 leases: %d %s", res.status, res.body)
	}
	st := moved.Addresses[0].Sticky
	if st == nil || deref(st.Reason, "") == "" || deref(st.Reused, true) {
		t.Fatalf("n2's sticky status %s", res.body)
	}
	leak("n2's sticky reason", deref(st.Reason, ""))
	// The operator moving it back to n1 reads where it was.
	if r := op.do(t, "DELETE", "/v1/nodes/n2/attachments/c2/eth0", ""); r.status != 204 {
		t.Fatalf("release: %d %s", r.status, r.body)
	}
	res = op.do(t, "POST", "/v1/nodes/n1/leases", body(stickyLease("c3", "db-0", id, nil)))
	var back ipamv1.Allocation
	if res.status != 201 || json.Unmarshal(res.body, &back) != nil {
		t.Fatalf("operator leases on n1: %d %s", res.status, res.body)
	}
	if r := deref(back.Addresses[0].Sticky.Reason, ""); !strings.Contains(r, "of node n2, not of n1") {
		t.Errorf("operator's reason %q", r)
	}
}
