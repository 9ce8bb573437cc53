// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/pki"
)

// With --tls-cert-file, --tls-key-file and --client-ca-file the server
// speaks mutual TLS only, and a node certificate reaches its own node only.
func TestServeMutualTLS(t *testing.T) {
	srv := startMutualTLS(t, pgtest.NewDatabase(t))
	ca, base, client := srv.ca, srv.base, srv.client
	node := client(ca.IssueNode("node-a", time.Hour))
	res, err := node.Get(base + "/readyz")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("node readyz: %v %v", res, err)
	}
	res.Body.Close()
	res, err = node.Get(base + "/v1/nodes/node-b/blocks")
	if err != nil || res.StatusCode != http.StatusForbidden {
		t.Fatalf("node-a on node-b: %v %v", res, err)
	}
	res.Body.Close()
	// Without a certificate: the probes' endpoints only.
	anon := client(nil, nil, nil)
	for path, want := range map[string]int{"/readyz": 200, "/healthz": 200, "/v1/pools": 401, "/v1/nodes/node-a/blocks": 401} {
		res, err := anon.Get(base + path)
		if err != nil || res.StatusCode != want {
			t.Fatalf("%s without a certificate: %v %v, want %d", path, res, err, want)
		}
		res.Body.Close()
	}
	// A certificate of another CA is never accepted: the client does not
	// even offer it (it is not of the CA the server asks for), so it counts
	// as none.
	other, _ := pki.NewCA("other CA", time.Hour)
	res, err = client(other.IssueClient("intruder", time.Hour)).Get(base + "/v1/pools")
	if err == nil {
		res.Body.Close()
	}
	if err == nil && res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a certificate of another CA got %d", res.StatusCode)
	}
}

// Without TLS flags the server speaks mutual TLS with a development PKI it
// creates in its data directory (and reuses on the next start).
func TestServeDevelopmentPKI(t *testing.T) {
	dataDir := t.TempDir()
	base := startServer(t, pgtest.NewDatabase(t), "--data-dir", dataDir)
	base = strings.Replace(base, "http://", "https://", 1)
	dir := filepath.Join(dataDir, "pki")
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "client-admin.crt"), filepath.Join(dir, "client-admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	admin := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}}}, Timeout: 10 * time.Second}
	res, err := admin.Get(base + "/v1/pools")
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("operator over the development PKI: %v %v", res, err)
	}
	res.Body.Close()
	host, _ := os.Hostname()
	if _, err := os.Stat(filepath.Join(dir, "node-"+strings.ToLower(host)+".crt")); err != nil {
		t.Fatalf("no node certificate for this host: %v", err)
	}
	// Plain HTTP on the TLS port gets no API answer.
	res, err = (&http.Client{Timeout: 5 * time.Second}).Get(strings.Replace(base, "https://", "http://", 1) + "/v1/pools")
	if err == nil {
		res.Body.Close()
		if res.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP was served on the TLS port")
		}
	}
}

