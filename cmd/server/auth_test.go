// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/pki"
)

// get sends GET path with a bearer token (none when empty) and answers
// the status.
func get(t *testing.T, base, path, token string) int {
	t.Helper()
	req, err := http.NewRequest("GET", base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

func readSecret(t *testing.T, path string) string {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSpace(string(data))
	if !alloc.LooksLikeTokenSecret(s) {
		t.Fatalf("%s holds %q", path, s)
	}
	return s
}

// --insecure-http without --dev-no-auth requires a token; the first admin
// token comes from --bootstrap-token-file: created when the file is
// missing, kept across restarts, registered in a database that lacks it,
// and not resurrected once revoked.
func TestBootstrapTokenFile(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	file := filepath.Join(t.TempDir(), "secrets", "admin.token")
	base := startServer(t, dbURL, "--insecure-http", "--bootstrap-token-file", file)
	secret := readSecret(t, file)
	if s := get(t, base, "/v1/pools", ""); s != 401 {
		t.Errorf("plain HTTP without a token: %d", s)
	}
	if s := get(t, base, "/healthz", ""); s != 200 {
		t.Errorf("healthz: %d", s)
	}
	if s := get(t, base, "/v1/tokens", secret); s != 200 {
		t.Fatalf("the bootstrap token lists tokens: %d", s)
	}

	// A second replica (or a restart) keeps the token and the file.
	base2 := startServer(t, dbURL, "--insecure-http", "--bootstrap-token-file", file)
	if again := readSecret(t, file); again != secret {
		t.Error("a restart replaced the bootstrap token")
	}
	if s := get(t, base2, "/v1/tokens", secret); s != 200 {
		t.Errorf("the bootstrap token on the second server: %d", s)
	}

	// A fresh database registers the secret the file holds (a Secret
	// provisioned before the service's first start).
	base3 := startServer(t, pgtest.NewDatabase(t), "--insecure-http", "--bootstrap-token-file", file)
	if s := get(t, base3, "/v1/tokens", secret); s != 200 {
		t.Errorf("the file's token on a fresh database: %d", s)
	}

	// Revoked through the API, it stays revoked across a restart.
	req, _ := http.NewRequest("DELETE", base+"/v1/tokens/"+BootstrapTokenName, nil)
	req.Header.Set("Authorization", "Bearer "+secret)
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 204 {
		t.Fatalf("revoke: %v %v", res, err)
	}
	res.Body.Close()
	base4 := startServer(t, dbURL, "--insecure-http", "--bootstrap-token-file", file)
	if s := get(t, base4, "/v1/pools", secret); s != 401 {
		t.Errorf("a revoked bootstrap token after a restart: %d", s)
	}

	// A file that holds something else stops the start.
	bad := filepath.Join(t.TempDir(), "bad.token")
	if err := os.WriteFile(bad, []byte("hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = run(t.Context(), []string{"serve", "--listen", "127.0.0.1:0", "--database-url", dbURL, "--insecure-http",
		"--bootstrap-token-file", bad}, func(string) string { return "" }, nil)
	if err == nil || !strings.Contains(err.Error(), "does not hold an API token") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a file without a token: %v", err)
	}
}

// `ipam-server token create|list|revoke` works on the database of
// IPAM_DATABASE_URL; the secret is printed once and works over HTTP.
func TestTokenCommand(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	base := startServer(t, dbURL, "--insecure-http")
	env := func(k string) string {
		if k == "IPAM_DATABASE_URL" {
			return dbURL
		}
		return ""
	}
	ctx := context.Background()
	var out strings.Builder
	if err := tokenCommand(ctx, []string{"create", "--name", "ci", "--role", "viewer", "--ttl", "1h"}, env, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	secret := lines[len(lines)-1]
	if !alloc.LooksLikeTokenSecret(secret) || strings.Count(out.String(), secret) != 1 {
		t.Fatalf("output:\n%s", out.String())
	}
	if s := get(t, base, "/v1/pools", secret); s != 200 {
		t.Errorf("the viewer token reads: %d", s)
	}
	if s := get(t, base, "/v1/tokens", secret); s != 403 {
		t.Errorf("the viewer token lists tokens: %d", s)
	}
	out.Reset()
	if err := tokenCommand(ctx, []string{"list"}, env, &out); err != nil || !strings.Contains(out.String(), "ci") ||
		!strings.Contains(out.String(), "viewer") || strings.Contains(out.String(), secret) {
		t.Errorf("list: %v\n%s", err, out.String())
	}
	if err := tokenCommand(ctx, []string{"revoke", "--name", "ci"}, env, &out); err != nil {
		t.Fatal(err)
	}
	if s := get(t, base, "/v1/pools", secret); s != 401 {
		t.Errorf("after revoke: %d", s)
	}
	for _, args := range [][]string{
		{}, {"frobnicate"}, {"create", "--name", "x", "--role", "root"}, {"create", "--name", "Bad_Name"},
		{"create", "--name", "x", "--ttl", "9000h"}, {"revoke", "--name", "nobody"}, {"list", "extra"},
	} {
		if err := tokenCommand(ctx, args, env, &out); err == nil {
			t.Errorf("token %v accepted", args)
		}
	}
	if err := tokenCommand(ctx, []string{"list"}, func(string) string { return "" }, &out); err == nil {
		t.Error("token list without a database URL accepted")
	}
}

// The flags of authentication and limits parse, with their environment
// variables, and refuse what makes no sense.
func TestAuthFlags(t *testing.T) {
	env := func(k string) string {
		if k == "IPAM_NODE_RATE_LIMIT" {
			return "10,20"
		}
		return ""
	}
	c, err := parseConfig("serve", []string{"--database-url", "postgres://x", "--client-rate-limit", "0"}, env)
	if err != nil {
		t.Fatal(err)
	}
	if c.RateLimits.Node.PerSecond != 10 || c.RateLimits.Node.Burst != 20 || c.RateLimits.Client.PerSecond != 0 ||
		c.RateLimits.Anonymous.PerSecond == 0 {
		t.Errorf("rate limits %+v", c.RateLimits)
	}
	none := func(string) string { return "" }
	for _, args := range [][]string{
		{"--dev-no-auth"},
		{"--node-rate-limit", "fast"},
		{"--client-rate-limit", "5,0"},
		{"--bootstrap-token-ttl", "10s"},
	} {
		if _, err := parseConfig("serve", append(args, "--database-url", "postgres://x"), none); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// The TLS listener refuses TLS 1.1 and older.
func TestTLSMinimumVersion(t *testing.T) {
	base := startServer(t, pgtest.NewDatabase(t), "--data-dir", t.TempDir())
	addr := strings.TrimPrefix(base, "http://")
	for v, want := range map[uint16]bool{tls.VersionTLS11: false, tls.VersionTLS12: true, tls.VersionTLS13: true} {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS10, MaxVersion: v}) //nolint:gosec // only the version is under test
		if err == nil {
			conn.Close()
		}
		if (err == nil) != want {
			t.Errorf("TLS version %x: handshake error %v, want success %v", v, err, want)
		}
	}
}

// The real server, at debug level, logs no secret: not the bootstrap
// token it creates, not the tokens its requests carry, not one it hands
// out through the API.
func TestServerLogsNoSecret(t *testing.T) {
	logFile, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = logFile // run logs to os.Stderr; these tests are not parallel
	defer func() { os.Stderr = stderr }()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	file := filepath.Join(t.TempDir(), "admin.token")
	bound, done := make(chan string, 1), make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--database-url", pgtest.NewDatabase(t),
			"--insecure-http", "--bootstrap-token-file", file, "--log-level", "debug"}, func(string) string { return "" }, bound)
	}()
	var base string
	select {
	case addr := <-bound:
		base = "http://" + addr
	case err := <-done:
		t.Fatalf("server did not start: %v", err)
	}
	admin := readSecret(t, file)
	call := func(method, path, token, body string) string {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, res.Body)
		return b.String()
	}
	created := call("POST", "/v1/tokens", admin, `{"name":"ci","role":"viewer","expiresIn":"1h"}`)
	_, rest, _ := strings.Cut(created, `"secret":"`)
	ci, _, _ := strings.Cut(rest, `"`)
	if !alloc.LooksLikeTokenSecret(ci) {
		t.Fatalf("create: %s", created)
	}
	call("GET", "/v1/pools", ci, "")
	call("POST", "/v1/pools", ci, `{"name":"p","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`) // 403
	call("DELETE", "/v1/tokens/ci", admin, "")
	call("GET", "/v1/pools", ci, "")                       // 401 revoked
	call("GET", "/v1/pools", admin[:len(admin)-1]+"A", "") // 401 unknown
	call("GET", "/v1/pools?continue="+admin, admin, "")    // 400: a secret in the wrong place
	cancel()
	if err := <-done; err != nil {
		t.Errorf("server exit: %v", err)
	}
	os.Stderr = stderr
	data, err := os.ReadFile(logFile.Name())
	if err != nil {
		t.Fatal(err)
	}
	logs := string(data)
	for _, want := range []string{`"msg":"created the bootstrap admin token"`, `"msg":"http request"`, `"status":401`, `"status":403`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s: the check below would prove little\n%s", want, logs)
		}
	}
	for _, secret := range []string{admin, ci, strings.TrimPrefix(admin, "ipam_"), strings.TrimPrefix(ci, "ipam_")} {
		if strings.Contains(logs, secret) {
			t.Errorf("a log line holds a secret:\n%s", logs)
		}
	}
}

