// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// In Cilium's multi-pool mode the store's maintenance leaves the
// operator's space to the agents (store.Options.AgentPoolsSpace); in the
// other modes, and without the operator, it rebalances every space.
func TestAgentPoolsSpace(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"--kubeconfig", "/k", "--cilium-ipam-mode", "multi-pool"}, "default"},
		{[]string{"--kubeconfig", "/k", "--cilium-ipam-mode", "cluster-pool"}, ""},
		{[]string{"--kubeconfig", "/k", "--cilium-ipam-mode", "crd"}, ""},
		{[]string{"--kubeconfig", "/k", "--cilium-ipam-mode", "multi-pool", "--cluster-space", "east"}, "east"},
	} {
		cfg, err := parseConfig("serve", append(c.args, "--database-url", "postgres://x"), func(string) string { return "" })
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got := agentPoolsSpace(cfg); got != c.want {
			t.Errorf("%v: agent pools space %q, want %q", c.args, got, c.want)
		}
	}
}

// The Cilium operator flags are checked before anything starts: an
// unknown mode, no cluster to talk to, or a limit that is no limit.
func TestCiliumFlagsValidated(t *testing.T) {
	env := func(k string) string {
		if k == "IPAM_CILIUM_LEASE_NAMESPACE" {
			return "ipam"
		}
		return ""
	}
	base := []string{"--database-url", "postgres://x"}
	cfg, err := parseConfig("serve", append(base, "--kube-in-cluster", "--cilium-ipam-mode", "crd"), env)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CiliumLeaseNamespace != "ipam" || cfg.CiliumKubeQPS != 20 || cfg.CiliumKubeBurst != 40 ||
		cfg.ExcessIPReleaseDelay.Seconds() != 180 || cfg.CiliumWorkers != 50 {
		t.Errorf("defaults and environment: %+v", cfg)
	}
	// The migration flag is read in multi-pool mode, from the environment
	// too.
	migrateEnv := func(k string) string {
		if k == "IPAM_CILIUM_CLUSTER_POOL_TO_MULTI_POOL_MIGRATION" {
			return "true"
		}
		return env(k)
	}
	cfg, err = parseConfig("serve", append(base, "--kube-in-cluster", "--cilium-ipam-mode", "multi-pool"), migrateEnv)
	if err != nil || !cfg.CiliumClusterPoolToMultiPoolMigration {
		t.Errorf("IPAM_CILIUM_CLUSTER_POOL_TO_MULTI_POOL_MIGRATION=true: %v, %+v", err, cfg)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kube-in-cluster", "--cilium-ipam-mode", "eni"}, "unknown Cilium IPAM mode"},
		{[]string{"--cilium-ipam-mode", "crd"}, "needs kubeconfig or kube-in-cluster"},
		{[]string{"--kube-in-cluster", "--cilium-ipam-mode", "crd", "--cilium-kube-qps", "1"}, "cilium-kube-qps must be at least 2"},
		{[]string{"--kube-in-cluster", "--cilium-ipam-mode", "crd", "--cilium-kube-burst", "2"}, "cilium-kube-burst at least 3"},
		{[]string{"--kube-in-cluster", "--cilium-ipam-mode", "crd", "--cilium-workers", "0"}, "cilium-workers"},
		{[]string{"--kube-in-cluster", "--cilium-ipam-mode", "crd", "--excess-ip-release-delay", "0s"}, "excess-ip-release-delay"},
		{[]string{"--kube-in-cluster", "--cilium-ipam-mode", "cluster-pool", "--cilium-cluster-pool-to-multi-pool-migration"}, "needs cilium-ipam-mode=multi-pool"},
		{[]string{"--kube-in-cluster", "--cilium-cluster-pool-to-multi-pool-migration"}, "needs cilium-ipam-mode=multi-pool"},
		{[]string{"--lbipam"}, "lbipam needs kubeconfig or kube-in-cluster"},
		{[]string{"--kube-in-cluster", "--lbipam", "--lbipam-families", "ipv4,ipx"}, "lbipam-families"},
		{[]string{"--kube-in-cluster", "--lbipam", "--cilium-kube-qps", "1"}, "lbipam: cilium-kube-qps must be at least 2"},
		{[]string{"--kube-in-cluster", "--lbipam", "--lbipam-default-ipam", "nodeipam"}, "needs node-ipam"},
		{[]string{"--kube-in-cluster", "--lbipam", "--lbipam-default-ipam", "metallb"}, "want lbipam, nodeipam or none"},
		{[]string{"--kube-in-cluster", "--node-ipam"}, "set lbipam too"},
		{[]string{"--kube-in-cluster", "--lbipam-mirror"}, "set lbipam too"},
		{[]string{"--kube-in-cluster", "--cluster-space", "East Side"}, "cluster-space"},
		{[]string{"--kube-in-cluster", "--cluster-space", ""}, "cluster-space"},
	} {
		_, err := parseConfig("serve", append(append([]string{}, base...), c.args...), env)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want an error saying %q", c.args, err, c.want)
		}
	}
}

// The cluster space must exist before the Kubernetes side starts in it: a
// misspelt space fails the start, naming the flag, rather than leaving
// every CiliumNode unserved. Without Kubernetes it is not looked up.
func TestClusterSpaceMustExist(t *testing.T) {
	spaces := func(_ context.Context, name string) (alloc.Space, error) {
		switch name {
		case "east":
			return alloc.Space{Name: name}, nil
		case "down":
			return alloc.Space{}, errors.New("connection refused")
		}
		return alloc.Space{}, alloc.NotFound("space", "address space", name)
	}
	for _, c := range []struct {
		args []string
		want string // "" for no error
	}{
		{[]string{"--cluster-space", "nowhere"}, ""},
		{[]string{"--kube-in-cluster", "--cluster-space", "east"}, ""},
		{[]string{"--kube-in-cluster", "--cluster-space", "esat"}, `cluster-space "esat": no such address space; create it first`},
		{[]string{"--kubeconfig", "/k", "--cluster-space", "down"}, `cluster-space "down": connection refused`},
	} {
		cfg, err := parseConfig("serve", append(c.args, "--database-url", "postgres://x"), func(string) string { return "" })
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		err = checkClusterSpace(t.Context(), cfg, spaces)
		if (c.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%v: %v; want %q", c.args, err, c.want)
		}
	}
}
