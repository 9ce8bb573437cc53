// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
)

func TestHealth(t *testing.T) {
	e := newEnv(t, nil)
	ctx := t.Context()

	h, err := e.client.GetHealthzWithResponse(ctx)
	if err != nil || h.StatusCode() != 200 || h.JSON200 == nil || h.JSON200.Status != "ok" {
		t.Fatalf("healthz: %v %d %s", err, h.StatusCode(), h.Body)
	}
	r, err := e.client.GetReadyzWithResponse(ctx)
	if err != nil || r.StatusCode() != 200 || r.JSON200 == nil {
		t.Fatalf("readyz: %v %d %s", err, r.StatusCode(), r.Body)
	}
	if v := deref(r.JSON200.SchemaVersion, 0); v != store.SchemaVersion() {
		t.Errorf("schemaVersion %d, want %d", v, store.SchemaVersion())
	}

	// With the database gone, readiness fails and liveness does not.
	e.store.Close()
	res := e.do("GET", "/readyz", nil)
	if res.status != http.StatusServiceUnavailable {
		t.Fatalf("readyz with a closed store: %d %s", res.status, res.body)
	}
	if p := res.problem(t); p.Type != "urn:ipam:problem:unavailable" {
		t.Errorf("type %q", p.Type)
	}
	if res := e.do("GET", "/healthz", nil); res.status != 200 {
		t.Errorf("healthz with a closed store: %d", res.status)
	}
	if !strings.Contains(e.logs.String(), "closed pool") {
		t.Errorf("the cause of the 503 was not logged:\n%s", e.logs)
	}
}

func TestSpaces(t *testing.T) {
	e := newEnv(t, nil)
	for _, n := range []string{"blue", "green", "red"} {
		var sp ipamv1.Space
		e.mustDo(201, "POST", "/v1/spaces", map[string]string{"name": n}, &sp)
		if sp.Name != n || sp.CreatedAt.IsZero() || sp.CreatedAt.Location() != time.UTC {
			t.Errorf("created %+v", sp)
		}
	}
	// Creating it again is a retry: the first answer again.
	var red, again ipamv1.Space
	e.mustDo(200, "GET", "/v1/spaces/red", nil, &red)
	e.mustDo(201, "POST", "/v1/spaces", map[string]string{"name": "red"}, &again)
	if !again.CreatedAt.Equal(red.CreatedAt) {
		t.Errorf("retried create answered %+v, first %+v", again, red)
	}

	// blue, default, green, red in two pages of 3 and 1.
	var names []string
	next := ""
	for pages := 0; ; pages++ {
		var l ipamv1.SpaceList
		e.mustDo(200, "GET", "/v1/spaces?limit=3&continue="+next, nil, &l)
		for _, s := range l.Items {
			names = append(names, s.Name)
		}
		if l.Continue == nil {
			if pages != 1 {
				t.Errorf("%d pages, want 2", pages+1)
			}
			break
		}
		next = *l.Continue
	}
	if want := []string{"blue", "default", "green", "red"}; !slices.Equal(names, want) {
		t.Errorf("spaces %v, want %v", names, want)
	}

	var sp ipamv1.Space
	e.mustDo(200, "GET", "/v1/spaces/green", nil, &sp)
	e.mustDo(204, "DELETE", "/v1/spaces/green", nil, nil)
	if res := e.do("GET", "/v1/spaces/green", nil); res.status != 404 {
		t.Errorf("deleted space: %d", res.status)
	}

	// Objects of a space are invisible from another.
	e.mustDo(201, "POST", "/v1/pools?space=blue", pool4("p", 24, "10.0.0.0/16"), nil)
	e.mustDo(201, "POST", "/v1/pools?space=red", pool4("p", 24, "10.0.0.0/16"), nil)
	var l ipamv1.PoolList
	e.mustDo(200, "GET", "/v1/pools", nil, &l)
	if len(l.Items) != 0 {
		t.Errorf("default space sees %d pools", len(l.Items))
	}
}

