// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// Issue 33's reproducer, on a server without Kubernetes: once node-b's Pod
// released statefulset/authz/web/0, node-a's certificate asking for that
// identity used to get it (201, a fresh address, the identity rebound to
// node-a), and node-b recreating web-0 with require then got a 409. Now
// node-a is refused (403 forbidden on sticky.identity, nothing changes)
// and node-b gets its address back. The identity leaves a node only by an
// operator (ending the binding, or leasing it elsewhere) or when its
// retention has ended.
func TestNodeMayNotTakeAnotherNodesIdentity(t *testing.T) {
	e := newEnv(t, nil)
	s := newAuthServer(t, e, Options{})
	op := s.operatorCaller()
	nodeA := s.nodeCaller("node-a")
	nodeB := s.nodeCaller("node-b")
	body := func(v any) string { return jsonBody(t, v) }
	const id = "statefulset/authz/web/0"
	sticky := func(cid string, extra map[string]any) string {
		b := stickyLease(cid, "web-0", id, extra)
		b["owner"] = map[string]any{"namespace": "authz", "name": "web-0"}
		return body(b)
	}
	leased := func(who caller, node, cid string, extra map[string]any) ipamv1.Allocation {
		t.Helper()
		res := who.do(t, "POST", "/v1/nodes/"+node+"/leases", sticky(cid, extra))
		var a ipamv1.Allocation
		if res.status != 201 || json.Unmarshal(res.body, &a) != nil {
			t.Fatalf("%s leases %s on %s: %d %s", who.name, cid, node, res.status, res.body)
		}
		return a
	}
	release := func(who caller, node, cid string) {
		t.Helper()
		if r := who.do(t, "DELETE", "/v1/nodes/"+node+"/attachments/"+cid+"/eth0", ""); r.status != 204 {
			t.Fatalf("%s releases %s: %d %s", who.name, cid, r.status, r.body)
		}
	}
	boundOn := func(what, node, addr string) {
		t.Helper()
		if b := e.bindingsOf(id); len(b) != 1 || b[0].Node != node || (addr != "" && b[0].Address != addr) {
			t.Fatalf("%s: bindings %s, want one on %s (%s)", what, dump(b), node, addr)
		}
	}
	if r := op.do(t, "POST", "/v1/pools", body(pool4("default", 28, "10.0.3.0/24"))); r.status != 201 {
		t.Fatalf("pool: %d %s", r.status, r.body)
	}
	retained := e.clock.Now().Add(alloc.DefaultStickyRetention)

	web0 := leased(nodeB, "node-b", "b1", nil)
	addr := web0.Addresses[0].Address
	release(nodeB, "node-b", "b1")

	// node-a asks: refused, and nothing changes.
	before := e.snapshot()
	res := nodeA.do(t, "POST", "/v1/nodes/node-a/leases", sticky("a1", nil))
	p := wantProblem(t, "node-a takes web-0", res, 403, "forbidden", "sticky.identity")
	d := deref(p.Detail, "")
	for _, want := range []string{"may not take over", retained.UTC().Format(time.RFC3339), "operator", "DELETE /v1/sticky-bindings"} {
		if !strings.Contains(d, want) {
			t.Errorf("detail %q does not say %q", d, want)
		}
	}
	for _, secret := range []string{"node-b", strings.TrimSuffix(addr, "/28"), "b1"} {
		if strings.Contains(string(res.body), secret) {
			t.Errorf("the refusal names %q: %s", secret, res.body)
		}
	}
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatal("a refused takeover changed the database")
	}
	// ... and node-b, recreating web-0 with require, gets its address.
	back := leased(nodeB, "node-b", "b2", map[string]any{"require": true})
	if back.Addresses[0].Address != addr || !deref(back.Addresses[0].Sticky.Reused, false) {
		t.Fatalf("node-b's web-0 back: %s, want %s reused", dump(back), addr)
	}
	release(nodeB, "node-b", "b2")

	// An operator ends the binding: node-a may then bind the identity, to
	// an address of its own; node-b may not take it back.
	var unbound ipamv1.LeaseList
	if r := op.do(t, "DELETE", "/v1/sticky-bindings?identity="+id, ""); r.status != 200 || json.Unmarshal(r.body, &unbound) != nil || len(unbound.Items) != 1 {
		t.Fatalf("operator unbinds: %d %s", r.status, r.body)
	}
	onA := leased(nodeA, "node-a", "a2", nil)
	boundOn("after the operator's unbinding", "node-a", onA.Addresses[0].Address)
	release(nodeA, "node-a", "a2")
	wantProblem(t, "node-b takes it back", nodeB.do(t, "POST", "/v1/nodes/node-b/leases", sticky("b3", nil)), 403, "forbidden", "sticky.identity")
	boundOn("after node-b's refusal", "node-a", onA.Addresses[0].Address)

	// An operator's lease moves it, and reads where it was.
	moved := leased(op, "node-b", "b3", nil)
	if r := deref(moved.Addresses[0].Sticky.Reason, ""); !strings.Contains(r, "of node node-a, not of node-b") {
		t.Errorf("the operator's reason %q", r)
	}
	boundOn("after the operator's lease", "node-b", moved.Addresses[0].Address)
	release(op, "node-b", "b3")

	// Once the retention has ended, node-a gets it.
	e.clock.Advance(alloc.DefaultStickyRetention - time.Second)
	wantProblem(t, "a second before the end", nodeA.do(t, "POST", "/v1/nodes/node-a/leases", sticky("a3", nil)), 403, "forbidden", "sticky.identity")
	e.clock.Advance(time.Second)
	late := leased(nodeA, "node-a", "a3", nil)
	if s := late.Addresses[0].Sticky; s == nil || deref(s.Reused, true) || deref(s.Reason, "") == "" {
		t.Fatalf("node-a after the retention: %s", dump(late))
	}
	boundOn("after the retention", "node-a", late.Addresses[0].Address)
}
