// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestShimTimesResult(t *testing.T) {
	var all shimTimes
	for w := range 2 {
		var part shimTimes
		for i := 1; i <= 50; i++ {
			d := time.Duration(w*50+i) * time.Millisecond
			part.adds, part.dels, part.pairs = append(part.adds, d), append(part.dels, 2*d), append(part.pairs, 3*d)
			part.calls += 2
		}
		part.calls += 2
		part.errors++
		part.samples = []string{"a", "b", "c"}
		all.add(part)
	}
	r := all.result("parallel=2", 2, 102, time.Second)
	if r.Calls != 204 || r.Errors != 2 || len(r.ErrorSamples) != maxSamplesPerRun {
		t.Fatalf("calls %d errors %d samples %d", r.Calls, r.Errors, len(r.ErrorSamples))
	}
	if want := 2.0 / 204; r.ErrorRate != want {
		t.Fatalf("error rate %v, want %v", r.ErrorRate, want)
	}
	if r.AddP50ms != 50 || r.AddP99ms != 99 || r.DelP50ms != 100 || r.DelP99ms != 198 || r.PairP50ms != 150 || r.PairP99ms != 297 {
		t.Fatalf("percentiles %+v", r)
	}
	line := shimLine("shim", r)
	for _, want := range []string{"shim parallel=2 ", "add_p50_ms=50.00", "pair_p99_ms=297.00", "errors=2"} {
		if !strings.Contains(line, want) {
			t.Fatalf("line %q lacks %q", line, want)
		}
	}
}

func TestShimNetconf(t *testing.T) {
	b, err := shimNetconf("https://127.0.0.1:1", "/certs", "s1", json.RawMessage(`{"cniVersion":"1.1.0","ips":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		CNIVersion string            `json:"cniVersion"`
		IPAM       map[string]string `json:"ipam"`
		Prev       map[string]any    `json:"prevResult"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.CNIVersion != "1.1.0" || m.IPAM["type"] != "ipam-shim" || m.IPAM["server"] != "https://127.0.0.1:1" ||
		m.IPAM["caFile"] != "/certs/ca.crt" || m.IPAM["certFile"] != "/certs/node.crt" || m.IPAM["keyFile"] != "/certs/node.key" ||
		m.IPAM["node"] != shimNode || m.IPAM["pool"] != "default" || m.IPAM["space"] != "s1" || m.IPAM["dataDir"] != "/certs/shim-reserve" || m.Prev["cniVersion"] != "1.1.0" {
		t.Fatalf("netconf %s", b)
	}
	b, err = shimNetconf("https://x", "/c", "s", nil)
	if err != nil || strings.Contains(string(b), "prevResult") {
		t.Fatalf("netconf without prev: %v %s", err, b)
	}
}

func TestShimRatio(t *testing.T) {
	r := ratioOf(shimResult{Mode: "sequential", PairP50ms: 39, PairP99ms: 90}, shimResult{PairP50ms: 30, PairP99ms: 60})
	if r.P50 != 1.3 || r.P99 != 1.5 || r.Limit != shimRatioLimit || r.ShimP50ms != 39 || r.ShimP99ms != 90 || r.HostLocalP50ms != 30 || r.HostLocalP99ms != 60 {
		t.Fatalf("ratio %+v", r)
	}
	if line := r.line(); line != "shim/host-local sequential pair_p50_ratio=1.30 pair_p99_ratio=1.50 target<=1.3 ok" {
		t.Fatalf("line %q", line)
	}
	if line := ratioOf(shimResult{Mode: "m", PairP50ms: 40}, shimResult{PairP50ms: 30}).line(); !strings.HasSuffix(line, " over") {
		t.Fatalf("line %q, want over", line)
	}
	if r := ratioOf(shimResult{PairP50ms: 40}, shimResult{}); r.P50 != 0 || !strings.HasSuffix(r.line(), " no figures") {
		t.Fatalf("no host-local figures: %+v", r)
	}
}

func TestHostLocalNetconf(t *testing.T) {
	b, err := hostLocalNetconf("/d", json.RawMessage(`{"cniVersion":"1.1.0"}`))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		IPAM struct {
			Type    string                `json:"type"`
			Ranges  [][]map[string]string `json:"ranges"`
			DataDir string                `json:"dataDir"`
		} `json:"ipam"`
		Prev map[string]any `json:"prevResult"`
	}
	if err := json.Unmarshal(b, &m); err != nil || m.IPAM.Type != "host-local" || m.IPAM.DataDir != "/d" ||
		m.IPAM.Ranges[0][0]["subnet"] != "10.250.0.0/16" || m.Prev == nil {
		t.Fatalf("netconf %s: %v", b, err)
	}
}