func TestPoolLifecycle(t *testing.T) {
	e := newEnv(t, nil)

	// Defaults: node-local router and health, no ingress, no first/last.
	var p ipamv1.Pool
	e.mustDo(201, "POST", "/v1/pools", map[string]any{
		"name":   "default",
		"labels": map[string]string{"team": "net"},
		"spec": map[string]any{
			"ipv4":      map[string]any{"cidrs": []string{"10.244.0.0/16"}, "maskSize": 24},
			"ipv6":      map[string]any{"cidrs": []string{"fd00:10:244::/104"}, "maskSize": 112},
			"nodeLocal": map[string]any{"health": false},
		},
	}, &p)
	if p.Name != "default" || p.Space != "default" || p.Labels["team"] != "net" {
		t.Errorf("created %+v", p)
	}
	if nl := p.Spec.NodeLocal; nl == nil || !*nl.Router || *nl.Health || *nl.Ingress {
		t.Errorf("nodeLocal %+v, want router only", nl)
	}
	if *p.Spec.AllowFirstIP || *p.Spec.AllowLastIP {
		t.Errorf("allowFirstIP/allowLastIP default to true")
	}
	if p.Status.Ipv4 == nil || p.Status.Ipv4.BlocksPossible != 256 || p.Status.Ipv4.BlocksCarved != 0 {
		t.Errorf("ipv4 status %+v", p.Status.Ipv4)
	}
	if p.Status.Ipv6 == nil || p.Status.Ipv6.BlocksPossible != 256 {
		t.Errorf("ipv6 status %+v", p.Status.Ipv6)
	}

	// A lease carves one block per family; the counts follow.
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "pod1"), &a)
	e.mustDo(200, "GET", "/v1/pools/default", nil, &p)
	// A /24 keeps 256 - network - broadcast - router = 253 leasable addresses.
	want := ipamv1.PoolFamilyStatus{BlocksPossible: 256, BlocksCarved: 1, AddressesTotal: 253, Leased: 1, Free: 252}
	if *p.Status.Ipv4 != want {
		t.Errorf("ipv4 status %+v, want %+v", *p.Status.Ipv4, want)
	}
	if p.Status.Ipv6.BlocksCarved != 1 || p.Status.Ipv6.Leased != 1 {
		t.Errorf("ipv6 status %+v", *p.Status.Ipv6)
	}

	// Update: labels replaced, a CIDR added; the pool keeps its blocks.
	e.mustDo(200, "PUT", "/v1/pools/default", map[string]any{
		"labels": map[string]string{"team": "infra"},
		"spec": map[string]any{
			"ipv4":      map[string]any{"cidrs": []string{"10.244.0.0/16", "10.245.0.0/16"}, "maskSize": 24},
			"ipv6":      map[string]any{"cidrs": []string{"fd00:10:244::/104"}, "maskSize": 112},
			"nodeLocal": map[string]any{"health": false},
		},
	}, &p)
	if p.Labels["team"] != "infra" || len(p.Spec.Ipv4.Cidrs) != 2 || p.Status.Ipv4.BlocksPossible != 512 || p.Status.Ipv4.BlocksCarved != 1 {
		t.Errorf("updated %+v %+v", p.Labels, *p.Status.Ipv4)
	}

	// A second pool, for the list.
	e.mustDo(201, "POST", "/v1/pools", pool4("other", 28, "192.168.0.0/24"), nil)
	var l ipamv1.PoolList
	e.mustDo(200, "GET", "/v1/pools?limit=1", nil, &l)
	if len(l.Items) != 1 || l.Items[0].Name != "default" || l.Continue == nil {
		t.Fatalf("first page %+v", l)
	}
	e.mustDo(200, "GET", "/v1/pools?limit=1&continue="+*l.Continue, nil, &l)
	if len(l.Items) != 1 || l.Items[0].Name != "other" || l.Continue != nil {
		t.Fatalf("second page %+v", l)
	}

	// The pool is in use until its blocks go: release the lease, let the
	// cooldown pass, release the blocks, then delete.
	if res := e.do("DELETE", "/v1/pools/default", nil); res.status != 409 {
		t.Fatalf("delete in use: %d %s", res.status, res.body)
	}
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/c1/eth0", nil, nil)
	e.mustDo(200, "GET", "/v1/pools/default", nil, &p)
	if p.Status.Ipv4.Leased != 0 || p.Status.Ipv4.Cooling != 1 || p.Status.Ipv4.Free != 252 {
		t.Errorf("after release: %+v", *p.Status.Ipv4)
	}
	e.clock.Advance(testCooldown + time.Second)
	for _, addr := range a.Addresses {
		e.mustDo(204, "DELETE", "/v1/nodes/n1/blocks?cidr="+addr.Block, nil, nil)
	}
	e.mustDo(204, "DELETE", "/v1/pools/default", nil, nil)
	if res := e.do("GET", "/v1/pools/default", nil); res.status != 404 {
		t.Errorf("deleted pool: %d %s", res.status, res.body)
	}
}

func TestNodes(t *testing.T) {
	e := newEnv(t, nil)
	ctx := t.Context()
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 26, "10.0.0.0/16"), nil)

	spec := ipamclient.NodeSpec{
		Labels:     &ipamclient.Labels{"topology.kubernetes.io/zone": "a"},
		Addresses:  &[]ipamclient.NodeAddress{{Type: ipamclient.InternalIP, Address: "192.168.1.10"}, {Type: ipamclient.ExternalIP, Address: "2001:db8::10"}},
		ProviderID: ptr("aws:///eu-west-1a/i-0123"),
	}
	r, err := e.client.PutNodeWithResponse(ctx, "node-1.example", nil, spec)
	if err != nil || r.StatusCode() != 201 || r.JSON201 == nil {
		t.Fatalf("register: %v %d %s", err, r.StatusCode(), r.Body)
	}
	n := r.JSON201
	if n.Name != "node-1.example" || n.Space != "default" || len(n.Addresses) != 2 || n.Addresses[1].Address != "2001:db8::10" ||
		deref(n.ProviderID, "") != "aws:///eu-west-1a/i-0123" || n.Labels["topology.kubernetes.io/zone"] != "a" {
		t.Errorf("registered %+v", n)
	}

	// Replacing answers 200; absent fields become empty.
	r, err = e.client.PutNodeWithResponse(ctx, "node-1.example", nil, ipamclient.NodeSpec{Labels: &ipamclient.Labels{"role": "worker"}})
	if err != nil || r.StatusCode() != 200 || r.JSON200 == nil {
		t.Fatalf("replace: %v %d %s", err, r.StatusCode(), r.Body)
	}
	if n := r.JSON200; len(n.Addresses) != 0 || n.ProviderID != nil || len(n.Labels) != 1 || n.Labels["role"] != "worker" {
		t.Errorf("replaced %+v", n)
	}

	for _, name := range []string{"node-2", "node-3"} {
		e.mustDo(201, "PUT", "/v1/nodes/"+name, map[string]any{}, nil)
	}
	e.mustDo(201, "POST", "/v1/nodes/node-2/leases", lease("c1", "eth0", "pod1"), nil)

	var got ipamv1.Node
	e.mustDo(200, "GET", "/v1/nodes/node-2", nil, &got)
	if got.Blocks != 1 || got.Leases != 1 || got.Labels == nil || got.Addresses == nil {
		t.Errorf("node-2 %+v", got)
	}

	var names []string
	for next := ""; ; {
		var l ipamv1.NodeList
		e.mustDo(200, "GET", "/v1/nodes?limit=2&continue="+next, nil, &l)
		for _, n := range l.Items {
			names = append(names, n.Name)
		}
		if l.Continue == nil {
			break
		}
		next = *l.Continue
	}
	if want := []string{"node-1.example", "node-2", "node-3"}; !slices.Equal(names, want) {
		t.Errorf("nodes %v, want %v", names, want)
	}

	// A node holding leases is deleted only with force, which frees its block.
	if res := e.do("DELETE", "/v1/nodes/node-2", nil); res.status != 409 {
		t.Fatalf("delete with leases: %d %s", res.status, res.body)
	}
	e.mustDo(204, "DELETE", "/v1/nodes/node-2?force=true", nil, nil)
	e.mustDo(204, "DELETE", "/v1/nodes/node-3", nil, nil)
	if res := e.do("GET", "/v1/nodes/node-2", nil); res.status != 404 {
		t.Errorf("deleted node: %d", res.status)
	}
	var p ipamv1.Pool
	e.mustDo(200, "GET", "/v1/pools/default", nil, &p)
	if p.Status.Ipv4.BlocksCarved != 0 || p.Status.Ipv4.Leased != 0 {
		t.Errorf("pool after forced delete: %+v", *p.Status.Ipv4)
	}
}

