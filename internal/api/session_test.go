// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// uiStub stands in for internal/ui's handler (which internal/api must
// not import): it answers every path it is given.
var uiStub = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, "ui "+r.URL.Path)
})

// sessionServer is the API with the web view on, over plain HTTP, with no
// anonymous role: every request needs a credential.
func sessionServer(t *testing.T, e *env, o Options) string {
	t.Helper()
	o.IsUnavailable = store.IsUnavailable
	srv := httptest.NewServer(NewHandler(StoresOf(e.store), o))
	t.Cleanup(srv.Close)
	return srv.URL
}

// sessionRequest sends method path with the session cookie set to cookie
// ("" sends none) and the given headers, and a JSON body when body is set.
func sessionRequest(t *testing.T, base, method, path, cookie, body string, header ...string) response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: SessionCookie, Value: cookie})
	}
	// Redirects are answers to check, not to follow.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noFollow.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// signedIn signs secret in and answers the cookie the server set.
func signedIn(t *testing.T, base, secret string) *http.Cookie {
	t.Helper()
	res := sessionRequest(t, base, "POST", "/ui/session", "", `{"token":"`+secret+`"}`)
	if res.status != http.StatusNoContent {
		t.Fatalf("sign-in: %d %s", res.status, res.body)
	}
	cs := (&http.Response{Header: res.header}).Cookies()
	if len(cs) != 1 || cs[0].Name != SessionCookie {
		t.Fatalf("sign-in set cookies %v, want one %s", cs, SessionCookie)
	}
	return cs[0]
}

