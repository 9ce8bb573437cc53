// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ui

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func serve(t *testing.T, method, path string, header ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), method, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	Handler().ServeHTTP(w, req)
	return w.Result()
}

// Every answer carries the security headers; the page and each file have
// the type a browser needs under nosniff; anything else is a 404.
func TestHandler(t *testing.T) {
	for _, tc := range []struct {
		path, ct string
		status   int
	}{
		{"/ui/", "text/html; charset=utf-8", 200},
		{"/ui/index.html", "text/html; charset=utf-8", 200},
		{"/ui/app.js", "text/javascript; charset=utf-8", 200},
		{"/ui/app.css", "text/css; charset=utf-8", 200},
		{"/ui/favicon.svg", "image/svg+xml", 200},
		{"/ui/nope.js", "text/plain; charset=utf-8", 404},
		{"/ui/../ui.go", "text/plain; charset=utf-8", 404},
		{"/ui/static/app.js", "text/plain; charset=utf-8", 404},
		{"/other", "text/plain; charset=utf-8", 404},
	} {
		res := serve(t, "GET", tc.path)
		if res.StatusCode != tc.status || res.Header.Get("Content-Type") != tc.ct {
			t.Errorf("GET %s: %d %q, want %d %q", tc.path, res.StatusCode, res.Header.Get("Content-Type"), tc.status, tc.ct)
		}
		for h, want := range map[string]string{
			"Content-Security-Policy": ContentSecurityPolicy,
			"X-Content-Type-Options":  "nosniff",
			"X-Frame-Options":         "DENY",
			"Referrer-Policy":         "no-referrer",
		} {
			if got := res.Header.Get(h); got != want {
				t.Errorf("GET %s: %s %q, want %q", tc.path, h, got, want)
			}
		}
	}
	for _, d := range []string{"script-src 'self'", "frame-ancestors 'none'", "default-src 'none'"} {
		if !strings.Contains(ContentSecurityPolicy, d) {
			t.Errorf("the policy lacks %s", d)
		}
	}
	if strings.Contains(ContentSecurityPolicy, "unsafe") {
		t.Error("the policy allows something unsafe")
	}

	// Revalidation: the ETag answers 304; HEAD has no body.
	res := serve(t, "GET", "/ui/app.js")
	etag := res.Header.Get("ETag")
	if etag == "" || res.Header.Get("Cache-Control") != "no-cache" {
		t.Fatalf("app.js: ETag %q, Cache-Control %q", etag, res.Header.Get("Cache-Control"))
	}
	if res := serve(t, "GET", "/ui/app.js", "If-None-Match", etag); res.StatusCode != 304 {
		t.Errorf("If-None-Match: %d, want 304", res.StatusCode)
	}
	res = serve(t, "HEAD", "/ui/")
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || len(b) != 0 {
		t.Errorf("HEAD /ui/: %d with %d bytes", res.StatusCode, len(b))
	}
}

// The scripts build the page from nodes and text only: no markup sink
// that would parse data as HTML, no eval, nothing from another origin.
// Every file the page and the modules name is served.
func TestStaticFilesAreSafeAndComplete(t *testing.T) {
	sinks := regexp.MustCompile(`\.innerHTML|\.outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function\(|setAttribute\(\s*'style'|https?://`)
	refs := regexp.MustCompile(`(?:from|import)\s+'\./([\w.-]+)'|(?:src|href)="([\w.-]+)"`)
	served := map[string]bool{}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		served[strings.TrimPrefix(p, "static/")] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range served {
		b, err := static.ReadFile("static/" + name)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		if strings.HasSuffix(name, ".js") {
			// The SVG namespace is a name, not a fetch.
			src = strings.ReplaceAll(src, "'http://www.w3.org/2000/svg'", "")
			if m := sinks.FindString(src); m != "" {
				t.Errorf("%s uses %s", name, m)
			}
		}
		for _, m := range refs.FindAllStringSubmatch(src, -1) {
			ref := m[1] + m[2]
			if !served[ref] {
				t.Errorf("%s names %s, which is not in static/", name, ref)
			}
			if res := serve(t, "GET", Prefix+ref); res.StatusCode != 200 {
				t.Errorf("%s names %s, answered %d", name, ref, res.StatusCode)
			}
		}
	}
}