func TestTLSFlagsGoTogether(t *testing.T) {
	env := func(string) string { return "" }
	for _, args := range [][]string{
		{"--tls-cert-file", "x.crt"},
		{"--tls-key-file", "x.key"},
		{"--client-ca-file", "ca.crt"},
		{"--insecure-http", "--tls-cert-file", "x.crt", "--tls-key-file", "x.key"},
	} {
		if _, err := parseConfig("serve", append(args, "--database-url", "postgres://x"), env); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// issue-cert creates a development CA once and issues node, operator and
// server certificates that verify against it; bad requests are refused.
func TestIssueCert(t *testing.T) {
	dir := t.TempDir()
	caDir, out := filepath.Join(dir, "pki"), filepath.Join(dir, "out")
	var sb strings.Builder
	for _, args := range [][]string{
		{"--node", "worker-1"}, {"--client", "platform"}, {"--server", "ipam.example,127.0.0.1"},
	} {
		if err := issueCert(append([]string{"--ca-dir", caDir, "--out", out}, args...), &sb); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	if strings.Count(sb.String(), "created a development CA") != 1 {
		t.Fatalf("output:\n%s", sb.String())
	}
	ca, err := pki.LoadCA(filepath.Join(caDir, pki.CACertFile), filepath.Join(caDir, pki.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	for _, name := range []string{"node", "client-platform", "server"} {
		data, err := os.ReadFile(filepath.Join(out, name+".crt"))
		if err != nil {
			t.Fatal(err)
		}
		cert, err := pki.ParseCert(data)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if name == "node" {
			if id, err := pki.IdentityOf(cert); err != nil || id.Node != "worker-1" || id.Space != "default" {
				t.Errorf("node identity %+v %v, want worker-1 in space default", id, err)
			}
		}
	}
	// --out holds the node's whole directory, as deploy/cni's configurations read it.
	if caOut, err := os.ReadFile(filepath.Join(out, pki.CACertFile)); err != nil || !bytes.Equal(caOut, pki.EncodeCert(ca.Cert)) {
		t.Errorf("%s in --out: %v", pki.CACertFile, err)
	}
	// Renewing the node's certificate is fine; overwriting another node's,
	// or the same node name's of another space, is not.
	if err := issueCert([]string{"--ca-dir", caDir, "--out", out, "--node", "worker-1"}, io.Discard); err != nil {
		t.Errorf("renewing worker-1: %v", err)
	}
	for _, args := range [][]string{{"--node", "worker-2"}, {"--node", "worker-1", "--space", "tenant2"}} {
		if err := issueCert(append([]string{"--ca-dir", caDir, "--out", out}, args...), io.Discard); err == nil ||
			!strings.Contains(err.Error(), "one --out directory per node") {
			t.Errorf("%v over worker-1's node.crt: %v", args, err)
		}
	}
	// A node of another space, in a directory of its own.
	out2 := filepath.Join(dir, "out-tenant2")
	if err := issueCert([]string{"--ca-dir", caDir, "--out", out2, "--node", "worker-1", "--space", "tenant2"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(out2, pki.NodeCertFile)); err != nil {
		t.Error(err)
	} else if cert, err := pki.ParseCert(data); err != nil {
		t.Error(err)
	} else if id, err := pki.IdentityOf(cert); err != nil || id.Node != "worker-1" || id.Space != "tenant2" {
		t.Errorf("tenant2 node identity %+v %v", id, err)
	}
	// Only Kubernetes node names: a name the API would unescape into
	// another node's (nod%65-b is node-b) is never certified.
	for _, args := range [][]string{{}, {"--node", "a", "--client", "b"}, {"--node", "bad name"}, {"extra"},
		{"--node", "nod%65-b"}, {"--node", "node%2Fb"}, {"--node", "Node-B"}, {"--node", "node_b"},
		{"--node", "a", "--space", "Bad_Space"}, {"--client", "b", "--space", "tenant2"}} {
		if err := issueCert(append([]string{"--ca-dir", caDir, "--out", out}, args...), io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// mutualTLS is a server started with certificates of a test CA, answering
// over mutual TLS at base.
type mutualTLS struct {
	ca    *pki.CA
	base  string
	roots *x509.CertPool
	t     *testing.T
}

// startMutualTLS starts the server on dbURL with a server certificate of a
// new test CA and that CA for its clients, and extra flags.
func startMutualTLS(t *testing.T, dbURL string, extra ...string) *mutualTLS {
	t.Helper()
	dir := t.TempDir()
	ca, err := pki.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sc, sk, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	base := startServer(t, dbURL, append([]string{
		"--tls-cert-file", write("server.crt", sc), "--tls-key-file", write("server.key", sk),
		"--client-ca-file", write("ca.crt", pki.EncodeCert(ca.Cert))}, extra...)...)
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	return &mutualTLS{ca: ca, base: strings.Replace(base, "http://", "https://", 1), roots: roots, t: t}
}

// client is an HTTPS client presenting the certificate certPEM (none when
// nil), in the order pki's Issue methods answer; it fails the test on err.
func (m *mutualTLS) client(certPEM, keyPEM []byte, err error) *http.Client {
	m.t.Helper()
	if err != nil {
		m.t.Fatal(err)
	}
	cfg := &tls.Config{RootCAs: m.roots}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			m.t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 30 * time.Second}
}
