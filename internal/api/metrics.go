// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// unmatchedRoute is the route label of a request that matched no route:
// 404s, 405s and bodies refused before routing. Raw paths are never labels,
// so the number of series stays bounded whatever clients send.
const unmatchedRoute = "unmatched"

// otherMethod is the method label of a request whose method is not a
// standard one (OpenTelemetry's convention), for the same reason.
const otherMethod = "_OTHER"

// durationBuckets are the bucket bounds of the request duration in seconds:
// an allocation is one short transaction (docs/performance.md has its
// latencies), so the buckets start well below a millisecond.
var durationBuckets = []float64{0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// metrics are the API's instruments. Every attribute set is built once:
// recording costs a lookup and the instrument's own work.
type metrics struct {
	duration metric.Float64Histogram

	// mu serializes writers of routes; readers load it without a lock
	// (copy on write: a published map is never modified).
	mu     sync.Mutex
	routes atomic.Pointer[map[routeKey][]metric.RecordOption]

	allocations metric.Int64Counter
	byResult    [numAllocationResults][]metric.AddOption
	releases    metric.Int64Counter

	cilium *ciliumMetrics // nil without a Cilium meter
}

// routeKey is one series of the request duration.
type routeKey struct {
	method, route string
	status        int
}

// allocationResult is the outcome of one AllocateLease call, the result
// label of ipam_lease_allocations_total.
type allocationResult int

const (
	resultCreated   allocationResult = iota // 201: new leases
	resultRetry                             // 200: the attachment's existing leases
	resultExhausted                         // pool-exhausted
	resultConflict                          // lease-conflict: the key is held otherwise
	resultPoolMatch                         // pool-match: no pool, or several, for the Pod
	resultError                             // anything else: invalid input, not found, internal
	numAllocationResults
)

var allocationResultNames = [numAllocationResults]string{"created", "retry", "exhausted", "conflict", "pool-match", "error"}

// allocationResultOf classifies the outcome of LeaseStore.Allocate (or of the
// validation before it).
func allocationResultOf(a alloc.Allocation, err error) allocationResult {
	var ae *alloc.Error
	switch {
	case err == nil && a.Created:
		return resultCreated
	case err == nil:
		return resultRetry
	case errors.As(err, &ae) && ae.Kind == alloc.KindPoolExhausted:
		return resultExhausted
	case errors.As(err, &ae) && ae.Kind == alloc.KindLeaseConflict:
		return resultConflict
	case errors.As(err, &ae) && ae.Kind == alloc.KindPoolMatch:
		return resultPoolMatch
	}
	return resultError
}

// newMetrics makes the API's instruments on meter; the lease counters
// start at 0 for every label set, so that rates exist before the first
// event. The error is a programming error (an invalid instrument name).
func newMetrics(meter metric.Meter) (*metrics, error) {
	m := &metrics{}
	var err, e error
	m.duration, e = meter.Float64Histogram("ipam.http.server.request.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of HTTP requests to the API by method, route pattern and status code."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	err = errors.Join(err, e)
	m.allocations, e = meter.Int64Counter("ipam.lease.allocations",
		metric.WithUnit("{allocation}"),
		metric.WithDescription("Lease allocation requests by result: created, retry (the attachment's existing leases), exhausted, conflict, pool-match (pools conflict: several match the Pod, or none and one is required) or error."))
	err = errors.Join(err, e)
	m.releases, e = meter.Int64Counter("ipam.lease.releases",
		metric.WithUnit("{lease}"),
		metric.WithDescription("Leases released through the API (attachment, address and reconcile releases); one per address, so a dual-stack attachment counts two."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("api: metrics: %w", err)
	}
	m.routes.Store(&map[routeKey][]metric.RecordOption{})
	ctx := context.Background()
	for r, name := range allocationResultNames {
		m.byResult[r] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("result", name)))}
		m.allocations.Add(ctx, 0, m.byResult[r]...)
	}
	m.releases.Add(ctx, 0)
	return m, nil
}

// observeRequest records one request's duration. route is the chi route
// pattern, "" when none matched.
func (m *metrics) observeRequest(ctx context.Context, method, route string, status int, d time.Duration) {
	k := routeKey{method: methodLabel(method), route: route, status: status}
	if k.route == "" {
		k.route = unmatchedRoute
	}
	opts, ok := (*m.routes.Load())[k]
	if !ok {
		opts = m.addRoute(k)
	}
	m.duration.Record(ctx, d.Seconds(), opts...)
	if m.cilium != nil {
		m.cilium.observe(ctx, method, route, status, d)
	}
}

// addRoute publishes the attribute set of a series seen for the first
// time: a copy of the map with k added.
func (m *metrics) addRoute(k routeKey) []metric.RecordOption {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.routes.Load()
	if opts, ok := old[k]; ok {
		return opts
	}
	opts := []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(
		attribute.String("method", k.method),
		attribute.String("route", k.route),
		attribute.Int("status_code", k.status)))}
	routes := maps.Clone(old)
	routes[k] = opts
	m.routes.Store(&routes)
	return opts
}

// methodLabel is the method as a label: a standard method, or otherMethod.
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace:
		return method
	}
	return otherMethod
}

// countAllocation counts one AllocateLease call by its outcome.
func (m *metrics) countAllocation(ctx context.Context, a alloc.Allocation, err error) {
	m.allocations.Add(ctx, 1, m.byResult[allocationResultOf(a, err)]...)
	if m.cilium != nil && err == nil && a.Created {
		m.cilium.allocated(ctx, a.Leases)
	}
}

// countReleases counts released leases; nothing released counts nothing.
func (m *metrics) countReleases(ctx context.Context, released []alloc.Lease) {
	if len(released) > 0 {
		m.releases.Add(ctx, int64(len(released)))
	}
	if m.cilium != nil {
		m.cilium.released(ctx, released)
	}
}
