// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/telemetry"
)

// newTokenServer serves e's store over plain HTTP with authentication
// (no anonymous role), logging at debug level into logs.
func newTokenServer(t *testing.T, e *env, o Options) (base string, logs *syncBuffer) {
	t.Helper()
	logs = &syncBuffer{}
	o.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	o.IsUnavailable = store.IsUnavailable
	srv := httptest.NewServer(NewHandler(StoresOf(e.store), o))
	t.Cleanup(srv.Close)
	return srv.URL, logs
}

// A token's life through the API: created by an admin with its secret
// shown once, listed without secret or hash, kept as a SHA-256 only, good
// for its role over plain HTTP, refused (401) once expired or revoked;
// bad requests name their field; no secret reaches a log line.
func TestTokenLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	base, logs := newTokenServer(t, e, Options{})
	rootSecret := mustToken(t, e, "root", alloc.RoleAdmin)
	root := caller{name: "root", client: http.DefaultClient, token: rootSecret, base: base}

	// No credentials, or not a token: 401 with a challenge.
	anon := caller{name: "anonymous", client: http.DefaultClient, base: base}
	for _, c := range []caller{anon, {name: "garbage", client: http.DefaultClient, base: base, token: "ipam_nope"}} {
		r := c.do(t, "GET", "/v1/pools", "")
		if p := r.problem(t); r.status != 401 || p.Type != "urn:ipam:problem:unauthenticated" || r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d %+v", c.name, r.status, p)
		}
	}
	req, _ := http.NewRequest("GET", base+"/v1/pools", nil)
	req.Header.Set("Authorization", "Basic "+rootSecret)
	if res, err := http.DefaultClient.Do(req); err != nil || res.StatusCode != 401 {
		t.Errorf("Basic scheme: %v %v", res, err)
	} else {
		res.Body.Close()
	}

	// Create: 201 with the secret, once.
	r := root.do(t, "POST", "/v1/tokens", `{"name":"ci","role":"viewer","expiresIn":"2h"}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var created ipamv1.TokenCreated
	if err := json.Unmarshal(r.body, &created); err != nil {
		t.Fatal(err)
	}
	secret := created.Secret
	if !strings.HasPrefix(secret, "ipam_") || len(secret) != alloc.TokenSecretLen || !alloc.LooksLikeTokenSecret(secret) {
		t.Fatalf("secret %q", secret)
	}
	wantExpiry := e.clock.Now().Add(2 * time.Hour)
	if created.Role != "viewer" || created.State != "active" || created.CreatedBy != "token:root" || !created.ExpiresAt.Equal(wantExpiry) {
		t.Errorf("created %+v, want viewer, active, by token:root, expiring %s", created, wantExpiry)
	}
	// The same name again is a conflict, and shows no secret.
	if r := root.do(t, "POST", "/v1/tokens", `{"name":"ci","role":"viewer"}`); r.status != 409 || bytes.Contains(r.body, []byte("ipam_")) {
		t.Errorf("second ci: %d %s", r.status, r.body)
	}

	// Listed without any secret or hash.
	r = root.do(t, "GET", "/v1/tokens", "")
	var list ipamv1.TokenList
	if err := json.Unmarshal(r.body, &list); err != nil || r.status != 200 {
		t.Fatalf("list: %d %s %v", r.status, r.body, err)
	}
	if len(list.Items) != 2 || list.Items[0].Name != "ci" || list.Items[1].Name != "root" {
		t.Errorf("list %s", r.body)
	}
	hash := sha256.Sum256([]byte(secret))
	for _, leak := range []string{secret, "secret", string(hash[:])} {
		if bytes.Contains(r.body, []byte(leak)) {
			t.Errorf("the list shows %q: %s", leak, r.body)
		}
	}
	// Stored as its SHA-256 only: no column holds the secret.
	var stored []byte
	var row string
	if err := e.db.QueryRow(t.Context(), `SELECT secret_sha256, t::text FROM api_tokens t WHERE name = 'ci'`).Scan(&stored, &row); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stored, hash[:]) || strings.Contains(row, secret) || strings.Contains(row, strings.TrimPrefix(secret, "ipam_")) {
		t.Errorf("stored row %s", row)
	}

	// Good for its role: a viewer reads, and may not write or manage tokens.
	ci := caller{name: "ci", client: http.DefaultClient, token: secret, base: base}
	if r := ci.do(t, "GET", "/v1/pools", ""); r.status != 200 {
		t.Errorf("viewer reads: %d %s", r.status, r.body)
	}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/pools", `{"name":"p","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`},
		{"GET", "/v1/tokens", ""},
		{"DELETE", "/v1/tokens/root", ""},
	} {
		if r := ci.do(t, c.method, c.path, c.body); r.status != 403 {
			t.Errorf("viewer %s %s: %d %s", c.method, c.path, r.status, r.body)
		}
	}

	// Revoked: refused at once, gone from the list, and a second revoke
	// finds nothing.
	other := caller{name: "other", client: http.DefaultClient, token: mustToken(t, e, "other", alloc.RoleOperator), base: base}
	if r := other.do(t, "GET", "/v1/pools", ""); r.status != 200 {
		t.Fatalf("other before revoke: %d", r.status)
	}
	if r := root.do(t, "DELETE", "/v1/tokens/other", ""); r.status != 204 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	if r := other.do(t, "GET", "/v1/pools", ""); r.status != 401 || !strings.Contains(string(r.body), "revoked") {
		t.Errorf("revoked token: %d %s", r.status, r.body)
	}
	if r := root.do(t, "DELETE", "/v1/tokens/other", ""); r.status != 404 {
		t.Errorf("second revoke: %d %s", r.status, r.body)
	}
	// The name is free again once revoked.
	if r := root.do(t, "POST", "/v1/tokens", `{"name":"other","role":"operator","expiresAt":"`+
		e.clock.Now().Add(time.Hour).Format(time.RFC3339)+`"}`); r.status != 201 {
		t.Errorf("recreate other: %d %s", r.status, r.body)
	}

	// Expired: refused, listed as expired, name held until revoked.
	e.clock.Advance(2*time.Hour + time.Second)
	if r := ci.do(t, "GET", "/v1/pools", ""); r.status != 401 || !strings.Contains(string(r.body), "expired") {
		t.Errorf("expired token: %d %s", r.status, r.body)
	}
	r = root.do(t, "GET", "/v1/tokens", "")
	if !strings.Contains(string(r.body), `"name":"ci"`) || !strings.Contains(string(r.body), `"state":"expired"`) {
		t.Errorf("list after expiry: %s", r.body)
	}

	// Bad input names the field and writes nothing.
	before := authSnapshot(e)
	for _, c := range []struct{ body, field string }{
		{`{"name":"Bad_Name","role":"viewer"}`, "name"},
		{`{"name":"` + strings.Repeat("a", 64) + `","role":"viewer"}`, "name"},
		{`{"name":"x","role":"root"}`, "role"},
		{`{"name":"x","role":"node"}`, "role"},
		{`{"name":"x","role":"viewer","expiresIn":"10s"}`, "expiresIn"},
		{`{"name":"x","role":"viewer","expiresIn":"forever"}`, "expiresIn"},
		{`{"name":"x","role":"viewer","expiresIn":"9000h"}`, "expiresIn"},
		{`{"name":"x","role":"viewer","expiresIn":"1h","expiresAt":"2031-01-01T00:00:00Z"}`, "expiresIn"},
		{`{"name":"x","role":"viewer","expiresAt":"2020-01-01T00:00:00Z"}`, "expiresAt"},
		{`{"name":"x","role":"viewer","expiresAt":"2040-01-01T00:00:00Z"}`, "expiresAt"},
		{`{"name":"x","role":"viewer","expiresAt":"soon"}`, "expiresAt"},
		{`{"role":"viewer"}`, "name"},
		{`{"name":"x","role":7}`, "role"},
	} {
		r := root.do(t, "POST", "/v1/tokens", c.body)
		if p := r.problem(t); r.status != 400 || deref(p.Field, "") != c.field {
			t.Errorf("%s: %d field %q, want 400 %q: %s", c.body, r.status, deref(p.Field, ""), c.field, r.body)
		}
	}
	for _, path := range []string{"/v1/tokens/Bad_Name", "/v1/tokens?limit=0", "/v1/tokens?limit=1001", "/v1/tokens?continue=%25"} {
		method := "GET"
		if strings.HasPrefix(path, "/v1/tokens/") {
			method = "DELETE"
		}
		if r := root.do(t, method, path, ""); r.status != 400 {
			t.Errorf("%s %s: %d %s", method, path, r.status, r.body)
		}
	}
	if after := authSnapshot(e); after["api_tokens"] != before["api_tokens"] {
		t.Error("a refused token request changed the tokens")
	}

	// Pages.
	r = root.do(t, "GET", "/v1/tokens?limit=1", "")
	if err := json.Unmarshal(r.body, &list); err != nil || len(list.Items) != 1 || list.Continue == nil {
		t.Fatalf("page 1: %s", r.body)
	}
	r = root.do(t, "GET", "/v1/tokens?limit=5&continue="+*list.Continue, "")
	list = ipamv1.TokenList{}
	if err := json.Unmarshal(r.body, &list); err != nil || len(list.Items) != 2 || list.Continue != nil {
		t.Errorf("page 2: %s", r.body)
	}

	// Nothing logged the secrets, though every request above was logged
	// at debug level.
	if !strings.Contains(logs.String(), `"msg":"http request"`) {
		t.Fatal("no access log lines: the check below would prove nothing")
	}
	for _, s := range []string{secret, rootSecret, strings.TrimPrefix(secret, "ipam_")} {
		if strings.Contains(logs.String(), s) {
			t.Errorf("a log line holds a secret:\n%s", logs)
		}
	}
}

