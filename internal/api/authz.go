// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/go-chi/chi/v5"
	"github.com/oapi-codegen/runtime"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pki"
)

// CredentialStore finds the API token of a bearer secret; it never sees
// the secret, only its SHA-256.
type CredentialStore interface {
	// TokenBySecret answers the token of a secret's hash in any state, or
	// KindNotFound. It reads the database on every call: a revocation
	// holds on every replica from the next request on.
	TokenBySecret(ctx context.Context, hash [sha256.Size]byte) (alloc.Token, error)
}

// authenticator is the API's gate. For every routed request it finds the
// operation (roles.go), and unless the operation is public it:
//  1. identifies the caller: a bearer token (checked in the database on
//     every request, so a revocation holds at once on every replica), else
//     a verified client certificate (a node's, or an operator's with the
//     role its Organization names), else the anonymous role when allowed;
//     otherwise 401;
//  2. takes one request from the caller's rate-limit bucket (429 with
//     Retry-After when empty);
//  3. checks the operation's role (403), and records the actor in the
//     context for the address history.
//
// Failed authentications count against the remote address's anonymous
// bucket (then 429). A valid credential from the same address is not held
// back by them: behind a proxy or NAT every client shares one address,
// and one client with a revoked token must not lock out the others. A
// failed lookup costs one index probe; guessing a 256-bit secret is hopeless
// anyway.
type authenticator struct {
	ps           problems
	tokens       CredentialStore
	routes       *chi.Mux // to find the operation before the router runs it
	anonymous    alloc.Role
	loopbackOnly bool
	sessions     bool          // the web view's session cookie counts (Options.UI set)
	bodyTimeout  time.Duration // a sign-in's body must arrive within it (Admission.BodyTimeout)
	limits       RateLimits
	buckets      *limiters
	log          *slog.Logger
	now          func() time.Time
	// certs remembers the identity of each client certificate read
	// (weak.Pointer[x509.Certificate] to identity): net/http gives every
	// request of a connection the same certificate, so a kept-alive
	// caller's is read once per connection rather than per request. An
	// entry goes when its certificate is collected, after its
	// connections. Refused certificates are not kept.
	certs sync.Map
}

// errUnauthenticated is a 401; Detail never quotes a credential.
func errUnauthenticated(format string, args ...any) error {
	return &alloc.Error{Kind: kindUnauthenticated, Detail: fmt.Sprintf(format, args...)}
}

func (a *authenticator) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Find the route as chi will (the raw path when there is one), so
		// that {node} here is what the handler gets.
		path := r.URL.RawPath
		if path == "" {
			path = r.URL.Path
		}
		rctx := chi.NewRouteContext()
		pattern := a.routes.Find(rctx, r.Method, path)
		if pattern == "" {
			next.ServeHTTP(w, r) // 404 or 405, from the router
			return
		}
		// The router never runs for a refused request: record its route
		// for the request metrics here, and take it back when the request
		// goes on to the router, which records it again.
		rc := chi.RouteContext(r.Context())
		mark := len(rc.RoutePatterns)
		rc.RoutePatterns = append(rc.RoutePatterns, pattern)
		proceed := func(r *http.Request) {
			rc.RoutePatterns = rc.RoutePatterns[:mark]
			next.ServeHTTP(w, r)
		}
		opID, ok := operationsByRoute[r.Method+" "+pattern]
		op := operations[opID]
		if !ok {
			op, ok = debugRoutes[r.Method+" "+pattern]
		}
		if !ok {
			op, ok = uiRoutes[r.Method+" "+pattern]
		}
		if !ok {
			// TestRoleTableMatchesSpec keeps this from happening; refuse
			// rather than serve an operation nobody gave a role.
			a.log.LogAttrs(r.Context(), slog.LevelError, "api: operation without a role",
				slog.String("method", r.Method), slog.String("route", pattern))
			a.ps.write(w, r, &alloc.Error{Kind: kindForbidden, Detail: "this operation has no role"})
			return
		}
		now := a.now()
		addrKey := "anonymous@" + remoteHost(r)
		if op.min == public {
			// Probes are not limited: a kubelet behind the same address
			// as a misbehaving client must not restart a healthy replica.
			// Both answers are cheap (readyz is one query).
			proceed(r)
			return
		}
		id, err := a.identify(r)
		if err != nil {
			if alloc.IsKind(err, kindUnauthenticated) {
				if !a.take(w, r, addrKey, a.limits.Anonymous, now) {
					return
				}
				w.Header().Set("WWW-Authenticate", `Bearer realm="ipam"`)
			}
			a.ps.write(w, r, err)
			return
		}
		if !a.take(w, r, id.key, id.limit, now) {
			return
		}
		r = r.WithContext(withCaller(alloc.WithActor(r.Context(), id.actor), id))
		var node, space string
		if id.role == alloc.RoleNode {
			// Authorize on exactly what the handler gets. A value the
			// generated wrapper cannot bind (a broken escape, space given
			// twice) is no node's and no space's: refused.
			var ok bool
			if node, ok = boundNode(r, rctx); !ok {
				node = ""
			}
			if space, ok = boundSpace(r); !ok {
				space = strings.Join(r.URL.Query()["space"], ",")
			}
		}
		if !op.allows(id, node, space) {
			a.ps.write(w, r, forbidden(id, op, node, space))
			return
		}
		proceed(r)
	})
}

