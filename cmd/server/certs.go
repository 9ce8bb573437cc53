package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ipam-dev/ipam/internal/pki"
)

// issueCert is the issue-cert subcommand: it loads the CA kept in --ca-dir
// (creating a development CA there when the directory holds none) and
// writes one certificate and key into --out:
//
//	issue-cert --node NAME        a node's client certificate (CN=system:node:NAME)
//	issue-cert --client NAME      an operator's client certificate
//	issue-cert --server HOST,...  the server's certificate for these names or IPs
func issueCert(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("issue-cert", flag.ContinueOnError)
	caDir := fs.String("ca-dir", filepath.Join(defaultDataDir(), "pki"), "directory of ca.crt and ca.key; a development CA is created there when it holds none")
	out := fs.String("out", ".", "directory to write NAME.crt and NAME.key to")
	node := fs.String("node", "", "issue the client certificate of this node")
	client := fs.String("client", "", "issue an operator's client certificate with this common name")
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
		name = "node-" + *node
		certPEM, keyPEM, err = ca.IssueNode(*node, *validity)
	case *client != "":
		name = "client-" + *client
		certPEM, keyPEM, err = ca.IssueClient(*client, *validity)
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
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(certPath, certPEM, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s and %s (CA: %s)\n", certPath, keyPath, filepath.Join(*caDir, pki.CACertFile))
	return nil
}
