// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestFloorPhase runs the floor with a few clients: every call answered,
// figures read, the line printed.
func TestFloorPhase(t *testing.T) {
	p, err := newBenchPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	b := &bench{cfg: config{Concurrency: []int{2}}, out: &out, pki: p}
	fr, err := b.floorPhase(context.Background(), 2, []string{"node-a", "node-b", "node-c"}, 2, 300*time.Millisecond, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if fr.Errors != 0 || fr.OpsPerSec <= 0 || fr.CPUPerOpUS <= 0 || fr.Nodes != 3 || fr.DelayMS != 1 || len(b.failed) != 0 {
		t.Fatalf("floor %+v, failed %v", fr, b.failed)
	}
	if !strings.HasPrefix(out.String(), "floor clients=2 nodes=3 delay_ms=1.00 ") {
		t.Fatalf("printed %q", out.String())
	}
}

// TestFloorServerRefuses: the floor server decodes what it is sent and
// asks for a client certificate, as the service does.
func TestFloorServerRefuses(t *testing.T) {
	p, err := newBenchPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	url, stop, err := startFloorServer(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	hc, err := p.nodeClient("default", "node-a", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{`{"containerID":""}`, `{"containerID":"c","unknown":1}`, `not json`} {
		res, err := hc.Post(url+"/v1/nodes/node-a/leases", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d", body, res.StatusCode)
		}
	}
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.roots}}}
	if res, err := anon.Get(url + "/v1/nodes/node-a/blocks"); err == nil {
		res.Body.Close()
		t.Fatalf("a client without a certificate got status %d", res.StatusCode)
	}
}
