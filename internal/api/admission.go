// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Admission bounds the API requests a replica serves at once. Past
// authentication and routing, an operation takes one of InFlight slots
// for as long as its handler runs (the database work, whose connections
// are as many); when none is free it waits, in line with at most Queue
// others, for at most Wait. A request beyond the line, or whose wait runs
// out, is answered 503 "unavailable" with Retry-After at once, on a
// connection that stays open, instead of piling onto the database until
// its client times out (which closes the connection, so the retry pays a
// new TLS handshake). /healthz and /readyz are not admitted through it,
// nor the profiler; /metrics is served beside the API.
//
// Whatever the limits, a request whose client has gone by the time it is
// admitted is dropped without touching the database (499, see
// problems.write), and one admitted goes on for a while after its client
// left (see finishing). The zero value (InFlight 0) limits nothing else.
//
// Slots are for the database work alone: a request's body is read whole
// (up to the maximum body size) and checked before it waits for one,
// within BodyTimeout, so a client that trickles its body holds nothing
// that others need. And no one caller may take every slot: PerCaller
// bounds the requests of one identity (a node, a token, an operator
// certificate) past authentication at once, from the reading of the body
// to the answer.
type Admission struct {
	InFlight int
	Queue    int
	Wait     time.Duration
	// PerCaller bounds the requests one caller has in progress at once
	// (reading its body, waiting for a slot or in flight); its next ones
	// wait for one of its own to end, for at most Wait, and are then
	// answered 429 with Retry-After. The anonymous role of local
	// development (Options.AnonymousRole), not rate-limited either, is
	// not bounded. 0: no bound.
	PerCaller int
	// BodyTimeout bounds the reading of a request's body; a body not
	// there in time is answered 408 and its connection closed. 0: only the
	// server's own read timeout bounds it.
	BodyTimeout time.Duration
}

// DefaultAdmission is the admission of a replica whose database pool has
// conns connections: as many requests in flight, four times as many in
// line, and a wait of at most a second. With a connection each, admitted
// requests never queue for one inside the store, where a request cannot
// tell how long it will wait; a second is well below the CNI plugin's
// default timeout (10 s), and far above an allocation's p99 at the
// pool's capacity (docs/performance.md has the figures).
//
// One caller may have half as many requests in progress as there are
// slots (at least one): a node starting many Pods at once still fills
// half the database's connections, which its own serialized work (one
// node's blocks) cannot use more of, and the other half stays for
// everyone else. A body has DefaultBodyTimeout to arrive.
func DefaultAdmission(conns int) Admission {
	return Admission{InFlight: conns, Queue: 4 * conns, Wait: time.Second,
		PerCaller: max(1, conns/2), BodyTimeout: DefaultBodyTimeout}
}

// DefaultBodyTimeout is how long a request body may take to arrive by
// default: the largest body (DefaultMaxBodyBytes, 1 MiB) at 200 KB/s. The
// service's clients are machines of the cluster's own network, where a
// reconcile list of a full node (the largest body in practice, about
// 100 KB) takes milliseconds.
const DefaultBodyTimeout = 5 * time.Second

// Validate reports invalid limits.
func (a Admission) Validate() error {
	var errs []error
	if a.InFlight < 0 {
		errs = append(errs, fmt.Errorf("admission: in-flight limit %d is negative", a.InFlight))
	}
	if a.Queue < 0 {
		errs = append(errs, fmt.Errorf("admission: queue %d is negative", a.Queue))
	}
	if (a.InFlight > 0 || a.PerCaller > 0) && a.Wait <= 0 {
		errs = append(errs, fmt.Errorf("admission: the longest wait must be positive, not %v", a.Wait))
	}
	if a.PerCaller < 0 {
		errs = append(errs, fmt.Errorf("admission: per-caller limit %d is negative", a.PerCaller))
	}
	if a.BodyTimeout < 0 {
		errs = append(errs, fmt.Errorf("admission: body timeout %v is negative", a.BodyTimeout))
	}
	return errors.Join(errs...)
}

// admissionRetryAfter is the Retry-After of a request refused admission:
// by then the requests ahead of it have been served or refused.
const admissionRetryAfter = time.Second

