// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ipam-dev/ipam/internal/store"
)

// withMetrics serves GET and HEAD /metrics from metrics and every other
// request from api, so the scrape shares the API's listener but not its
// routes, middleware or request metrics.
func withMetrics(api, metrics http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
			metrics.ServeHTTP(w, r)
			return
		}
		api.ServeHTTP(w, r)
	})
}

// gcMetrics count the GC loop's work.
type gcMetrics struct {
	expired metric.Int64Counter // pending leases released at expiry
	purged  metric.Int64Counter // cooled addresses made free
	errors  metric.Int64Counter // failed expire or purge passes
}

// newGCMetrics makes the GC counters on meter, each starting at 0.
func newGCMetrics(meter metric.Meter) (gcMetrics, error) {
	var m gcMetrics
	var err, e error
	m.expired, e = meter.Int64Counter("ipam.gc.expired", metric.WithUnit("{lease}"),
		metric.WithDescription("Pending leases the GC released because they expired unconfirmed."))
	err = errors.Join(err, e)
	m.purged, e = meter.Int64Counter("ipam.gc.purged", metric.WithUnit("{lease}"),
		metric.WithDescription("Released leases the GC purged after their cooldown, freeing their addresses."))
	err = errors.Join(err, e)
	m.errors, e = meter.Int64Counter("ipam.gc.errors", metric.WithUnit("{error}"),
		metric.WithDescription("GC passes (expire or purge) that failed; the log says why."))
	err = errors.Join(err, e)
	if err != nil {
		return gcMetrics{}, fmt.Errorf("gc metrics: %w", err)
	}
	ctx := context.Background()
	for _, c := range []metric.Int64Counter{m.expired, m.purged, m.errors} {
		c.Add(ctx, 0)
	}
	return m, nil
}

// observePool reports the database connection pool at every collection,
// from one stat() call: connections by state (gauges) and the acquires that
// found no idle connection, with their cumulative wait (counters). The
// wait's rate is the mean number of requests queued for a connection; when
// it keeps rising, see --max-conns.
func observePool(meter metric.Meter, stat func() *pgxpool.Stat) (metric.Registration, error) {
	gauge := func(name, desc string) (metric.Int64ObservableGauge, error) {
		return meter.Int64ObservableGauge(name, metric.WithUnit("{connection}"), metric.WithDescription(desc))
	}
	var err, e error
	var total, acquired, idle, maxConns metric.Int64ObservableGauge
	total, e = gauge("ipam.db.pool.connections", "Open database connections of the pool: acquired, idle and being opened.")
	err = errors.Join(err, e)
	acquired, e = gauge("ipam.db.pool.acquired_connections", "Database connections in use by a request or the GC.")
	err = errors.Join(err, e)
	idle, e = gauge("ipam.db.pool.idle_connections", "Open database connections that are not in use.")
	err = errors.Join(err, e)
	maxConns, e = gauge("ipam.db.pool.max_connections", "The pool's connection limit (--max-conns).")
	err = errors.Join(err, e)
	emptyAcquires, e := meter.Int64ObservableCounter("ipam.db.pool.empty_acquires", metric.WithUnit("{acquire}"),
		metric.WithDescription("Connection acquires that waited because no idle connection was there (all in use, or none opened yet)."))
	err = errors.Join(err, e)
	wait, e := meter.Float64ObservableCounter("ipam.db.pool.acquire_wait", metric.WithUnit("s"),
		metric.WithDescription("Cumulative time connection acquires waited for a connection to be released or opened."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("pool metrics: %w", err)
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stat()
		o.ObserveInt64(total, int64(s.TotalConns()))
		o.ObserveInt64(acquired, int64(s.AcquiredConns()))
		o.ObserveInt64(idle, int64(s.IdleConns()))
		o.ObserveInt64(maxConns, int64(s.MaxConns()))
		o.ObserveInt64(emptyAcquires, s.EmptyAcquireCount())
		o.ObserveFloat64(wait, s.EmptyAcquireWaitTime().Seconds())
		return nil
	}, total, acquired, idle, maxConns, emptyAcquires, wait)
}

