// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// withAdmission serves e's store again through a handler with the given
// admission, on e's logs and metrics.
func (e *env) withAdmission(a Admission) {
	e.t.Helper()
	e.srv.Close()
	log := slog.New(slog.NewJSONHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.srv = httptest.NewServer(NewHandler(StoresOf(e.store), Options{Logger: log, Meter: e.metrics.Meter(), IsUnavailable: store.IsUnavailable,
		AnonymousRole: alloc.RoleAdmin, Admission: a}))
	e.t.Cleanup(e.srv.Close)
}

// holdCarveLock locks the CIDR rows of every pool, as a transaction
// carving a block does, until the returned function is called: an
// allocation for a node without a block then waits in the database.
func (e *env) holdCarveLock() (release func()) {
	e.t.Helper()
	conn, err := pgx.Connect(e.t.Context(), e.conn)
	if err != nil {
		e.t.Fatal(err)
	}
	tx, err := conn.Begin(e.t.Context())
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := tx.Exec(e.t.Context(), `SELECT id FROM pool_cidrs FOR NO KEY UPDATE`); err != nil {
		e.t.Fatal(err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			_ = tx.Rollback(context.Background())
			_ = conn.Close(context.Background())
		}
	}
	e.t.Cleanup(release)
	return release
}

// eventually polls cond until it holds, failing the test after a long
// deadline; it synchronizes with the server, it times nothing.
func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitingInDB reports whether a statement of the store waits for a lock.
func (e *env) waitingInDB() bool {
	var n int64
	if err := e.db.QueryRow(e.t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n > 0
}

// async sends a request in the background with ctx; the answer arrives on
// the channel.
func (e *env) async(ctx context.Context, method, path string, body any) <-chan response {
	e.t.Helper()
	j, err := json.Marshal(body)
	if err != nil {
		e.t.Fatal(err)
	}
	out := make(chan response, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, method, e.srv.URL+path, bytes.NewReader(j))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- response{status: -1, body: []byte(err.Error())}
			return
		}
		defer res.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(res.Body)
		out <- response{status: res.StatusCode, header: res.Header, body: buf.Bytes()}
	}()
	return out
}

