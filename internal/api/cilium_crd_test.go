// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

// Cilium's crd mode through the HTTP API: the pools' nodeSelector, and the
// single addresses a node holds for Cilium's agent, which the Cilium
// operator (internal/cilium, through the store) alone may change.

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// A pool's nodeSelector is stored and answered like its other selectors;
// a bad one is a 400 naming spec.nodeSelector, changing nothing.
func TestPoolNodeSelector(t *testing.T) {
	e := newEnv(t, nil)
	sel := map[string]any{"matchLabels": plKV("rack", "r1"),
		"matchExpressions": []map[string]any{{"key": "topology.kubernetes.io/zone", "operator": "In", "values": []string{"a", "b"}}}}
	body := map[string]any{"name": "rack1", "spec": map[string]any{"ipv4": plFam(24, "10.1.0.0/16"), "nodeSelector": sel}}
	var p ipamv1.Pool
	e.mustDo(201, "POST", "/v1/pools", body, &p)
	got := p.Spec.NodeSelector
	if got == nil || deref(got.MatchLabels, nil)["rack"] != "r1" || len(deref(got.MatchExpressions, nil)) != 1 {
		t.Fatalf("nodeSelector answered %+v", got)
	}
	e.mustDo(200, "GET", "/v1/pools/rack1", nil, &p)
	if p.Spec.NodeSelector == nil || deref(p.Spec.NodeSelector.MatchLabels, nil)["rack"] != "r1" {
		t.Fatalf("nodeSelector read back %+v", p.Spec.NodeSelector)
	}
	// An update without it drops it.
	e.mustDo(200, "PUT", "/v1/pools/rack1", map[string]any{"spec": map[string]any{"ipv4": plFam(24, "10.1.0.0/16")}}, &p)
	if p.Spec.NodeSelector != nil {
		t.Fatalf("nodeSelector kept after an update without it: %+v", p.Spec.NodeSelector)
	}
	bad := map[string]any{"matchExpressions": []map[string]any{{"key": "rack", "operator": "Foo", "values": []string{"x"}}}}
	e.plRefuse("PUT", "/v1/pools/rack1", map[string]any{"spec": map[string]any{"ipv4": plFam(24, "10.1.0.0/16"), "nodeSelector": bad}},
		400, "invalid-input", "spec.nodeSelector")
	e.plRefuse("POST", "/v1/pools", map[string]any{"name": "rack2", "spec": map[string]any{"ipv4": plFam(24, "10.2.0.0/16"),
		"nodeSelector": map[string]any{"matchLabels": plKV("bad key!", "x")}}}, 400, "invalid-input", "spec.nodeSelector")
}

// A node's addresses for Cilium's agent are visible through the API (state
// reserved, or active with the Pod), but no API path can release, confirm,
// reconcile or lease them: only the operator's store calls change them.
func TestCrdAddressesOutOfTheAPIsReach(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.9.0.0/16"), nil)
	ctx := t.Context()
	held, err := e.store.ReserveNodeAddresses(ctx, "default", "n1", nil, "", alloc.IPv4, 3)
	if err != nil || len(held) != 3 {
		t.Fatalf("reserve: %v, %v", held, err)
	}
	a0, a1 := held[0].Addr.String(), held[1].Addr.String()
	if _, err := e.store.SyncNodeUse(ctx, "default", "n1", map[netip.Addr]alloc.Owner{held[0].Addr: {Namespace: "shop", Name: "web-0"}}); err != nil {
		t.Fatal(err)
	}

	var l ipamv1.Lease
	e.mustDo(200, "GET", "/v1/addresses/"+a1, nil, &l)
	if l.State != ipamv1.LeaseState("reserved") || l.Owner != nil || l.Node != "n1" || deref(l.Network, "") != "cilium:crd" ||
		l.ContainerID != a1 || l.Interface != "pool" || deref(l.SelectedBy, "") != "default" {
		t.Fatalf("reserved address answered %+v", l)
	}
	e.mustDo(200, "GET", "/v1/addresses/"+a0, nil, &l)
	if l.State != ipamv1.LeaseState("active") || l.Owner == nil || l.Owner.Namespace != "shop" || l.Owner.Name != "web-0" {
		t.Fatalf("used address answered %+v", l)
	}
	var list ipamv1.LeaseList
	e.mustDo(200, "GET", "/v1/leases?state=reserved", nil, &list)
	if len(list.Items) != 2 || list.Items[0].Address != a1+"/24" {
		t.Fatalf("reserved leases %+v", list.Items)
	}
	var hist ipamv1.AddressHistory
	e.mustDo(200, "GET", "/v1/addresses/"+a0+"/history", nil, &hist)
	if len(hist.Items) != 2 || deref(hist.Items[0].State, "") != "reserved" || hist.Items[0].Owner != nil ||
		deref(hist.Items[1].State, "") != "active" || hist.Items[1].Owner == nil || hist.Items[1].Reason != "cilium-used" {
		t.Fatalf("history %+v", hist.Items)
	}

	// Release by address: refused whether used or not, with or without a
	// generation.
	for _, path := range []string{"/v1/addresses/" + a0, "/v1/addresses/" + a1,
		fmt.Sprintf("/v1/addresses/%s?generation=%d", a1, held[1].Generation)} {
		p := e.plRefuse("DELETE", path, nil, 409, "in-use", "address")
		plDetail(t, p, "crd mode", "release handshake")
	}
	// The attachment cannot be named, and the unnamed network's attachment
	// of the same name is another one.
	e.plRefuse("DELETE", "/v1/nodes/n1/attachments/"+a1+"/pool?network=cilium:crd", nil, 400, "invalid-input", "network")
	e.plRefuse("POST", "/v1/nodes/n1/attachments/"+a1+"/pool/confirm?network=cilium:crd", nil, 400, "invalid-input", "network")
	e.plRefuse("POST", "/v1/nodes/n1/reconcile", map[string]any{"network": "cilium:crd", "attachments": []any{}}, 400, "invalid-input", "network")
	e.plRefuse("POST", "/v1/nodes/n1/leases", map[string]any{"owner": map[string]any{"namespace": "ns", "name": "p"},
		"network": "cilium:crd", "containerID": a1, "interface": "pool"}, 400, "invalid-input", "network")
	before := e.snapshot()
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/"+a1+"/pool", nil, nil)
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []any{}}, nil)
	e.plUnchanged(before)
	// Nothing else can lease them: a lease of the node takes another
	// address.
	var got ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease(a1, "pool", "p1"), &got)
	for _, h := range held {
		if got.Addresses[0].Address == h.Addr.String()+"/24" {
			t.Fatalf("the API leased %s, which n1 holds for Cilium", h.Addr)
		}
	}
	// The node cannot be deleted from under its agent, unless forced.
	p := e.plRefuse("DELETE", "/v1/nodes/n1", nil, 409, "in-use", "node")
	plDetail(t, p, "3 addresses for Cilium's agent (crd mode) and 1 other leases", "CiliumNode")
	e.mustDo(204, "DELETE", "/v1/nodes/n1?force=true", nil, nil)
	e.mustDo(404, "GET", "/v1/addresses/"+a1, nil, nil)
}