// admitter enforces an Admission.
type admitter struct {
	limits  Admission
	slots   chan struct{} // one token per request in flight
	waiting atomic.Int64  // requests in line for a slot
	ps      problems
	// rejected counts refusals by reason (queue full, wait over, the
	// caller's own limit).
	rejected   metric.Int64Counter
	queueFull  []metric.AddOption
	waitOver   []metric.AddOption
	callerFull []metric.AddOption

	mu      sync.Mutex              // guards callers
	callers map[string]*callerTurns // by identity key, while it has requests in progress
}

// callerTurns is one identity's share of the admission (Admission.PerCaller).
type callerTurns struct {
	turns chan struct{} // one token per request of the caller in progress
	users int           // requests holding or waiting for a turn; guarded by admitter.mu
}

// newAdmitter enforces limits; with limits.InFlight 0 it admits every
// request (and still drops those whose client has gone).
func newAdmitter(limits Admission, ps problems, meter metric.Meter) (*admitter, error) {
	rejected, err := meter.Int64Counter("ipam.http.server.admission.rejections",
		metric.WithUnit("{request}"),
		metric.WithDescription("API requests refused by admission control: reason queue-full (503: the line of waiting requests was full), wait (503: no slot came free in time) or caller (429: the caller had as many requests in progress as one caller may)."))
	if err != nil {
		return nil, fmt.Errorf("api: metrics: %w", err)
	}
	a := &admitter{limits: limits, ps: ps, rejected: rejected, callers: map[string]*callerTurns{},
		queueFull:  []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "queue-full")))},
		waitOver:   []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "wait")))},
		callerFull: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("reason", "caller")))}}
	ctx := context.Background()
	if limits.PerCaller > 0 {
		a.rejected.Add(ctx, 0, a.callerFull...)
	}
	if limits.InFlight == 0 {
		return a, nil
	}
	a.slots = make(chan struct{}, limits.InFlight)
	a.rejected.Add(ctx, 0, a.queueFull...)
	a.rejected.Add(ctx, 0, a.waitOver...)
	_, err = meter.Int64ObservableGauge("ipam.http.server.admission.in_flight",
		metric.WithUnit("{request}"),
		metric.WithDescription("API requests admitted and not yet answered (at most --max-in-flight)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(int64(len(a.slots)))
			return nil
		}))
	if err == nil {
		_, err = meter.Int64ObservableGauge("ipam.http.server.admission.waiting",
			metric.WithUnit("{request}"),
			metric.WithDescription("API requests waiting for admission (at most --admission-queue)."),
			metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
				o.Observe(a.waiting.Load())
				return nil
			}))
	}
	if err != nil {
		return nil, fmt.Errorf("api: metrics: %w", err)
	}
	return a, nil
}

// unadmitted are the operations that never wait for admission: probes,
// which must answer while the replica is saturated.
var unadmitted = map[string]bool{"/healthz": true, "/readyz": true}

// perCaller bounds the requests of each caller (Admission.PerCaller). It
// runs first after routing, before the body is read, and holds the
// caller's turn until the answer: reading a body, waiting for a slot and
// being served all count.
func (a *admitter) perCaller(next http.Handler) http.Handler {
	if a.limits.PerCaller == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := r.Context().Value(callerKey{}).(identity)
		if unadmitted[r.URL.Path] || id.key == "" {
			next.ServeHTTP(w, r)
			return
		}
		done, err := a.takeTurn(r.Context(), id.key)
		if err != nil {
			a.ps.write(w, r, err)
			return
		}
		defer done()
		next.ServeHTTP(w, r)
	})
}