// issue-cert --client names the operator's role in the certificate
// (admin unless --role says otherwise); a role that is not one is refused.
func TestIssueCertRole(t *testing.T) {
	dir := t.TempDir()
	for role, want := range map[string]string{"": "ipam:admin", "viewer": "ipam:viewer"} {
		args := []string{"--ca-dir", filepath.Join(dir, "pki"), "--out", dir, "--client", "c" + role}
		if role != "" {
			args = append(args, "--role", role)
		}
		if err := issueCert(args, io.Discard); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(dir, "client-c"+role+".crt"))
		if err != nil {
			t.Fatal(err)
		}
		cert, err := pki.ParseCert(data)
		if err != nil {
			t.Fatal(err)
		}
		if len(cert.Subject.Organization) != 1 || cert.Subject.Organization[0] != want {
			t.Errorf("role %q: organization %v, want %s", role, cert.Subject.Organization, want)
		}
	}
	if err := issueCert([]string{"--ca-dir", filepath.Join(dir, "pki"), "--out", dir, "--client", "x", "--role", "node"}, io.Discard); err == nil {
		t.Error("--role node accepted")
	}
}

// The server bounds what a client may hold or send before a handler runs:
// headers over 64 KiB are refused (431 problem+json), and a client that sends its
// headers too slowly is cut off after the 5 s header timeout instead of
// holding a connection (and a goroutine) forever.
func TestServerBoundsHeaders(t *testing.T) {
	base := startServer(t, pgtest.NewDatabase(t))
	req, _ := http.NewRequest("GET", base+"/healthz", nil)
	req.Header.Set("X-Padding", strings.Repeat("a", 80<<10))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge || res.Header.Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(string(body), "urn:ipam:problem:header-too-large") {
		t.Errorf("80 KiB of headers: %d %s %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	// Beyond 1 MiB Go's server answers itself, in text/plain (documented
	// under the spec's default response).
	req.Header.Set("X-Padding", strings.Repeat("a", 1100<<10))
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("1.1 MiB of headers: %d", res.StatusCode)
	}

	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil { // never finished
		t.Fatal(err)
	}
	start := time.Now()
	_ = conn.SetReadDeadline(start.Add(15 * time.Second))
	_, err = io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server still holds a half-sent request after %s", time.Since(start))
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the connection was closed after %s, want about 5 s", d)
	}
}
