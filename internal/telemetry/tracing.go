// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// ServiceName is the service.name of the service's spans unless
// OTEL_SERVICE_NAME says otherwise.
const ServiceName = "ipam-server"

// Tracing is the service's tracer provider; the zero value is tracing off.
type Tracing struct {
	provider *sdktrace.TracerProvider // nil when off
}

// TracingRequested reports whether the standard OpenTelemetry variables
// ask for traces: an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or an exporter named in
// OTEL_TRACES_EXPORTER other than "none". Without them tracing is off and
// costs nothing: no spans are made at all.
func TracingRequested(getenv func(string) string) bool {
	if e := getenv("OTEL_TRACES_EXPORTER"); e != "" {
		return e != "none"
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// NewTracing starts the exporter the OTEL_* variables describe (OTLP over
// gRPC or HTTP/protobuf, or the console; see go.opentelemetry.io/contrib/
// exporters/autoexport) behind a batching tracer provider. Call it when
// TracingRequested; the zero Tracing is tracing off.
func NewTracing(ctx context.Context) (*Tracing, error) {
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, fmt.Errorf("telemetry: trace exporter: %w", err)
	}
	return NewTracingWith(sdktrace.WithBatcher(exp)), nil
}

// NewTracingWith is a Tracing whose provider has the given options (tests
// pass sdktrace.WithSyncer of an in-memory exporter).
func NewTracingWith(opts ...sdktrace.TracerProviderOption) *Tracing {
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(serviceName())))
	if err != nil {
		res = resource.Default()
	}
	return &Tracing{provider: sdktrace.NewTracerProvider(append([]sdktrace.TracerProviderOption{sdktrace.WithResource(res)}, opts...)...)}
}

func serviceName() string {
	if n := os.Getenv("OTEL_SERVICE_NAME"); n != "" {
		return n
	}
	return ServiceName
}

// Provider answers the tracer provider, nil when tracing is off: callers
// then install no instrumentation at all.
func (t *Tracing) Provider() trace.TracerProvider {
	if t.provider == nil {
		return nil
	}
	return t.provider
}

// Propagator reads and writes W3C trace context and baggage headers, so a
// caller's trace continues into the service.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Shutdown flushes and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// LogHandler adds the trace and span IDs of the context's span to every
// record logged with a context (slog's ...Context methods), so a log line
// leads to its trace.
func LogHandler(h slog.Handler) slog.Handler { return traceLogHandler{h} }

type traceLogHandler struct{ slog.Handler }

func (h traceLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceLogHandler{h.Handler.WithAttrs(as)}
}

func (h traceLogHandler) WithGroup(name string) slog.Handler {
	return traceLogHandler{h.Handler.WithGroup(name)}
}
