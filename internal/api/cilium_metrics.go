// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// ciliumMetrics are the instruments named after Cilium's operator and
// agent metrics, so that dashboards and alerts written for Cilium port by
// changing the prefix. The service plays both parts: it gives addresses
// to Pods (the agent's ipam_events_total) and is where allocations and
// releases are timed and counted (the operator's ipam_ip_allocation_ops,
// ipam_allocation_duration_seconds and their release twins). Cilium labels
// those by subnet_id; here the pool is the subnet.
type ciliumMetrics struct {
	allocationOps, releaseOps metric.Int64Counter
	events                    metric.Int64Counter
	allocationDuration        metric.Float64Histogram
	releaseDuration           metric.Float64Histogram

	pools sync.Map // pool name -> []metric.AddOption (attribute sets built once)
	// events by action and family; durations by release type and status.
	allocateEvents, releaseEvents [2][]metric.AddOption // [0] IPv4, [1] IPv6
	durations                     map[durationKey][]metric.RecordOption
}

type durationKey struct {
	kind    string // "pod" for allocations; attachment, address or reconcile for releases
	success bool
}

// releaseRoutes are the routes that release leases, by the type label of
// ipam_release_duration_seconds.
var releaseRoutes = map[string]string{
	"/v1/nodes/{node}/attachments/{containerID}/{interface}": "attachment",
	"/v1/addresses/{addr}":       "address",
	"/v1/nodes/{node}/reconcile": "reconcile",
}

const leasesRoute = "/v1/nodes/{node}/leases"

// newCiliumMetrics makes the Cilium-named instruments on meter, which must
// export names verbatim (telemetry.Metrics.CiliumMeter).
func newCiliumMetrics(meter metric.Meter) (*ciliumMetrics, error) {
	m := &ciliumMetrics{durations: map[durationKey][]metric.RecordOption{}}
	var err, e error
	m.allocationOps, e = meter.Int64Counter("ipam_ip_allocation_ops",
		metric.WithDescription("Addresses allocated to Pods, by pool (Cilium operator: by subnet_id)."))
	err = errors.Join(err, e)
	m.releaseOps, e = meter.Int64Counter("ipam_ip_release_ops",
		metric.WithDescription("Addresses released, by pool (Cilium operator: by subnet_id)."))
	err = errors.Join(err, e)
	m.events, e = meter.Int64Counter("ipam_events_total",
		metric.WithDescription("IPAM events by action (allocate, release) and family (Cilium agent)."))
	err = errors.Join(err, e)
	m.allocationDuration, e = meter.Float64Histogram("ipam_allocation_duration_seconds",
		metric.WithDescription("Duration of allocation requests by type (pod) and status (success, failure)."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	m.releaseDuration, e = meter.Float64Histogram("ipam_release_duration_seconds",
		metric.WithDescription("Duration of release requests by type (attachment, address, reconcile) and status (success, failure)."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("api: Cilium metrics: %w", err)
	}
	ctx := context.Background()
	for i, fam := range []string{"ipv4", "ipv6"} {
		m.allocateEvents[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String("action", "allocate"), attribute.String("family", fam)))}
		m.releaseEvents[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
			attribute.String("action", "release"), attribute.String("family", fam)))}
		m.events.Add(ctx, 0, m.allocateEvents[i]...)
		m.events.Add(ctx, 0, m.releaseEvents[i]...)
	}
	for _, kind := range []string{"pod", "attachment", "address", "reconcile"} {
		for _, ok := range []bool{true, false} {
			status := "failure"
			if ok {
				status = "success"
			}
			m.durations[durationKey{kind, ok}] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(
				attribute.String("type", kind), attribute.String("status", status)))}
		}
	}
	return m, nil
}

func familyIndex(f alloc.Family) int {
	if f == alloc.IPv6 {
		return 1
	}
	return 0
}

// poolSet answers the attribute set of a pool, built once per pool name.
func (m *ciliumMetrics) poolSet(pool string) []metric.AddOption {
	if v, ok := m.pools.Load(pool); ok {
		return v.([]metric.AddOption)
	}
	v, _ := m.pools.LoadOrStore(pool, []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("pool", pool)))})
	return v.([]metric.AddOption)
}

func (m *ciliumMetrics) allocated(ctx context.Context, leases []alloc.Lease) {
	for _, l := range leases {
		m.allocationOps.Add(ctx, 1, m.poolSet(l.Pool)...)
		m.events.Add(ctx, 1, m.allocateEvents[familyIndex(l.Family)]...)
	}
}

func (m *ciliumMetrics) released(ctx context.Context, leases []alloc.Lease) {
	for _, l := range leases {
		m.releaseOps.Add(ctx, 1, m.poolSet(l.Pool)...)
		m.events.Add(ctx, 1, m.releaseEvents[familyIndex(l.Family)]...)
	}
}

// observe times allocation and release requests by their route; a 2xx is
// a success, anything else a failure.
func (m *ciliumMetrics) observe(ctx context.Context, method, route string, status int, d time.Duration) {
	ok := status >= 200 && status < 300
	switch {
	case method == http.MethodPost && route == leasesRoute:
		m.allocationDuration.Record(ctx, d.Seconds(), m.durations[durationKey{"pod", ok}]...)
	case method == http.MethodDelete || method == http.MethodPost && route == "/v1/nodes/{node}/reconcile":
		if kind, found := releaseRoutes[route]; found {
			m.releaseDuration.Record(ctx, d.Seconds(), m.durations[durationKey{kind, ok}]...)
		}
	}
}
