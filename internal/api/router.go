package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"runtime/debug"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/telemetry"
)

// DefaultMaxBodyBytes bounds request bodies when Options.MaxBodyBytes is 0.
// The largest legitimate body, a reconcile list of a node's attachments, is
// far below it.
const DefaultMaxBodyBytes int64 = 1 << 20

// DefaultMaxHeaderBytes bounds a request's line and headers when
// Options.MaxHeaderBytes is 0; larger ones are answered 431 as a problem.
// The http.Server's own MaxHeaderBytes must be larger (cmd/server gives it
// 16 times this), or Go's server answers first, in text/plain.
const DefaultMaxHeaderBytes = 64 << 10

// Options configure NewHandler. The zero value is valid.
type Options struct {
	// Logger receives internal errors and panics (error level), store
	// outages (warn) and one access line per request (debug). Nil means
	// slog.Default().
	Logger *slog.Logger
	// MaxBodyBytes bounds request bodies; larger ones are answered 413.
	// 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxHeaderBytes bounds the request line and headers; larger ones are
	// answered 431. 0 means DefaultMaxHeaderBytes.
	MaxHeaderBytes int
	// Meter receives the request duration histogram
	// (ipam.http.server.request.duration by method, route pattern and
	// status code) and the lease counters (ipam.lease.allocations by
	// result, ipam.lease.releases). Nil means a no-op meter.
	Meter metric.Meter
	// CiliumMeter receives the metrics named after Cilium's
	// (ipam_ip_allocation_ops, ipam_events_total, ...), and must export
	// names as given (telemetry.Metrics.CiliumMeter). Nil leaves them out.
	CiliumMeter metric.Meter
	// TracerProvider, when set, makes a server span of every request
	// (continuing the caller's W3C trace context); the store's spans of the
	// request's statements are its children. Nil traces nothing.
	TracerProvider trace.TracerProvider
	// Pprof serves the Go profiler at /debug/pprof/ (admin only). A CPU
	// profile or trace must be shorter than the server's write timeout.
	Pprof bool
	// IsUnavailable tells store errors that mean the database cannot be
	// reached (connection refused or lost, timeouts) from failed
	// statements; those are answered 503 "unavailable" with Retry-After,
	// so clients such as the CNI plugin retry instead of failing. Nil
	// answers every unclassified error 500.
	IsUnavailable func(error) bool
	// Liveness, when set, is asked by /healthz: an error answers 503, so
	// that a process whose own database is gone for good (the embedded
	// PostgreSQL that no restart brings back) is restarted by its
	// supervisor. Nil: alive while it serves HTTP.
	Liveness func() error
	// AnonymousRole is the role of a plain-HTTP request that carries no
	// credentials (no bearer token, no client certificate). Empty, the
	// zero value, answers such a request 401 "unauthenticated", as any
	// request over TLS without credentials is answered, except on the
	// public /healthz and /readyz. Tests, the benchmark and
	// --dev-no-auth set it.
	AnonymousRole alloc.Role
	// AnonymousLoopbackOnly grants AnonymousRole only to requests from a
	// loopback address, so that a development server on :8080 is not
	// open to the network.
	AnonymousLoopbackOnly bool
	// RateLimits bound each identity's requests (429 with Retry-After).
	// The zero value limits nobody; cmd/server passes its flags, which
	// default to DefaultRateLimits.
	RateLimits RateLimits
	// Admission bounds the requests served at once (503 with
	// Retry-After beyond it). The zero value admits everything;
	// cmd/server passes its flags, which default to DefaultAdmission of
	// its connection pool.
	Admission Admission
	// PodMetadata, when set, looks up the labels and annotations of a
	// lease request's Pod and namespace that the request does not carry
	// (the server's Kubernetes informers), for pool selection.
	PodMetadata PodMetadataSource
	// CiliumNodes, when set, adds the node's CiliumNode state to GET
	// /v1/nodes/{node}.
	CiliumNodes CiliumNodeSource
}

// CiliumNodeSource answers a node's CiliumNode state (the Cilium operator
// role, internal/cilium); ok is false when the node has none.
type CiliumNodeSource interface {
	CiliumNodeState(ctx context.Context, space, node string) (st alloc.CiliumNodeState, ok bool, err error)
}

// PodMetadataSource answers the metadata of a Pod and of its namespace.
// An unknown Pod or namespace is an error that Is ErrPodNotFound.
type PodMetadataSource interface {
	PodMetadata(ctx context.Context, namespace, name string) (pod, ns alloc.Metadata, err error)
}