// Every state change names its actor: a token's creator is recorded as
// token:NAME, and the actor reaches the store's context.
func TestTokenActor(t *testing.T) {
	e := newEnv(t, nil)
	base, _ := newTokenServer(t, e, Options{})
	admin := caller{name: "admin", client: http.DefaultClient, token: mustToken(t, e, "ops-bot", alloc.RoleAdmin), base: base}
	if r := admin.do(t, "POST", "/v1/tokens", `{"name":"child","role":"operator"}`); r.status != 201 || !strings.Contains(string(r.body), `"createdBy":"token:ops-bot"`) {
		t.Errorf("child: %d %s", r.status, r.body)
	}
	var lastUsed *time.Time
	if err := e.db.QueryRow(t.Context(), `SELECT last_used_at FROM api_tokens WHERE name = 'ops-bot'`).Scan(&lastUsed); err != nil || lastUsed == nil {
		t.Errorf("last use not recorded: %v %v", lastUsed, err)
	}
}

// Each identity has its own bucket: one over its rate gets 429
// problem+json with Retry-After, others go on; failed authentications
// count against the remote address.
func TestRateLimitPerIdentity(t *testing.T) {
	e := newEnv(t, nil)
	// One request per 100 s after a burst of 2: the third is refused
	// however slow the machine.
	slow := RateLimit{PerSecond: 0.01, Burst: 2}
	base, _ := newTokenServer(t, e, Options{RateLimits: RateLimits{Client: slow, Anonymous: slow}})
	a := caller{name: "a", client: http.DefaultClient, token: mustToken(t, e, "a", alloc.RoleViewer), base: base}
	b := caller{name: "b", client: http.DefaultClient, token: mustToken(t, e, "b", alloc.RoleViewer), base: base}
	for i := range 2 {
		if r := a.do(t, "GET", "/v1/pools", ""); r.status != 200 {
			t.Fatalf("a's request %d: %d %s", i, r.status, r.body)
		}
	}
	r := a.do(t, "GET", "/v1/pools", "")
	p := r.problem(t)
	retry, err := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != 429 || p.Type != "urn:ipam:problem:rate-limited" || err != nil || retry < 90 || retry > 100 {
		t.Errorf("a's third request: %d %+v Retry-After %q", r.status, p, r.header.Get("Retry-After"))
	}
	if r := b.do(t, "GET", "/v1/pools", ""); r.status != 200 {
		t.Errorf("b is limited by a's requests: %d %s", r.status, r.body)
	}
	// Failed authentications of an address: two 401s, then 429.
	anon := caller{name: "anon", client: http.DefaultClient, token: "ipam_" + strings.Repeat("A", 43), base: base}
	for i, want := range []int{401, 401, 429, 429} {
		if r := anon.do(t, "GET", "/v1/pools", ""); r.status != want {
			t.Errorf("bad token %d: %d, want %d: %s", i, r.status, want, r.body)
		}
	}
	// Neither the probes nor a valid token from the same address are
	// held back by them.
	for _, path := range []string{"/healthz", "/readyz"} {
		if r := anon.do(t, "GET", path, ""); r.status != 200 {
			t.Errorf("%s after the address's failures: %d", path, r.status)
		}
	}
	if r := b.do(t, "GET", "/v1/pools", ""); r.status != 200 {
		t.Errorf("b after anonymous failures: %d %s", r.status, r.body)
	}
}

