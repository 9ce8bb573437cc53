// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/telemetry"
)

// With tracing on, one request is one trace: a server span named by its
// route, and under it a span for each database statement of the request.
// The access log line carries the trace's ID, and a caller's W3C
// traceparent is continued rather than replaced.
func TestOneTracePerRequest(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tracing := telemetry.NewTracingWith(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tracing.Shutdown(t.Context()) })
	st, err := store.Open(t.Context(), pgtest.NewDatabase(t), store.Options{
		LeaseExpiry: testLeaseExpiry, Cooldown: testCooldown, AutoRegisterNodes: true, TracerProvider: tracing.Provider(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	logs := &syncBuffer{}
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	srv := httptest.NewServer(NewHandler(StoresOf(st), Options{Logger: log, TracerProvider: tracing.Provider(), IsUnavailable: store.IsUnavailable,
		AnonymousRole: alloc.RoleAdmin}))
	t.Cleanup(srv.Close)

	send := func(method, path, body string, header http.Header) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if header != nil {
			req.Header = header.Clone()
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode >= 300 {
			t.Fatalf("%s %s: %d", method, path, res.StatusCode)
		}
	}
	// rootOf waits for the request's server span (ended after the answer
	// is written) and answers it with every span exported so far.
	rootOf := func(name string) (sdktrace.ReadOnlySpan, tracetest.SpanStubs) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			spans := exp.GetSpans()
			for _, s := range spans {
				if s.Name == name && s.SpanKind == trace.SpanKindServer {
					return s.Snapshot(), spans
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no server span %q among %d spans", name, len(spans))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	send("POST", "/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`, nil)
	rootOf("POST /v1/pools")
	exp.Reset()

	send("POST", "/v1/nodes/n1/leases", `{"containerID":"c1","interface":"eth0","owner":{"namespace":"ns","name":"p1"}}`, nil)
	root, spans := rootOf("POST /v1/nodes/{node}/leases")
	traceID := root.SpanContext().TraceID()
	if root.Parent().IsValid() {
		t.Errorf("the server span has a parent %v: the request began no trace", root.Parent())
	}
	byID := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range spans {
		if s.SpanContext.TraceID() != traceID {
			t.Errorf("span %q is in another trace %s: one request made two traces", s.Name, s.SpanContext.TraceID())
		}
		byID[s.SpanContext.SpanID()] = s
	}
	var db int
	for _, s := range spans {
		if !strings.Contains(s.InstrumentationScope.Name, "otelpgx") {
			continue
		}
		db++
		// Its chain of parents leads to the server span.
		p := s.Parent.SpanID()
		for p.IsValid() && p != root.SpanContext().SpanID() {
			p = byID[p].Parent.SpanID()
		}
		if p != root.SpanContext().SpanID() {
			t.Errorf("database span %q does not descend from the request's span", s.Name)
		}
	}
	if db == 0 {
		t.Errorf("no database span under the request; spans: %v", names(spans))
	}
	t.Logf("the lease request: %d spans, %d of the database: %v", len(spans), db, names(spans))
	var sawLog bool
	for line := range strings.Lines(logs.String()) {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "http request" && rec["path"] == "/v1/nodes/n1/leases" {
			sawLog = true
			if rec["trace_id"] != traceID.String() {
				t.Errorf("access log trace_id %v, want %s", rec["trace_id"], traceID)
			}
		}
	}
	if !sawLog {
		t.Errorf("no access log line of the lease request:\n%s", logs.String())
	}

	// A caller's trace continues into the service.
	exp.Reset()
	const caller = "4bf92f3577b34da6a3ce929d0e0e4736"
	send("GET", "/v1/nodes/n1/blocks", "", http.Header{"Traceparent": {"00-" + caller + "-00f067aa0ba902b7-01"}})
	root, _ = rootOf("GET /v1/nodes/{node}/blocks")
	if got := root.SpanContext().TraceID().String(); got != caller || root.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("trace %s parent %s, want the caller's trace %s", got, root.Parent().SpanID(), caller)
	}
}

func names(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name+" ("+s.InstrumentationScope.Name+")")
	}
	return out
}
