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
// address. Operators' certificates, and plain HTTP for local development,
// are not confined here (the TLS layer decides who may connect at all).
func authorizeNode(ps problems) ipamv1.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
				next.ServeHTTP(w, r)
				return
			}
			id, err := pki.IdentityOf(r.TLS.PeerCertificates[0])
			if err != nil {
				ps.write(w, r, &alloc.Error{Kind: kindForbidden, Detail: "the client certificate is neither a node's nor an operator's"})
				return
			}
			node := chi.URLParam(r, "node")
			switch {
			case !id.IsNode(), node == id.Node, r.URL.Path == "/healthz", r.URL.Path == "/readyz":
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
