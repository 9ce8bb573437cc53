// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ipam-dev/ipam/internal/store"
)

// usageForecastWindow is the window of the exhaustion forecast the metrics
// export: the capacity endpoint's default.
const usageForecastWindow = time.Hour

// usageReports caches the last usage report so that a scrape reads the
// database at most once per refresh, whatever the number of scrapers and
// of meters whose callbacks read it.
type usageReports struct {
	read    func(context.Context, time.Duration) (store.UsageReport, error)
	refresh time.Duration
	timeout time.Duration
	log     *slog.Logger
	now     func() time.Time
	// crdNeeded answers a crd-mode node's need as the Cilium operator
	// computed it in its last round (nil: the role is off).
	crdNeeded func(space, node string) (int64, bool)

	mu     sync.Mutex
	last   store.UsageReport
	at     time.Time // of last; zero before the first good read
	failed time.Time // of the last failed read, not retried before refresh
}

// get answers the cached report when it is younger than refresh, else
// reads a new one. ok is false when no report could be read: the usage
// series are then absent from the scrape (an alert on their absence
// fires), rather than frozen at stale values.
func (u *usageReports) get(ctx context.Context) (r store.UsageReport, ok bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := u.now()
	if !u.at.IsZero() && now.Sub(u.at) < u.refresh {
		return u.last, true
	}
	if !u.failed.IsZero() && now.Sub(u.failed) < u.refresh {
		return store.UsageReport{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	r, err := u.read(ctx, usageForecastWindow)
	if err != nil {
		u.failed, u.at = now, time.Time{}
		u.log.Warn("usage metrics: reading the usage report failed; the usage series are left out until it succeeds", "err", err)
		return store.UsageReport{}, false
	}
	u.last, u.at, u.failed = r, now, time.Time{}
	return r, true
}

// observeUsage exports the usage report: on the Cilium meter, the
// operator's per-node gauges ipam_available_ips, ipam_used_ips and
// ipam_needed_ips (label target_node, plus space) and ipam_nodes{category};
// on the service's meter, per pool and family, addresses by state, blocks,
// nodes by category and the exhaustion forecast. The labels are spaces,
// nodes, pools and families: bounded by the cluster's size, never per Pod.
func observeUsage(cilium, meter metric.Meter, reports *usageReports) error {
	var err, e error
	gauge := func(m metric.Meter, name, unit, desc string) metric.Int64ObservableGauge {
		var g metric.Int64ObservableGauge
		g, e = m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		err = errors.Join(err, e)
		return g
	}
	available := gauge(cilium, "ipam_available_ips", "", "Addresses a node holds: the leasable addresses of its blocks (Cilium operator: ipam_available_ips).")
	used := gauge(cilium, "ipam_used_ips", "", "Addresses of a node's blocks that are not free: leased, pending, reserved for Cilium's agent (crd mode), or released and cooling (Cilium operator: ipam_used_ips).")
	needed := gauge(cilium, "ipam_needed_ips", "", "Addresses a node lacks to meet its pools' need, neededIPCeil(demand, preAllocate) (Cilium operator: ipam_needed_ips).")
	nodes := gauge(cilium, "ipam_nodes", "", "Nodes by category: total, in-deficit (below their need), at-capacity (no free address in some pool family they hold blocks of).")
	lbConflicting := gauge(cilium, "lbipam_conflicting_pools", "", "VIP pools marked conflicting (a block overlaps an older pool's), per space (Cilium: lbipam_conflicting_pools).")
	lbAvailable := gauge(cilium, "lbipam_ips_available", "", "Addresses a VIP pool may still give, per pool (Cilium: lbipam_ips_available).")
	lbUsed := gauge(cilium, "lbipam_ips_used", "", "Addresses given from a VIP pool and held, per pool (Cilium: lbipam_ips_used).")
	lbMatching := gauge(cilium, "lbipam_services_matching", "", "VIP owners (Services) served, per space (Cilium: lbipam_services_matching).")
	lbUnsatisfied := gauge(cilium, "lbipam_services_unsatisfied", "", "VIP owners whose last request was not satisfied (no pool, out of addresses, stranded...), per space (Cilium: lbipam_services_unsatisfied).")

	poolAddresses := gauge(meter, "ipam.pool.addresses", "{address}", "A pool family's addresses in carved blocks by state: leased (pending and active), cooling, free.")
	poolBlocks := gauge(meter, "ipam.pool.blocks", "{block}", "A pool family's blocks: carved, and free (can still be carved, outside reserved ranges).")
	poolNodes := gauge(meter, "ipam.pool.nodes", "{node}", "Nodes of a pool family: with-blocks, at-capacity, in-deficit.")
	var hours, rate metric.Float64ObservableGauge
	hours, e = meter.Float64ObservableGauge("ipam.pool.exhaustion.forecast", metric.WithUnit("h"),
		metric.WithDescription("Hours until a pool family is full at its net growth over the last hour; absent when it is not growing or has too few samples."))
	err = errors.Join(err, e)
	rate, e = meter.Float64ObservableGauge("ipam.pool.growth", metric.WithUnit("{address}/h"),
		metric.WithDescription("A pool family's net growth of used addresses per hour over the last hour (least squares over the usage samples)."))
	err = errors.Join(err, e)
	if err != nil {
		return fmt.Errorf("usage metrics: %w", err)
	}

	total, inDeficit, atCapacity := categorySet("total"), categorySet("in-deficit"), categorySet("at-capacity")
	if _, err := cilium.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		r, ok := reports.get(ctx)
		if !ok {
			return nil
		}
		var deficit, full int64
		for _, n := range r.Nodes {
			if n.CiliumPool > 0 {
				n = crdTerms(n, reports.crdNeeded)
			}
			attrs := metric.WithAttributeSet(attribute.NewSet(attribute.String("space", n.Space), attribute.String("target_node", n.Node)))
			o.ObserveInt64(available, n.Available, attrs)
			o.ObserveInt64(used, n.Used, attrs)
			o.ObserveInt64(needed, n.Needed, attrs)
			if n.InDeficit {
				deficit++
			}
			if n.AtCapacity {
				full++
			}
		}
		o.ObserveInt64(nodes, int64(len(r.Nodes)), total)
		o.ObserveInt64(nodes, deficit, inDeficit)
		o.ObserveInt64(nodes, full, atCapacity)
		observeLB(o, r, lbConflicting, lbAvailable, lbUsed, lbMatching, lbUnsatisfied)
		return nil
	}, available, used, needed, nodes, lbConflicting, lbAvailable, lbUsed, lbMatching, lbUnsatisfied); err != nil {
		return fmt.Errorf("usage metrics: %w", err)
	}

	_, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		r, ok := reports.get(ctx)
		if !ok {
			return nil
		}
		for _, p := range r.Pools {
			base := []attribute.KeyValue{attribute.String("space", p.Space), attribute.String("pool", p.Pool), attribute.String("family", p.Family.String())}
			with := func(k, v string) metric.MeasurementOption {
				return metric.WithAttributeSet(attribute.NewSet(append(base[:len(base):len(base)], attribute.String(k, v))...))
			}
			o.ObserveInt64(poolAddresses, p.Leased, with("state", "leased"))
			o.ObserveInt64(poolAddresses, p.Cooling, with("state", "cooling"))
			o.ObserveInt64(poolAddresses, p.Free(), with("state", "free"))
			o.ObserveInt64(poolBlocks, p.BlocksCarved, with("state", "carved"))
			o.ObserveInt64(poolBlocks, p.FreeBlocks, with("state", "free"))
			o.ObserveInt64(poolNodes, p.NodesWithBlocks, with("category", "with-blocks"))
			o.ObserveInt64(poolNodes, p.NodesAtCapacity, with("category", "at-capacity"))
			o.ObserveInt64(poolNodes, p.NodesInDeficit, with("category", "in-deficit"))
			attrs := metric.WithAttributeSet(attribute.NewSet(base...))
			o.ObserveFloat64(rate, p.Forecast.RatePerHour, attrs)
			if p.Forecast.HoursToFull != nil {
				o.ObserveFloat64(hours, *p.Forecast.HoursToFull, attrs)
			}
		}
		return nil
	}, poolAddresses, poolBlocks, poolNodes, hours, rate)
	if err != nil {
		return fmt.Errorf("usage metrics: %w", err)
	}
	return nil
}