// takeTurn takes one of key's turns, waiting for at most the admission's
// Wait; done gives it back. Its error is the problem to answer: 429 when
// the wait runs out, ctx's error when the client went away.
func (a *admitter) takeTurn(ctx context.Context, key string) (done func(), err error) {
	a.mu.Lock()
	c := a.callers[key]
	if c == nil {
		c = &callerTurns{turns: make(chan struct{}, a.limits.PerCaller)}
		a.callers[key] = c
	}
	c.users++
	a.mu.Unlock()
	leave := func() {
		a.mu.Lock()
		if c.users--; c.users == 0 {
			delete(a.callers, key)
		}
		a.mu.Unlock()
	}
	done = func() {
		<-c.turns
		leave()
	}
	select {
	case c.turns <- struct{}{}:
		return done, nil
	default:
	}
	t := time.NewTimer(a.limits.Wait)
	defer t.Stop()
	select {
	case c.turns <- struct{}{}:
		return done, nil
	case <-ctx.Done():
		leave()
		return nil, ctx.Err()
	case <-t.C:
		leave()
		a.rejected.Add(ctx, 1, a.callerFull...)
		return nil, &alloc.Error{Kind: kindRateLimited, RetryAfter: admissionRetryAfter,
			Detail: fmt.Sprintf("this caller has %d requests in progress, as many as one caller may have at once; retry when they are answered", a.limits.PerCaller)}
	}
}

// callersTracked is the number of callers with requests in progress, for
// tests.
func (a *admitter) callersTracked() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.callers)
}

// middleware admits each request to a slot (see Admission); it runs after
// routing, once the body has been read and checked (checkBody).
func (a *admitter) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if unadmitted[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		ctx := r.Context()
		if err := a.admit(ctx); err != nil {
			a.ps.write(w, r, err)
			return
		}
		defer a.done()
		// The handler/store boundary: a client gone while its request
		// waited never starts a transaction.
		if err := ctx.Err(); err != nil {
			a.ps.write(w, r, err)
			return
		}
		hctx, release := finishing(ctx)
		defer release()
		next.ServeHTTP(w, r.WithContext(hctx))
	})
}

// done gives back the slot of an admitted request.
func (a *admitter) done() {
	if a.slots != nil {
		<-a.slots
	}
}

// inFlightGrace is how long a request's handler may go on after its client
// went away.
const inFlightGrace = 5 * time.Second

// finishing answers the context of an admitted request's handler: ctx
// (with its values: trace, identity), except that the client's going away
// ends it only inFlightGrace later. Work the handler started then runs to
// its end (an allocation is one short transaction), and the lease it made is
// there for the client's retry, which the same attachment makes
// idempotent. Cut at once, the statement in flight would take its
// database connection with it (the driver closes a connection whose
// statement's context ends), and the pool would open a new one, a
// backend process and its prepared statements, for each client that timed
// out. release ends the context when the handler is done.
func finishing(ctx context.Context) (context.Context, context.CancelFunc) {
	hctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	var grace atomic.Pointer[time.Timer]
	stop := context.AfterFunc(ctx, func() {
		grace.Store(time.AfterFunc(inFlightGrace, func() { cancel(context.Cause(ctx)) }))
	})
	return hctx, func() {
		stop()
		if t := grace.Load(); t != nil {
			t.Stop()
		}
		cancel(context.Canceled)
	}
}

// admit takes a slot, waiting for one when the line has room. Its error
// is the problem to answer: 503 when refused, ctx's error when the client
// went away while waiting.
func (a *admitter) admit(ctx context.Context) error {
	if err := ctx.Err(); err != nil || a.slots == nil {
		return err
	}
	select {
	case a.slots <- struct{}{}:
		return nil
	default:
	}
	if a.waiting.Add(1) > int64(a.limits.Queue) {
		a.waiting.Add(-1)
		a.rejected.Add(ctx, 1, a.queueFull...)
		return &alloc.Error{Kind: kindUnavailable, RetryAfter: admissionRetryAfter,
			Detail: fmt.Sprintf("overloaded: %d requests in flight and %d waiting; retry later", a.limits.InFlight, a.limits.Queue)}
	}
	defer a.waiting.Add(-1)
	t := time.NewTimer(a.limits.Wait)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		a.rejected.Add(ctx, 1, a.waitOver...)
		return &alloc.Error{Kind: kindUnavailable, RetryAfter: admissionRetryAfter,
			Detail: fmt.Sprintf("overloaded: no request slot came free within %v; retry later", a.limits.Wait)}
	}
}
