// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/go-chi/chi/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// edge is the outermost middleware: it bounds the request body, turns a
// panic into a logged 500 problem, records the request duration and writes
// the access log line. It allocates only its status recorder, and reads
// the clock only when the meter or debug logging is on.
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
	if r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		rec.body = &trackedBody{ReadCloser: r.Body}
		r.Body = rec.body
	}
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

// statusRecorder remembers the status a handler wrote, and closes the
// connection after an answer given before the request's body was read.
type statusRecorder struct {
	http.ResponseWriter
	status int
	body   *trackedBody // nil: the request has no body
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 && code >= 200 {
		s.status = code
		s.closeIfBodyUnread()
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
		s.closeIfBodyUnread()
	}
	return s.ResponseWriter.Write(b)
}

// closeIfBodyUnread marks the answer Connection: close when the request's
// body has not been read to its end: a request refused before its body
// (unauthenticated, over its caller's share, too large) or never read.
// Otherwise net/http reads up to 256 KiB of the rest before it sends the
// answer, to keep the connection, and a client that trickles its body
// would keep the answer, and a goroutine, waiting for the server's whole
// read timeout.
func (s *statusRecorder) closeIfBodyUnread() {
	if s.body != nil && !s.body.ended {
		s.ResponseWriter.Header().Set("Connection", "close")
	}
}

// trackedBody is a request body that knows whether it was read to its end.
type trackedBody struct {
	io.ReadCloser
	ended bool // a read answered an error: EOF, or a failure that ends it
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.ended = true
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusRecorder) statusOr200() int {
	if s.status == 0 {
		return http.StatusOK
	}
	return s.status
}
