package api

import (
	"fmt"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pki"
)

// authorizeNode confines a node to its own node. A caller that presented a
// node certificate (pki: CN=system:node:NAME) may reach the health endpoints
// and the routes under /v1/nodes/{node} of its own name, nothing else: not
// another node's leases, blocks or reconcile, and not pools or releases by
// address. Operators' certificates are not confined. With requireCert, a
// TLS request without a verified certificate reaches the health endpoints
// only (401 elsewhere); plain HTTP (local development) is not checked.
func authorizeNode(ps problems, requireCert bool) ipamv1.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			health := r.URL.Path == "/healthz" || r.URL.Path == "/readyz"
			if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
				if requireCert && r.TLS != nil && !health {
					ps.write(w, r, &alloc.Error{Kind: kindUnauthenticated, Detail: "a client certificate of the service's CA is required"})
					return
				}
				next.ServeHTTP(w, r)
				return
			}
			id, err := pki.IdentityOf(r.TLS.PeerCertificates[0])
			if err != nil {
				ps.write(w, r, &alloc.Error{Kind: kindForbidden, Detail: "the client certificate is neither a node's nor an operator's"})
				return
			}
			actor := "cert:" + id.Subject
			if id.IsNode() {
				actor = "node:" + id.Node
			}
			r = r.WithContext(alloc.WithActor(r.Context(), actor))
			node := chi.URLParam(r, "node")
			switch {
			case !id.IsNode(), node == id.Node, health:
				next.ServeHTTP(w, r)
			case node != "":
				ps.write(w, r, &alloc.Error{Kind: kindForbidden, Field: "node",
					Detail: fmt.Sprintf("node %q may act on its own node only, not on %q", id.Node, node)})
			default:
				ps.write(w, r, &alloc.Error{Kind: kindForbidden,
					Detail: fmt.Sprintf("node %q may use the routes of its own node only", id.Node)})
			}
		})
	}
}
