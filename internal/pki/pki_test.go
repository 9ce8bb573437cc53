// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package pki

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func mustCA(t *testing.T) *CA {
	t.Helper()
	ca, err := NewCA("ipam test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// A node certificate verifies against the CA and names its node; an
// operator's names none; a half-formed node certificate is refused.
func TestIdentityOf(t *testing.T) {
	ca := mustCA(t)
	certPEM, _, err := ca.IssueNode("worker-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ParseCert(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("node certificate does not verify: %v", err)
	}
	id, err := IdentityOf(cert)
	if err != nil || id.Node != "worker-1" || id.Space != "default" || !id.IsNode() || !id.MayActOn("default", "worker-1") ||
		id.MayActOn("default", "worker-2") || id.MayActOn("tenant2", "worker-1") {
		t.Fatalf("node identity %+v %v", id, err)
	}
	opPEM, _, err := ca.IssueClient("platform-team", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	op, _ := ParseCert(opPEM)
	if id, err := IdentityOf(op); err != nil || id.IsNode() || !id.MayActOn("tenant2", "worker-2") {
		t.Fatalf("operator identity %+v %v", id, err)
	}
	for _, subject := range []pkix.Name{
		{CommonName: "system:node:"},                                         // no name
		{CommonName: "system:node:worker-1"},                                 // no organization
		{CommonName: "system:node:worker-1", Organization: []string{"evil"}}, // wrong organization
	} {
		if id, err := IdentityOf(&x509.Certificate{Subject: subject}); err == nil {
			t.Errorf("%v accepted as %+v", subject, id)
		}
	}
	// Only Kubernetes node names (DNS-1123 subdomains): nothing the API
	// would unescape or split into another name.
	for _, bad := range []string{"", "a:b", "a/b", "a b", "nod%65-b", "node%2Fb", "Node-A", "-a", "a..b", "a_b",
		strings.Repeat("a", 254)} {
		if _, _, err := ca.IssueNode(bad, time.Hour); err == nil {
			t.Errorf("node certificate issued for %q", bad)
		}
		if id, err := IdentityOf(&x509.Certificate{Subject: pkix.Name{CommonName: "system:node:" + bad,
			Organization: []string{NodesOrganization}}}); err == nil {
			t.Errorf("a node certificate for %q accepted as %+v", bad, id)
		}
	}
	if _, _, err := ca.IssueNode("worker-1.zone-a.example", time.Hour); err != nil {
		t.Errorf("a DNS subdomain refused: %v", err)
	}
	if _, _, err := ca.IssueClient("system:node:x", time.Hour); err == nil {
		t.Error("an operator certificate passed for a node's")
	}
}

// A node certificate names its address space in a URI SAN; one without
// (issued before spaces were bound) is of the space "default"; two spaces
// or an invalid one are refused.
func TestNodeCertificateSpace(t *testing.T) {
	ca := mustCA(t)
	certPEM, _, err := ca.IssueNodeInSpace("tenant2", "node-a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ParseCert(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != "urn:ipam:space:tenant2" ||
		cert.Subject.CommonName != "system:node:node-a" || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		t.Fatalf("subject %v, URIs %v", cert.Subject, cert.URIs)
	}
	id, err := IdentityOf(cert)
	if err != nil || id.Space != "tenant2" || id.Node != "node-a" || id.MayActOn("default", "node-a") || !id.MayActOn("tenant2", "node-a") {
		t.Fatalf("identity %+v %v", id, err)
	}
	defPEM, _, _ := ca.IssueNode("node-a", time.Hour)
	def, _ := ParseCert(defPEM)
	if len(def.URIs) != 1 || def.URIs[0].String() != "urn:ipam:space:default" {
		t.Errorf("IssueNode URIs %v, want urn:ipam:space:default", def.URIs)
	}
	node := pkix.Name{CommonName: "system:node:node-a", Organization: []string{NodesOrganization}}
	if id, err := IdentityOf(&x509.Certificate{Subject: node}); err != nil || id.Space != "default" {
		t.Errorf("a certificate without a space: %+v %v", id, err)
	}
	other, _ := url.Parse("https://example.com/x")
	if id, err := IdentityOf(&x509.Certificate{Subject: node, URIs: []*url.URL{other}}); err != nil || id.Space != "default" {
		t.Errorf("a certificate with an unrelated URI: %+v %v", id, err)
	}
	for _, uris := range [][]*url.URL{
		{SpaceURI("default"), SpaceURI("tenant2")},
		{{Scheme: "urn", Opaque: "ipam:space:Bad_Space"}},
		{{Scheme: "urn", Opaque: "ipam:space:"}},
	} {
		if id, err := IdentityOf(&x509.Certificate{Subject: node, URIs: uris}); err == nil {
			t.Errorf("URIs %v accepted as %+v", uris, id)
		}
	}
	for _, bad := range []string{"", "Tenant", "a.b", "a/b"} {
		if _, _, err := ca.IssueNodeInSpace(bad, "node-a", time.Hour); err == nil {
			t.Errorf("a node certificate issued in space %q", bad)
		}
	}
}

// The CA is created once in a directory and loaded afterwards; a directory
// holding half a CA is an error.
func TestLoadOrCreateCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	ca, created, err := LoadOrCreateCA(dir, "ipam dev CA", time.Hour)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, CAKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	again, created, err := LoadOrCreateCA(dir, "ipam dev CA", time.Hour)
	if err != nil || created || !again.Cert.Equal(ca.Cert) {
		t.Fatalf("load: %v %v", created, err)
	}
	if err := os.Remove(filepath.Join(dir, CAKeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateCA(dir, "ipam dev CA", time.Hour); err == nil {
		t.Fatal("half a CA was accepted")
	}
}

// Mutual TLS end to end: the server verifies node certificates against the
// CA and reads the node from the connection; an unknown client is refused.
func TestMutualTLS(t *testing.T) {
	ca := mustCA(t)
	srvCert, srvKey, err := ca.IssueServer([]string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nodeCert, nodeKey, err := ca.IssueNode("worker-1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := IdentityOf(r.TLS.PeerCertificates[0])
		if err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		_, _ = io.WriteString(w, id.Node)
	}))
	pair, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	defer srv.Close()

	client := func(certPEM, keyPEM []byte) *http.Client {
		cfg := &tls.Config{RootCAs: pool}
		if certPEM != nil {
			pair, err := tls.X509KeyPair(certPEM, keyPEM)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	res, err := client(nodeCert, nodeKey).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != "worker-1" {
		t.Fatalf("server saw node %q", body)
	}
	if _, err := client(nil, nil).Get(srv.URL); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	other := mustCA(t)
	strangerCert, strangerKey, _ := other.IssueNode("worker-1", time.Hour)
	if _, err := client(strangerCert, strangerKey).Get(srv.URL); err == nil {
		t.Fatal("a certificate from another CA was served")
	}
}

// A Kubernetes client certificate carries the user as its common name and
// the groups as organizations, for client authentication only.
func TestIssueKubeClient(t *testing.T) {
	ca, err := NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := ca.IssueKubeClient("admin", []string{"system:masters", "ops"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseCert(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	// The organizations are one SET in the certificate: their order is
	// DER's, not the caller's.
	if c.Subject.CommonName != "admin" || !slices.Equal(slices.Sorted(slices.Values(c.Subject.Organization)), []string{"ops", "system:masters"}) ||
		!slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("subject %v, usage %v", c.Subject, c.ExtKeyUsage)
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: certPool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("not signed by the CA: %v", err)
	}
	if _, _, err := ca.IssueKubeClient("", nil, time.Hour); err == nil {
		t.Error("a certificate without a user was issued")
	}
}

func certPool(ca *CA) *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}
