// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"time"
	"unicode/utf8"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The web view (Options.UI) is a static shell under /ui/ whose JavaScript
// reads /v1 like any other client. A browser sends a client certificate
// by itself, but cannot put a bearer token on a navigation or an <img>,
// so a viewer signs in once: POST /ui/session checks the token as the gate
// checks a bearer token and answers it back as an HttpOnly cookie, which
// the gate then takes in place of an Authorization header, on GET and
// HEAD only (identify). A cookie travels with any request the browser
// makes, including one a hostile page starts; since it never authorizes a
// state change, a forged request can at most read, and SameSite=Strict
// keeps even that from cross-site pages.
// The web view's routes; uiRoutes (roles.go) declares them public.
const (
	uiPrefix     = "/ui"
	uiRoute      = "/ui/*"
	sessionRoute = "/ui/session"
	// SessionCookie names the cookie that carries a signed-in token.
	SessionCookie = "ipam_session"
	// sessionMaxAge bounds a sign-in to a working day (or the token's
	// own expiry, when sooner): a browser left open signs in again.
	sessionMaxAge = 12 * time.Hour
)

// sessionAllowed reports whether r may authenticate with the session
// cookie: a read (GET, HEAD) that carries no other credential. Writes
// ignore it, so that a request a hostile page makes the browser send can
// change nothing (no CSRF), and an explicit credential always wins.
func sessionAllowed(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
		r.Header.Get("Authorization") == "" && (r.TLS == nil || len(r.TLS.PeerCertificates) == 0)
}

// sessionSecret is the token of r's session cookie, or "".
func sessionSecret(r *http.Request) string {
	c, err := r.Cookie(SessionCookie)
	if err != nil {
		return ""
	}
	return c.Value
}

// signIn serves POST /ui/session: the body's token ({"token": "ipam_..."}
// as JSON, or token=ipam_... as a form) must be an active token of the
// credential store; the answer sets it as the session cookie (204).
func (a *authenticator) signIn(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		a.ps.write(w, r, err)
		return
	}
	secret, err := sessionBody(w, r, a.bodyTimeout)
	if err != nil {
		a.ps.write(w, r, err)
		return
	}
	now := a.now()
	id, tok, err := a.token(r.Context(), secret)
	if err != nil {
		if alloc.IsKind(err, kindUnauthenticated) && !a.take(w, r, "anonymous@"+remoteHost(r), a.limits.Anonymous, now) {
			return
		}
		a.ps.write(w, r, err)
		return
	}
	if !id.role.AtLeast(alloc.RoleViewer) {
		a.ps.write(w, r, &alloc.Error{Kind: kindForbidden, Detail: fmt.Sprintf("role %s may not use the web view; it needs viewer", id.role)})
		return
	}
	if !a.take(w, r, id.key, id.limit, now) {
		return
	}
	expires := now.Add(sessionMaxAge)
	if tok.ExpiresAt.Before(expires) {
		expires = tok.ExpiresAt
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: secret, Path: "/", Expires: expires,
		MaxAge: max(1, int(expires.Sub(now).Seconds())), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// signOut serves DELETE /ui/session: the browser drops the cookie (204),
// whether or not it had one. The token stays valid; revoking it is an
// admin's call (DELETE /v1/tokens/{name}).
func (a *authenticator) signOut(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		a.ps.write(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// sameOrigin refuses a sign-in or sign-out that another site's page
// started (browsers send Origin on every cross-origin POST and DELETE):
// a hostile page must not sign a viewer in with a token of its choosing.
// A request without Origin (curl, an old browser's same-origin form)
// passes; the cookie it gets authorizes reads only.
func sameOrigin(r *http.Request) error {
	o := r.Header.Get("Origin")
	if o == "" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || u.Host != r.Host {
		return &alloc.Error{Kind: kindForbidden, Field: "Origin",
			Detail: "a session is opened or closed from the web view's own pages only"}
	}
	return nil
}

// signInBody is the JSON body of a sign-in.
type signInBody struct {
	Token string `json:"token"`
}

// sessionBody reads the token of a sign-in: {"token": "..."} as JSON, or
// token=... as a form (a browser without JavaScript). The body is read as
// the API's are (readBody, within timeout) and held to the same rules:
// UTF-8, one JSON value, no unknown, duplicate, differently cased or null
// property; a form names token once and nothing else.
func sessionBody(w http.ResponseWriter, r *http.Request, timeout time.Duration) (string, error) {
	ct := r.Header.Get("Content-Type")
	mt, _, _ := mime.ParseMediaType(ct)
	if mt != "application/json" && mt != "application/x-www-form-urlencoded" {
		return "", &alloc.Error{Kind: kindUnsupportedMediaType, Field: "Content-Type",
			Detail: fmt.Sprintf("the body must be application/json or application/x-www-form-urlencoded, not %q", ct)}
	}
	b, err := readBody(w, r, timeout)
	if err != nil {
		return "", bodyError(err)
	}
	if !utf8.Valid(b) {
		return "", alloc.Invalid("body", "is not valid UTF-8 (byte %d)", invalidUTF8At(b))
	}
	var secret string
	switch mt {
	case "application/json":
		if err := oneJSONValue(b); err != nil {
			return "", err
		}
		if err := checkStrictJSON(b, reflect.TypeFor[signInBody]()); err != nil {
			return "", err
		}
		var req signInBody
		if err := json.Unmarshal(b, &req); err != nil {
			return "", alloc.Invalid("body", `must be a JSON object {"token": "ipam_..."}`)
		}
		secret = req.Token
	case "application/x-www-form-urlencoded":
		form, err := url.ParseQuery(string(b))
		if err != nil {
			return "", alloc.Invalid("body", "is not a URL-encoded form")
		}
		vs, ok := form["token"]
		if !ok {
			return "", alloc.Invalid("token", "is required: an API token (ipam_...)")
		}
		if len(vs) != 1 {
			return "", alloc.Invalid("token", "is given %d times", len(vs))
		}
		for k := range form {
			if k != "token" {
				return "", alloc.Invalid(k, "is not a field of this form; the form holds only token")
			}
		}
		secret = vs[0]
	}
	if secret == "" {
		return "", alloc.Invalid("token", "is required: an API token (ipam_...)")
	}
	if !alloc.LooksLikeTokenSecret(secret) {
		return "", alloc.Invalid("token", "is not an API token of this service (ipam_ and 43 characters)")
	}
	return secret, nil
}