func TestBlocks(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{
		"name": "default",
		"spec": map[string]any{
			"ipv4":      map[string]any{"cidrs": []string{"10.0.0.0/24"}, "maskSize": 28},
			"nodeLocal": map[string]any{"ingress": true},
		},
	}, nil)
	e.mustDo(201, "PUT", "/v1/nodes/n1", map[string]any{}, nil)

	var b ipamv1.Block
	e.mustDo(201, "POST", "/v1/nodes/n1/blocks", map[string]string{"pool": "default", "family": "ipv4"}, &b)
	want := ipamv1.Block{
		Cidr: "10.0.0.0/28", Node: "n1", Pool: "default", Family: ipamv1.Ipv4, Gateway: ptr("10.0.0.1"),
		Reserved: ipamv1.ReservedAddresses{Router: ptr("10.0.0.1"), Health: ptr("10.0.0.2"), Ingress: ptr("10.0.0.3")},
		Capacity: 11, CreatedAt: b.CreatedAt, Source: ptr(ipamv1.Carved),
	}
	if dump(b) != dump(want) || b.CreatedAt.IsZero() {
		t.Errorf("carved %s, want %s", dump(b), dump(want))
	}
	e.mustDo(201, "POST", "/v1/nodes/n1/blocks", map[string]string{"pool": "default", "family": "ipv4"}, &b)
	if b.Cidr != "10.0.0.16/28" {
		t.Errorf("second block %s", b.Cidr)
	}
	var l ipamv1.BlockList
	e.mustDo(200, "GET", "/v1/nodes/n1/blocks", nil, &l)
	if len(l.Items) != 2 || l.Items[0].Cidr != "10.0.0.0/28" || l.Items[1].Cidr != "10.0.0.16/28" {
		t.Errorf("blocks %s", dump(l))
	}
	e.mustDo(204, "DELETE", "/v1/nodes/n1/blocks?cidr=10.0.0.0/28", nil, nil)
	e.mustDo(200, "GET", "/v1/nodes/n1/blocks", nil, &l)
	if len(l.Items) != 1 || l.Items[0].Cidr != "10.0.0.16/28" {
		t.Errorf("blocks after release %s", dump(l))
	}
	if res := e.do("DELETE", "/v1/nodes/n1/blocks?cidr=10.0.0.0/28", nil); res.status != 404 {
		t.Errorf("released block again: %d %s", res.status, res.body)
	}
}

func TestLeaseLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	ctx := t.Context()
	e.mustDo(201, "POST", "/v1/pools", map[string]any{
		"name": "default",
		"spec": map[string]any{
			"ipv4": map[string]any{"cidrs": []string{"10.244.0.0/16"}, "maskSize": 26},
			"ipv6": map[string]any{"cidrs": []string{"fd00::/104"}, "maskSize": 120},
		},
	}, nil)

	req := ipamclient.LeaseRequest{
		Owner:       ipamclient.Owner{Namespace: "kube-system", Name: "coredns-1", Uid: ptr("0b6a-11")},
		ContainerID: "0123456789abcdef",
		Interface:   "eth0",
	}
	r, err := e.client.AllocateLeaseWithResponse(ctx, "n1", nil, req)
	if err != nil || r.StatusCode() != 201 || r.JSON201 == nil {
		t.Fatalf("allocate: %v %d %s", err, r.StatusCode(), r.Body)
	}
	first := *r.JSON201
	if first.State != ipamclient.Pending || first.ExpiresAt == nil || !first.ExpiresAt.Equal(e.clock.Now().Add(testLeaseExpiry)) {
		t.Errorf("state %s expires %v", first.State, first.ExpiresAt)
	}
	if dump(first.Owner) != dump(req.Owner) {
		t.Errorf("owner %+v", first.Owner)
	}
	wantAddrs := []ipamclient.LeaseAddress{
		{Family: ipamclient.Ipv4, Address: "10.244.0.3/26", Gateway: ptr("10.244.0.1"), Pool: "default", Block: "10.244.0.0/26",
			SelectedBy: ptr(ipamclient.LeaseAddressSelectedByDefault), Generation: ptr(first.Generation)},
		{Family: ipamclient.Ipv6, Address: "fd00::3/120", Gateway: ptr("fd00::1"), Pool: "default", Block: "fd00::/120",
			SelectedBy: ptr(ipamclient.LeaseAddressSelectedByDefault), Generation: ptr(first.Generation)},
	}
	if first.Generation < 1 {
		t.Errorf("generation %d", first.Generation)
	}
	if dump(first.Addresses) != dump(wantAddrs) {
		t.Errorf("addresses %s, want %s", dump(first.Addresses), dump(wantAddrs))
	}

	// A retry answers 200 with the same addresses.
	r, err = e.client.AllocateLeaseWithResponse(ctx, "n1", nil, req)
	if err != nil || r.StatusCode() != 200 || r.JSON200 == nil {
		t.Fatalf("retry: %v %d %s", err, r.StatusCode(), r.Body)
	}
	if dump(r.JSON200.Addresses) != dump(first.Addresses) {
		t.Errorf("retry answered %s, first %s", dump(r.JSON200.Addresses), dump(first.Addresses))
	}

	// The same key for another owner is a conflict.
	other := req
	other.Owner = ipamclient.Owner{Namespace: "kube-system", Name: "coredns-2"}
	r, err = e.client.AllocateLeaseWithResponse(ctx, "n1", nil, other)
	if err != nil || r.StatusCode() != 409 || r.ApplicationproblemJSON409 == nil ||
		r.ApplicationproblemJSON409.Type != "urn:ipam:problem:lease-conflict" {
		t.Fatalf("other owner: %v %d %s", err, r.StatusCode(), r.Body)
	}

	// Confirm stops the expiry.
	c, err := e.client.ConfirmAttachmentWithResponse(ctx, "n1", req.ContainerID, "eth0", nil)
	if err != nil || c.StatusCode() != 200 || c.JSON200 == nil {
		t.Fatalf("confirm: %v %d %s", err, c.StatusCode(), c.Body)
	}
	if c.JSON200.State != ipamclient.Active || c.JSON200.ExpiresAt != nil || dump(c.JSON200.Addresses) != dump(first.Addresses) {
		t.Errorf("confirmed %s", dump(c.JSON200))
	}
	g, err := e.client.GetAttachmentWithResponse(ctx, "n1", req.ContainerID, "eth0", nil)
	if err != nil || g.StatusCode() != 200 || g.JSON200.State != ipamclient.Active {
		t.Fatalf("get attachment: %v %d %s", err, g.StatusCode(), g.Body)
	}

	// Who holds an address.
	var l ipamv1.Lease
	e.mustDo(200, "GET", "/v1/addresses/10.244.0.3", nil, &l)
	if l.Address != "10.244.0.3/26" || l.Block != "10.244.0.0/26" || deref(l.Gateway, "") != "10.244.0.1" || l.State != ipamv1.Active ||
		l.ConfirmedAt == nil || l.ExpiresAt != nil || l.ReleasedAt != nil || l.Node != "n1" || l.ContainerID != req.ContainerID {
		t.Errorf("holder %s", dump(l))
	}

	// Release answers 204, also when nothing is held any more.
	for range 2 {
		e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/"+req.ContainerID+"/eth0", nil, nil)
	}
	e.mustDo(200, "GET", "/v1/addresses/fd00::3", nil, &l)
	if l.State != ipamv1.Cooling || l.ReleasedAt == nil || l.CooldownUntil == nil || !l.CooldownUntil.Equal(e.clock.Now().Add(testCooldown)) {
		t.Errorf("released %s", dump(l))
	}
	if res := e.do("GET", "/v1/nodes/n1/attachments/"+req.ContainerID+"/eth0", nil); res.status != 404 {
		t.Errorf("released attachment: %d %s", res.status, res.body)
	}
	e.mustDo(204, "DELETE", "/v1/addresses/10.244.0.3", nil, nil)
	e.mustDo(204, "DELETE", "/v1/addresses/10.244.99.99", nil, nil)

	// The address is not handed out again before its cooldown ends.
	r, err = e.client.AllocateLeaseWithResponse(ctx, "n1", nil, ipamclient.LeaseRequest{
		Owner: req.Owner, ContainerID: "fedcba", Interface: "eth0", Families: &[]ipamclient.Family{ipamclient.Ipv4}, Expire: ptr(false),
	})
	if err != nil || r.StatusCode() != 201 {
		t.Fatalf("allocate v4 only: %v %d %s", err, r.StatusCode(), r.Body)
	}
	if a := r.JSON201; len(a.Addresses) != 1 || a.Addresses[0].Address == "10.244.0.3/26" || a.State != ipamclient.Active || a.ExpiresAt != nil {
		t.Errorf("second allocation %s", dump(a))
	}
}