// The session cookie authenticates reads and nothing else: a GET with it
// is the token's, a write with only it is a 401 whatever the token's role
// (so a forged cross-site request can change nothing), a revoked token's
// cookie is refused at once, a viewer's cookie gets a viewer's 403s, and
// signing out clears it.
func TestSessionCookieReadsOnly(t *testing.T) {
	e := newEnv(t, nil)
	base := sessionServer(t, e, Options{UI: uiStub})
	admin := mustToken(t, e, "admin", alloc.RoleAdmin)
	viewer := mustToken(t, e, "viewer", alloc.RoleViewer)
	doomed := mustToken(t, e, "doomed", alloc.RoleViewer)

	c := signedIn(t, base, viewer)
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.Secure {
		t.Errorf("cookie over plain HTTP: HttpOnly %v, SameSite %v, Path %q, Secure %v; want HttpOnly, Strict, /, not Secure",
			c.HttpOnly, c.SameSite, c.Path, c.Secure)
	}
	if c.MaxAge <= 0 || time.Duration(c.MaxAge)*time.Second > sessionMaxAge {
		t.Errorf("cookie Max-Age %d s, want 1 s to %s", c.MaxAge, sessionMaxAge)
	}
	if c.Value != viewer {
		t.Error("the cookie does not carry the token")
	}

	// Reads with the cookie alone.
	for _, path := range []string{"/v1/pools", "/v1/nodes", "/v1/history?node=x"} {
		if res := sessionRequest(t, base, "GET", path, viewer, ""); res.status != 200 {
			t.Errorf("GET %s with a viewer cookie: %d %s", path, res.status, res.body)
		}
	}
	// A viewer's cookie gets a viewer's refusals.
	for _, path := range []string{"/v1/tokens", "/v1/consistency"} {
		res := sessionRequest(t, base, "GET", path, viewer, "")
		if res.status != 403 || res.problem(t).Type != "urn:ipam:problem:forbidden" {
			t.Errorf("GET %s with a viewer cookie: %d %s, want 403 forbidden", path, res.status, res.body)
		}
	}
	// Writes with only the cookie, even an admin's: 401, nothing written.
	before := authSnapshot(e)
	for _, w := range []struct{ method, path, body string }{
		{"POST", "/v1/pools", `{"name":"p","spec":{"ipv4":{"cidrs":["10.1.0.0/16"],"maskSize":24}}}`},
		{"PUT", "/v1/nodes/n1", `{}`},
		{"DELETE", "/v1/tokens/viewer", ""},
		{"POST", "/v1/tokens", `{"name":"t","role":"admin","expiresIn":"1h"}`},
	} {
		res := sessionRequest(t, base, w.method, w.path, admin, w.body)
		if res.status != 401 || res.problem(t).Type != "urn:ipam:problem:unauthenticated" {
			t.Errorf("%s %s with an admin cookie only: %d %s, want 401", w.method, w.path, res.status, res.body)
		} else if p := res.problem(t); p.Detail == nil || !strings.Contains(*p.Detail, "reads (GET, HEAD) only") {
			t.Errorf("%s %s: the 401 does not say why: %s", w.method, w.path, res.body)
		}
	}
	if after := authSnapshot(e); !equalSnapshots(before, after) {
		t.Errorf("a write with only a cookie changed the database:\nbefore %v\nafter  %v", before, after)
	}
	// The same write with the token as a bearer header works: it is the
	// credential's path, not the token, that is refused.
	if res := sessionRequest(t, base, "PUT", "/v1/nodes/n1", admin, `{}`, "Authorization", "Bearer "+admin); res.status != 201 {
		t.Errorf("PUT with the bearer header: %d %s", res.status, res.body)
	}
	// An Authorization header wins over the cookie, even a bad one.
	if res := sessionRequest(t, base, "GET", "/v1/pools", viewer, "", "Authorization", "Bearer ipam_nope"); res.status != 401 {
		t.Errorf("a bad bearer with a good cookie: %d, want 401", res.status)
	}

	// Revoked: the next read with its cookie is refused.
	signedIn(t, base, doomed)
	if res := sessionRequest(t, base, "GET", "/v1/pools", doomed, ""); res.status != 200 {
		t.Fatalf("before revocation: %d %s", res.status, res.body)
	}
	if err := e.store.RevokeToken(t.Context(), "doomed"); err != nil {
		t.Fatal(err)
	}
	res := sessionRequest(t, base, "GET", "/v1/pools", doomed, "")
	if res.status != 401 || !strings.Contains(string(res.body), "revoked") {
		t.Errorf("GET with a revoked token's cookie: %d %s, want 401 revoked", res.status, res.body)
	}
	// Nor can it sign in again.
	if res := sessionRequest(t, base, "POST", "/ui/session", "", `{"token":"`+doomed+`"}`); res.status != 401 || res.header.Get("Set-Cookie") != "" {
		t.Errorf("sign-in with a revoked token: %d %s (Set-Cookie %q)", res.status, res.body, res.header.Get("Set-Cookie"))
	}

	// Signing out expires the cookie.
	res = sessionRequest(t, base, "DELETE", "/ui/session", viewer, "")
	cs := (&http.Response{Header: res.header}).Cookies()
	if res.status != 204 || len(cs) != 1 || cs[0].Name != SessionCookie || cs[0].MaxAge >= 0 || cs[0].Value != "" {
		t.Errorf("sign-out: %d %v, want 204 and an expired cookie", res.status, cs)
	}

	// The shell is public, like /healthz; unknown routes stay problems.
	if res := sessionRequest(t, base, "GET", "/ui/", "", ""); res.status != 200 || string(res.body) != "ui /ui/" {
		t.Errorf("GET /ui/ without credentials: %d %s", res.status, res.body)
	}
	if res := sessionRequest(t, base, "HEAD", "/ui/app.js", "", ""); res.status != 200 {
		t.Errorf("HEAD /ui/app.js without credentials: %d", res.status)
	}
	if res := sessionRequest(t, base, "GET", "/ui", "", ""); res.status != 301 || res.header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d Location %q, want 301 to /ui/", res.status, res.header.Get("Location"))
	}
	for _, r := range []struct{ method, path string }{{"GET", "/nowhere"}, {"PUT", "/ui/session"}, {"POST", "/ui/app.js"}} {
		res := sessionRequest(t, base, r.method, r.path, "", "")
		if ct := res.header.Get("Content-Type"); res.status < 400 || ct != problemContentType {
			t.Errorf("%s %s: %d %s %s, want a problem", r.method, r.path, res.status, ct, res.body)
		}
	}
}

