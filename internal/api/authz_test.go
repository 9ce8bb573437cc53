package api

import (
	"encoding/json"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/pki"
)

// Over mutual TLS, a node's certificate reaches its own node only: another
// node's leases, blocks and reconcile, pools and releases by address answer
// 403 problem+json, and nothing changes; an operator's reaches everything.
func TestNodeCertificateIsConfinedToItsNode(t *testing.T) {
	e := newEnv(t, nil)
	// As cmd/server: certificates verified when given; the API refuses a
	// request without credentials.
	srv := newAuthServer(t, e, Options{})
	ca, client := srv.ca, srv.client
	opCert, opKey, _ := ca.IssueClient("platform-team", time.Hour)
	aCert, aKey, _ := ca.IssueNode("node-a", time.Hour)
	op, nodeA := client(opCert, opKey), client(aCert, aKey)

	call := func(c *http.Client, method, path, body string) (int, ipamv1.Problem) {
		t.Helper()
		req, err := http.NewRequest(method, srv.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var p ipamv1.Problem
		if res.StatusCode >= 400 {
			if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("%s %s: %d with %s", method, path, res.StatusCode, ct)
			}
			_ = json.NewDecoder(res.Body).Decode(&p)
		}
		return res.StatusCode, p
	}
	lease := func(cid string) string {
		return `{"owner":{"namespace":"ns","name":"pod-` + cid + `"},"containerID":"` + cid + `","interface":"eth0"}`
	}
	if s, p := call(op, "POST", "/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`); s != 201 {
		t.Fatalf("operator creates a pool: %d %+v", s, p)
	}
	if s, p := call(op, "POST", "/v1/nodes/node-b/leases", lease("b1")); s != 201 {
		t.Fatalf("operator leases on node-b: %d %+v", s, p)
	}
	if s, p := call(nodeA, "POST", "/v1/nodes/node-a/leases", lease("a1")); s != 201 {
		t.Fatalf("node-a leases on itself: %d %+v", s, p)
	}
	if s, p := call(nodeA, "GET", "/v1/nodes/node-a/pools", ""); s != 200 {
		t.Fatalf("node-a reads its own pool usage: %d %+v", s, p)
	}
	if s, _ := call(nodeA, "GET", "/readyz", ""); s != 200 {
		t.Fatalf("node-a readyz: %d", s)
	}
	before := e.snapshot()
	for _, c := range []struct{ method, path, body, field string }{
		{"DELETE", "/v1/nodes/node-b/attachments/b1/eth0", "", "node"},
		{"POST", "/v1/nodes/node-b/leases", lease("x"), "node"},
		{"POST", "/v1/nodes/node-b/reconcile", `{"attachments":[]}`, "node"},
		{"GET", "/v1/nodes/node-b/blocks", "", "node"},
		{"GET", "/v1/nodes/node-b/pools", "", "node"},
		{"DELETE", "/v1/addresses/10.9.1.1", "", ""},
		{"POST", "/v1/pools", `{"name":"mine","spec":{"ipv4":{"cidrs":["10.10.0.0/16"],"maskSize":24}}}`, ""},
	} {
		s, p := call(nodeA, c.method, c.path, c.body)
		if s != 403 || p.Type != "urn:ipam:problem:forbidden" || deref(p.Field, "") != c.field {
			t.Errorf("node-a %s %s: %d %+v", c.method, c.path, s, p)
		}
	}
	// Without a certificate: health only, 401 elsewhere.
	anon := client(nil, nil)
	if s, _ := call(anon, "GET", "/readyz", ""); s != 200 {
		t.Errorf("anonymous readyz: %d", s)
	}
	for _, path := range []string{"/v1/pools", "/v1/nodes/node-b/blocks"} {
		if s, p := call(anon, "GET", path, ""); s != 401 || p.Type != "urn:ipam:problem:unauthenticated" {
			t.Errorf("anonymous %s: %d %+v", path, s, p)
		}
	}
	if s, _ := call(anon, "DELETE", "/v1/nodes/node-b/attachments/b1/eth0", ""); s != 401 {
		t.Errorf("anonymous release: %d", s)
	}
	if after := e.snapshot(); !maps.Equal(after, before) {
		t.Error("a refused call changed the database")
	}
	// A certificate from another CA counts as none.
	other, _ := pki.NewCA("other CA", time.Hour)
	sCert, sKey, _ := other.IssueNode("node-b", time.Hour)
	if s, _ := call(client(sCert, sKey), "GET", "/v1/nodes/node-b/blocks", ""); s != 401 {
		t.Errorf("a certificate of another CA: %d", s)
	}
}