func TestListLeases(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("blue", 24, "10.1.0.0/16"), nil)
	// n1: 5 in default (ns a), 2 in blue (ns b); n2: 3 in default (ns b).
	for i := range 5 {
		e.mustDo(201, "POST", "/v1/nodes/n1/leases", map[string]any{
			"owner": map[string]string{"namespace": "a", "name": fmt.Sprintf("p%d", i)}, "containerID": fmt.Sprintf("a%d", i), "interface": "eth0",
		}, nil)
	}
	for i := range 2 {
		e.mustDo(201, "POST", "/v1/nodes/n1/leases", map[string]any{
			"owner": map[string]string{"namespace": "b", "name": fmt.Sprintf("q%d", i)}, "containerID": fmt.Sprintf("b%d", i), "interface": "eth0", "pool": "blue",
		}, nil)
	}
	for i := range 3 {
		e.mustDo(201, "POST", "/v1/nodes/n2/leases", map[string]any{
			"owner": map[string]string{"namespace": "b", "name": fmt.Sprintf("r%d", i)}, "containerID": fmt.Sprintf("c%d", i), "interface": "eth0",
		}, nil)
	}
	e.mustDo(200, "POST", "/v1/nodes/n1/attachments/a0/eth0/confirm", nil, nil)
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/a1/eth0", nil, nil)

	list := func(query string) []string {
		t.Helper()
		var addrs []string
		pages := 0
		for next := ""; ; pages++ {
			var l ipamv1.LeaseList
			e.mustDo(200, "GET", "/v1/leases?limit=3&"+query+"&continue="+next, nil, &l)
			if len(l.Items) > 3 {
				t.Fatalf("page of %d", len(l.Items))
			}
			for _, it := range l.Items {
				addrs = append(addrs, it.Address+" "+string(it.State))
			}
			if l.Continue == nil {
				break
			}
			next = *l.Continue
		}
		return addrs
	}
	all := list("")
	if len(all) != 10 {
		t.Fatalf("all leases (4 pages of 3): %v", all)
	}
	if !slices.IsSortedFunc(all, func(a, b string) int {
		pa := netip.MustParsePrefix(strings.Fields(a)[0])
		pb := netip.MustParsePrefix(strings.Fields(b)[0])
		return pa.Addr().Compare(pb.Addr())
	}) {
		t.Errorf("not ordered by address: %v", all)
	}
	for _, c := range []struct {
		query string
		want  int
	}{
		{"node=n1", 7},
		{"node=n2", 3},
		{"pool=blue", 2},
		{"ownerNamespace=b", 5},
		{"ownerNamespace=a&ownerName=p3", 1},
		{"node=n1&pool=default", 5},
		{"state=pending", 8},
		{"state=active", 1},
		{"state=cooling", 1},
		{"node=nobody", 0},
	} {
		if got := list(c.query); len(got) != c.want {
			t.Errorf("%s: %d leases, want %d: %v", c.query, len(got), c.want, got)
		}
	}
	if got := list("state=cooling"); len(got) != 1 || got[0] != "10.0.0.4/24 cooling" {
		t.Errorf("cooling %v", got)
	}
	// After the cooldown the address is free and no longer listed.
	e.clock.Advance(testCooldown)
	if got := list("state=cooling"); len(got) != 0 {
		t.Errorf("cooling after the cooldown: %v", got)
	}
}

func TestReconcile(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	for _, c := range []string{"keep1", "drop1", "keep2", "drop2"} {
		e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease(c, "eth0", c), nil)
	}
	e.mustDo(201, "POST", "/v1/nodes/n2/leases", lease("other", "eth0", "other"), nil)

	var res ipamv1.ReconcileResult
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []map[string]string{
		{"containerID": "keep1", "interface": "eth0"}, {"containerID": "keep2", "interface": "eth0"}, {"containerID": "gone", "interface": "eth0"},
	}}, &res)
	var dropped []string
	for _, l := range res.Released {
		if l.State != ipamv1.Cooling || l.Node != "n1" {
			t.Errorf("released %s", dump(l))
		}
		dropped = append(dropped, l.ContainerID)
	}
	slices.Sort(dropped)
	if !slices.Equal(dropped, []string{"drop1", "drop2"}) {
		t.Errorf("released %v", dropped)
	}
	// Nothing left to release; other nodes are untouched.
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []map[string]string{
		{"containerID": "keep1", "interface": "eth0"}, {"containerID": "keep2", "interface": "eth0"},
	}}, &res)
	if res.Released == nil || len(res.Released) != 0 {
		t.Errorf("second reconcile released %s", dump(res))
	}
	var n ipamv1.Node
	e.mustDo(200, "GET", "/v1/nodes/n2", nil, &n)
	if n.Leases != 1 {
		t.Errorf("n2 holds %d leases", n.Leases)
	}
	// An empty list releases everything of the node.
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []string{}}, &res)
	if len(res.Released) != 2 {
		t.Errorf("empty list released %d", len(res.Released))
	}
}

func TestSizing(t *testing.T) {
	e := newEnv(t, nil)
	for _, c := range []struct {
		query string
		want  ipamv1.Sizing
	}{
		{"cidr=10.0.0.0/8&maskSize=24",
			ipamv1.Sizing{Cidr: "10.0.0.0/8", Family: ipamv1.Ipv4, MaskSize: 24, Nodes: 65536, AddressesPerNode: 256, ReservedPerNode: 4, UsablePerNode: 252}},
		{"cidr=10.0.0.0/8&maskSize=24&router=false&health=false&allowFirstIP=true&allowLastIP=true",
			ipamv1.Sizing{Cidr: "10.0.0.0/8", Family: ipamv1.Ipv4, MaskSize: 24, Nodes: 65536, AddressesPerNode: 256, ReservedPerNode: 0, UsablePerNode: 256}},
		{"cidr=10.244.0.0/16&maskSize=28&ingress=true",
			ipamv1.Sizing{Cidr: "10.244.0.0/16", Family: ipamv1.Ipv4, MaskSize: 28, Nodes: 4096, AddressesPerNode: 16, ReservedPerNode: 5, UsablePerNode: 11}},
		{"cidr=fd00::/104&maskSize=120",
			ipamv1.Sizing{Cidr: "fd00::/104", Family: ipamv1.Ipv6, MaskSize: 120, Nodes: 65536, AddressesPerNode: 256, ReservedPerNode: 4, UsablePerNode: 252}},
	} {
		var got ipamv1.Sizing
		e.mustDo(200, "GET", "/v1/sizing?"+c.query, nil, &got)
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.query, got, c.want)
		}
	}
}

