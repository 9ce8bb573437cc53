// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/pki"
)

// certValidity is how long the benchmark's certificates are valid.
const certValidity = 24 * time.Hour

// adminCommonName is the operator certificate that creates the space, the
// pools and the nodes: not system:node:NAME, so the service treats it as an
// administrator.
const adminCommonName = "ipam-bench-admin"

// benchPKI is a temporary CA, the server's certificate (written to dir for
// the server's flags) and the clients' certificates: one administrator and
// one certificate per node (CN=system:node:NAME, O=system:nodes), as the
// CNI plugin on each node has.
type benchPKI struct {
	dir   string
	ca    *pki.CA
	roots *x509.CertPool
	admin tls.Certificate
	// handshakes counts the TLS connections every client opened, so a
	// phase can show that requests reuse them.
	handshakes atomic.Int64

	mu    sync.Mutex
	nodes map[string]*http.Client // node -> its client, one transport each
}

// newBenchPKI makes the CA and writes ca.crt, server.crt and server.key
// (for 127.0.0.1) into dir.
func newBenchPKI(dir string) (*benchPKI, error) {
	ca, err := pki.NewCA("ipam-bench CA", certValidity)
	if err != nil {
		return nil, err
	}
	srvCert, srvKey, err := ca.IssueServer([]string{"127.0.0.1"}, certValidity)
	if err != nil {
		return nil, err
	}
	caPEM := pki.EncodeCert(ca.Cert)
	for name, data := range map[string][]byte{"ca.crt": caPEM, "server.crt": srvCert, "server.key": srvKey} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("CA certificate is no PEM")
	}
	p := &benchPKI{dir: dir, ca: ca, roots: roots, nodes: map[string]*http.Client{}}
	adminCert, adminKey, err := ca.IssueClient(adminCommonName, certValidity)
	if err != nil {
		return nil, err
	}
	if p.admin, err = tls.X509KeyPair(adminCert, adminKey); err != nil {
		return nil, err
	}
	return p, nil
}

// adminClient answers a client with the administrator's certificate.
func (p *benchPKI) adminClient() *http.Client { return p.client(p.admin, 4) }

// nodeClient answers the client of node in space, issuing its certificate
// on first use. Every worker driving the node shares it, as the plugin's calls on
// one node share the node's identity; idle connections are kept for
// perHost concurrent callers per server.
func (p *benchPKI) nodeClient(space, node string, perHost int) (*http.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := space + "/" + node
	if c, ok := p.nodes[key]; ok {
		return c, nil
	}
	certPEM, keyPEM, err := p.ca.IssueNodeInSpace(space, node, certValidity)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	c := p.client(pair, perHost)
	p.nodes[key] = c
	return c, nil
}

// writeNode writes the certificate and key of node in space as node.crt
// and node.key, with ca.crt, into dir (the CNI plugin's files).
func (p *benchPKI) writeNode(space, node, dir string) error {
	certPEM, keyPEM, err := p.ca.IssueNodeInSpace(space, node, certValidity)
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"ca.crt": pki.EncodeCert(p.ca.Cert), "node.crt": certPEM, "node.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// client is an HTTPS client presenting cert: keep-alive connections (the
// TLS handshake is paid once per connection, not per request), no
// compression, HTTP/1.1 as the server speaks it.
func (p *benchPKI) client(cert tls.Certificate, perHost int) *http.Client {
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				p.handshakes.Add(1)
				return dialer.DialContext(ctx, network, addr)
			},
			TLSClientConfig:     &tls.Config{RootCAs: p.roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
			TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConnsPerHost: perHost + 1,
			IdleConnTimeout:     100 * time.Second, // below the server's IdleTimeout (120 s): never reuse a connection it closed
			DisableCompression:  true,
		},
	}
}

// apiClient is the generated client of server over hc.
func apiClient(server string, hc *http.Client) (*ipamclient.ClientWithResponses, error) {
	return ipamclient.NewClientWithResponses(server, ipamclient.WithHTTPClient(hc))
}
