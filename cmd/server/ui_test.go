// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/ui"
)

// The server serves the web view at /ui/ by default, with its security
// headers, and --ui=false takes the routes (and the session) away.
func TestWebViewFlag(t *testing.T) {
	get := func(base, path string) (*http.Response, string) {
		t.Helper()
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	on := startServer(t, pgtest.NewDatabase(t))
	res, body := get(on, "/ui/")
	if res.StatusCode != 200 || res.Header.Get("Content-Security-Policy") != ui.ContentSecurityPolicy || !strings.Contains(body, `<script type="module" src="app.js">`) {
		t.Errorf("GET /ui/: %d CSP %q %.100s", res.StatusCode, res.Header.Get("Content-Security-Policy"), body)
	}
	off := startServer(t, pgtest.NewDatabase(t), "--insecure-http", "--dev-no-auth", "--ui=false")
	for _, path := range []string{"/ui/", "/ui/app.js"} {
		if res, body := get(off, path); res.StatusCode != 404 || res.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("--ui=false GET %s: %d %s %.100s, want a 404 problem", path, res.StatusCode, res.Header.Get("Content-Type"), body)
		}
	}
}
