// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package ui is the service's read-only web view: static HTML, CSS and
// JavaScript modules embedded in the binary, served under /ui/. The pages
// hold no data; their scripts read every figure from the REST API (/v1)
// with the browser's credentials (a client certificate, or the session
// cookie of POST /ui/session, which internal/api serves), exactly as any
// other client would. There is no build step: what is in static/ is what
// the browser runs.
package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// Prefix is the path the handler serves under.
const Prefix = "/ui/"

// ContentSecurityPolicy is sent with every answer. Scripts and styles come
// only from the service itself, nothing may be framed or frame the view,
// and requests go only back to the API: an address, label or name shown on
// a page can never run as code, even if a bug put it into markup.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// contentTypes are the types of the files in static/, set explicitly
// because the browser refuses a module script of any other type under
// nosniff, and the system's MIME table varies.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

// file is one static file, read once.
type file struct {
	body        []byte
	contentType string
	etag        string
}

// Handler serves the web view at Prefix: Prefix itself is the page, and
// Prefix+NAME the file static/NAME. Any other path answers 404 in plain
// text. It serves GET and HEAD; the router in front decides the methods.
func Handler() http.Handler {
	files := map[string]file{}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		ct, ok := contentTypes[path.Ext(p)]
		if !ok {
			return nil // not served: a file type the policy above has not considered
		}
		sum := sha256.Sum256(b)
		files[strings.TrimPrefix(p, "static/")] = file{body: b, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic(err) // the embedded tree is part of the binary: unreadable only by a build bug
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		// Pages name addresses and nodes in their URLs' fragments, which
		// browsers never send; no Referer at all keeps it that way for
		// anything else.
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		name, ok := strings.CutPrefix(r.URL.Path, Prefix)
		if !ok {
			notFound(w)
			return
		}
		if name == "" {
			name = "index.html"
		}
		f, ok := files[name]
		if !ok {
			notFound(w)
			return
		}
		h.Set("Content-Type", f.contentType)
		// The files change only with the binary: a browser revalidates
		// (If-None-Match, answered 304) and never runs a stale script
		// after an upgrade.
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", f.etag)
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.body))
	})
}

func notFound(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write([]byte("404 not found: the web view is at " + Prefix + "\n"))
}
