// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"maps"
	"net/netip"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// TestObjectOwnedLBPoolsAPI: a VIP pool or CIDR group imported from a
// Kubernetes object is that object's: the REST API's PUT and DELETE of it
// are a 409 conflict naming the object's kind, and change nothing.
func TestObjectOwnedLBPoolsAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	ctx := t.Context()
	if _, err := e.store.CreateLBPool(ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: "kp", Origin: alloc.FromKubernetes("uid-1"),
		Spec: alloc.LBPoolSpec{Blocks: []alloc.LBBlock{{CIDR: netip.MustParsePrefix("10.0.10.0/24")}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.CreateCIDRGroup(ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "kg", Origin: alloc.FromKubernetes("uid-2"),
		CIDRs: []netip.Prefix{netip.MustParsePrefix("10.30.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name         string
		method, path string
		body         any
		kind         string
	}{
		{"a pool's update", "PUT", "/v1/lb-pools/kp", map[string]any{"spec": blocks(map[string]any{"cidr": "10.0.30.0/24"})}, "CiliumLoadBalancerIPPool"},
		{"a pool's deletion", "DELETE", "/v1/lb-pools/kp", nil, "CiliumLoadBalancerIPPool"},
		{"a group's update", "PUT", "/v1/cidr-groups/kg", map[string]any{"externalCIDRs": []string{"10.31.0.0/16"}}, "CiliumCIDRGroup"},
		{"a group's deletion", "DELETE", "/v1/cidr-groups/kg", nil, "CiliumCIDRGroup"},
	} {
		before := e.snapshot()
		r := e.do(c.method, c.path, c.body)
		p := r.problem(t)
		if r.status != 409 || p.Type != "urn:ipam:problem:conflict" || !strings.Contains(deref(p.Detail, ""), c.kind) {
			t.Errorf("%s: %d %s: %s; want 409 conflict naming %s", c.name, r.status, p.Type, r.body, c.kind)
		}
		if after := e.snapshot(); !maps.Equal(before, after) {
			t.Errorf("%s: the refusal wrote:\n%v\n%v", c.name, before, after)
		}
	}
}