// boundNode is the {node} the handler of r gets: the generated chi
// wrapper (api/ipamv1) binds it with the runtime's styled binder, which
// path-unescapes the raw segment whenever the request has a raw path, so
// n%6Fde-a is node-a there and must be node-a here. ok is false when the
// binder refuses the value (the wrapper then answers 400).
func boundNode(r *http.Request, rctx *chi.Context) (node string, ok bool) {
	raw := rctx.URLParam("node")
	if raw == "" {
		return "", true
	}
	err := runtime.BindStyledParameterWithOptions("simple", "node", raw, &node, runtime.BindStyledParameterOptions{
		ParamLocation: runtime.ParamLocationPath, Explode: false, Required: true, Type: "string", ValueIsUnescaped: r.URL.RawPath == ""})
	return node, err == nil
}

// boundSpace is the address space the handler of r works in: the query
// parameter space as the generated wrapper binds it (SpaceParam), and
// alloc.DefaultSpace when absent. ok is false when the binder refuses it.
func boundSpace(r *http.Request) (space string, ok bool) {
	var p *ipamv1.SpaceParam
	if err := runtime.BindQueryParameterWithOptions("form", true, false, "space", r.URL.Query(), &p,
		runtime.BindQueryParameterOptions{Type: "string"}); err != nil {
		return "", false
	}
	if p == nil {
		return alloc.DefaultSpace, true
	}
	return *p, true
}

// forbidden explains a refusal without naming more than the caller knows.
func forbidden(id identity, op access, node, space string) error {
	switch {
	case id.role == alloc.RoleNode && space != id.space:
		return &alloc.Error{Kind: kindForbidden, Field: "space",
			Detail: fmt.Sprintf("node %q of space %q may not act in space %q", id.node, id.space, space)}
	case id.role == alloc.RoleNode && op.ownNode && node != "":
		return &alloc.Error{Kind: kindForbidden, Field: "node",
			Detail: fmt.Sprintf("node %q may act on its own node only, not on %q", id.node, node)}
	case id.role == alloc.RoleNode:
		return &alloc.Error{Kind: kindForbidden,
			Detail: fmt.Sprintf("node %q may use the routes of its own node only", id.node)}
	}
	return &alloc.Error{Kind: kindForbidden,
		Detail: fmt.Sprintf("role %s may not %s %s; it needs %s", id.role, op.method, op.path, op.min)}
}

