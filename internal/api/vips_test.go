// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"fmt"
	"maps"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// TestVIPsAPI: VIPs through HTTP: an owner's request, a retry, sharing,
// an unsatisfied request answered 200 with Cilium's reason, refusals that
// write nothing, and the history of the address.
func TestVIPsAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	spec := blocks(map[string]any{"start": "192.168.10.10", "stop": "192.168.10.20"}, map[string]any{"cidr": "fd10::/120"})
	spec["serviceSelector"] = map[string]any{"matchExpressions": []any{map[string]any{"key": "io.kubernetes.service.namespace", "operator": "In", "values": []string{"shop"}}}}
	e.mustDo(201, "POST", "/v1/lb-pools", lbBody("shop", spec), nil)

	web := map[string]any{"families": []string{"ipv4", "ipv6"}, "sharing": map[string]any{"key": "front", "ports": []any{map[string]any{"port": 80}}}}
	var a ipamv1.VIPAssignment
	e.mustDo(200, "PUT", "/v1/vip-owners/shop/web", web, &a)
	if !a.Satisfied || a.Reason != "satisfied" || a.Generation == 0 || len(a.Addresses) != 2 || a.Addresses[0].Address != "192.168.10.10" || a.Addresses[1].Address != "fd10::" ||
		a.Addresses[0].Pool != "shop" || a.Addresses[0].Holders != 1 {
		t.Fatalf("web: %+v", a)
	}
	var again ipamv1.VIPAssignment
	e.mustDo(200, "PUT", "/v1/vip-owners/shop/web", web, &again)
	if again.Addresses[0].Generation != a.Addresses[0].Generation {
		t.Fatalf("a retry gave anew: %+v", again)
	}
	tls := map[string]any{"sharing": map[string]any{"key": "front", "ports": []any{map[string]any{"port": 443, "protocol": "TCP"}}}}
	var shared ipamv1.VIPAssignment
	e.mustDo(200, "PUT", "/v1/vip-owners/shop/tls", tls, &shared)
	if len(shared.Addresses) != 1 || shared.Addresses[0].Address != "192.168.10.10" || shared.Addresses[0].Holders != 2 {
		t.Fatalf("tls did not share: %+v", shared)
	}
	var other ipamv1.VIPAssignment
	e.mustDo(200, "PUT", "/v1/vip-owners/blog/web", map[string]any{}, &other)
	if other.Satisfied || other.Reason != "no_pool" || len(other.Addresses) != 0 {
		t.Fatalf("another namespace: %+v", other)
	}
	var list ipamv1.VIPOwnerList
	e.mustDo(200, "GET", "/v1/vip-owners?limit=2", nil, &list)
	if len(list.Items) != 2 || list.Items[0].Namespace != "blog" || list.Continue == nil {
		t.Fatalf("list: %+v", list)
	}
	var pool ipamv1.LBPool
	e.mustDo(200, "GET", "/v1/lb-pools/shop", nil, &pool)
	if pool.Status.Ipv4.Total != 11 || pool.Status.Ipv4.Used != 1 || pool.Status.Ipv4.Available != 10 {
		t.Fatalf("pool status: %+v", pool.Status.Ipv4)
	}

	for _, c := range []struct {
		name, method, path string
		body               any
		status             int
		field              string
	}{
		{"a bad namespace", "PUT", "/v1/vip-owners/Shop/web", map[string]any{}, 400, "namespace"},
		{"a bad family", "PUT", "/v1/vip-owners/shop/x", map[string]any{"families": []string{"ipv5"}}, 400, "families[0]"},
		{"a family twice", "PUT", "/v1/vip-owners/shop/x", map[string]any{"families": []string{"ipv4", "ipv4"}}, 400, "families[1]"},
		{"a bad address", "PUT", "/v1/vip-owners/shop/x", map[string]any{"addresses": []string{"192.168.10.300"}}, 400, "addresses[0]"},
		{"an address twice", "PUT", "/v1/vip-owners/shop/x", map[string]any{"addresses": []string{"192.168.10.11", "192.168.10.11"}}, 400, "addresses[1]"},
		{"port 0", "PUT", "/v1/vip-owners/shop/x", map[string]any{"sharing": map[string]any{"ports": []any{map[string]any{"port": 0}}}}, 400, "sharing.ports[0].port"},
		{"a bad protocol", "PUT", "/v1/vip-owners/shop/x", map[string]any{"sharing": map[string]any{"ports": []any{map[string]any{"port": 1, "protocol": "ICMP"}}}}, 400, "sharing.ports[0].protocol"},
		{"a bad policy", "PUT", "/v1/vip-owners/shop/x", map[string]any{"sharing": map[string]any{"externalTrafficPolicy": "Nearest"}}, 400, "sharing.externalTrafficPolicy"},
		{"a bad namespace to share with", "PUT", "/v1/vip-owners/shop/x", map[string]any{"sharing": map[string]any{"crossNamespace": []string{"a b"}}}, 400, "sharing.crossNamespace[0]"},
		{"a bad label", "PUT", "/v1/vip-owners/shop/x", map[string]any{"labels": map[string]string{"a b": "c"}}, 400, "labels[a b]"},
		{"a missing space", "PUT", "/v1/vip-owners/shop/x?space=nope", map[string]any{}, 404, "space"},
		{"a missing owner", "GET", "/v1/vip-owners/shop/nope", nil, 404, "owner"},
	} {
		before := e.snapshot()
		r := e.do(c.method, c.path, c.body)
		p := r.problem(t)
		if r.status != c.status || deref(p.Field, "") != c.field {
			t.Errorf("%s: %d field %q, want %d %q: %s", c.name, r.status, deref(p.Field, ""), c.status, c.field, r.body)
		}
		if !maps.Equal(before, e.snapshot()) {
			t.Errorf("%s: the refusal wrote", c.name)
		}
	}

	stale := e.do("DELETE", fmt.Sprintf("/v1/vip-owners/shop/web?generation=%d", a.Generation+1000), nil)
	if p := stale.problem(t); stale.status != 409 || p.Type != "urn:ipam:problem:stale-generation" {
		t.Fatalf("a stale release: %d %s", stale.status, stale.body)
	}
	e.mustDo(204, "DELETE", fmt.Sprintf("/v1/vip-owners/shop/web?generation=%d", a.Generation), nil, nil)
	e.mustDo(204, "DELETE", "/v1/vip-owners/shop/web", nil, nil)
	e.mustDo(200, "GET", "/v1/vip-owners/shop/tls", nil, &shared)
	if len(shared.Addresses) != 1 || shared.Addresses[0].Holders != 1 {
		t.Fatalf("tls after web left: %+v", shared)
	}
	var h ipamv1.AddressHistory
	e.mustDo(200, "GET", "/v1/addresses/192.168.10.10/history", nil, &h)
	kinds := ""
	for _, ev := range h.Items {
		kinds += string(ev.Kind) + " "
	}
	if kinds != "vip-assign vip-assign vip-release " {
		t.Fatalf("history of the VIP: %q", kinds)
	}
}