// panicStore is the real store with one method that panics: fault
// injection for the recovery middleware, not a model of the store.
type panicStore struct{ *store.Store }

func (panicStore) ListNodes(context.Context, string, alloc.Page) ([]alloc.Node, string, error) {
	panic("boom")
}

// leakStore is the real store with one method failing with an internal
// error whose text must not reach clients.
type leakStore struct{ *store.Store }

func (leakStore) GetNode(context.Context, string, string) (alloc.Node, error) {
	return alloc.Node{}, errors.New("SECRET connection string postgres://admin:hunter2@db")
}

func TestInternalErrors(t *testing.T) {
	e := newEnv(t, func(s *store.Store) Stores { st := StoresOf(s); st.Nodes = panicStore{s}; return st })
	res := e.do("GET", "/v1/nodes", nil)
	if res.status != 500 {
		t.Fatalf("panic: %d %s", res.status, res.body)
	}
	if p := res.problem(t); p.Type != "urn:ipam:problem:internal" || deref(p.Detail, "") != "internal error" {
		t.Errorf("panic answered %s", res.body)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "boom") || !strings.Contains(logs, "panic") {
		t.Errorf("panic not logged:\n%s", logs)
	}
	// The server survives.
	e.mustDo(200, "GET", "/healthz", nil, nil)

	e = newEnv(t, func(s *store.Store) Stores { st := StoresOf(s); st.Nodes = leakStore{s}; return st })
	res = e.do("GET", "/v1/nodes/n1", nil)
	if res.status != 500 || strings.Contains(string(res.body), "SECRET") {
		t.Fatalf("internal error: %d %s", res.status, res.body)
	}
	if p := res.problem(t); p.Type != "urn:ipam:problem:internal" || p.Field != nil {
		t.Errorf("internal error answered %s", res.body)
	}
	if !strings.Contains(e.logs.String(), "SECRET") {
		t.Errorf("internal error not logged:\n%s", e.logs)
	}
}