// take takes one request from key's bucket, or answers 429.
func (a *authenticator) take(w http.ResponseWriter, r *http.Request, key string, l RateLimit, now time.Time) bool {
	ok, wait := a.buckets.allow(key, l, now)
	if ok {
		return true
	}
	secs := max(1, int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	a.ps.write(w, r, &alloc.Error{Kind: kindRateLimited,
		Detail: fmt.Sprintf("too many requests from this caller; retry in %d s", secs)})
	return false
}

// identify authenticates r: a bearer token wins over a client certificate
// (it is the more specific credential), either over the web view's
// session cookie, which authenticates reads only (session.go), and any of
// them over anonymity. A write with only the cookie is answered as one
// without credentials, with a detail that says why.
func (a *authenticator) identify(r *http.Request) (identity, error) {
	if h := r.Header.Get("Authorization"); h != "" {
		return a.bearer(r.Context(), h)
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		return a.certificate(r)
	}
	secret := ""
	if a.sessions {
		secret = sessionSecret(r)
	}
	if secret != "" && sessionAllowed(r) {
		id, _, err := a.token(r.Context(), secret)
		return id, err
	}
	if a.anonymous != "" && r.TLS == nil && (!a.loopbackOnly || isLoopback(remoteHost(r))) {
		// Local development (--dev-no-auth): one person on loopback, not
		// rate-limited.
		return identity{role: a.anonymous, actor: alloc.ActorAnonymous}, nil
	}
	if secret != "" {
		return identity{}, errUnauthenticated("the web view's session cookie authenticates reads (GET, HEAD) only; send the token as Authorization: Bearer")
	}
	if r.TLS != nil {
		return identity{}, errUnauthenticated("a bearer token or a client certificate of the service's CA is required")
	}
	return identity{}, errUnauthenticated("a bearer token is required (Authorization: Bearer ipam_...)")
}

// bearer checks an Authorization header's token in the store.
func (a *authenticator) bearer(ctx context.Context, header string) (identity, error) {
	scheme, secret, _ := strings.Cut(header, " ")
	secret = strings.TrimSpace(secret)
	if !strings.EqualFold(scheme, "Bearer") {
		return identity{}, errUnauthenticated("the Authorization header must be Bearer followed by an API token")
	}
	id, _, err := a.token(ctx, secret)
	return id, err
}

// token checks a token secret in the store, wherever it came from (an
// Authorization header, a session cookie, a sign-in), and answers the
// identity it grants and the token itself.
func (a *authenticator) token(ctx context.Context, secret string) (identity, alloc.Token, error) {
	if !alloc.LooksLikeTokenSecret(secret) {
		return identity{}, alloc.Token{}, errUnauthenticated("the bearer credential is not an API token of this service")
	}
	if a.tokens == nil {
		return identity{}, alloc.Token{}, errUnauthenticated("this server accepts no API tokens")
	}
	t, err := a.tokens.TokenBySecret(ctx, alloc.HashTokenSecret(secret))
	switch {
	case alloc.IsKind(err, alloc.KindNotFound):
		return identity{}, alloc.Token{}, errUnauthenticated("unknown API token")
	case err != nil:
		return identity{}, alloc.Token{}, err
	case t.State == alloc.TokenRevoked:
		return identity{}, alloc.Token{}, errUnauthenticated("API token %q was revoked", t.Name)
	case t.State != alloc.TokenActive:
		return identity{}, alloc.Token{}, errUnauthenticated("API token %q expired at %s", t.Name, t.ExpiresAt.Format(time.RFC3339))
	}
	actor := "token:" + t.Name
	return identity{role: t.Role, actor: actor, key: actor, limit: a.limits.Client}, t, nil
}

// certificate reads the identity of a verified client certificate.
func (a *authenticator) certificate(r *http.Request) (identity, error) {
	cert := r.TLS.PeerCertificates[0]
	key := weak.Make(cert)
	if id, ok := a.certs.Load(key); ok {
		return id.(identity), nil
	}
	id, err := a.readCertificate(cert)
	if err != nil {
		return identity{}, err
	}
	if _, loaded := a.certs.LoadOrStore(key, id); !loaded {
		goruntime.AddCleanup(cert, func(k weak.Pointer[x509.Certificate]) { a.certs.Delete(k) }, key)
	}
	return id, nil
}

// readCertificate is the identity a verified client certificate names.
func (a *authenticator) readCertificate(cert *x509.Certificate) (identity, error) {
	id, err := pki.IdentityOf(cert)
	if err != nil {
		return identity{}, &alloc.Error{Kind: kindForbidden, Detail: "the client certificate is neither a node's nor an operator's"}
	}
	if id.IsNode() {
		// The history's events carry their space, so the actor stays
		// node:NAME; the rate-limit bucket is per (space, node), since
		// node names repeat across spaces.
		actor, key := "node:"+id.Node, "node:"+id.Node
		if id.Space != alloc.DefaultSpace {
			key = "node:" + id.Space + "/" + id.Node
		}
		return identity{role: alloc.RoleNode, node: id.Node, space: id.Space, actor: actor, key: key, limit: a.limits.Node}, nil
	}
	role, err := certRole(cert.Subject.Organization)
	if err != nil {
		return identity{}, err
	}
	actor := "cert:" + id.Subject
	return identity{role: role, actor: actor, key: actor, limit: a.limits.Client}, nil
}

// certRole is the role an operator certificate's Organization names. A
// certificate that names none is an admin: before roles every operator
// certificate could do everything, and those already issued keep working.
// One that names two roles, or an unknown one, is refused.
func certRole(orgs []string) (alloc.Role, error) {
	role := alloc.RoleAdmin
	named := 0
	for _, o := range orgs {
		name, ok := strings.CutPrefix(o, pki.RoleOrganizationPrefix)
		if !ok {
			continue
		}
		named++
		r, err := alloc.ParseTokenRole("", name)
		if err != nil || named > 1 {
			return "", &alloc.Error{Kind: kindForbidden,
				Detail: "the client certificate must name one role as O=ipam:admin, ipam:operator or ipam:viewer"}
		}
		role = r
	}
	return role, nil
}

// remoteHost is the peer's address without its port. Behind a proxy every
// anonymous caller shares the proxy's address; forwarded headers are not
// trusted, since any client can set them.
func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