// equalSnapshots compares two snapshots table by table.
func equalSnapshots(a, b snapshot) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// A sign-in whose body is not a token is a 400 problem naming the field
// at fault (or a 415 for another media type), a token the service does
// not know a 401, and a sign-in started by another site's page a 403;
// none of them sets a cookie.
func TestSessionSignInRefusals(t *testing.T) {
	e := newEnv(t, nil)
	base := sessionServer(t, e, Options{UI: uiStub})
	viewer := mustToken(t, e, "viewer", alloc.RoleViewer)
	unknown, _ := alloc.NewTokenSecret()
	form := "application/x-www-form-urlencoded"
	for _, tc := range []struct {
		name, ct, body string
		header         []string
		status         int
		kind, field    string
	}{
		{"empty object", "application/json", `{}`, nil, 400, "invalid-input", "token"},
		{"token not a string", "application/json", `{"token":5}`, nil, 400, "invalid-input", "token"},
		{"token null", "application/json", `{"token":null}`, nil, 400, "invalid-input", "token"},
		{"token empty", "application/json", `{"token":""}`, nil, 400, "invalid-input", "token"},
		{"not a token", "application/json", `{"token":"hunter2"}`, nil, 400, "invalid-input", "token"},
		{"unknown property", "application/json", `{"token":"` + viewer + `","remember":true}`, nil, 400, "invalid-input", "remember"},
		{"token twice", "application/json", `{"token":"` + unknown + `","token":"` + viewer + `"}`, nil, 400, "invalid-input", "token"},
		{"token in another case", "application/json", `{"Token":"` + viewer + `"}`, nil, 400, "invalid-input", "Token"},
		{"data after the value", "application/json", `{"token":"` + viewer + `"} x`, nil, 400, "invalid-input", "body"},
		{"a second object", "application/json", `{"token":"` + viewer + `"}{"token":"` + viewer + `"}`, nil, 400, "invalid-input", "body"},
		{"not JSON", "application/json", `token=` + viewer, nil, 400, "invalid-input", "body"},
		{"JSON array", "application/json", `["` + viewer + `"]`, nil, 400, "invalid-input", "body"},
		{"form without token", form, `tok=` + viewer, nil, 400, "invalid-input", "token"},
		{"form token twice", form, `token=` + viewer + `&token=` + viewer, nil, 400, "invalid-input", "token"},
		{"other media type", "text/plain", viewer, nil, 415, "unsupported-media-type", "Content-Type"},
		{"unknown token", "application/json", `{"token":"` + unknown + `"}`, nil, 401, "unauthenticated", ""},
		{"another site", "application/json", `{"token":"` + viewer + `"}`, []string{"Origin", "https://evil.example"}, 403, "forbidden", "Origin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), "POST", base+"/ui/session", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", tc.ct)
			for i := 0; i+1 < len(tc.header); i += 2 {
				req.Header.Set(tc.header[i], tc.header[i+1])
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			r := response{status: res.StatusCode, header: res.Header, body: b}
			if r.status != tc.status {
				t.Fatalf("%d %s, want %d", r.status, b, tc.status)
			}
			p := r.problem(t)
			if p.Type != problemTypePrefix+tc.kind || (p.Field == nil) != (tc.field == "") || (p.Field != nil && *p.Field != tc.field) {
				t.Errorf("problem %s, want type %s field %q", b, tc.kind, tc.field)
			}
			if sc := res.Header.Get("Set-Cookie"); sc != "" {
				t.Errorf("a refused sign-in set a cookie: %s", sc)
			}
			if strings.Contains(string(b), viewer) {
				t.Error("the answer quotes the token")
			}
		})
	}
	// The form a browser without JavaScript posts, from the view itself.
	req, _ := http.NewRequestWithContext(t.Context(), "POST", base+"/ui/session", strings.NewReader(url.Values{"token": {viewer}}.Encode()))
	req.Header.Set("Content-Type", form)
	req.Header.Set("Origin", base)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 204 || len(res.Cookies()) != 1 {
		t.Errorf("form sign-in from the same origin: %d %v", res.StatusCode, res.Cookies())
	}
}