func TestAccessLog(t *testing.T) {
	e := newEnv(t, nil)
	e.do("GET", "/v1/nodes/nope", nil)
	logs := e.logs.String()
	for _, want := range []string{`"msg":"http request"`, `"method":"GET"`, `"path":"/v1/nodes/nope"`, `"status":404`, `"duration":`} {
		if !strings.Contains(logs, want) {
			t.Errorf("access log lacks %s:\n%s", want, logs)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	if err := (Options{}).Validate(); err != nil {
		t.Errorf("zero options: %v", err)
	}
	if err := (Options{MaxBodyBytes: -1}).Validate(); err == nil {
		t.Error("negative MaxBodyBytes accepted")
	}
}

func TestSmallBodyLimit(t *testing.T) {
	e := newEnv(t, nil)
	e.srv = httptest.NewServer(NewHandler(StoresOf(e.store), Options{MaxBodyBytes: 64}))
	t.Cleanup(e.srv.Close)
	res := e.do("PUT", "/v1/nodes/n1", map[string]any{"labels": map[string]string{"k": strings.Repeat("v", 60)}})
	if res.status != 413 {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	if p := res.problem(t); p.Type != "urn:ipam:problem:payload-too-large" {
		t.Errorf("type %s", p.Type)
	}
}

// dump shows a value with what its pointers point to.
func dump(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

func TestAddressReuseAfterCooldown(t *testing.T) {
	e := newEnv(t, nil)
	// A /30 with the router reserved leaves one leasable address: 10.9.0.2.
	e.mustDo(201, "POST", "/v1/pools", map[string]any{
		"name": "default",
		"spec": map[string]any{
			"ipv4":      map[string]any{"cidrs": []string{"10.9.0.0/30"}, "maskSize": 30},
			"nodeLocal": map[string]any{"health": false},
		},
	}, nil)
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p1"), &a)
	if a.Addresses[0].Address != "10.9.0.2/30" {
		t.Fatalf("first address %s", a.Addresses[0].Address)
	}
	// Full, and nothing cooling: no Retry-After.
	res := e.do("POST", "/v1/nodes/n1/leases", lease("c2", "eth0", "p2"))
	if p := res.problem(t); res.status != 409 || strings.Contains(deref(p.Detail, ""), "cooling") || res.header.Get("Retry-After") != "" {
		t.Fatalf("full: %d %s, Retry-After %q", res.status, res.body, res.header.Get("Retry-After"))
	}
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/c1/eth0", nil, nil)

	// Cooling: the pool is exhausted for now, and says until when.
	e.clock.Advance(10500 * time.Millisecond)
	res = e.do("POST", "/v1/nodes/n1/leases", lease("c2", "eth0", "p2"))
	if p := res.problem(t); res.status != 409 || p.Type != "urn:ipam:problem:pool-exhausted" ||
		deref(p.Pool, "") != "default" || deref(p.Family, "") != ipamv1.Ipv4 ||
		!strings.HasSuffix(deref(p.Detail, ""), "; 1 address cooling, the first free in 20 s") {
		t.Fatalf("during cooldown: %d %s", res.status, res.body)
	}
	if got := res.header.Get("Retry-After"); got != "20" {
		t.Errorf("Retry-After %q during cooldown, want 20 (seconds, rounded up)", got)
	}
	e.clock.Advance(testCooldown - 10500*time.Millisecond)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c2", "eth0", "p2"), &a)
	if a.Addresses[0].Address != "10.9.0.2/30" || a.Owner.Name != "p2" {
		t.Errorf("after cooldown %s", dump(a))
	}
}

func TestPoolFamilyAdded(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p1"), nil)
	var p ipamv1.Pool
	e.mustDo(200, "PUT", "/v1/pools/default", map[string]any{"spec": map[string]any{
		"ipv4": map[string]any{"cidrs": []string{"10.0.0.0/16"}, "maskSize": 24},
		"ipv6": map[string]any{"cidrs": []string{"fd00::/104"}, "maskSize": 120},
	}}, &p)
	if p.Spec.Ipv6 == nil || p.Status.Ipv6 == nil || p.Status.Ipv6.BlocksPossible != 65536 || len(p.Labels) != 0 {
		t.Fatalf("updated %s", dump(p))
	}
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c2", "eth0", "p2"), &a)
	if len(a.Addresses) != 2 || a.Addresses[1].Family != ipamv1.Ipv6 {
		t.Errorf("dual-stack allocation %s", dump(a))
	}
	// The first attachment keeps its IPv4-only lease on retry.
	e.mustDo(200, "POST", "/v1/nodes/n1/leases", leaseWith("containerID", "c1", "owner", map[string]string{"namespace": "ns", "name": "p1"}, "families", []string{"ipv4"}), &a)
}

// TestAllocateWithoutNodeLocalAddresses: a pool that reserves no node-local
// address leases from a freshly carved block. (The store of d55264c passed
// the new block's reserved offsets as a nil slice, SQL NULL, so that
// "o <> ALL (NULL)" matched nothing and the first lease failed with a 500.)
func TestAllocateWithoutNodeLocalAddresses(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{
		"name": "default",
		"spec": map[string]any{
			"ipv4":      map[string]any{"cidrs": []string{"10.9.0.0/24"}, "maskSize": 28},
			"nodeLocal": map[string]any{"router": false, "health": false},
		},
	}, nil)
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p1"), &a)
	if got := a.Addresses[0]; got.Address != "10.9.0.1/28" || got.Gateway != nil {
		t.Errorf("leased %s", dump(got))
	}
}

// TestConcurrentAllocation: retries of one attachment racing each other get
// one address between them; distinct attachments racing on several new
// nodes never share an address.
func TestConcurrentAllocation(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 26, "10.0.0.0/16"), nil)

	type answer struct {
		status int
		addr   string
		body   string
	}
	run := func(n int, req func(i int) (node string, body map[string]any)) []answer {
		out := make([]answer, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				node, body := req(i)
				b, _ := json.Marshal(body)
				res, err := http.Post(e.srv.URL+"/v1/nodes/"+node+"/leases", "application/json", bytes.NewReader(b))
				if err != nil {
					out[i] = answer{body: err.Error()}
					return
				}
				defer res.Body.Close()
				var a ipamv1.Allocation
				raw, _ := io.ReadAll(res.Body)
				_ = json.Unmarshal(raw, &a)
				out[i] = answer{status: res.StatusCode, body: string(raw)}
				if len(a.Addresses) == 1 {
					out[i].addr = a.Addresses[0].Address
				}
			})
		}
		wg.Wait()
		return out
	}

	same := run(16, func(int) (string, map[string]any) { return "n0", lease("same", "eth0", "p") })
	created := 0
	for _, a := range same {
		switch {
		case a.status == 201:
			created++
		case a.status != 200:
			t.Errorf("retry race: %d %s", a.status, a.body)
		}
		if a.addr != same[0].addr {
			t.Errorf("retry race answered %s and %s", a.addr, same[0].addr)
		}
	}
	if created != 1 {
		t.Errorf("%d answers were 201, want 1", created)
	}

	many := run(60, func(i int) (string, map[string]any) {
		return fmt.Sprintf("n%d", 1+i%4), lease(fmt.Sprintf("c%d", i), "eth0", fmt.Sprintf("p%d", i))
	})
	seen := map[string]int{}
	for i, a := range many {
		if a.status != 201 {
			t.Errorf("allocation %d: %d %s", i, a.status, a.body)
			continue
		}
		if j, dup := seen[a.addr]; dup {
			t.Errorf("%s handed out twice (%d and %d)", a.addr, j, i)
		}
		seen[a.addr] = i
	}
	var l ipamv1.NodeList
	e.mustDo(200, "GET", "/v1/nodes", nil, &l)
	if len(l.Items) != 5 {
		t.Errorf("%d nodes registered, want 5", len(l.Items))
	}
}

