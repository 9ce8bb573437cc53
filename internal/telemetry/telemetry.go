// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package telemetry builds the service's metrics: an OpenTelemetry
// MeterProvider whose one reader is a Prometheus exporter on a registry of
// its own. Nothing is global: no otel.SetMeterProvider, no Prometheus
// default registry, so tests and several servers in one process each get
// their own series.
//
// Instruments are named in OpenTelemetry form with a unit
// ("ipam.http.server.request.duration", "s") and exported in Prometheus
// form ("ipam_http_server_request_duration_seconds"); counters gain
// "_total".
//
// A second meter, CiliumMeter, carries the metrics named after Cilium's
// operator and agent ("ipam_available_ips", "ipam_ip_allocation_ops",
// "ipam_events_total"): exported verbatim (no unit or counter suffix)
// after a configurable prefix, so dashboards and alerts written for
// "cilium_operator_ipam_available_ips" port by setting the prefix to
// "cilium_operator".
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// ScopeName names the instrumentation scope of the service's meter.
const ScopeName = "github.com/ipam-dev/ipam"

// Metrics is a MeterProvider exported for Prometheus scrapes.
type Metrics struct {
	provider *sdkmetric.MeterProvider
	cilium   *sdkmetric.MeterProvider
	handler  http.Handler
}

// New returns a MeterProvider exported on a new registry, which also
// carries the Go runtime and process collectors (go_*, process_*). The
// export has no target_info series and no otel_scope_* labels: every series
// comes from this one service, and the scrape's job and instance labels say
// which replica.
func New(opts ...Option) (*Metrics, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	ciliumPrefix := cfg.ciliumPrefix
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutTargetInfo(), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	// Cilium's names already end as Prometheus names should
	// (ipam_events_total, ..._duration_seconds), and some of its counters
	// have no _total (ipam_ip_allocation_ops): no suffix is added.
	ciliumExp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutTargetInfo(), otelprom.WithoutScopeInfo(),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithoutSuffixes), otelprom.WithNamespace(ciliumPrefix))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter (Cilium names): %w", err)
	}
	return &Metrics{
		provider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)),
		cilium:   sdkmetric.NewMeterProvider(sdkmetric.WithReader(ciliumExp)),
		handler:  promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
	}, nil
}

// Meter is the service's meter (scope ScopeName). Every call returns the
// same meter, and the same instrument for the same name and options.
func (m *Metrics) Meter() metric.Meter { return m.provider.Meter(ScopeName) }

// Option configures New.
type Option func(*config)

type config struct{ ciliumPrefix string }

// CiliumPrefix goes before the names of CiliumMeter's instruments, joined
// by "_": "cilium_operator" exports ipam_available_ips as
// cilium_operator_ipam_available_ips. Empty (the default) adds nothing.
func CiliumPrefix(prefix string) Option { return func(c *config) { c.ciliumPrefix = prefix } }

// CiliumMeter is the meter of the instruments named after Cilium's
// metrics; they are exported as named, after the prefix.
func (m *Metrics) CiliumMeter() metric.Meter { return m.cilium.Meter(ScopeName) }

// Handler serves the Prometheus text exposition of every instrument: mount
// it at GET /metrics.
func (m *Metrics) Handler() http.Handler { return m.handler }

// Shutdown stops the provider; later measurements are dropped and later
// scrapes answer no OpenTelemetry series. It is safe to call more than
// once (the calls after the first return an error).
func (m *Metrics) Shutdown(ctx context.Context) error {
	return errors.Join(m.provider.Shutdown(ctx), m.cilium.Shutdown(ctx))
}
