// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"fmt"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// GET /v1/pools/{pool}/blocks pages through the pool's blocks with their
// nodes and fill; each bad parameter is a 400 naming it, a missing pool a
// 404.
func TestListPoolBlocks(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 28, "10.0.0.0/24"), nil)
	for i := range 3 {
		e.mustDo(201, "POST", fmt.Sprintf("/v1/nodes/n%d/leases", i), map[string]any{
			"owner": map[string]string{"namespace": "a", "name": fmt.Sprintf("p%d", i)}, "containerID": fmt.Sprintf("c%d", i), "interface": "eth0",
		}, nil)
	}
	var got []string
	for next := ""; ; {
		var l ipamv1.BlockList
		e.mustDo(200, "GET", "/v1/pools/default/blocks?limit=2&continue="+next, nil, &l)
		for _, b := range l.Items {
			got = append(got, fmt.Sprintf("%s %s %d/%d", b.Cidr, b.Node, b.Leased, b.Capacity))
		}
		if l.Continue == nil {
			break
		}
		next = *l.Continue
	}
	if fmt.Sprint(got) != "[10.0.0.0/28 n0 1/12 10.0.0.16/28 n1 1/12 10.0.0.32/28 n2 1/12]" {
		t.Fatalf("blocks %v", got)
	}
	var v6 ipamv1.BlockList
	e.mustDo(200, "GET", "/v1/pools/default/blocks?family=ipv6", nil, &v6)
	if len(v6.Items) != 0 {
		t.Fatalf("IPv6 blocks of an IPv4 pool: %+v", v6.Items)
	}

	for _, c := range []struct{ query, field string }{
		{"family=ipv5", "family"},
		{"limit=0", "limit"},
		{"limit=1001", "limit"},
		{"continue=garbage", "continue"},
		{"space=Not_A_Space", "space"},
	} {
		res := e.do("GET", "/v1/pools/default/blocks?"+c.query, nil)
		if res.status != 400 {
			t.Errorf("%s: status %d, want 400 (%s)", c.query, res.status, res.body)
			continue
		}
		if p := res.problem(t); deref(p.Field, "") != c.field {
			t.Errorf("%s: problem names field %q, want %q", c.query, deref(p.Field, ""), c.field)
		}
	}
	if res := e.do("GET", "/v1/pools/Bad_Name/blocks", nil); res.status != 400 {
		t.Errorf("bad pool name: %d %s", res.status, res.body)
	}
	if res := e.do("GET", "/v1/pools/missing/blocks", nil); res.status != 404 {
		t.Errorf("missing pool: %d %s", res.status, res.body)
	}
}
