// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/telemetry"
)

// scrape answers the metrics handler's exposition text.
func (e *env) scrape() string {
	e.t.Helper()
	rec := httptest.NewRecorder()
	e.metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		e.t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// sample answers the value of one series (name and labels exactly as
// exported, labels in name order), and whether it is there.
func sample(exposition, series string) (string, bool) {
	for line := range strings.Lines(exposition) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, nil)
	// One /30 block with the router reserved: one leasable address.
	e.mustDo(201, "POST", "/v1/pools", map[string]any{
		"name": "default",
		"spec": map[string]any{
			"ipv4":      map[string]any{"cidrs": []string{"10.9.0.0/30"}, "maskSize": 30},
			"nodeLocal": map[string]any{"health": false},
		},
	}, nil)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p1"), nil) // created
	e.mustDo(200, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p1"), nil) // retry
	e.mustDo(409, "POST", "/v1/nodes/n1/leases", lease("c2", "eth0", "p2"), nil) // exhausted
	e.mustDo(409, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p9"), nil) // conflict
	e.mustDo(400, "POST", "/v1/nodes/n1/leases", lease("c3", "", "p3"), nil)     // error
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/c1/eth0", nil, nil)        // one lease
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/c1/eth0", nil, nil)        // nothing held
	e.mustDo(404, "GET", "/v1/no/such/route", nil, nil)
	e.mustDo(405, "PATCH", "/v1/pools/default", nil, nil)
	e.mustDo(405, "BREW", "/v1/pools", nil, nil)

	got := e.scrape()
	const dur = "ipam_http_server_request_duration_seconds"
	for series, want := range map[string]string{
		`ipam_lease_allocations_total{result="created"}`:   "1",
		`ipam_lease_allocations_total{result="retry"}`:     "1",
		`ipam_lease_allocations_total{result="exhausted"}`: "1",
		`ipam_lease_allocations_total{result="conflict"}`:  "1",
		`ipam_lease_allocations_total{result="error"}`:     "1",
		`ipam_lease_releases_total`:                        "1",

		dur + `_count{method="POST",route="/v1/pools",status_code="201"}`:                                                "1",
		dur + `_count{method="POST",route="/v1/nodes/{node}/leases",status_code="201"}`:                                  "1",
		dur + `_count{method="POST",route="/v1/nodes/{node}/leases",status_code="200"}`:                                  "1",
		dur + `_count{method="POST",route="/v1/nodes/{node}/leases",status_code="409"}`:                                  "2",
		dur + `_count{method="POST",route="/v1/nodes/{node}/leases",status_code="400"}`:                                  "1",
		dur + `_count{method="DELETE",route="/v1/nodes/{node}/attachments/{containerID}/{interface}",status_code="204"}`: "2",
		dur + `_count{method="GET",route="unmatched",status_code="404"}`:                                                 "1",
		dur + `_count{method="PATCH",route="unmatched",status_code="405"}`:                                               "1",
		dur + `_count{method="_OTHER",route="unmatched",status_code="405"}`:                                              "1",
		dur + `_bucket{method="POST",route="/v1/nodes/{node}/leases",status_code="409",le="+Inf"}`:                       "2",
	} {
		if v, ok := sample(got, series); !ok || v != want {
			t.Errorf("%s = %q (present %v), want %s", series, v, ok, want)
		}
	}
	for line := range strings.Lines(got) {
		if strings.Contains(line, `route="/v1/nodes/n1`) || strings.Contains(line, "/v1/no/such") || strings.Contains(line, "BREW") {
			t.Errorf("a raw path or method became a label: %s", line)
		}
	}
	if t.Failed() {
		t.Logf("exposition:\n%s", got)
	}
}

func TestAllocationResultOf(t *testing.T) {
	for _, tc := range []struct {
		a    alloc.Allocation
		err  error
		want allocationResult
	}{
		{alloc.Allocation{Created: true}, nil, resultCreated},
		{alloc.Allocation{}, nil, resultRetry},
		{alloc.Allocation{}, alloc.Exhausted("default", alloc.IPv4), resultExhausted},
		{alloc.Allocation{}, &alloc.Error{Kind: alloc.KindLeaseConflict}, resultConflict},
		{alloc.Allocation{}, &alloc.Error{Kind: alloc.KindPoolMatch}, resultPoolMatch},
		{alloc.Allocation{}, alloc.Invalid("interface", "is required"), resultError},
		{alloc.Allocation{}, alloc.NotFound("node", "node", "n1"), resultError},
		{alloc.Allocation{}, errors.New("connection refused"), resultError},
	} {
		if got := allocationResultOf(tc.a, tc.err); got != tc.want {
			t.Errorf("allocationResultOf(%+v, %v) = %s, want %s", tc.a, tc.err,
				allocationResultNames[got], allocationResultNames[tc.want])
		}
	}
}

// Recording a request of a series seen before allocates nothing.
func TestObserveRequestAllocs(t *testing.T) {
	tm, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(tm.Meter())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	m.observeRequest(ctx, "POST", "/v1/nodes/{node}/leases", 201, time.Millisecond)
	if n := testing.AllocsPerRun(100, func() {
		m.observeRequest(ctx, "POST", "/v1/nodes/{node}/leases", 201, time.Millisecond)
	}); n != 0 {
		t.Errorf("%v allocations per request", n)
	}
}

// BenchmarkObserveRequest is what metrics add to each request; every
// goroutine records into one series, the worst case for contention.
func BenchmarkObserveRequest(b *testing.B) {
	tm, err := telemetry.New()
	if err != nil {
		b.Fatal(err)
	}
	m, err := newMetrics(tm.Meter())
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.observeRequest(ctx, "POST", "/v1/nodes/{node}/leases", 201, time.Millisecond)
		}
	})
}
