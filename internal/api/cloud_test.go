// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"net/http"
	"net/netip"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// TestCloudPoolAPI: a cloud pool through the API: its spec round-trips,
// a node's lease is refused until the cloud's addresses are recorded,
// then comes from them, and its blocks say so.
func TestCloudPoolAPI(t *testing.T) {
	e := newEnv(t, nil)
	body := map[string]any{"name": "aws", "spec": map[string]any{
		"ipv4": plFam(28, "10.80.0.0/16"),
		"cloud": map[string]any{"provider": "aws", "prefixes": true, "subnetIDs": []string{"subnet-0123456789abcdef0"},
			"securityGroups": []string{"sg-0123456789abcdef0"}, "warmTargets": map[string]any{"warmPrefix": 1, "maxPods": 110}},
	}}
	var p ipamv1.Pool
	e.mustDo(http.StatusCreated, http.MethodPost, "/v1/pools", body, &p)
	c := p.Spec.Cloud
	if c == nil || c.Provider != "aws" || !deref(c.Prefixes, false) || deref(c.ReleaseDelaySeconds, 0) != 180 ||
		c.WarmTargets == nil || deref(c.WarmTargets.WarmPrefix, 0) != 1 || deref(c.WarmTargets.MaxPods, 0) != 110 || len(deref(c.SubnetIDs, nil)) != 1 {
		t.Fatalf("spec.cloud %+v", c)
	}
	// A retry of the create is answered the same.
	e.mustDo(http.StatusCreated, http.MethodPost, "/v1/pools", body, nil)
	if res := e.do(http.MethodPut, "/v1/nodes/n1", map[string]any{"providerID": "aws:///eu-west-1a/i-0123456789abcdef0"}); res.status != http.StatusCreated {
		t.Fatalf("registering n1: %d %s", res.status, res.body)
	}
	lease := plLease("c1", "shop", "web-0", map[string]any{"pool": "aws"})
	res := e.do(http.MethodPost, "/v1/nodes/n1/leases", lease)
	wantProblem(t, "a lease before the cloud gave addresses", res, http.StatusConflict, "pool-exhausted", "pool")
	if err := e.store.RecordCloudBlocks(t.Context(), "default", "n1", "aws", "eni-1", []netip.Prefix{netip.MustParsePrefix("10.80.3.7/32")}); err != nil {
		t.Fatal(err)
	}
	var a ipamv1.Allocation
	e.mustDo(http.StatusCreated, http.MethodPost, "/v1/nodes/n1/leases", lease, &a)
	if len(a.Addresses) != 1 || a.Addresses[0].Address != "10.80.3.7/32" {
		t.Fatalf("leased %+v", a.Addresses)
	}
	var blocks ipamv1.BlockList
	e.mustDo(http.StatusOK, http.MethodGet, "/v1/nodes/n1/blocks", nil, &blocks)
	if len(blocks.Items) != 1 || deref(blocks.Items[0].Source, "") != ipamv1.BlockSource("cloud") {
		t.Fatalf("blocks %+v", blocks.Items)
	}
}

// TestCloudPoolAPIRefusals: every bad spec.cloud is a 400 naming its
// field, and writes nothing.
func TestCloudPoolAPIRefusals(t *testing.T) {
	e := newEnv(t, nil)
	before := e.snapshot()
	for _, c := range []struct {
		cloud any
		ipv6  bool
		field string
	}{
		{map[string]any{"provider": "gcp"}, false, "spec.cloud.provider"},
		{map[string]any{}, false, "spec.cloud.provider"},
		{map[string]any{"provider": "azure", "prefixes": true}, false, "spec.cloud.prefixes"},
		{map[string]any{"provider": "aws", "subnetIDs": []string{"vpc-01234567"}}, false, "spec.cloud.subnetIDs[0]"},
		{map[string]any{"provider": "aws", "securityGroups": []string{"default"}}, false, "spec.cloud.securityGroups[0]"},
		{map[string]any{"provider": "aws", "watermarks": map[string]any{}, "warmTargets": map[string]any{}}, false, "spec.cloud.warmTargets"},
		{map[string]any{"provider": "aws", "warmTargets": map[string]any{"warmPrefix": 1}}, false, "spec.cloud.warmTargets.warmPrefix"},
		{map[string]any{"provider": "aws", "releaseDelaySeconds": -1}, false, "spec.cloud.releaseDelaySeconds"},
		// 0 is no max Pods: leave it out for the instance type's.
		{map[string]any{"provider": "aws", "warmTargets": map[string]any{"maxPods": 0}}, false, "spec.cloud.warmTargets.maxPods"},
		{map[string]any{"provider": "aws", "warmTargets": map[string]any{"maxPods": 5000}}, false, "spec.cloud.warmTargets.maxPods"},
		// IPv6 on AWS is a delegated /80, of which the node leases a /96
		// at most: a /64 block is too large for any pool.
		{map[string]any{"provider": "aws"}, true, "spec.ipv6.maskSize"},
		{map[string]any{"provider": "azure"}, true, "spec.ipv6"},
	} {
		spec := map[string]any{"ipv4": plFam(28, "10.81.0.0/16"), "cloud": c.cloud}
		if c.ipv6 {
			spec["ipv6"] = plFam(64, "fd00:81::/48")
		}
		res := e.do(http.MethodPost, "/v1/pools", map[string]any{"name": "bad", "spec": spec})
		wantProblem(t, c.field, res, http.StatusBadRequest, "invalid-input", c.field)
	}
	e.plUnchanged(before)
	// An AWS pool with its subnets' IPv6 range is a dual-stack cloud pool.
	spec := map[string]any{"ipv4": plFam(28, "10.81.0.0/16"), "ipv6": plFam(96, "2600:1f18:aaaa:bb00::/56"), "cloud": map[string]any{"provider": "aws"}}
	e.mustDo(http.StatusCreated, http.MethodPost, "/v1/pools", map[string]any{"name": "dual", "spec": spec}, nil)
}
