// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pki"
)

// issueCert is the issue-cert subcommand: it loads the CA kept in --ca-dir
// (creating a development CA there when the directory holds none) and
// writes one certificate and key into --out:
//
//	issue-cert --node NAME        a node's client certificate (CN=system:node:NAME,
//	                              URI SAN urn:ipam:space:SPACE of --space, default "default")
//	                              as node.crt and node.key, with the CA's ca.crt: the node's
//	                              /etc/ipam/pki as the CNI configurations read it
//	issue-cert --client NAME      an operator's client certificate (--role, default admin)
//	issue-cert --server HOST,...  the server's certificate for these names or IPs
func issueCert(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("issue-cert", flag.ContinueOnError)
	caDir := fs.String("ca-dir", filepath.Join(defaultDataDir(), "pki"), "directory of ca.crt and ca.key; a development CA is created there when it holds none")
	out := fs.String("out", ".", "directory to write NAME.crt and NAME.key to (--node: node.crt, node.key and ca.crt, one directory per node)")
	node := fs.String("node", "", "issue the client certificate of this node (a Kubernetes node name: a DNS-1123 subdomain)")
	space := fs.String("space", alloc.DefaultSpace, "with --node: the address space the node certificate is bound to (URI SAN urn:ipam:space:SPACE)")
	client := fs.String("client", "", "issue an operator's client certificate with this common name")
	role := fs.String("role", string(alloc.RoleAdmin), "with --client: the operator's role, admin, operator or viewer (O=ipam:ROLE)")
	server := fs.String("server", "", "issue the server certificate for these comma-separated DNS names or IPs")
	validity := fs.Duration("validity", 365*24*time.Hour, "how long the certificate is valid")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	kinds := 0
	for _, v := range []string{*node, *client, *server} {
		if v != "" {
			kinds++
		}
	}
	if kinds != 1 {
		return errors.New("issue-cert needs exactly one of --node, --client and --server")
	}
	if _, err := alloc.ParseTokenRole("role", *role); err != nil {
		return err
	}
	spaceSet := false
	fs.Visit(func(f *flag.Flag) { spaceSet = spaceSet || f.Name == "space" })
	if spaceSet && *node == "" {
		return errors.New("--space applies to --node only")
	}
	if *node != "" {
		// Refused before a development CA is created for nothing.
		if err := alloc.ValidateNodeName("node", *node); err != nil {
			return err
		}
		if err := alloc.ValidateLabelName("space", *space); err != nil {
			return err
		}
	}
	ca, created, err := pki.LoadOrCreateCA(*caDir, "ipam development CA", 10*365*24*time.Hour)
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(stdout, "created a development CA in %s\n", *caDir)
	}
	var name string
	var certPEM, keyPEM []byte
	switch {
	case *node != "":
		name = strings.TrimSuffix(pki.NodeCertFile, ".crt")
		certPEM, keyPEM, err = ca.IssueNodeInSpace(*space, *node, *validity)
	case *client != "":
		name = "client-" + *client
		certPEM, keyPEM, err = ca.IssueOperator(*client, *role, *validity)
	default:
		name = "server"
		certPEM, keyPEM, err = ca.IssueServer(strings.Split(*server, ","), *validity)
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	certPath, keyPath := filepath.Join(*out, name+".crt"), filepath.Join(*out, name+".key")
	if *node != "" {
		certPath, keyPath = filepath.Join(*out, pki.NodeCertFile), filepath.Join(*out, pki.NodeKeyFile)
		if err := refuseOtherNode(certPath, *space, *node); err != nil {
			return err
		}
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(certPath, certPEM, 0o644); err != nil {
		return err
	}
	caPath := filepath.Join(*caDir, pki.CACertFile)
	if *node != "" {
		// The node's directory is complete: the CA that verifies the server.
		if caPath, err = copyCACert(caPath, filepath.Join(*out, pki.CACertFile)); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "wrote %s and %s (CA: %s)\n", certPath, keyPath, caPath)
	return nil
}

// refuseOtherNode refuses to overwrite a node certificate of another node
// (issuing for several nodes into one --out); renewing the same node's is
// fine.
func refuseOtherNode(certPath, space, node string) error {
	data, err := os.ReadFile(certPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	cert, err := pki.ParseCert(data)
	if err != nil {
		return fmt.Errorf("%s exists and is not a certificate (%v): not overwriting it", certPath, err)
	}
	if id, err := pki.IdentityOf(cert); err != nil || id.Node != node || id.Space != space {
		return fmt.Errorf("%s holds the certificate of %q, not of node %q in space %q: use one --out directory per node", certPath, cert.Subject.CommonName, node, space)
	}
	return nil
}

// copyCACert copies the CA certificate to dst unless they are the same
// file; it answers dst.
func copyCACert(src, dst string) (string, error) {
	if a, err := filepath.Abs(src); err == nil {
		if b, err := filepath.Abs(dst); err == nil && a == b {
			return dst, nil
		}
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	return dst, os.WriteFile(dst, data, 0o644)
}

// withDevelopmentPKI points cfg at a development PKI in the data directory
// (pki/: a CA, a server certificate for this host and one node certificate
// for it, plus an operator's certificate for curl), creating what is
// missing, so that a server started without TLS flags still speaks mutual
// TLS. Production passes its own certificates.
func withDevelopmentPKI(cfg config, log *slog.Logger) (config, error) {
	dir := filepath.Join(cfg.DataDir, "pki")
	ca, created, err := pki.LoadOrCreateCA(dir, "ipam development CA", 10*365*24*time.Hour)
	if err != nil {
		return cfg, err
	}
	host, err := os.Hostname()
	if err != nil {
		return cfg, err
	}
	host = strings.ToLower(host)
	const validity = 365 * 24 * time.Hour
	type issuer struct {
		name  string
		issue func() ([]byte, []byte, error)
	}
	issuers := []issuer{
		{"server", func() ([]byte, []byte, error) {
			return ca.IssueServer([]string{"localhost", "127.0.0.1", "::1", host}, validity)
		}},
		{"client-admin", func() ([]byte, []byte, error) { return ca.IssueOperator("admin", string(alloc.RoleAdmin), validity) }},
	}
	// Node certificates name Kubernetes node names only; a host name that
	// is none (an underscore, say) gets no node certificate.
	if err := alloc.ValidateNodeName("node", host); err == nil {
		issuers = append(issuers, issuer{"node-" + host, func() ([]byte, []byte, error) { return ca.IssueNode(host, validity) }})
	} else {
		log.Warn("development PKI: no node certificate for this host", "host", host, "error", err.Error())
	}
	for _, c := range issuers {
		certPath, keyPath := filepath.Join(dir, c.name+".crt"), filepath.Join(dir, c.name+".key")
		if _, err := os.Stat(certPath); err == nil {
			continue
		}
		certPEM, keyPEM, err := c.issue()
		if err != nil {
			return cfg, err
		}
		if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
			return cfg, err
		}
		if err := os.WriteFile(certPath, certPEM, 0o644); err != nil {
			return cfg, err
		}
	}
	cfg.TLSCertFile, cfg.TLSKeyFile = filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	cfg.ClientCAFile = filepath.Join(dir, pki.CACertFile)
	log.Info("mutual TLS with the development PKI", "dir", dir, "createdCA", created,
		"curl", fmt.Sprintf("curl --cacert %[1]s/ca.crt --cert %[1]s/client-admin.crt --key %[1]s/client-admin.key https://localhost%s/readyz", dir, portOf(cfg.Listen)))
	return cfg, nil
}

// portOf answers ":PORT" of a listen address, or "" when it has none.
func portOf(listen string) string {
	if i := strings.LastIndex(listen, ":"); i >= 0 {
		return listen[i:]
	}
	return ""
}
