// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"maps"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// TestCIDRGroupsAPI: the CiliumCIDRGroup shape over HTTP, the groups
// holding an address, and refusals that write nothing.
func TestCIDRGroupsAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var g ipamv1.CIDRGroup
	body := map[string]any{"name": "corp-ranges", "labels": map[string]string{"tier": "internal"}, "externalCIDRs": []string{"10.30.0.0/16", "192.168.100.0/24"}}
	e.mustDo(201, "POST", "/v1/cidr-groups", body, &g)
	if len(g.ExternalCIDRs) != 2 || g.Labels["tier"] != "internal" {
		t.Fatalf("created %+v", g)
	}
	e.mustDo(201, "POST", "/v1/cidr-groups", body, nil) // a retry
	e.mustDo(201, "POST", "/v1/cidr-groups", map[string]any{"name": "lab", "externalCIDRs": []string{"10.30.5.0/24"}}, nil)
	var m ipamv1.CIDRGroupMatchList
	e.mustDo(200, "GET", "/v1/addresses/10.30.5.9/cidr-groups", nil, &m)
	if len(m.Items) != 2 || m.Items[0].Group != "corp-ranges" || m.Items[0].Cidr != "10.30.0.0/16" || m.Items[1].Cidr != "10.30.5.0/24" {
		t.Fatalf("matches %+v", m)
	}
	e.mustDo(200, "GET", "/v1/addresses/172.16.0.1/cidr-groups", nil, &m)
	if len(m.Items) != 0 {
		t.Fatalf("matches %+v", m)
	}
	e.mustDo(200, "PUT", "/v1/cidr-groups/lab", map[string]any{"externalCIDRs": []string{"10.31.0.0/16"}}, &g)
	e.mustDo(200, "GET", "/v1/addresses/10.30.5.9/cidr-groups", nil, &m)
	if len(m.Items) != 1 {
		t.Fatalf("after the update %+v", m)
	}
	for _, c := range []struct {
		name, method, path string
		body               any
		status             int
		field              string
	}{
		{"host bits", "POST", "/v1/cidr-groups", map[string]any{"name": "x", "externalCIDRs": []string{"10.30.0.1/16"}}, 400, "externalCIDRs[0]"},
		{"a CIDR twice", "POST", "/v1/cidr-groups", map[string]any{"name": "x", "externalCIDRs": []string{"10.0.0.0/8", "10.0.0.0/8"}}, 400, "externalCIDRs[1]"},
		{"a bad name", "POST", "/v1/cidr-groups", map[string]any{"name": "Corp"}, 400, "name"},
		{"another body for a name", "POST", "/v1/cidr-groups", map[string]any{"name": "lab"}, 409, "name"},
		{"a rename", "PUT", "/v1/cidr-groups/lab", map[string]any{"name": "lab2"}, 400, "name"},
		{"a missing group", "GET", "/v1/cidr-groups/nope", nil, 404, "group"},
		{"a bad address", "GET", "/v1/addresses/10.30.5/cidr-groups", nil, 400, "address"},
		{"a missing space", "GET", "/v1/addresses/10.30.5.9/cidr-groups?space=nope", nil, 404, "space"},
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
	e.mustDo(204, "DELETE", "/v1/cidr-groups/lab", nil, nil)
	e.mustDo(404, "GET", "/v1/cidr-groups/lab", nil, nil)
}
