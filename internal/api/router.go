// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
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
	// PodMetadata, when set, looks up a lease request's Pod in
	// Kubernetes (the server's informers): the labels and annotations of
	// the Pod and its namespace that the request does not carry, for pool
	// selection, and, for a node certificate's request, the node the Pod
	// is bound to (placement.go). Nil: requests carry their metadata or
	// have none, and a node certificate never takes a sticky identity
	// from another node.
	PodMetadata PodMetadataSource
	// KubeSpace is the address space of the cluster PodMetadata reads
	// ("": the default space). Requests of other spaces belong to other
	// clusters, which this server cannot see: for them it acts as a server
	// without Kubernetes.
	KubeSpace string
	// CiliumNodes, when set, adds the node's CiliumNode state to GET
	// /v1/nodes/{node}.
	CiliumNodes CiliumNodeSource
	// UI, when set, serves the web view's static files at /ui/ (GET and
	// HEAD of /ui/*; cmd/server passes internal/ui's handler), public
	// like /healthz since they carry no data, and turns on its session:
	// POST and DELETE /ui/session sign a token in and out as a cookie
	// that authenticates reads only (session.go). Nil serves neither, and
	// the cookie authenticates nothing.
	UI http.Handler
}

// CiliumNodeSource answers a node's CiliumNode state (the Cilium operator
// role, internal/cilium); ok is false when the node has none.
type CiliumNodeSource interface {
	CiliumNodeState(ctx context.Context, space, node string) (st alloc.CiliumNodeState, ok bool, err error)
}

// PodMetadataSource answers what Kubernetes knows of a Pod. An unknown
// Pod or namespace is an error that Is ErrPodNotFound; any other error
// means Kubernetes could not be asked.
type PodMetadataSource interface {
	// Pod answers Pod namespace/name from a cache, reading the API server
	// on a miss. recheck, when not nil, is asked of a cached Pod's
	// placement: when it answers true (the caller expected another), the
	// Pod is read again from the API server, whose answer stands; the
	// cache lags behind the scheduler's binding, and behind a StatefulSet
	// Pod recreated under the same name on another node.
	Pod(ctx context.Context, namespace, name string, recheck func(alloc.PodPlacement) bool) (PodInfo, error)
}

// PodInfo is what a PodMetadataSource knows of a Pod: its metadata and
// its namespace's, and where it is (Placement.Exists is true).
type PodInfo struct {
	Pod, Namespace alloc.Metadata
	Placement      alloc.PodPlacement
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

// NewHandler serves the API over st. Every error it answers, including
// unknown routes, wrong methods, undecodable bodies and panics, is an
// application/problem+json problem. It panics when a field of st is nil or
// o is invalid (check with o.Validate first).
func NewHandler(st Stores, o Options) http.Handler {
	st.mustBeComplete("NewHandler")
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
	auth := &authenticator{ps: ps, tokens: st.Credentials, routes: r, anonymous: o.AnonymousRole, loopbackOnly: o.AnonymousLoopbackOnly,
		sessions: o.UI != nil, bodyTimeout: o.Admission.BodyTimeout, limits: o.RateLimits, buckets: newLimiters(), log: o.Logger, now: time.Now}
	r.Use(auth.middleware)
	r.NotFound(func(w http.ResponseWriter, req *http.Request) {
		ps.write(w, req, &alloc.Error{Kind: alloc.KindNotFound,
			Detail: fmt.Sprintf("no route for %s %s", req.Method, req.URL.Path)})
	})
	if o.Pprof {
		r.Get(pprofRoute, pprofHandler)
	}
	if o.UI != nil {
		r.Get(uiPrefix, func(w http.ResponseWriter, req *http.Request) {
			http.Redirect(w, req, uiPrefix+"/", http.StatusMovedPermanently)
		})
		r.Get(uiRoute, o.UI.ServeHTTP)
		r.Head(uiRoute, o.UI.ServeHTTP)
		r.Post(sessionRoute, auth.signIn)
		r.Delete(sessionRoute, auth.signOut)
	}
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		allow := allowedMethods(r, req.URL.Path)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		ps.write(w, req, &alloc.Error{Kind: kindMethodNotAllowed,
			Detail: fmt.Sprintf("%s is not allowed on %s; use %s", req.Method, req.URL.Path, strings.Join(allow, ", "))})
	})

	checks := []ipamv1.StrictMiddlewareFunc{refuseBadText}
	strict := ipamv1.NewStrictHandlerWithOptions(newServer(st, m, o), checks, ipamv1.StrictHTTPServerOptions{
		RequestErrorHandlerFunc:  ps.requestError,
		ResponseErrorHandlerFunc: ps.write,
	})
	h := ipamv1.HandlerWithOptions(strict, ipamv1.ChiServerOptions{
		BaseRouter:       r,
		ErrorHandlerFunc: ps.paramError,
		// The last runs first, after routing: the caller's own limit,
		// then a body must be JSON, then it is read whole and must be
		// UTF-8, one JSON value and strictly decodable, and only then
		// does the request wait for a slot.
		Middlewares: []ipamv1.MiddlewareFunc{admit.middleware, checkBody(ps, o.Admission.BodyTimeout), requireJSON(ps), admit.perCaller},
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
