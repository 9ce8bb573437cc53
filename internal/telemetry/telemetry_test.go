// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package telemetry

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// scrape answers GET /metrics of m.
func scrape(t *testing.T, m *Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func TestExport(t *testing.T) {
	m, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown(t.Context()) })
	c, err := m.Meter().Int64Counter("ipam.test.things", metric.WithUnit("{thing}"), metric.WithDescription("Things counted."))
	if err != nil {
		t.Fatal(err)
	}
	c.Add(t.Context(), 2, metric.WithAttributes(attribute.String("kind", "a")))
	c.Add(t.Context(), 1, metric.WithAttributes(attribute.String("kind", "a")))
	h, err := m.Meter().Float64Histogram("ipam.test.duration", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.1, 1))
	if err != nil {
		t.Fatal(err)
	}
	h.Record(t.Context(), 0.5)

	got := scrape(t, m)
	for _, want := range []string{
		"# HELP ipam_test_things_total Things counted.\n",
		"# TYPE ipam_test_things_total counter\n",
		"ipam_test_things_total{kind=\"a\"} 3\n",
		"ipam_test_duration_seconds_bucket{le=\"0.1\"} 0\n",
		"ipam_test_duration_seconds_bucket{le=\"1\"} 1\n",
		"ipam_test_duration_seconds_count 1\n",
		"go_goroutines ",
		"process_start_time_seconds ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("scrape lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"target_info", "otel_scope_"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("scrape has %s:\n%s", unwanted, got)
		}
	}

	if err := m.Shutdown(t.Context()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := m.Shutdown(t.Context()); err == nil {
		t.Error("second shutdown answered no error")
	}
	c.Add(t.Context(), 1) // dropped, without a panic
	if got := scrape(t, m); strings.Contains(got, "ipam_test_things_total") {
		t.Errorf("series exported after shutdown:\n%s", got)
	}
}

// Two providers share nothing, and neither touches the global registry.
func TestNoGlobalState(t *testing.T) {
	a, err := New()
	if err != nil {
		t.Fatal(err)
	}
	b, err := New()
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.Meter().Int64Counter("ipam.test.only_in_a")
	if err != nil {
		t.Fatal(err)
	}
	c.Add(t.Context(), 1)
	if !strings.Contains(scrape(t, a), "ipam_test_only_in_a_total 1\n") {
		t.Error("a lacks its own counter")
	}
	if strings.Contains(scrape(t, b), "ipam_test_only_in_a") {
		t.Error("b exports a's counter")
	}
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "ipam_") {
			t.Errorf("the default registry has %s", f.GetName())
		}
	}
}