// Failed sign-ins count against the caller's address, as failed
// authentications do, so the form is no faster a guessing oracle than the
// API.
func TestSessionSignInRateLimited(t *testing.T) {
	e := newEnv(t, nil)
	base := sessionServer(t, e, Options{UI: uiStub, RateLimits: RateLimits{Anonymous: RateLimit{PerSecond: 0.001, Burst: 2}}})
	unknown, _ := alloc.NewTokenSecret()
	var last response
	for range 3 {
		last = sessionRequest(t, base, "POST", "/ui/session", "", `{"token":"`+unknown+`"}`)
	}
	if last.status != 429 || last.header.Get("Retry-After") == "" {
		t.Errorf("third failed sign-in: %d %s, want 429 with Retry-After", last.status, last.body)
	}
}

// Without the web view the cookie is nobody's credential and /ui is not
// routed.
func TestSessionOffWithoutUI(t *testing.T) {
	e := newEnv(t, nil)
	base := sessionServer(t, e, Options{})
	viewer := mustToken(t, e, "viewer", alloc.RoleViewer)
	if res := sessionRequest(t, base, "GET", "/v1/pools", viewer, ""); res.status != 401 {
		t.Errorf("GET with a cookie and no UI: %d %s, want 401", res.status, res.body)
	}
	for _, r := range []struct{ method, path, body string }{{"GET", "/ui/", ""}, {"POST", "/ui/session", `{"token":"` + viewer + `"}`}} {
		res := sessionRequest(t, base, r.method, r.path, "", r.body)
		if res.status != 404 || res.problem(t).Type != "urn:ipam:problem:not-found" {
			t.Errorf("%s %s without UI: %d %s, want a 404 problem", r.method, r.path, res.status, res.body)
		}
	}
}

// Over TLS the cookie is Secure, and a client certificate wins over it: a
// viewer certificate with an admin's cookie is a viewer.
func TestSessionOverTLS(t *testing.T) {
	e := newEnv(t, nil)
	s := newAuthServer(t, e, Options{UI: uiStub})
	admin := mustToken(t, e, "admin", alloc.RoleAdmin)
	cert, key, err := s.ca.IssueOperator("ops-viewer", "viewer", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	post := func(c *http.Client) *http.Response {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", s.url+"/ui/session", strings.NewReader(`{"token":"`+admin+`"}`))
		req.Header.Set("Content-Type", "application/json")
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	res := post(s.client(nil, nil))
	if cs := res.Cookies(); res.StatusCode != 204 || len(cs) != 1 || !cs[0].Secure {
		t.Fatalf("sign-in over TLS: %d %v, want a Secure cookie", res.StatusCode, cs)
	}
	get := func(c *http.Client, path string) int {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", s.url+path, nil)
		req.AddCookie(&http.Cookie{Name: SessionCookie, Value: admin})
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var p struct{ Type string }
		_ = json.NewDecoder(res.Body).Decode(&p)
		return res.StatusCode
	}
	if got := get(s.client(nil, nil), "/v1/tokens"); got != 200 {
		t.Errorf("admin cookie over TLS on GET /v1/tokens: %d, want 200", got)
	}
	if got := get(s.client(cert, key), "/v1/tokens"); got != 403 {
		t.Errorf("viewer certificate with an admin cookie on GET /v1/tokens: %d, want 403 (the certificate wins)", got)
	}
}
