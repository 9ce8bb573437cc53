// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

// VIP pools through the HTTP API: Cilium's CiliumLoadBalancerIPPool
// semantics (blocks, selector, allowFirstLastIPs, conflicts), and every
// refusal checked for its status, problem type and field, and for leaving
// the database as it was.

import (
	"maps"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

func lbBody(name string, spec map[string]any) map[string]any {
	return map[string]any{"name": name, "spec": spec}
}

func blocks(b ...map[string]any) map[string]any { return map[string]any{"blocks": b} }

func TestLBPoolsAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "pods", "spec": map[string]any{"ipv4": plFam(24, "10.244.0.0/16")}}, nil)

	var blue ipamv1.LBPool
	spec := blocks(map[string]any{"cidr": "10.0.10.0/24"}, map[string]any{"start": "10.0.20.100", "stop": "10.0.20.200"},
		map[string]any{"start": "fd00:20::5"})
	spec["serviceSelector"] = map[string]any{"matchLabels": map[string]string{"color": "blue"}}
	spec["allowFirstLastIPs"] = "No"
	e.mustDo(201, "POST", "/v1/lb-pools", lbBody("blue", spec), &blue)
	if blue.Status.Conflicting || blue.Status.Ipv4 == nil || blue.Status.Ipv4.Total != 254+101 || blue.Status.Ipv6.Total != 1 ||
		*blue.Spec.AllowFirstLastIPs != ipamv1.AllowFirstLastNo || *blue.Spec.Blocks[2].Start != "fd00:20::5" || *blue.Spec.Blocks[2].Stop != "fd00:20::5" {
		t.Fatalf("blue: %+v", blue)
	}
	// A retry answers the pool again.
	var again ipamv1.LBPool
	e.mustDo(201, "POST", "/v1/lb-pools", lbBody("blue", spec), &again)
	if !again.CreatedAt.Equal(blue.CreatedAt) {
		t.Fatalf("retry: %+v", again)
	}
	// Overlap with another VIP pool marks the newer: created, giving nothing.
	var red ipamv1.LBPool
	e.mustDo(201, "POST", "/v1/lb-pools", lbBody("red", blocks(map[string]any{"cidr": "10.0.10.128/25"})), &red)
	if !red.Status.Conflicting || deref(red.Status.Conflict, "") != `block 10.0.10.128/25 overlaps block 10.0.10.0/24 of pool "blue"` {
		t.Fatalf("red: %+v", red.Status)
	}
	// Moving blue off lifts red's mark.
	spec["blocks"] = []map[string]any{{"cidr": "10.0.11.0/24"}}
	e.mustDo(200, "PUT", "/v1/lb-pools/blue", map[string]any{"spec": spec}, nil)
	e.mustDo(200, "GET", "/v1/lb-pools/red", nil, &red)
	if red.Status.Conflicting {
		t.Fatalf("red still conflicting: %+v", red.Status)
	}
	var list ipamv1.LBPoolList
	e.mustDo(200, "GET", "/v1/lb-pools?limit=1", nil, &list)
	if len(list.Items) != 1 || list.Items[0].Name != "blue" || list.Continue == nil {
		t.Fatalf("list: %+v", list)
	}

	for _, c := range []struct {
		name         string
		method, path string
		body         any
		status       int
		typ, field   string
	}{
		{"a Pod pool's CIDR", "POST", "/v1/lb-pools", lbBody("x", blocks(map[string]any{"cidr": "10.0.30.0/24"}, map[string]any{"cidr": "10.244.7.0/24"})),
			409, "overlap", "spec.blocks[1]"},
		{"a Pod pool onto a VIP block", "POST", "/v1/pools", map[string]any{"name": "x", "spec": map[string]any{"ipv4": plFam(28, "10.0.11.0/24")}},
			409, "overlap", "spec.ipv4.cidrs[0]"},
		{"no block", "POST", "/v1/lb-pools", lbBody("x", blocks()), 400, "invalid-input", "spec.blocks"},
		{"cidr and start", "POST", "/v1/lb-pools", lbBody("x", blocks(map[string]any{"cidr": "10.0.30.0/24", "start": "10.0.30.1"})), 400, "invalid-input", "spec.blocks[0]"},
		{"a stop alone", "POST", "/v1/lb-pools", lbBody("x", blocks(map[string]any{"stop": "10.0.30.1"})), 400, "invalid-input", "spec.blocks[0]"},
		{"host bits", "POST", "/v1/lb-pools", lbBody("x", blocks(map[string]any{"cidr": "10.0.30.1/24"})), 400, "invalid-input", "spec.blocks[0].cidr"},
		{"a bad start", "POST", "/v1/lb-pools", lbBody("x", blocks(map[string]any{"start": "10.0.30.256"})), 400, "invalid-input", "spec.blocks[0].start"},
		{"a zone", "POST", "/v1/lb-pools", lbBody("x", blocks(map[string]any{"start": "fe80::1%eth0"})), 400, "invalid-input", "spec.blocks[0].start"},
		{"stop before start", "POST", "/v1/lb-pools", lbBody("x", blocks(map[string]any{"start": "10.0.30.9", "stop": "10.0.30.1"})), 400, "invalid-input", "spec.blocks[0].stop"},
		{"two families", "POST", "/v1/lb-pools", lbBody("x", blocks(map[string]any{"start": "10.0.30.9", "stop": "fd00::1"})), 400, "invalid-input", "spec.blocks[0].stop"},
		{"blocks overlapping", "POST", "/v1/lb-pools", lbBody("x", blocks(map[string]any{"cidr": "10.0.30.0/24"}, map[string]any{"start": "10.0.30.9"})),
			409, "overlap", "spec.blocks[1]"},
		{"allowFirstLastIPs maybe", "POST", "/v1/lb-pools", lbBody("x", map[string]any{"blocks": []any{map[string]any{"cidr": "10.0.30.0/24"}}, "allowFirstLastIPs": "maybe"}),
			400, "invalid-input", "spec.allowFirstLastIPs"},
		{"a bad selector", "POST", "/v1/lb-pools", lbBody("x", map[string]any{"blocks": []any{map[string]any{"cidr": "10.0.30.0/24"}},
			"serviceSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "a", "operator": "In"}}}}), 400, "invalid-input", "spec.serviceSelector"},
		{"a bad name", "POST", "/v1/lb-pools", lbBody("X_1", blocks(map[string]any{"cidr": "10.0.30.0/24"})), 400, "invalid-input", "name"},
		{"another spec for a name", "POST", "/v1/lb-pools", lbBody("blue", blocks(map[string]any{"cidr": "10.0.30.0/24"})), 409, "conflict", "name"},
		{"a rename", "PUT", "/v1/lb-pools/blue", map[string]any{"name": "green", "spec": blocks(map[string]any{"cidr": "10.0.30.0/24"})}, 400, "invalid-input", "name"},
		{"a missing pool", "GET", "/v1/lb-pools/nope", nil, 404, "not-found", "pool"},
		{"a missing pool's update", "PUT", "/v1/lb-pools/nope", map[string]any{"spec": blocks(map[string]any{"cidr": "10.0.30.0/24"})}, 404, "not-found", "pool"},
		{"a missing space", "POST", "/v1/lb-pools?space=nope", lbBody("x", blocks(map[string]any{"cidr": "10.0.30.0/24"})), 404, "not-found", "space"},
		{"a missing pool's deletion", "DELETE", "/v1/lb-pools/nope", nil, 404, "not-found", "pool"},
	} {
		before := e.snapshot()
		r := e.do(c.method, c.path, c.body)
		p := r.problem(t)
		if r.status != c.status || p.Type != "urn:ipam:problem:"+c.typ || deref(p.Field, "") != c.field {
			t.Errorf("%s: %d %s field %q, want %d %s %q: %s", c.name, r.status, p.Type, deref(p.Field, ""), c.status, c.typ, c.field, r.body)
		}
		if after := e.snapshot(); !maps.Equal(before, after) {
			t.Errorf("%s: the refusal wrote:\n%v\n%v", c.name, before, after)
		}
	}

	var dry ipamv1.LBPool
	before := e.snapshot()
	e.mustDo(200, "DELETE", "/v1/lb-pools/red?dryRun=true", nil, &dry)
	if dry.Name != "red" || !maps.Equal(before, e.snapshot()) {
		t.Fatalf("dry-run delete: %+v", dry)
	}
	e.mustDo(204, "DELETE", "/v1/lb-pools/red", nil, nil)
	e.mustDo(404, "GET", "/v1/lb-pools/red", nil, nil)
}
