// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"errors"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// ciliumNodes answers fixed CiliumNode states (the real source is the
// operator, tested against a real API server in internal/cilium).
type ciliumNodes struct {
	states map[string]alloc.CiliumNodeState
	err    error
}

func (c ciliumNodes) CiliumNodeState(_ context.Context, space, node string) (alloc.CiliumNodeState, bool, error) {
	if c.err != nil {
		return alloc.CiliumNodeState{}, false, c.err
	}
	st, ok := c.states[space+"/"+node]
	return st, ok, nil
}

// GET /v1/nodes/{node} shows the node's CiliumNode state when the
// operator role is on, and answers the node alone when the API server
// cannot be read.
func TestGetNodeShowsCiliumState(t *testing.T) {
	e := newEnv(t, nil)
	for _, n := range []string{"crd-node", "pool-node", "plain-node"} {
		if r, err := e.client.PutNodeWithResponse(t.Context(), n, nil, ipamclient.NodeSpec{}); err != nil || r.StatusCode() >= 300 {
			t.Fatalf("PUT node %s: %v %s", n, err, r.Body)
		}
	}
	src := ciliumNodes{states: map[string]alloc.CiliumNodeState{
		"default/crd-node": {Mode: "crd", ResourceVersion: "42", OperatorError: "allocator full",
			IPv4: &alloc.CiliumFamilyState{Pool: 10, Used: 3, MarkedForRelease: 2, ReadyForRelease: 1, Released: 1}},
		"default/pool-node": {Mode: "multi-pool", ResourceVersion: "7", Pools: []alloc.CiliumPoolState{
			{Pool: "mars", Allocated: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/27")}, NeededIPv4: 20}}},
	}}
	get := func(src CiliumNodeSource, node string) *ipamclient.Node {
		t.Helper()
		srv := httptest.NewServer(NewHandler(StoresOf(e.store), Options{IsUnavailable: store.IsUnavailable, AnonymousRole: alloc.RoleAdmin, CiliumNodes: src}))
		defer srv.Close()
		c, err := ipamclient.NewClientWithResponses(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.GetNodeWithResponse(t.Context(), node, nil)
		if err != nil || r.JSON200 == nil {
			t.Fatalf("GET node %s: %v %d %s", node, err, r.StatusCode(), r.Body)
		}
		return r.JSON200
	}

	n := get(src, "crd-node")
	if n.Cilium == nil || n.Cilium.Mode != "crd" || n.Cilium.ResourceVersion != "42" || n.Cilium.Ipv4 == nil || n.Cilium.Ipv6 != nil {
		t.Fatalf("crd node: cilium %+v", n.Cilium)
	}
	if f := n.Cilium.Ipv4; f.Pool != 10 || f.Used != 3 || f.Releasing.MarkedForRelease != 2 || f.Releasing.ReadyForRelease != 1 ||
		f.Releasing.DoNotRelease != 0 || f.Releasing.Released != 1 {
		t.Errorf("crd node IPv4 %+v", f)
	}
	if n.Cilium.OperatorError == nil || *n.Cilium.OperatorError != "allocator full" {
		t.Errorf("crd node operatorError %v", n.Cilium.OperatorError)
	}
	n = get(src, "pool-node")
	if n.Cilium == nil || n.Cilium.Pools == nil || len(*n.Cilium.Pools) != 1 {
		t.Fatalf("multi-pool node: cilium %+v", n.Cilium)
	}
	if p := (*n.Cilium.Pools)[0]; p.Pool != "mars" || len(p.Allocated) != 1 || p.Allocated[0] != "10.20.0.0/27" || p.NeededIPv4 == nil || *p.NeededIPv4 != 20 {
		t.Errorf("multi-pool node pool %+v", p)
	}
	if n := get(src, "plain-node"); n.Cilium != nil {
		t.Errorf("node without CiliumNode: cilium %+v", n.Cilium)
	}
	if n := get(nil, "crd-node"); n.Cilium != nil {
		t.Errorf("operator role off: cilium %+v", n.Cilium)
	}
	if n := get(ciliumNodes{err: errors.New("connection refused")}, "crd-node"); n.Cilium != nil || n.Name != "crd-node" {
		t.Errorf("API server unreachable: %+v", n)
	}
}
