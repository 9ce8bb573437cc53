// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pki"
	"github.com/ipam-dev/ipam/internal/store"
)

// specOperations reads every operation of api/openapi.yaml: operationId
// to method and path, and whether it declares `security: []` (public).
func specOperations(t *testing.T) map[string]struct {
	method, path string
	public       bool
} {
	t.Helper()
	data, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]yaml.Node `yaml:"paths"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	ops := map[string]struct {
		method, path string
		public       bool
	}{}
	for path, item := range doc.Paths {
		for method, node := range item {
			if method == "parameters" {
				continue
			}
			var op struct {
				OperationID string                 `yaml:"operationId"`
				Security    *[]map[string][]string `yaml:"security"`
			}
			if err := node.Decode(&op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			if op.OperationID == "" {
				t.Fatalf("%s %s has no operationId", method, path)
			}
			ops[op.OperationID] = struct {
				method, path string
				public       bool
			}{strings.ToUpper(method), path, op.Security != nil && len(*op.Security) == 0}
		}
	}
	return ops
}

// The role table (roles.go) and the spec name the same operations with the
// same methods and paths; public operations are exactly those the spec
// exempts from security; and the declared roles keep the rules of roles.go:
// viewers read, writes need an operator at least, tokens and spaces are
// an admin's.
func TestRoleTableMatchesSpec(t *testing.T) {
	spec := specOperations(t)
	for id, s := range spec {
		a, ok := operations[id]
		switch {
		case !ok:
			t.Errorf("operation %s (%s %s) has no role in roles.go", id, s.method, s.path)
		case a.method != s.method || a.path != s.path:
			t.Errorf("operation %s: roles.go says %s %s, the spec %s %s", id, a.method, a.path, s.method, s.path)
		case (a.min == public) != s.public:
			t.Errorf("operation %s: public in roles.go %v, in the spec (security: []) %v", id, a.min == public, s.public)
		}
	}
	for id, a := range operations {
		if _, ok := spec[id]; !ok {
			t.Errorf("roles.go declares %s, which the spec lacks", id)
		}
		if a.min == public {
			continue
		}
		read := a.method == http.MethodGet
		// The consistency check reads whole tables for seconds: a load
		// only an admin may put on the database, though it changes nothing.
		adminOnly := strings.HasPrefix(a.path, "/v1/tokens") || (strings.HasPrefix(a.path, "/v1/spaces") && !read) ||
			a.path == "/v1/consistency"
		switch {
		case adminOnly && a.min != alloc.RoleAdmin:
			t.Errorf("%s: tokens, space changes and the consistency check are an admin's, not %s's", id, a.min)
		case !adminOnly && read && a.min != alloc.RoleViewer:
			t.Errorf("%s: a read needs viewer, not %s", id, a.min)
		case !adminOnly && !read && a.min != alloc.RoleOperator:
			t.Errorf("%s: a write needs operator, not %s", id, a.min)
		case a.ownNode && !strings.HasPrefix(a.path, "/v1/nodes/{node}"):
			t.Errorf("%s: ownNode on a path without {node}", id)
		}
	}
}

// authServer is an API over mutual TLS (certificates verified when given,
// as cmd/server) on env e's store, with no anonymous role.
type authServer struct {
	t    *testing.T
	url  string
	addr string // host:port of url
	ca   *pki.CA
	pool *x509.CertPool
}

func newAuthServer(t *testing.T, e *env, o Options) *authServer {
	t.Helper()
	ca, err := pki.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sc, sk, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(sc, sk)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	o.IsUnavailable = store.IsUnavailable
	srv := httptest.NewUnstartedServer(NewHandler(StoresOf(e.store), o))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.VerifyClientCertIfGiven,
		MinVersion: tls.VersionTLS12}
	// cmd/server's timeouts: a slow client meets the same bounds here.
	srv.Config.ReadHeaderTimeout, srv.Config.ReadTimeout, srv.Config.WriteTimeout = 5*time.Second, 30*time.Second, 30*time.Second
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return &authServer{t: t, url: srv.URL, addr: srv.Listener.Addr().String(), ca: ca, pool: pool}
}

// client answers an HTTPS client presenting certPEM (nil: none).
func (s *authServer) client(certPEM, keyPEM []byte) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: s.tlsConfig(certPEM, keyPEM)}, Timeout: 30 * time.Second}
}

// tlsConfig is the client side of a connection presenting certPEM (nil:
// none).
func (s *authServer) tlsConfig(certPEM, keyPEM []byte) *tls.Config {
	cfg := &tls.Config{RootCAs: s.pool}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			s.t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

// operatorCaller is a caller presenting an operator certificate of s's CA.
func (s *authServer) operatorCaller() caller {
	s.t.Helper()
	return s.certCaller("operator")(s.ca.IssueOperator("platform", "operator", time.Hour))
}

// nodeCaller is a caller presenting the node certificate of node.
func (s *authServer) nodeCaller(node string) caller {
	s.t.Helper()
	return s.certCaller(node)(s.ca.IssueNode(node, time.Hour))
}

// certCaller answers a function making the caller name out of a
// certificate as s.ca's Issue methods answer it (a failed issue fails the
// test).
func (s *authServer) certCaller(name string) func(certPEM, keyPEM []byte, err error) caller {
	return func(certPEM, keyPEM []byte, err error) caller {
		s.t.Helper()
		if err != nil {
			s.t.Fatal(err)
		}
		return caller{name: name, client: s.client(certPEM, keyPEM), base: s.url}
	}
}

// jsonBody is v as a request body.
func jsonBody(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// caller is one identity of the role table.
type caller struct {
	name   string
	client *http.Client
	token  string // a bearer secret, or ""
	node   string // what {node} becomes in this caller's requests ("" = the sample's)
	// space is the ?space= this caller's requests add ("" adds none: the
	// default space); nodeSpace the space of its node certificate.
	space, nodeSpace string
	base             string
}

func (c caller) do(t *testing.T, method, path, body string) response {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, c.base+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	res, err := c.client.Do(req)
	if err != nil {
		t.Fatalf("%s: %s %s: %v", c.name, method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// mustToken stores a token of role directly and answers its secret.
func mustToken(t *testing.T, e *env, name string, role alloc.Role) string {
	t.Helper()
	secret, hash := alloc.NewTokenSecret()
	if _, err := e.store.CreateToken(t.Context(), alloc.TokenSpec{Name: name, Role: role, TTL: 30 * 24 * time.Hour, CreatedBy: "test"}, hash); err != nil {
		t.Fatal(err)
	}
	return secret
}

// authSnapshot is env.snapshot plus the token table.
func authSnapshot(e *env) snapshot {
	s := e.snapshot()
	var n int64
	var digest string
	// Without last_used_at: authenticating records a token's use, which is
	// not a change the refused request made.
	if err := e.db.QueryRow(e.t.Context(), `SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
		FROM (SELECT id, name, role, secret_sha256, created_at, created_by, expires_at, revoked_at FROM api_tokens) t`).Scan(&n, &digest); err != nil {
		e.t.Fatal(err)
	}
	s["api_tokens"] = fmt.Sprintf("%d rows, md5 %s", n, digest)
	return s
}

// roleSample is one request per operation that succeeds for a caller
// allowed to make it. setup (run before each call, as admin) makes what
// the request needs and answers values for {placeholders} in path.
type roleSample struct {
	path, body string
	node       string // {node} for callers that are not nodes; default node-a
	setup      func(node string) map[string]string
}

// TestRoleTable sends every operation of the spec as every kind of caller
// (admin, operator and viewer tokens, a node certificate on its own node
// and on another node, the same certificate in another address space, a
// node certificate of another space in the default one, no credentials)
// and checks the answer against the role roles.go declares: 2xx when
// allowed, 403 forbidden when not, 401 unauthenticated without
// credentials; a refused request changes nothing. An operation without a
// sample fails the test.
func TestRoleTable(t *testing.T) {
	e := newEnv(t, nil)
	s := newAuthServer(t, e, Options{})
	nodeCert, nodeKey, err := s.ca.IssueNode("node-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	plain, nodeA := s.client(nil, nil), s.client(nodeCert, nodeKey)
	t2Cert, t2Key, err := s.ca.IssueNodeInSpace("tenant2", "node-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	callers := []caller{
		{name: "admin", client: plain, token: mustToken(t, e, "admin", alloc.RoleAdmin), base: s.url},
		{name: "operator", client: plain, token: mustToken(t, e, "operator", alloc.RoleOperator), base: s.url},
		{name: "viewer", client: plain, token: mustToken(t, e, "viewer", alloc.RoleViewer), base: s.url},
		{name: "node (own node)", client: nodeA, node: "node-a", base: s.url},
		{name: "node (other node)", client: nodeA, node: "node-b", base: s.url},
		// Node names repeat across clusters: node-a of default is not
		// node-a of tenant2, on routes with {node} or without.
		{name: "node (own node, other space)", client: nodeA, node: "node-a", space: "tenant2", base: s.url},
		{name: "node of tenant2 (same name, default space)", client: s.client(t2Cert, t2Key), node: "node-a", nodeSpace: "tenant2", base: s.url},
		{name: "anonymous", client: plain, base: s.url},
	}
	admin := callers[0]
	must := func(want int, method, path, body string) []byte {
		t.Helper()
		r := admin.do(t, method, path, body)
		if r.status != want && !(method == "PUT" && r.status == 200) { // PUT: registered or updated
			t.Fatalf("setup %s %s: %d, want %d: %s", method, path, r.status, want, r.body)
		}
		return r.body
	}
	// Every caller allowed to carve carves node-a a block: more than the
	// default per-node limit of /24 blocks (5).
	must(201, "POST", "/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24},"maxBlocksPerNode":64}}`)
	must(201, "PUT", "/v1/nodes/node-a", `{}`)
	must(201, "PUT", "/v1/nodes/node-b", `{}`)
	// tenant2 has the same pool and nodes, so a request let through
	// there would succeed rather than fail for want of them.
	must(201, "POST", "/v1/spaces", `{"name":"tenant2"}`)
	must(201, "POST", "/v1/pools?space=tenant2", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`)
	must(201, "PUT", "/v1/nodes/node-a?space=tenant2", `{}`)
	must(201, "POST", "/v1/lb-pools", `{"name":"vip","spec":{"blocks":[{"cidr":"192.168.1.0/24"}]}}`)
	must(201, "POST", "/v1/lb-pools?space=tenant2", `{"name":"vip","spec":{"blocks":[{"cidr":"192.168.1.0/24"}]}}`)
	must(201, "POST", "/v1/cidr-groups", `{"name":"corp","externalCIDRs":["10.30.0.0/16"]}`)
	must(201, "POST", "/v1/cidr-groups?space=tenant2", `{"name":"corp","externalCIDRs":["10.30.0.0/16"]}`)
	leaseBody := func(cid string) string {
		return `{"owner":{"namespace":"ns","name":"pod-` + cid + `"},"containerID":"` + cid + `","interface":"eth0"}`
	}
	lease := func(node, cid string) map[string]string {
		var a struct {
			Addresses []struct{ Address string } `json:"addresses"`
		}
		r := admin.do(t, "POST", "/v1/nodes/"+node+"/leases", leaseBody(cid))
		if r.status != 201 && r.status != 200 {
			t.Fatalf("setup lease: %d %s", r.status, r.body)
		}
		if err := json.Unmarshal(r.body, &a); err != nil || len(a.Addresses) == 0 {
			t.Fatalf("setup lease: %v %s", err, r.body)
		}
		return map[string]string{"{addr}": strings.Split(a.Addresses[0].Address, "/")[0]}
	}
	samples := map[string]roleSample{
		"getHealthz":  {path: "/healthz"},
		"getReadyz":   {path: "/readyz"},
		"listSpaces":  {path: "/v1/spaces"},
		"createSpace": {path: "/v1/spaces", body: `{"name":"extra"}`},
		"getSpace":    {path: "/v1/spaces/default"},
		"deleteSpace": {path: "/v1/spaces/doomed", setup: func(string) map[string]string {
			must(201, "POST", "/v1/spaces", `{"name":"doomed"}`)
			return nil
		}},
		"listPools":  {path: "/v1/pools"},
		"createPool": {path: "/v1/pools", body: `{"name":"second","spec":{"ipv4":{"cidrs":["10.20.0.0/16"],"maskSize":24}}}`},
		"getPool":    {path: "/v1/pools/default"},
		"updatePool": {path: "/v1/pools/default", body: `{"spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24},"maxBlocksPerNode":64}}`},
		"deletePool": {path: "/v1/pools/doomed", setup: func(string) map[string]string {
			must(201, "POST", "/v1/pools", `{"name":"doomed","spec":{"ipv4":{"cidrs":["10.30.0.0/16"],"maskSize":24}}}`)
			return nil
		}},
		"getPoolCapacity": {path: "/v1/pools/default/capacity"},
		"listPoolBlocks":  {path: "/v1/pools/default/blocks"},
		"listLBPools":     {path: "/v1/lb-pools"},
		"createLBPool":    {path: "/v1/lb-pools", body: `{"name":"vip2","spec":{"blocks":[{"cidr":"192.168.2.0/24"}]}}`},
		"getLBPool":       {path: "/v1/lb-pools/vip"},
		"updateLBPool":    {path: "/v1/lb-pools/vip", body: `{"spec":{"blocks":[{"cidr":"192.168.1.0/24"}],"disabled":true}}`},
		"deleteLBPool": {path: "/v1/lb-pools/doomed", setup: func(string) map[string]string {
			must(201, "POST", "/v1/lb-pools", `{"name":"doomed","spec":{"blocks":[{"start":"192.168.3.1"}]}}`)
			return nil
		}},
		"listVIPOwners": {path: "/v1/vip-owners"},
		"assignVIPs":    {path: "/v1/vip-owners/ns/web", body: `{"families":["ipv4"]}`},
		"getVIPs": {path: "/v1/vip-owners/ns/held", setup: func(string) map[string]string {
			must(200, "PUT", "/v1/vip-owners/ns/held", `{}`)
			return nil
		}},
		"releaseVIPs":     {path: "/v1/vip-owners/ns/web"},
		"listCIDRGroups":  {path: "/v1/cidr-groups"},
		"createCIDRGroup": {path: "/v1/cidr-groups", body: `{"name":"corp2","externalCIDRs":["10.30.0.0/16"]}`},
		"getCIDRGroup":    {path: "/v1/cidr-groups/corp"},
		"updateCIDRGroup": {path: "/v1/cidr-groups/corp", body: `{"externalCIDRs":["10.31.0.0/16"]}`},
		"deleteCIDRGroup": {path: "/v1/cidr-groups/doomed", setup: func(string) map[string]string {
			must(201, "POST", "/v1/cidr-groups", `{"name":"doomed"}`)
			return nil
		}},
		"getAddressCIDRGroups": {path: "/v1/addresses/10.30.0.1/cidr-groups"},
		"listNodes":            {path: "/v1/nodes"},
		"getNode":              {path: "/v1/nodes/{node}"},
		"putNode":              {path: "/v1/nodes/{node}", body: `{"labels":{"zone":"a"}}`},
		"deleteNode": {path: "/v1/nodes/{node}", node: "doomed", setup: func(string) map[string]string {
			must(201, "PUT", "/v1/nodes/doomed", `{}`)
			return nil
		}},
		"getNodeUsage": {path: "/v1/nodes/{node}/pools"},
		"listBlocks":   {path: "/v1/nodes/{node}/blocks"},
		"carveBlock":   {path: "/v1/nodes/{node}/blocks", body: `{"pool":"default","family":"ipv4"}`},
		"releaseBlock": {path: "/v1/nodes/{node}/blocks?cidr={cidr}", setup: func(node string) map[string]string {
			var b struct{ Cidr string }
			if err := json.Unmarshal(must(201, "POST", "/v1/nodes/"+node+"/blocks", `{"pool":"default","family":"ipv4"}`), &b); err != nil {
				t.Fatal(err)
			}
			return map[string]string{"{cidr}": b.Cidr}
		}},
		"allocateLease": {path: "/v1/nodes/{node}/leases", body: leaseBody("c1")},
		"getAttachment": {path: "/v1/nodes/{node}/attachments/c1/eth0", setup: func(node string) map[string]string {
			return lease(node, "c1")
		}},
		"releaseAttachment": {path: "/v1/nodes/{node}/attachments/c1/eth0"},
		"confirmAttachment": {path: "/v1/nodes/{node}/attachments/c1/eth0/confirm", setup: func(node string) map[string]string {
			return lease(node, "c1")
		}},
		"reconcileNode":         {path: "/v1/nodes/{node}/reconcile", body: `{"attachments":[{"containerID":"c1","interface":"eth0"}]}`},
		"listLeases":            {path: "/v1/leases"},
		"getAddressHistory":     {path: "/v1/addresses/10.9.0.7/history"},
		"listHistory":           {path: "/v1/history?node=node-a"},
		"checkConsistency":      {path: "/v1/consistency"},
		"getReconcileWatermark": {path: "/v1/nodes/{node}/reconcile"},
		"getStickyBindings":     {path: "/v1/sticky-bindings?identity=statefulset/ns/web/0"},
		"deleteStickyBindings":  {path: "/v1/sticky-bindings?identity=statefulset/ns/web/0"},
		"getAddress": {path: "/v1/addresses/{addr}", setup: func(string) map[string]string {
			return lease("node-a", "held")
		}},
		"releaseAddress": {path: "/v1/addresses/10.9.255.200"},
		"getSizing":      {path: "/v1/sizing?cidr=10.0.0.0/16&maskSize=24"},
		"listTokens":     {path: "/v1/tokens"},
		"createToken": {path: "/v1/tokens", body: `{"name":"fresh","role":"viewer","expiresIn":"1h"}`, setup: func(string) map[string]string {
			if err := e.store.RevokeToken(t.Context(), "fresh"); err != nil && !alloc.IsKind(err, alloc.KindNotFound) {
				t.Fatal(err)
			}
			return nil
		}},
		"revokeToken": {path: "/v1/tokens/doomed", setup: func(string) map[string]string {
			_, hash := alloc.NewTokenSecret()
			if _, err := e.store.ReplaceToken(t.Context(), alloc.TokenSpec{Name: "doomed", Role: alloc.RoleViewer, TTL: time.Hour}, hash); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
	}

	ids := slices.Sorted(maps.Keys(specOperations(t)))
	for _, id := range ids {
		a, ok := operations[id]
		sample, hasSample := samples[id]
		if !ok || !hasSample {
			t.Errorf("operation %s: no role (%v) or no sample request (%v); every operation needs both", id, ok, hasSample)
			continue
		}
		for _, c := range callers {
			want := expectedStatus(a, c)
			node := sample.node
			if node == "" {
				node = "node-a"
			}
			if c.node != "" {
				node = c.node
			}
			path := strings.ReplaceAll(sample.path, "{node}", node)
			if sample.setup != nil {
				for k, v := range sample.setup(node) {
					path = strings.ReplaceAll(path, k, v)
				}
			}
			if c.space != "" {
				sep := "?"
				if strings.Contains(path, "?") {
					sep = "&"
				}
				path += sep + "space=" + c.space
			}
			var before snapshot
			if want != 200 {
				before = authSnapshot(e)
			}
			r := c.do(t, a.method, path, sample.body)
			switch {
			case want == 200 && (r.status < 200 || r.status > 299):
				t.Errorf("%s as %s: %s %s: %d, want 2xx: %s", id, c.name, a.method, path, r.status, r.body)
			case want != 200 && r.status != want:
				t.Errorf("%s as %s: %s %s: %d, want %d: %s", id, c.name, a.method, path, r.status, want, r.body)
			case want != 200:
				p := r.problem(t)
				if kind := map[int]string{401: "unauthenticated", 403: "forbidden"}[want]; p.Type != problemTypePrefix+kind {
					t.Errorf("%s as %s: problem type %s", id, c.name, p.Type)
				}
				if want == 401 && r.header.Get("WWW-Authenticate") == "" {
					t.Errorf("%s as %s: 401 without WWW-Authenticate", id, c.name)
				}
				if after := authSnapshot(e); !maps.Equal(before, after) {
					t.Errorf("%s as %s: a refused request changed the database", id, c.name)
				}
			}
		}
	}
	for id := range samples {
		if _, ok := operations[id]; !ok {
			t.Errorf("sample for %s, an operation roles.go does not declare", id)
		}
	}
}

// expectedStatus derives a caller's answer from the declaration alone: 200
// stands for any 2xx.
func expectedStatus(a access, c caller) int {
	switch {
	case a.min == public:
		return 200
	case c.name == "anonymous":
		return 401
	case c.node != "": // node-a's certificate
		if a.ownNode && c.node == "node-a" && c.space == c.nodeSpace {
			return 200
		}
		return 403
	}
	rank := map[alloc.Role]int{alloc.RoleViewer: 1, alloc.RoleOperator: 2, alloc.RoleAdmin: 3}
	if rank[alloc.Role(c.name)] >= rank[a.min] {
		return 200
	}
	return 403
}

// An operator certificate's Organization names its role; one naming none
// is an admin; two roles or an unknown one are refused.
func TestCertificateRoles(t *testing.T) {
	e := newEnv(t, nil)
	s := newAuthServer(t, e, Options{})
	issue := func(role string) *http.Client {
		c, k, err := s.ca.IssueOperator("someone", role, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return s.client(c, k)
	}
	plainCert, plainKey, _ := s.ca.IssueClient("legacy", time.Hour)
	pool := `{"name":"p","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`
	for _, c := range []struct {
		name         string
		client       *http.Client
		read, create int
	}{
		{"viewer", issue("viewer"), 200, 403},
		{"operator", issue("operator"), 200, 201},
		{"no role (admin)", s.client(plainCert, plainKey), 200, 201},
		{"unknown role", issue("root"), 403, 403},
	} {
		cl := caller{name: c.name, client: c.client, base: s.url}
		if r := cl.do(t, "GET", "/v1/pools", ""); r.status != c.read {
			t.Errorf("%s reads pools: %d, want %d: %s", c.name, r.status, c.read, r.body)
		}
		if r := cl.do(t, "POST", "/v1/pools", pool); r.status != c.create {
			t.Errorf("%s creates a pool: %d, want %d: %s", c.name, r.status, c.create, r.body)
		}
		if r := cl.do(t, "GET", "/v1/tokens", ""); c.name != "no role (admin)" && r.status != 403 {
			t.Errorf("%s lists tokens: %d, want 403", c.name, r.status)
		}
	}
	if _, err := certRole([]string{"ipam:viewer", "ipam:admin"}); err == nil {
		t.Error("two roles accepted")
	}
	if r, err := certRole([]string{"Example Corp", "ipam:operator"}); err != nil || r != alloc.RoleOperator {
		t.Errorf("role among other organizations: %v %v", r, err)
	}
	if r, err := certRole(nil); err != nil || r != alloc.RoleAdmin {
		t.Errorf("no organization: %v %v", r, err)
	}
	var ae *alloc.Error
	if _, err := certRole([]string{"ipam:node"}); !errors.As(err, &ae) || ae.Kind != kindForbidden {
		t.Errorf("ipam:node on an operator certificate: %v", err)
	}
}