// TestAdmission saturates a replica with one slot and a line of one: the
// request beyond the line is answered 503 problem+json with Retry-After at
// once, the probes still answer, and a request whose client gives up
// while in line leaves it and never reaches the database (it is counted
// 499, and nothing is logged as an error).
func TestAdmission(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	e.withAdmission(Admission{InFlight: 1, Queue: 1, Wait: time.Hour})
	release := e.holdCarveLock()

	// A takes the only slot and waits in the database to carve its block.
	a := e.async(t.Context(), "POST", "/v1/nodes/n1/leases", lease("a", "eth0", "pa"))
	e.eventually("the allocation waits for the carve lock", e.waitingInDB)

	// B waits in line, until its client gives up.
	bctx, bcancel := context.WithCancel(t.Context())
	b := e.async(bctx, "POST", "/v1/nodes/gone/leases", lease("b", "eth0", "pb"))
	e.eventually("B waits for admission", func() bool {
		v, _ := sample(e.scrape(), `ipam_http_server_admission_waiting`)
		return v == "1"
	})

	// C finds the line full.
	res := e.do("GET", "/v1/pools", nil)
	if p := res.problem(t); res.status != 503 || p.Type != "urn:ipam:problem:unavailable" || !strings.Contains(deref(p.Detail, ""), "overloaded") {
		t.Errorf("beyond the line: %d %s", res.status, res.body)
	}
	if got := res.header.Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1", got)
	}
	for _, probe := range []string{"/healthz", "/readyz"} {
		if res := e.do("GET", probe, nil); res.status != 200 {
			t.Errorf("%s while saturated: %d %s", probe, res.status, res.body)
		}
	}

	bcancel()
	if r := <-b; r.status != -1 {
		t.Errorf("B answered %d after its client gave up", r.status)
	}
	const dur = "ipam_http_server_request_duration_seconds_count"
	e.eventually("B is counted 499", func() bool {
		v, _ := sample(e.scrape(), dur+`{method="POST",route="/v1/nodes/{node}/leases",status_code="499"}`)
		return v == "1"
	})
	release()
	if r := <-a; r.status != 201 {
		t.Fatalf("A: %d %s", r.status, r.body)
	}
	// B never reached the database: its node was not registered, and no
	// lease or event names it.
	e.mustDo(404, "GET", "/v1/nodes/gone", nil, nil)
	var rows int64
	if err := e.db.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM leases WHERE container_id = 'b') + (SELECT count(*) FROM address_events WHERE node = 'gone')`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("%d rows of the request whose client gave up", rows)
	}
	// The slot is free again.
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("d", "eth0", "pd"), nil)

	got := e.scrape()
	if v, _ := sample(got, `ipam_http_server_admission_rejections_total{reason="queue-full"}`); v != "1" {
		t.Errorf("queue-full rejections %q, want 1", v)
	}
	if strings.Contains(got, `status_code="500"`) {
		t.Errorf("a 500 was counted:\n%s", got)
	}
	if strings.Contains(e.logs.String(), `"level":"ERROR"`) {
		t.Errorf("an error was logged:\n%s", e.logs)
	}
}

// TestAdmissionWaitRunsOut: no slot comes free within the wait: 503 with
// Retry-After.
func TestAdmissionWaitRunsOut(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	e.withAdmission(Admission{InFlight: 1, Queue: 4, Wait: 50 * time.Millisecond})
	release := e.holdCarveLock()
	a := e.async(t.Context(), "POST", "/v1/nodes/n1/leases", lease("a", "eth0", "pa"))
	e.eventually("the allocation waits for the carve lock", e.waitingInDB)

	res := e.do("POST", "/v1/nodes/n2/leases", lease("b", "eth0", "pb"))
	if p := res.problem(t); res.status != 503 || !strings.Contains(deref(p.Detail, ""), "no request slot came free within 50ms") ||
		res.header.Get("Retry-After") != "1" {
		t.Errorf("after the wait: %d %s, Retry-After %q", res.status, res.body, res.header.Get("Retry-After"))
	}
	release()
	if r := <-a; r.status != 201 {
		t.Fatalf("A: %d %s", r.status, r.body)
	}
	if v, _ := sample(e.scrape(), `ipam_http_server_admission_rejections_total{reason="wait"}`); v != "1" {
		t.Errorf("wait rejections %q, want 1", v)
	}
}

// TestAdmittedRequestFinishesAfterItsClientLeft: an allocation whose client
// times out while it waits in the database still completes (its
// connection is not cut), and the client's retry of the same attachment
// answers the lease it made.
func TestAdmittedRequestFinishesAfterItsClientLeft(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	release := e.holdCarveLock()
	ctx, cancel := context.WithCancel(t.Context())
	a := e.async(ctx, "POST", "/v1/nodes/n1/leases", lease("a", "eth0", "pa"))
	e.eventually("the allocation waits for the carve lock", e.waitingInDB)
	cancel()
	if r := <-a; r.status != -1 {
		t.Fatalf("answered %d after the client gave up", r.status)
	}
	release()
	var addr string
	e.eventually("the lease is made", func() bool {
		err := e.db.QueryRow(t.Context(), `SELECT host(addr) FROM leases WHERE container_id = 'a'`).Scan(&addr)
		return err == nil
	})
	var got ipamv1.Allocation
	e.mustDo(200, "POST", "/v1/nodes/n1/leases", lease("a", "eth0", "pa"), &got)
	if got.Addresses[0].Address != addr+"/24" {
		t.Errorf("the retry answered %s, want the lease made %s", got.Addresses[0].Address, addr)
	}
	if strings.Contains(e.logs.String(), `"level":"ERROR"`) {
		t.Errorf("an error was logged:\n%s", e.logs)
	}
}

// TestAdmissionDropsGoneClient: a request whose client has gone when it
// is admitted never reaches its handler.
func TestAdmissionDropsGoneClient(t *testing.T) {
	for _, limits := range []Admission{{}, {InFlight: 1, Queue: 1, Wait: time.Second}} {
		a, err := newAdmitter(limits, problems{log: slog.New(slog.DiscardHandler)}, noop.Meter{})
		if err != nil {
			t.Fatal(err)
		}
		called := false
		h := a.middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/pools", nil).WithContext(ctx))
		if called || rec.Code != statusClientClosedRequest {
			t.Errorf("%+v: handler called %t, status %d", limits, called, rec.Code)
		}
	}
}