// batchMetrics names the counters of one of the store's batchers.
type batchMetrics struct {
	batches, batched, alone, fallbacks [2]string // name, description
}

// writeBatchMetrics are the write batcher's (--batch-writers): how many
// transactions carried two or more lease and release statements, how many
// statements they carried, how many went alone, and how many ran again
// alone after their batch failed.
var writeBatchMetrics = batchMetrics{
	batches:   [2]string{"ipam.store.write_batches", "Transactions that carried two or more concurrent lease and release statements."},
	batched:   [2]string{"ipam.store.batched_writes", "Lease and release statements that shared a transaction with others."},
	alone:     [2]string{"ipam.store.unbatched_writes", "Lease and release statements sent alone: nothing was queued with them."},
	fallbacks: [2]string{"ipam.store.batch_fallbacks", "Statements that ran again alone because a statement of their batch, or its commit, failed."},
}

// lookupBatchMetrics are the same for the allocations' lookups, which
// concurrent allocations share.
var lookupBatchMetrics = batchMetrics{
	batches:   [2]string{"ipam.store.lookup_batches", "Round trips that carried the lookups of two or more concurrent allocations."},
	batched:   [2]string{"ipam.store.batched_lookups", "Allocation lookups that shared a round trip with others."},
	alone:     [2]string{"ipam.store.unbatched_lookups", "Allocation lookups sent alone: nothing was queued with them."},
	fallbacks: [2]string{"ipam.store.lookup_batch_fallbacks", "Allocation lookups that ran again alone because their batch failed."},
}

// observeBatches exports one of the store's batchers as m names it.
func observeBatches(meter metric.Meter, m batchMetrics, stats func() store.WriteBatchStats) (metric.Registration, error) {
	counter := func(nd [2]string, unit string) (metric.Int64ObservableCounter, error) {
		return meter.Int64ObservableCounter(nd[0], metric.WithUnit(unit), metric.WithDescription(nd[1]))
	}
	var err, e error
	var batches, batched, alone, fallbacks metric.Int64ObservableCounter
	batches, e = counter(m.batches, "{transaction}")
	err = errors.Join(err, e)
	batched, e = counter(m.batched, "{statement}")
	err = errors.Join(err, e)
	alone, e = counter(m.alone, "{statement}")
	err = errors.Join(err, e)
	fallbacks, e = counter(m.fallbacks, "{statement}")
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("batch metrics: %w", err)
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := stats()
		o.ObserveInt64(batches, s.Batches)
		o.ObserveInt64(batched, s.Batched)
		o.ObserveInt64(alone, s.Alone)
		o.ObserveInt64(fallbacks, s.Fallbacks)
		return nil
	}, batches, batched, alone, fallbacks)
}

// observeCarves reports, at every collection, the blocks this replica
// carved and who carved them (one carves() call): ipam.inline_carves
// counts the blocks allocations carved on the lease path (store.Carves);
// ipam.background_carves the blocks the top-up (by="top-up") and the GC's
// Rebalance (by="rebalance") carved ahead of demand.
func observeCarves(meter metric.Meter, carves func() store.Carves) (metric.Registration, error) {
	inline, errInline := meter.Int64ObservableCounter("ipam.inline_carves", metric.WithUnit("{block}"),
		metric.WithDescription("Blocks allocations carved themselves, for a node with no free address left (the top-up fell behind, or is off) or with every free one held by its concurrent allocations."))
	background, errBackground := meter.Int64ObservableCounter("ipam.background_carves", metric.WithUnit("{block}"),
		metric.WithDescription("Blocks carved ahead of demand, by the top-up after allocations or by the GC's pass."))
	if err := errors.Join(errInline, errBackground); err != nil {
		return nil, fmt.Errorf("carve metrics: %w", err)
	}
	topUp := metric.WithAttributes(attribute.String("by", "top-up"))
	rebalance := metric.WithAttributes(attribute.String("by", "rebalance"))
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		c := carves()
		o.ObserveInt64(inline, c.Inline)
		o.ObserveInt64(background, c.TopUp, topUp)
		o.ObserveInt64(background, c.Rebalance, rebalance)
		return nil
	}, inline, background)
}
