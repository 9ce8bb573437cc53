// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/telemetry"
)

// call sends a request with an optional JSON body and answers the status
// and body.
func call(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// mustCall is call that fails the test unless the status is want.
func mustCall(t *testing.T, want int, method, url, body string) string {
	t.Helper()
	status, b := call(t, method, url, body)
	if status != want {
		t.Fatalf("%s %s: %d, want %d: %s", method, url, status, want, b)
	}
	return b
}

// sample answers the value of one series (labels in name order, as
// exported) and whether it is there.
func sample(exposition, series string) (string, bool) {
	for line := range strings.Lines(exposition) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// The server exposes its metrics at GET /metrics on the API's listener:
// lease outcomes, request durations by route pattern, the GC counters and
// the connection pool.
func TestMetricsEndpoint(t *testing.T) {
	base := startServer(t, pgtest.NewDatabase(t))
	// One /30 block with the router reserved: one leasable address.
	mustCall(t, 201, "POST", base+"/v1/pools",
		`{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/30"],"maskSize":30},"nodeLocal":{"health":false}}}`)
	c1 := `{"containerID":"c1","interface":"eth0","owner":{"namespace":"ns","name":"p1"}}`
	mustCall(t, 201, "POST", base+"/v1/nodes/n1/leases", c1) // created
	mustCall(t, 200, "POST", base+"/v1/nodes/n1/leases", c1) // retry
	mustCall(t, 409, "POST", base+"/v1/nodes/n1/leases",     // exhausted
		`{"containerID":"c2","interface":"eth0","owner":{"namespace":"ns","name":"p2"}}`)
	mustCall(t, 204, "DELETE", base+"/v1/nodes/n1/attachments/c1/eth0", "")
	mustCall(t, 404, "GET", base+"/v1/nodes/n1/attachments/c1/eth0/nope", "")
	// /metrics answers only GET and HEAD; anything else is the API's 404.
	if status, body := call(t, "POST", base+"/metrics", "{}"); status != 404 || !strings.Contains(body, "urn:ipam:problem:not-found") {
		t.Errorf("POST /metrics: %d %s", status, body)
	}
	mustCall(t, 200, "HEAD", base+"/metrics", "")

	got := mustCall(t, 200, "GET", base+"/metrics", "")
	const dur = "ipam_http_server_request_duration_seconds"
	for series, want := range map[string]string{
		`ipam_lease_allocations_total{result="created"}`:                                                                 "1",
		`ipam_lease_allocations_total{result="retry"}`:                                                                   "1",
		`ipam_lease_allocations_total{result="exhausted"}`:                                                               "1",
		`ipam_lease_allocations_total{result="conflict"}`:                                                                "0",
		`ipam_lease_allocations_total{result="pool-match"}`:                                                              "0",
		`ipam_lease_allocations_total{result="error"}`:                                                                   "0",
		`ipam_lease_releases_total`:                                                                                      "1",
		dur + `_count{method="POST",route="/v1/nodes/{node}/leases",status_code="201"}`:                                  "1",
		dur + `_count{method="POST",route="/v1/nodes/{node}/leases",status_code="200"}`:                                  "1",
		dur + `_count{method="POST",route="/v1/nodes/{node}/leases",status_code="409"}`:                                  "1",
		dur + `_count{method="DELETE",route="/v1/nodes/{node}/attachments/{containerID}/{interface}",status_code="204"}`: "1",
		dur + `_count{method="GET",route="unmatched",status_code="404"}`:                                                 "1",
		dur + `_count{method="POST",route="unmatched",status_code="404"}`:                                                "1",
		`ipam_gc_expired_total`: "0",
		`ipam_gc_purged_total`:  "0",
		`ipam_gc_errors_total`:  "0",
	} {
		if v, ok := sample(got, series); !ok || v != want {
			t.Errorf("%s = %q (present %v), want %s", series, v, ok, want)
		}
	}
	// The pool has at least one open connection and a limit.
	for _, series := range []string{"ipam_db_pool_connections", "ipam_db_pool_max_connections"} {
		if v, ok := sample(got, series); !ok || v == "0" {
			t.Errorf("%s = %q (present %v), want > 0", series, v, ok)
		}
	}
	// A test database has no standby: the service says its commits do
	// not wait for one.
	for series, want := range map[string]string{`ipam_db_standbys`: "0", `ipam_db_sync_standbys`: "0"} {
		if v, ok := sample(got, series); !ok || v != want {
			t.Errorf("%s = %q (present %v), want %s", series, v, ok, want)
		}
	}
	if !strings.Contains(got, "\nipam_db_synchronous{") || !regexp.MustCompile(`\nipam_db_synchronous\{[^}]*synchronous_commit="[a-z_]+"[^}]*\} 0\n`).MatchString(got) {
		t.Errorf("ipam_db_synchronous is not 0 with the synchronous_commit label")
	}
	for _, series := range []string{"ipam_db_pool_acquired_connections", "ipam_db_pool_idle_connections",
		"ipam_db_pool_empty_acquires_total", "ipam_db_pool_acquire_wait_seconds_total"} {
		if _, ok := sample(got, series); !ok {
			t.Errorf("%s is missing", series)
		}
	}
	for line := range strings.Lines(got) {
		if strings.Contains(line, "/v1/nodes/n1") || strings.Contains(line, `route="/metrics"`) {
			t.Errorf("a raw path or the scrape became a label: %s", line)
		}
	}
	if t.Failed() {
		t.Logf("exposition:\n%s", got)
	}
}

// An unconfirmed lease expires and, with no cooldown, is purged: the GC
// counts both.
func TestMetricsGC(t *testing.T) {
	base := startServer(t, pgtest.NewDatabase(t), "--lease-expiry", "100ms", "--cooldown", "0s", "--gc-interval", "20ms")
	mustCall(t, 201, "POST", base+"/v1/pools",
		`{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/24"],"maskSize":26}}}`)
	mustCall(t, 201, "POST", base+"/v1/nodes/n1/leases",
		`{"containerID":"c1","interface":"eth0","owner":{"namespace":"ns","name":"p1"}}`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := mustCall(t, 200, "GET", base+"/metrics", "")
		expired, _ := sample(got, "ipam_gc_expired_total")
		purged, _ := sample(got, "ipam_gc_purged_total")
		errs, _ := sample(got, "ipam_gc_errors_total")
		if errs != "0" {
			t.Fatalf("ipam_gc_errors_total = %q", errs)
		}
		if expired == "1" && purged == "1" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20s: expired %q, purged %q, want 1 and 1", expired, purged)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A GC pass that fails is counted: here the store's pool is closed.
func TestMetricsGCErrors(t *testing.T) {
	st, err := store.Open(t.Context(), pgtest.NewDatabase(t), store.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	metrics, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	m, err := newGCMetrics(metrics.Meter())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		runGC(ctx, st, time.Millisecond, time.Minute, slog.New(slog.DiscardHandler), m)
	}()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec := httptest.NewRecorder()
		metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		v, _ := sample(rec.Body.String(), "ipam_gc_errors_total")
		if n, _ := strconv.Atoi(v); n >= 2 { // one expire and one purge pass at least
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ipam_gc_errors_total = %q after 10s", v)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
