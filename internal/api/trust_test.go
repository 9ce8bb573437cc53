// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// A pool CIDR overlapping a special-purpose range is refused naming the
// CIDR's field and the range; allowSpecialPurpose admits it, the pool
// answers the flag and leases from it.
func TestSpecialPurposeCIDRs(t *testing.T) {
	e := newEnv(t, nil)
	for _, c := range []struct {
		body  any
		field string
		rng   string
	}{
		{pool4("p", 24, "10.5.0.0/16", "127.0.0.0/16"), "spec.ipv4.cidrs[1]", "127.0.0.0/8"},
		{pool4("p", 8, "0.0.0.0/4"), "spec.ipv4.cidrs[0]", "0.0.0.0/8"},
		{pool4("p", 28, "255.255.255.0/24"), "spec.ipv4.cidrs[0]", "240.0.0.0/4"},
		{pool6("p", 16, "::/0"), "spec.ipv6.cidrs[0]", "::/128"},
		{pool6("p", 120, "fe80::/112"), "spec.ipv6.cidrs[0]", "fe80::/10"},
	} {
		r := e.do("POST", "/v1/pools", c.body)
		p := wantProblem(t, c.field, r, 400, "invalid-input", c.field)
		if d := deref(p.Detail, ""); !strings.Contains(d, "special-purpose range "+c.rng) || !strings.Contains(d, "allowSpecialPurpose") {
			t.Errorf("%s: detail %q, want it to name %s and allowSpecialPurpose", c.field, d, c.rng)
		}
	}
	body := pool4("lab", 24, "169.254.0.0/16")
	body["spec"].(map[string]any)["allowSpecialPurpose"] = true
	var p ipamv1.Pool
	e.mustDo(201, "POST", "/v1/pools", body, &p)
	if !deref(p.Spec.AllowSpecialPurpose, false) {
		t.Fatalf("pool %s", dump(p))
	}
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", leaseWith("pool", "lab"), &a)
	if !strings.HasPrefix(a.Addresses[0].Address, "169.254.") {
		t.Fatalf("allocation %s", dump(a))
	}
	// A write without the flag is refused; the pool is unchanged.
	put := map[string]any{"spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"169.254.0.0/16"}, "maskSize": 24}}}
	wantProblem(t, "update without the flag", e.do("PUT", "/v1/pools/lab", put), 400, "invalid-input", "spec.ipv4.cidrs[0]")
	e.mustDo(200, "GET", "/v1/pools/lab", nil, &p)
	if !deref(p.Spec.AllowSpecialPurpose, false) {
		t.Fatalf("pool after a refused update %s", dump(p))
	}
}

// A node certificate cannot carve a pool's blocks past maxBlocksPerNode,
// neither by POST /v1/nodes/{node}/blocks nor by leasing: 409
// node-block-limit naming pool and family, and nothing changes. The limit
// is part of the pool's spec.
func TestNodeBlockLimitOverHTTP(t *testing.T) {
	e := newEnv(t, nil)
	s := newAuthServer(t, e, Options{})
	node := s.nodeCaller("n1")
	body := pool4("default", 30, "10.7.0.0/24")
	body["spec"].(map[string]any)["maxBlocksPerNode"] = 2
	body["spec"].(map[string]any)["nodeLocal"] = map[string]any{"router": false, "health": false}
	var p ipamv1.Pool
	e.mustDo(201, "POST", "/v1/pools", body, &p)
	if deref(p.Spec.MaxBlocksPerNode, 0) != 2 {
		t.Fatalf("pool %s", dump(p))
	}
	if r := node.do(t, "PUT", "/v1/nodes/n1", `{}`); r.status != 201 {
		t.Fatalf("register: %d %s", r.status, r.body)
	}
	carve := `{"pool":"default","family":"ipv4"}`
	for i := range 2 {
		if r := node.do(t, "POST", "/v1/nodes/n1/blocks", carve); r.status != 201 {
			t.Fatalf("carve %d: %d %s", i, r.status, r.body)
		}
	}
	pr := wantProblem(t, "third carve", node.do(t, "POST", "/v1/nodes/n1/blocks", carve), 409, "node-block-limit", "pool")
	if deref(pr.Pool, "") != "default" || pr.Family == nil || *pr.Family != ipamv1.Ipv4 || !strings.Contains(deref(pr.Detail, ""), "2") {
		t.Errorf("problem %+v", pr)
	}
	// Two /30 blocks lease four addresses; the fifth lease needs a third.
	for i := range 4 {
		b, _ := json.Marshal(lease(fmt.Sprint("c", i), "eth0", "pod"))
		if r := node.do(t, "POST", "/v1/nodes/n1/leases", string(b)); r.status != 201 {
			t.Fatalf("lease %d: %d %s", i, r.status, r.body)
		}
	}
	before := e.snapshot()
	b, _ := json.Marshal(lease("c4", "eth0", "pod"))
	wantProblem(t, "fifth lease", node.do(t, "POST", "/v1/nodes/n1/leases", string(b)), 409, "node-block-limit", "pool")
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Error("a refused lease changed the database")
	}
}
