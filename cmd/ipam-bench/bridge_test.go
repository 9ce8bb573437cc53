// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestBridgeNetconf(t *testing.T) {
	ipam := shimIPAM("https://127.0.0.1:1", "/certs", "s1")
	b, err := bridgeNetconf("net1", "br0", ipam, json.RawMessage(`{"cniVersion":"1.1.0","interfaces":[{"name":"br0"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		CNIVersion string            `json:"cniVersion"`
		Name       string            `json:"name"`
		Type       string            `json:"type"`
		Bridge     string            `json:"bridge"`
		IsGateway  *bool             `json:"isGateway"`
		IPMasq     *bool             `json:"ipMasq"`
		IPAM       map[string]string `json:"ipam"`
		Prev       map[string]any    `json:"prevResult"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.CNIVersion != shimCNIVersion || m.Name != "net1" || m.Type != "bridge" || m.Bridge != "br0" ||
		m.IsGateway == nil || !*m.IsGateway || m.IPMasq == nil || *m.IPMasq {
		t.Fatalf("netconf %s", b)
	}
	if m.IPAM["type"] != "ipam-shim" || m.IPAM["server"] != "https://127.0.0.1:1" || m.IPAM["space"] != "s1" || m.Prev["interfaces"] == nil {
		t.Fatalf("netconf %s: the ipam section or prevResult is not passed on", b)
	}
	b, err = bridgeNetconf("net1", "br0", hostLocalIPAM("/d"), nil)
	if err != nil || strings.Contains(string(b), "prevResult") || !strings.Contains(string(b), `"type":"host-local"`) {
		t.Fatalf("ADD's netconf: %v %s", err, b)
	}
}

func TestBridgeSkip(t *testing.T) {
	found := func(string) (string, error) { return "/usr/sbin/ip", nil }
	missing := func(string) (string, error) { return "", errors.New("not found") }
	const unix = "host=/tmp/pg-run port=5432 user=postgres dbname=postgres sslmode=disable"
	for _, tt := range []struct {
		name       string
		calls      int
		euid       int
		lookPath   func(string) (string, error)
		url        string
		wantReason string // "" runs
	}{
		{"runs as root with ip and the private database", 100, 0, found, unix, ""},
		{"a database URL with a socket directory", 1, 0, found, "postgres://postgres@%2Fvar%2Frun%2Fpostgresql/ipam", ""},
		{"turned off", 0, 0, found, unix, "-shim-bridge-calls 0"},
		{"not root", 100, 1000, found, unix, "need root (euid 1000)"},
		{"no ip", 100, 0, missing, unix, "need ip (iproute2)"},
		{"database over TCP", 100, 0, found, "postgres://u@127.0.0.1:5432/db", "host is 127.0.0.1"},
	} {
		got := bridgeSkip(tt.calls, tt.euid, tt.lookPath, tt.url)
		if (tt.wantReason == "") != (got == "") || !strings.Contains(got, tt.wantReason) {
			t.Errorf("%s: reason %q, want %q", tt.name, got, tt.wantReason)
		}
	}
}

func TestParseConfigShimBridge(t *testing.T) {
	c, err := parseConfig(nil)
	if err != nil || c.ShimBridgeCalls != 100 {
		t.Fatalf("default -shim-bridge-calls: %d %v", c.ShimBridgeCalls, err)
	}
	if c, err := parseConfig([]string{"-shim-bridge-calls", "0"}); err != nil || c.ShimBridgeCalls != 0 {
		t.Fatalf("-shim-bridge-calls 0: %d %v", c.ShimBridgeCalls, err)
	}
	if _, err := parseConfig([]string{"-shim-bridge-calls", "-1"}); err == nil || !strings.Contains(err.Error(), "-shim-bridge-calls must not be negative") {
		t.Fatalf("-shim-bridge-calls -1: %v", err)
	}
}

func TestShimReportResults(t *testing.T) {
	var r shimReport
	r.Sequential.Mode, r.Parallel.Mode = "sequential", "parallel=2"
	if got := r.results(); len(got) != 4 {
		t.Fatalf("results without the bridge mode: %+v", got)
	}
	r.Bridge, r.HostLocal.Bridge = &shimResult{Mode: "bridge", ErrorRate: 0.5}, &shimResult{Mode: "bridge"}
	got := r.results()
	if len(got) != 6 || got[4].ErrorRate != 0.5 {
		t.Fatalf("results with the bridge mode: %+v", got)
	}
}

func TestShimSummary(t *testing.T) {
	r := &shimReport{BridgeSkipped: "-shim-bridge-calls 0", Ratios: []shimRatio{
		ratioOf(shimResult{Mode: "sequential", PairP50ms: 19, PairP99ms: 40}, shimResult{PairP50ms: 3.8, PairP99ms: 8}),
		ratioOf(shimResult{Mode: "bridge", PairP50ms: 39, PairP99ms: 90}, shimResult{PairP50ms: 30, PairP99ms: 60}),
	}}
	var out strings.Builder
	printShimSummary(&out, r)
	want := "shim sequential  pair ms p50/p99: host-local 3.80/8.00 shim 19.00/40.00 ratio 5.00/5.00 (target p50<=1.3) over\n" +
		"shim bridge      pair ms p50/p99: host-local 30.00/60.00 shim 39.00/90.00 ratio 1.30/1.50 (target p50<=1.3) ok\n" +
		"shim bridge: skipped: -shim-bridge-calls 0\n"
	if out.String() != want {
		t.Fatalf("summary\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	printShimSummary(&out, nil)
	if out.Len() != 0 {
		t.Fatalf("summary without the phase: %q", out.String())
	}
}