// The default limits never throttle the benchmark's load: 256 nodes, about
// 2,000 requests per second in all, spread at random, for a minute; nor a
// node that starts 110 Pods at once (a lease and a confirmation each).
func TestDefaultRateLimitsDoNotThrottleTheBenchmark(t *testing.T) {
	ls := newLimiters()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	const nodes, perSecond, seconds = 256, 2000, 60
	x := uint64(1)
	for i := range perSecond * seconds {
		x = x*6364136223846793005 + 1442695040888963407 // an LCG: reproducible spread
		node := "node:n" + strconv.Itoa(int(x>>33)%nodes)
		at := now.Add(time.Duration(i) * time.Second / perSecond)
		if ok, _ := ls.allow(node, DefaultRateLimits.Node, at); !ok {
			t.Fatalf("request %d of %s throttled", i, node)
		}
	}
	for i := range 220 {
		if ok, _ := ls.allow("node:booting", DefaultRateLimits.Node, now.Add(time.Minute)); !ok {
			t.Fatalf("a booting node's request %d throttled", i)
		}
	}
}

// Buckets of idle identities are dropped once full again, so memory
// follows the active identities; a limited one keeps its bucket.
func TestLimitersForgetIdleIdentities(t *testing.T) {
	ls := newLimiters()
	l := RateLimit{PerSecond: 10, Burst: 20} // full again 2 s after the last use
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 1000 {
		ls.allow("anonymous@10.0."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256), l, now)
	}
	for range 20 {
		ls.allow("busy", l, now)
	}
	if ls.size() != 1001 {
		t.Fatalf("%d buckets", ls.size())
	}
	later := now.Add(sweepEvery)
	ok, wait := ls.allow("busy", l, now.Add(50*time.Millisecond))
	if ok || wait <= 0 {
		t.Fatalf("busy allowed past its burst: %v %v", ok, wait)
	}
	ls.allow("busy", l, later.Add(-time.Second)) // active within its refill time
	ls.allow("fresh", l, later)
	if ls.size() != 2 {
		t.Errorf("%d buckets after the sweep, want busy and fresh", ls.size())
	}
	if _, err := ParseRateLimit("50,300"); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"", "50", "x,1", "1,x", "-1,5", "5,0", "NaN,3", "Inf,3"} {
		if _, err := ParseRateLimit(bad); err == nil {
			t.Errorf("rate limit %q accepted", bad)
		}
	}
}