// ErrPodNotFound is what a PodMetadataSource answers for a Pod (or
// namespace) Kubernetes does not know.
var ErrPodNotFound = errors.New("pod not found")

// Validate reports every invalid option.
func (o Options) Validate() error {
	var errs []error
	if o.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("api: MaxBodyBytes is %d; it must not be negative", o.MaxBodyBytes))
	}
	if o.MaxHeaderBytes < 0 {
		errs = append(errs, fmt.Errorf("api: MaxHeaderBytes is %d; it must not be negative", o.MaxHeaderBytes))
	}
	if o.AnonymousRole != "" {
		if _, err := alloc.ParseTokenRole("AnonymousRole", string(o.AnonymousRole)); err != nil {
			errs = append(errs, fmt.Errorf("api: %w", err))
		}
	}
	if err := o.RateLimits.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("api: %w", err))
	}
	if err := o.Admission.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("api: %w", err))
	}
	return errors.Join(errs...)
}

// NewHandler serves the API over store. Every error it answers, including
// unknown routes, wrong methods, undecodable bodies and panics, is an
// application/problem+json problem. It panics when store is nil or o is
// invalid (check with o.Validate first).
func NewHandler(store Store, o Options) http.Handler {
	if store == nil {
		panic("api: NewHandler with a nil Store")
	}
	if err := o.Validate(); err != nil {
		panic(err)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxHeaderBytes == 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if o.Meter == nil {
		o.Meter = noop.Meter{}
	}
	m, err := newMetrics(o.Meter)
	if err != nil {
		panic(err)
	}
	if o.CiliumMeter != nil {
		if m.cilium, err = newCiliumMetrics(o.CiliumMeter); err != nil {
			panic(err)
		}
	}
	ps := problems{log: o.Logger, isUnavailable: o.IsUnavailable}
	admit, err := newAdmitter(o.Admission, ps, o.Meter)
	if err != nil {
		panic(err)
	}

	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler {
		return &edge{next: next, log: o.Logger, maxBody: o.MaxBodyBytes, maxHeader: o.MaxHeaderBytes, problems: ps, metrics: m}
	})
	// Before routing, parameter binding and body checks: a caller without
	// the operation's role learns nothing about its request, and every
	// request counts against its identity's rate.
	auth := &authenticator{ps: ps, tokens: store, routes: r, anonymous: o.AnonymousRole, loopbackOnly: o.AnonymousLoopbackOnly,
		limits: o.RateLimits, buckets: newLimiters(), log: o.Logger, now: time.Now}
	r.Use(auth.middleware)
	r.NotFound(func(w http.ResponseWriter, req *http.Request) {
		ps.write(w, req, &alloc.Error{Kind: alloc.KindNotFound,
			Detail: fmt.Sprintf("no route for %s %s", req.Method, req.URL.Path)})
	})
	if o.Pprof {
		r.Get(pprofRoute, pprofHandler)
	}
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		allow := allowedMethods(r, req.URL.Path)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		ps.write(w, req, &alloc.Error{Kind: kindMethodNotAllowed,
			Detail: fmt.Sprintf("%s is not allowed on %s; use %s", req.Method, req.URL.Path, strings.Join(allow, ", "))})
	})

	checks := []ipamv1.StrictMiddlewareFunc{refuseBadText}
	strict := ipamv1.NewStrictHandlerWithOptions(&Server{store: store, metrics: m, podMetadata: o.PodMetadata, ciliumNodes: o.CiliumNodes, log: o.Logger, liveness: o.Liveness}, checks, ipamv1.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  ps.requestError,
		ResponseErrorHandlerFunc: ps.write,
	})
	h := ipamv1.HandlerWithOptions(strict, ipamv1.ChiServerOptions{
		BaseRouter:       r,
		ErrorHandlerFunc: ps.paramError,
		// The last runs first, after routing: admission, then a body must
		// be JSON, then UTF-8 and strictly decodable.
		Middlewares: []ipamv1.MiddlewareFunc{checkBody(ps), requireJSON(ps), admit.middleware},
	})
	if o.TracerProvider == nil {
		return h
	}
	// One server span per request, continuing the caller's trace (W3C
	// traceparent); the edge names it by route once chi has matched one.
	return otelhttp.NewHandler(h, "http.server", otelhttp.WithTracerProvider(o.TracerProvider),
		otelhttp.WithPropagators(telemetry.Propagator()), otelhttp.WithMeterProvider(noop.NewMeterProvider()))
}

