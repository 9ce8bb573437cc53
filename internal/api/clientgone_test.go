// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// TestClientGoneIsNotInternal: the errors a handler gets when its client
// went away are answered (and counted) 499; the same errors while the
// client waits, and any other error, are what they were.
func TestClientGoneIsNotInternal(t *testing.T) {
	ps := problems{log: slog.New(slog.DiscardHandler), isUnavailable: store.IsUnavailable}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	cut := &pgconn.ConnectError{}
	for _, tc := range []struct {
		ctx  context.Context
		err  error
		want int
	}{
		{gone, context.Canceled, statusClientClosedRequest},
		{gone, fmt.Errorf("store: %w", context.DeadlineExceeded), statusClientClosedRequest},
		{gone, cut, statusClientClosedRequest},
		{gone, &unavailableError{err: context.Canceled}, statusClientClosedRequest}, // a readiness probe's client
		{gone, errors.New("a bug"), http.StatusInternalServerError},
		{context.Background(), errors.New("a bug"), http.StatusInternalServerError},
		{context.Background(), cut, http.StatusServiceUnavailable},
	} {
		rec := httptest.NewRecorder()
		ps.write(rec, httptest.NewRequest("GET", "/v1/pools", nil).WithContext(tc.ctx), tc.err)
		if rec.Code != tc.want {
			t.Errorf("%v (client gone %t): %d, want %d", tc.err, tc.ctx.Err() != nil, rec.Code, tc.want)
		}
	}
}

// TestBodyCutByReadTimeout: a body that does not arrive within the
// server's read timeout is answered 408 problem+json on that connection,
// counted 408 and not logged as an error: a body of known length (read
// before admission) and a chunked one (read by the handler's decoding).
func TestBodyCutByReadTimeout(t *testing.T) {
	e := newEnv(t, nil)
	log := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := &http.Server{Handler: NewHandler(StoresOf(e.store), Options{Logger: log, Meter: e.metrics.Meter(), IsUnavailable: store.IsUnavailable,
		AnonymousRole: alloc.RoleAdmin}), ReadTimeout: 200 * time.Millisecond, WriteTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	for i, start := range []string{
		// The headers and the body's first byte; the other 99 never come.
		"Content-Length: 100\r\n\r\n{",
		// A first chunk, and never the next.
		"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
	} {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := fmt.Fprintf(conn, "POST /v1/nodes/n1/leases HTTP/1.1\r\nHost: ipam\r\nContent-Type: application/json\r\n%s", start); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		var p ipamv1.Problem
		err = json.NewDecoder(res.Body).Decode(&p)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 408 || res.Header.Get("Content-Type") != problemContentType || p.Type != "urn:ipam:problem:request-timeout" ||
			deref(p.Field, "") != "body" || !res.Close {
			t.Errorf("%q: %d %s %+v, close %t", start, res.StatusCode, res.Header.Get("Content-Type"), p, res.Close)
		}
		want := fmt.Sprint(i + 1)
		if v, _ := sample(e.scrape(), `ipam_http_server_request_duration_seconds_count{method="POST",route="/v1/nodes/{node}/leases",status_code="408"}`); v != want {
			t.Errorf("%q: 408 counted %q times, want %s", start, v, want)
		}
	}
	if strings.Contains(e.logs.String(), `"level":"ERROR"`) {
		t.Errorf("an error was logged:\n%s", e.logs)
	}
}
