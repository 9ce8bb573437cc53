package api

// Cilium's crd mode through the HTTP API: the pools' nodeSelector, and the
// single addresses a node holds for Cilium's agent, which the Cilium
// operator (internal/cilium, through the store) alone may change.

import (
	"testing"

	"github.com/ipam-dev/ipam/api/ipamv1"
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
