// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"time"

	"github.com/ipam-dev/ipam/internal/pki"
)

// certValidity is long enough for any test run.
const certValidity = 24 * time.Hour

// pkiFiles are the PEM files of a cluster's credentials, paths under its
// directory.
type pkiFiles struct {
	caCert, serverCert, serverKey, saKey, saPub string
	// The admin's client certificate, in group system:masters.
	caPEM, adminCertPEM, adminKeyPEM []byte
}

// writePKI creates a cluster's CA, the API server's serving certificate
// (loopback and the in-cluster names of the kubernetes Service), an admin
// client certificate in group system:masters, and the service-account
// signing key pair, as files in dir.
func writePKI(dir string) (*pkiFiles, error) {
	ca, err := pki.NewCA("kubetest-ca", certValidity)
	if err != nil {
		return nil, err
	}
	serverCert, serverKey, err := ca.IssueServer([]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
		"kubernetes.default.svc.cluster.local", "127.0.0.1", "::1", serviceIP}, certValidity)
	if err != nil {
		return nil, err
	}
	adminCert, adminKey, err := ca.IssueKubeClient("kubetest-admin", []string{"system:masters"}, certValidity)
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := pki.EncodeKey(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}

	f := &pkiFiles{
		caCert:       filepath.Join(dir, "ca.crt"),
		serverCert:   filepath.Join(dir, "apiserver.crt"),
		serverKey:    filepath.Join(dir, "apiserver.key"),
		saKey:        filepath.Join(dir, "sa.key"),
		saPub:        filepath.Join(dir, "sa.pub"),
		caPEM:        pki.EncodeCert(ca.Cert),
		adminCertPEM: adminCert,
		adminKeyPEM:  adminKey,
	}
	for path, data := range map[string][]byte{
		f.caCert:     f.caPEM,
		f.serverCert: serverCert,
		f.serverKey:  serverKey,
		f.saKey:      saKeyPEM,
		f.saPub:      pemBlock("PUBLIC KEY", saPubDER),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