// A database that cannot be reached is a 503 "unavailable" with
// Retry-After on every endpoint that needs it, never a 500, so clients
// (the CNI plugin above all) retry.
func TestDatabaseUnreachableIsUnavailable(t *testing.T) {
	st, err := store.Open(t.Context(), "host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=2 sslmode=disable", store.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	logs := &syncBuffer{}
	srv := httptest.NewServer(NewHandler(StoresOf(st), Options{
		Logger:        slog.New(slog.NewJSONHandler(logs, nil)),
		IsUnavailable: store.IsUnavailable,
		AnonymousRole: alloc.RoleAdmin,
	}))
	defer srv.Close()
	body := strings.NewReader(`{"owner":{"namespace":"ns","name":"pod"},"containerID":"c1","interface":"eth0"}`)
	res, err := http.Post(srv.URL+"/v1/nodes/node-a/leases", "application/json", body)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
	}
	var p ipamv1.Problem
	if err := json.NewDecoder(res.Body).Decode(&p); err != nil || p.Type != "urn:ipam:problem:unavailable" {
		t.Fatalf("problem %+v %v", p, err)
	}
	if !strings.Contains(logs.String(), "api: unavailable") {
		t.Errorf("the outage was not logged:\n%s", logs)
	}
}

// A reconcile names its CNI network and releases only that network's
// leases; a request without one is the unnamed network. The attachment
// routes take the network as a query parameter, and a reserve lease is
// handed over to a Pod through fromReserve.
func TestReconcileByNetwork(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	onNet := func(c, network string) map[string]any {
		b := lease(c, "eth0", c)
		if network != "" {
			b["network"] = network
		}
		return b
	}
	var lab, cmp, plain ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", onNet("lab1", "labnet"), &lab)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", onNet("cmp1", "cmp"), &cmp)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", onNet("plain", ""), &plain)
	if lab.Network == nil || *lab.Network != "labnet" || plain.Network != nil {
		t.Fatalf("networks in the answers: %s %s", dump(lab), dump(plain))
	}

	var res ipamv1.ReconcileResult
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", map[string]any{"network": "cmp", "attachments": []string{}}, &res)
	if len(res.Released) != 1 || res.Released[0].ContainerID != "cmp1" || res.Released[0].Network == nil || *res.Released[0].Network != "cmp" {
		t.Fatalf("GC of cmp released %s", dump(res))
	}
	e.mustDo(200, "GET", "/v1/nodes/n1/attachments/lab1/eth0?network=labnet", nil, nil)
	if r := e.do("GET", "/v1/nodes/n1/attachments/lab1/eth0", nil); r.status != 404 {
		t.Fatalf("labnet's attachment in the unnamed network: %d %s", r.status, r.body)
	}
	// Without a network: the unnamed network only.
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []string{}}, &res)
	if len(res.Released) != 1 || res.Released[0].ContainerID != "plain" {
		t.Fatalf("reconcile without a network released %s", dump(res))
	}
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/lab1/eth0", nil, nil) // the unnamed network's: nothing
	e.mustDo(200, "GET", "/v1/nodes/n1/attachments/lab1/eth0?network=labnet", nil, nil)
	if r := e.do("POST", "/v1/nodes/n1/reconcile", map[string]any{"network": "bad net", "attachments": []string{}}); r.status != 400 || !strings.Contains(string(r.body), "network") {
		t.Fatalf("bad network: %d %s", r.status, r.body)
	}

	// The handover.
	slot := onNet("reserve-0", "labnet")
	slot["interface"], slot["expire"] = "reserve", false
	var s0 ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", slot, &s0)
	pod := onNet("pod1", "labnet")
	pod["expire"] = false
	pod["fromReserve"] = map[string]any{"containerID": "reserve-0", "interface": "reserve", "generation": s0.Generation}
	var got ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", pod, &got)
	if got.Addresses[0].Address != s0.Addresses[0].Address || got.Owner.Name != "pod1" || got.State != ipamv1.Active {
		t.Fatalf("handed over %s, want %s", dump(got), s0.Addresses[0].Address)
	}
	e.mustDo(200, "POST", "/v1/nodes/n1/leases", pod, &got)
	if r := e.do("GET", "/v1/nodes/n1/attachments/reserve-0/reserve?network=labnet", nil); r.status != 404 {
		t.Fatalf("the slot after the handover: %d %s", r.status, r.body)
	}
	pod["fromReserve"] = map[string]any{"containerID": "reserve-0", "interface": "reserve", "generation": 0}
	if r := e.do("POST", "/v1/nodes/n1/leases", pod); r.status != 400 || !strings.Contains(string(r.body), "fromReserve.generation") {
		t.Fatalf("generation 0: %d %s", r.status, r.body)
	}
}

// /healthz answers 503 while the liveness check fails (the embedded
// PostgreSQL gone for good), and 200 again when it passes.
func TestHealthzLiveness(t *testing.T) {
	t.Parallel()
	st, err := store.Open(t.Context(), pgtest.NewDatabase(t), store.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	var down atomic.Bool
	srv := httptest.NewServer(NewHandler(StoresOf(st), Options{Logger: slog.New(slog.DiscardHandler), Liveness: func() error {
		if down.Load() {
			return errors.New("pgembed: PostgreSQL exited and 3 restarts failed")
		}
		return nil
	}}))
	t.Cleanup(srv.Close)
	get := func() (int, string) {
		res, err := http.Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if s, body := get(); s != http.StatusOK {
		t.Fatalf("alive: %d %s", s, body)
	}
	down.Store(true)
	if s, body := get(); s != http.StatusServiceUnavailable || !strings.Contains(body, "urn:ipam:problem:unavailable") || strings.Contains(body, "restarts") {
		t.Fatalf("gone: %d %s, want a 503 unavailable problem without the cause", s, body)
	}
	down.Store(false)
	if s, _ := get(); s != http.StatusOK {
		t.Fatalf("back: %d", s)
	}
}
