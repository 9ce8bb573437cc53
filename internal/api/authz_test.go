// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"math/big"
	"net/http"
	"net/url"
	"slices"
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
		res, err := c.Do(jsonRequest(t, method, srv.url+path, bodyOf(body)))
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

// craftNodeCert issues, bypassing pki's checks, a client certificate of
// ca with CN=system:node:NAME and O=system:nodes plus uris: what a CA
// that certified any name, or a certificate issued before spaces were
// bound, looks like.
func craftNodeCert(t *testing.T, ca *pki.CA, name string, uris ...*url.URL) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: pki.NodeCommonNamePrefix + name, Organization: []string{pki.NodesOrganization}},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err = pki.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM
}

// pathEncodings are spellings of name in a path segment that the router
// and the generated wrapper read as name: each character percent-encoded
// in upper and lower case hex, and all of them at once.
func pathEncodings(name string) []string {
	var out []string
	var all strings.Builder
	for i := range len(name) {
		for _, f := range []string{"%%%02X", "%%%02x"} {
			out = append(out, name[:i]+fmt.Sprintf(f, name[i])+name[i+1:])
		}
		fmt.Fprintf(&all, "%%%02X", name[i])
	}
	return append(out, all.String())
}

// A node certificate is authorized on exactly the node the handler acts
// on, the unescaped {node}: every percent-encoding of its own name reaches
// its own node, and no spelling of another name (encoded, double-encoded,
// with encoded slashes or dot segments) gets past the gate, on every
// route a node may use. A certificate whose name is itself an encoding
// (nod%65-b, which a CA must never issue) reaches nothing.
func TestNodeAuthorizationUsesTheUnescapedNode(t *testing.T) {
	e := newEnv(t, nil)
	s := newAuthServer(t, e, Options{})
	admin := s.certCaller("admin")(s.ca.IssueClient("platform", time.Hour))
	nodeA := s.nodeCaller("node-a")
	if r := admin.do(t, "POST", "/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`); r.status != 201 {
		t.Fatalf("pool: %d %s", r.status, r.body)
	}
	for _, n := range []string{"node-a", "node-b"} {
		if r := admin.do(t, "PUT", "/v1/nodes/"+n, `{}`); r.status != 201 {
			t.Fatalf("node %s: %d %s", n, r.status, r.body)
		}
	}
	if r := admin.do(t, "POST", "/v1/nodes/node-b/leases", `{"owner":{"namespace":"ns","name":"b"},"containerID":"c1","interface":"eth0"}`); r.status != 201 {
		t.Fatalf("lease on node-b: %d %s", r.status, r.body)
	}

	var routes []access
	for _, a := range operations {
		if a.ownNode {
			routes = append(routes, a)
		}
	}
	slices.SortFunc(routes, func(x, y access) int { return strings.Compare(x.method+x.path, y.method+y.path) })
	path := func(a access, node string) string {
		return strings.NewReplacer("{node}", node, "{containerID}", "c1", "{interface}", "eth0").Replace(a.path)
	}
	body := func(a access) string {
		if a.method == "GET" || a.method == "DELETE" {
			return ""
		}
		return "{}"
	}

	// Others' names, however spelled.
	var others []string
	others = append(others, "node-b", "Node-a", "node-A", "nod%2565-a", "node-%2561", "%256Eode-a", "node-a%2F", "node-a%2f",
		"node-a%2Fx", "x%2Fnode-a", "node-b%2F..%2Fnode-a", "node-a%2F..%2Fnode-b", "%2E%2E%2Fnode-b", "node-a%00", "node-a%20",
		"node-a.", "node-a%2E")
	others = append(others, pathEncodings("node-b")...)
	for _, enc := range pathEncodings("node-b") {
		others = append(others, strings.ReplaceAll(enc, "%", "%25")) // double encoding
	}
	before := e.snapshot()
	for _, a := range routes {
		for _, other := range others {
			p := path(a, other)
			r := nodeA.do(t, a.method, p, body(a))
			if r.status != 403 {
				t.Errorf("node-a %s %s: %d, want 403: %s", a.method, p, r.status, r.body)
				continue
			}
			if pr := r.problem(t); pr.Type != problemTypePrefix+"forbidden" {
				t.Errorf("node-a %s %s: problem %s", a.method, p, pr.Type)
			}
		}
	}
	if after := e.snapshot(); !maps.Equal(before, after) {
		t.Error("a refused request changed the database")
	}

	// Its own name, however spelled: past the gate, to node-a.
	for _, a := range routes {
		for _, own := range pathEncodings("node-a") {
			p := path(a, own)
			if r := nodeA.do(t, a.method, p, body(a)); r.status == 401 || r.status == 403 {
				t.Errorf("node-a %s %s: %d, its own node refused: %s", a.method, p, r.status, r.body)
			}
		}
	}
	for _, own := range pathEncodings("node-a") {
		r := nodeA.do(t, "GET", "/v1/nodes/"+own, "")
		var n struct{ Name string }
		if r.status != 200 || json.Unmarshal(r.body, &n) != nil || n.Name != "node-a" {
			t.Errorf("node-a GET /v1/nodes/%s: %d %s", own, r.status, r.body)
		}
	}

	// A certificate for the name nod%65-b: the handler would act on
	// node-b, so it must not pass as node-b (nor as anything else).
	forged := []string{"nod%65-b", "node-b%2F", "node%2Fb"}
	for _, name := range forged {
		c, k := craftNodeCert(t, s.ca, name)
		cl := caller{name: name, client: s.client(c, k), base: s.url}
		before := e.snapshot()
		for _, r := range []struct{ method, path, body string }{
			{"DELETE", "/v1/nodes/" + name + "/attachments/c1/eth0", ""},
			{"POST", "/v1/nodes/" + name + "/leases", `{"owner":{"namespace":"ns","name":"x"},"containerID":"c2","interface":"eth0"}`},
			{"GET", "/v1/nodes/" + name + "/blocks", ""},
		} {
			if res := cl.do(t, r.method, r.path, r.body); res.status != 403 {
				t.Errorf("certificate %q %s %s: %d, want 403: %s", name, r.method, r.path, res.status, res.body)
			}
		}
		if after := e.snapshot(); !maps.Equal(before, after) {
			t.Errorf("certificate %q changed the database", name)
		}
	}
}