// observeLB exports the VIP pools and owners of r in Cilium's LB IPAM
// names, with a space label: every space that has VIP pools or owners
// reports its conflicting pools and owners, 0 included.
func observeLB(o metric.Observer, r store.UsageReport, conflicting, available, used, matching, unsatisfied metric.Int64Observable) {
	conflicts := map[string]int64{}
	for _, p := range r.LBPools {
		attrs := metric.WithAttributeSet(attribute.NewSet(attribute.String("space", p.Space), attribute.String("pool", p.Pool)))
		o.ObserveInt64(available, p.Available, attrs)
		o.ObserveInt64(used, p.Used, attrs)
		if p.Conflicting {
			conflicts[p.Space]++
		} else {
			conflicts[p.Space] += 0
		}
	}
	for space, n := range conflicts {
		o.ObserveInt64(conflicting, n, metric.WithAttributeSet(attribute.NewSet(attribute.String("space", space))))
	}
	for _, w := range r.LBOwners {
		attrs := metric.WithAttributeSet(attribute.NewSet(attribute.String("space", w.Space)))
		o.ObserveInt64(matching, w.Matching, attrs)
		o.ObserveInt64(unsatisfied, w.Unsatisfied, attrs)
	}
}

// crdTerms restates a node served in Cilium's crd mode as Cilium's operator
// reports such a node: available is the addresses of its CiliumNode's
// pool, used those Pods use, needed what the operator computed from the
// node's watermarks in its last round (known to the leading replica
// only; 0 elsewhere), in deficit when that is above 0.
func crdTerms(n store.NodeTotals, needed func(space, node string) (int64, bool)) store.NodeTotals {
	n.Available, n.Used, n.Needed = n.CiliumPool, n.CiliumUsed, 0
	if needed != nil {
		if v, ok := needed(n.Space, n.Node); ok {
			n.Needed = v
		}
	}
	n.InDeficit = n.Needed > 0
	return n
}

func categorySet(c string) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("category", c)))
}
