// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/telemetry"
	"github.com/ipam-dev/ipam/internal/testclock"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Migrate)
}

// env is one test's API server over a real store on a database of its own.
type env struct {
	t       *testing.T
	conn    string // the database's connection string
	store   *store.Store
	srv     *httptest.Server
	client  *ipamclient.ClientWithResponses
	clock   *testclock.Clock
	logs    *syncBuffer // everything the handler logged, debug level and up
	db      *pgx.Conn   // for snapshots
	metrics *telemetry.Metrics
}

const (
	testLeaseExpiry = 10 * time.Minute
	testCooldown    = 30 * time.Second
)

// newEnv starts a server over a fresh database. wrap, when not nil, answers
// the stores the server uses, around the real store (for fault injection
// only; behaviour always comes from PostgreSQL).
func newEnv(t *testing.T, wrap func(*store.Store) Stores) *env {
	t.Helper()
	return newEnvWith(t, wrap, nil)
}

// newEnvWith is newEnv with store options changed by opts (when not nil).
func newEnvWith(t *testing.T, wrap func(*store.Store) Stores, opts func(*store.Options)) *env {
	t.Helper()
	conn := pgtest.NewDatabase(t)
	clk := testclock.New(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	o := store.Options{
		LeaseExpiry:       testLeaseExpiry,
		Cooldown:          testCooldown,
		AutoRegisterNodes: true,
		Now:               clk.Now,
	}
	if opts != nil {
		opts(&o)
	}
	st, err := store.Open(t.Context(), conn, o)
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	s := StoresOf(st)
	if wrap != nil {
		s = wrap(st)
	}
	logs := &syncBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	metrics, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = metrics.Shutdown(context.Background()) })
	// Plain HTTP without credentials acts as admin here; the role and
	// token tests (auth_test.go) start servers that authenticate.
	srv := httptest.NewServer(NewHandler(s, Options{Logger: log, Meter: metrics.Meter(), IsUnavailable: store.IsUnavailable,
		AnonymousRole: alloc.RoleAdmin}))
	t.Cleanup(srv.Close)
	client, err := ipamclient.NewClientWithResponses(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	db, err := pgx.Connect(t.Context(), conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.Background()) })
	return &env{t: t, conn: conn, store: st, srv: srv, client: client, clock: clk, logs: logs, db: db, metrics: metrics}
}

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// response is a raw answer of the server.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request with a JSON body (contentType application/json unless
// given otherwise); body may be a string, an io.Reader or any value to
// marshal.
func (e *env) do(method, path string, body any, contentType ...string) response {
	e.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case io.Reader:
		r = b
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(e.t.Context(), method, e.srv.URL+path, r)
	if err != nil {
		e.t.Fatal(err)
	}
	switch {
	case len(contentType) > 0:
		if contentType[0] != "" {
			req.Header.Set("Content-Type", contentType[0])
		}
	case body != nil:
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// mustDo is do that fails the test unless the status is want; it decodes
// the body into out when out is not nil.
func (e *env) mustDo(want int, method, path string, body, out any) {
	e.t.Helper()
	res := e.do(method, path, body)
	if res.status != want {
		e.t.Fatalf("%s %s: status %d, want %d: %s\nlogs:\n%s", method, path, res.status, want, res.body, e.logs)
	}
	if out != nil {
		reflect.ValueOf(out).Elem().SetZero() // no merging with an earlier answer
		if err := json.Unmarshal(res.body, out); err != nil {
			e.t.Fatalf("%s %s: decoding %s: %v", method, path, res.body, err)
		}
	}
}

// problem decodes a problem answer and checks its media type and status.
func (r response) problem(t *testing.T) ipamv1.Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != problemContentType {
		t.Errorf("Content-Type = %q, want %q (body %s)", ct, problemContentType, r.body)
	}
	var p ipamv1.Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %s: %v", r.body, err)
	}
	if p.Status != r.status {
		t.Errorf("problem status %d differs from HTTP status %d", p.Status, r.status)
	}
	if p.Title == "" {
		t.Errorf("problem without a title: %s", r.body)
	}
	return p
}

// tables are every table of the schema; a snapshot dumps them all.
var tables = []string{"address_spaces", "pools", "pool_cidrs", "nodes", "blocks", "leases", "address_events", "lb_pools", "address_ranges", "vip_owners", "vips", "vip_holders", "cidr_groups", "cidr_group_cidrs"}

// snapshot is each table's row count and a digest of its rows' text.
type snapshot map[string]string

func (e *env) snapshot() snapshot {
	e.t.Helper()
	s := snapshot{}
	for _, tbl := range tables {
		var n int64
		var digest string
		err := e.db.QueryRow(e.t.Context(), `SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
			FROM `+tbl+` t`).Scan(&n, &digest)
		if err != nil {
			e.t.Fatalf("snapshot of %s: %v", tbl, err)
		}
		s[tbl] = fmt.Sprintf("%d rows, md5 %s", n, digest)
	}
	return s
}

// jsonRequest is a request to url carrying body as JSON (no body, and no
// Content-Type, when body is nil).
func jsonRequest(t testing.TB, method, url string, body io.Reader) *http.Request {
	t.Helper()
	if body == nil {
		body = http.NoBody
	}
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if body != http.NoBody {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

// bodyOf is body as a request body, nil when it is empty.
func bodyOf(body string) io.Reader {
	if body == "" {
		return nil
	}
	return strings.NewReader(body)
}