// A node certificate issued before spaces were bound (no urn:ipam:space
// URI) acts in the default space only; one of tenant2 in tenant2 only,
// on its own node there, and never on routes without {node}.
func TestNodeCertificateIsConfinedToItsSpace(t *testing.T) {
	e := newEnv(t, nil)
	s := newAuthServer(t, e, Options{})
	admin := s.certCaller("admin")(s.ca.IssueClient("platform", time.Hour))
	for _, r := range []struct{ method, path, body string }{
		{"POST", "/v1/spaces", `{"name":"tenant2"}`},
		{"POST", "/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`},
		{"POST", "/v1/pools?space=tenant2", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`},
	} {
		if res := admin.do(t, r.method, r.path, r.body); res.status != 201 {
			t.Fatalf("%s %s: %d %s", r.method, r.path, res.status, res.body)
		}
	}
	legacyCert, legacyKey := craftNodeCert(t, s.ca, "node-a")
	t2Cert, t2Key, err := s.ca.IssueNodeInSpace("tenant2", "node-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	lease := func(cid string) string {
		return `{"owner":{"namespace":"ns","name":"` + cid + `"},"containerID":"` + cid + `","interface":"eth0"}`
	}
	for _, c := range []struct {
		name        string
		client      *http.Client
		own, others []string // query strings of its space and of the others
	}{
		{"legacy (no space claim)", s.client(legacyCert, legacyKey), []string{"", "?space=default"}, []string{"?space=tenant2", "?space=", "?space=Default", "?space=default&space=tenant2"}},
		{"tenant2", s.client(t2Cert, t2Key), []string{"?space=tenant2"}, []string{"", "?space=default", "?space=tenant3", "?space=tenant2&space=default"}},
	} {
		cl := caller{name: c.name, client: c.client, base: s.url}
		for i, q := range c.own {
			cid := fmt.Sprintf("own%d", i)
			if r := cl.do(t, "POST", "/v1/nodes/node-a/leases"+q, lease(cid)); r.status != 201 {
				t.Errorf("%s leases with %q: %d %s", c.name, q, r.status, r.body)
			}
			if r := cl.do(t, "DELETE", "/v1/nodes/node-a/attachments/"+cid+"/eth0"+q, ""); r.status != 204 {
				t.Errorf("%s releases with %q: %d %s", c.name, q, r.status, r.body)
			}
		}
		before := e.snapshot()
		for _, q := range c.others {
			for _, r := range []struct{ method, path, body string }{
				{"POST", "/v1/nodes/node-a/leases", lease("x")},
				{"GET", "/v1/nodes/node-a/blocks", ""},
				{"DELETE", "/v1/nodes/node-a/attachments/own0/eth0", ""},
				{"GET", "/v1/leases", ""},
				{"GET", "/v1/pools", ""},
			} {
				res := cl.do(t, r.method, r.path+q, r.body)
				if res.status != 403 {
					t.Errorf("%s %s %s%s: %d, want 403: %s", c.name, r.method, r.path, q, res.status, res.body)
					continue
				}
				if p := res.problem(t); p.Type != problemTypePrefix+"forbidden" {
					t.Errorf("%s %s %s%s: %s", c.name, r.method, r.path, q, p.Type)
				}
			}
		}
		if after := e.snapshot(); !maps.Equal(before, after) {
			t.Errorf("%s: a refused request changed the database", c.name)
		}
	}
}