// The anonymous role of --dev-no-auth reaches loopback callers over plain
// HTTP only: from another address, or over TLS, credentials are required.
func TestAnonymousRoleIsLoopbackOnly(t *testing.T) {
	e := newEnv(t, nil)
	h := NewHandler(StoresOf(e.store), Options{AnonymousRole: alloc.RoleAdmin, AnonymousLoopbackOnly: true,
		Logger: slog.New(slog.DiscardHandler)})
	for addr, want := range map[string]int{"127.0.0.1:4000": 200, "[::1]:4000": 200, "192.0.2.7:4000": 401, "[2001:db8::1]:4000": 401} {
		req := httptest.NewRequest("GET", "/v1/pools", nil)
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("from %s: %d, want %d: %s", addr, rec.Code, want, rec.Body)
		}
	}
}

// A token cannot be checked while the database is down: 503 with
// Retry-After (the client retries), not 401 (which would read as "your
// token is bad") and not 500.
func TestTokenCheckWithDatabaseDown(t *testing.T) {
	st, err := store.Open(t.Context(), "host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=2 sslmode=disable", store.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv := httptest.NewServer(NewHandler(StoresOf(st), Options{Logger: slog.New(slog.DiscardHandler), IsUnavailable: store.IsUnavailable}))
	defer srv.Close()
	secret, _ := alloc.NewTokenSecret()
	r := caller{name: "c", client: http.DefaultClient, token: secret, base: srv.URL}.do(t, "GET", "/v1/pools", "")
	if p := r.problem(t); r.status != 503 || p.Type != "urn:ipam:problem:unavailable" || r.header.Get("Retry-After") == "" {
		t.Errorf("%d %+v", r.status, p)
	}
}

// Refused requests are measured under their operation's route, like the
// others, and an admitted one under its route once.
func TestRefusalsAreMeasuredByRoute(t *testing.T) {
	e := newEnv(t, nil)
	m, err := telemetry.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown(context.Background()) })
	base, _ := newTokenServer(t, e, Options{Meter: m.Meter()})
	viewer := caller{name: "viewer", client: http.DefaultClient, token: mustToken(t, e, "v", alloc.RoleViewer), base: base}
	anon := caller{name: "anon", client: http.DefaultClient, base: base}
	anon.do(t, "GET", "/v1/pools", "")
	viewer.do(t, "POST", "/v1/pools", `{}`)
	viewer.do(t, "GET", "/v1/pools?limit=x", "") // refused after the gate, by parameter binding
	viewer.do(t, "GET", "/v1/pools", "")
	e.metrics = m
	got := e.scrape()
	const dur = "ipam_http_server_request_duration_seconds"
	for series, want := range map[string]string{
		dur + `_count{method="GET",route="/v1/pools",status_code="401"}`:  "1",
		dur + `_count{method="POST",route="/v1/pools",status_code="403"}`: "1",
		dur + `_count{method="GET",route="/v1/pools",status_code="400"}`:  "1",
		dur + `_count{method="GET",route="/v1/pools",status_code="200"}`:  "1",
	} {
		if v, ok := sample(got, series); !ok || v != want {
			t.Errorf("%s = %q (present %v), want %s", series, v, ok, want)
		}
	}
	if strings.Contains(got, "/v1/pools/v1/pools") {
		t.Error("a route recorded twice")
	}
}

// The gate runs before parameters and bodies are looked at: without
// credentials a malformed request is a 401, and a caller without the role
// learns nothing about its request's validity (403, not 400 or 415).
func TestGateBeforeValidation(t *testing.T) {
	e := newEnv(t, nil)
	base, _ := newTokenServer(t, e, Options{})
	anon := caller{name: "anon", client: http.DefaultClient, base: base}
	viewer := caller{name: "viewer", client: http.DefaultClient, token: mustToken(t, e, "v", alloc.RoleViewer), base: base}
	for _, c := range []struct {
		who          caller
		method, path string
		body         string
		want         int
	}{
		{anon, "GET", "/v1/pools?limit=x", "", 401},
		{anon, "GET", "/v1/nodes/" + strings.Repeat("a", 300) + "/blocks", "", 401},
		{viewer, "POST", "/v1/pools", "not json", 403},
		{viewer, "DELETE", "/v1/nodes/n/blocks?cidr=x", "", 403},
	} {
		if r := c.who.do(t, c.method, c.path, c.body); r.status != c.want {
			t.Errorf("%s %s %s: %d, want %d: %s", c.who.name, c.method, c.path, r.status, c.want, r.body)
		}
	}
}