// allowedMethods lists the methods routed for path, for the Allow header
// of a 405.
func allowedMethods(routes chi.Routes, path string) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		if routes.Match(chi.NewRouteContext(), m, path) {
			allow = append(allow, m)
		}
	}
	return allow
}

// edge is the outermost middleware: it bounds the request body, turns a
// panic into a logged 500 problem, records the request duration and writes
// the access log line. It costs one small allocation per request; the clock
// is read only when the meter or debug logging is on.
type edge struct {
	next      http.Handler
	log       *slog.Logger
	maxBody   int64
	maxHeader int
	problems  problems
	metrics   *metrics
}

func (e *edge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := &statusRecorder{ResponseWriter: w}
	logged := e.log.Enabled(r.Context(), slog.LevelDebug)
	measured := e.metrics.duration.Enabled(r.Context())
	var start time.Time
	if logged || measured {
		start = time.Now()
	}
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			e.log.LogAttrs(r.Context(), slog.LevelError, "api: panic serving request",
				slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
			if rec.status == 0 {
				writeProblem(rec, internalProblem())
			}
		}
		if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
			route := chi.RouteContext(r.Context()).RoutePattern()
			if route == "" {
				route = unmatchedRoute
			}
			span.SetName(r.Method + " " + route)
			span.SetAttributes(attribute.String("http.route", route))
		}
		if !logged && !measured {
			return
		}
		d := time.Since(start)
		if measured {
			// After routing, chi's context holds the matched pattern; it
			// holds none for a 404, a 405 or a body refused before routing.
			e.metrics.observeRequest(r.Context(), r.Method, chi.RouteContext(r.Context()).RoutePattern(),
				rec.statusOr200(), d)
		}
		if logged {
			e.log.LogAttrs(r.Context(), slog.LevelDebug, "http request",
				slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Int("status", rec.statusOr200()), slog.Duration("duration", d))
		}
	}()
	if n := headerBytes(r); n > e.maxHeader {
		e.problems.write(rec, r, &alloc.Error{Kind: kindHeaderTooLarge,
			Detail: fmt.Sprintf("the request line and headers take %d bytes; at most %d are read", n, e.maxHeader)})
		return
	}
	if r.ContentLength > e.maxBody {
		e.problems.write(rec, r, bodyError(&http.MaxBytesError{Limit: e.maxBody}))
		return
	}
	// The original writer lets net/http close the connection after a body
	// over the limit.
	r.Body = http.MaxBytesReader(w, r.Body, e.maxBody)
	e.next.ServeHTTP(rec, r)
}

// headerBytes is the size of r's request line and headers as they were
// sent (HTTP/1.1 framing), as http.Server's MaxHeaderBytes counts them.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + 2
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + 2 + len(v) + 2
		}
	}
	return n + len(r.Host) + len("Host: \r\n")
}

func internalProblem() ipamv1.Problem {
	p, _ := problemOf(errors.New("panic"))
	return p
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) statusOr200() int {
	if s.status == 0 {
		return http.StatusOK
	}
	return s.status
}

// refuseBadText answers 400 to a request with a string no field can hold
// (checkRequestText) before its handler runs.
func refuseBadText(next ipamv1.StrictHandlerFunc, _ string) ipamv1.StrictHandlerFunc {
	return func(ctx context.Context, w http.ResponseWriter, r *http.Request, req any) (any, error) {
		if err := checkRequestText(req); err != nil {
			return nil, err
		}
		return next(ctx, w, r, req)
	}
}

// requireJSON refuses (415) a POST or PUT whose body is not
// application/json. It runs after routing, so an unknown route is a 404
// whatever its body.
func requireJSON(ps problems) ipamv1.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if (r.Method == http.MethodPost || r.Method == http.MethodPut) && r.ContentLength != 0 {
				if ct := r.Header.Get("Content-Type"); ct != "application/json" && !isJSON(ct) {
					w.Header().Set("Accept", "application/json")
					ps.write(w, r, &alloc.Error{Kind: kindUnsupportedMediaType, Field: "Content-Type",
						Detail: fmt.Sprintf("the body must be application/json, not %q", ct)})
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// isJSON reports whether a Content-Type is application/json with any
// parameters (such as charset=utf-8), in any letter case.
func isJSON(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}
