package kubetest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
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
	caKey, err := newKey()
	if err != nil {
		return nil, err
	}
	caTmpl, err := certTemplate(pkix.Name{CommonName: "kubetest-ca"})
	if err != nil {
		return nil, err
	}
	caTmpl.IsCA = true
	caTmpl.BasicConstraintsValid = true
	caTmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}

	issue := func(subject pkix.Name, usage x509.ExtKeyUsage, dns []string, ips []net.IP) (certPEM, keyPEM []byte, err error) {
		key, err := newKey()
		if err != nil {
			return nil, nil, err
		}
		tmpl, err := certTemplate(subject)
		if err != nil {
			return nil, nil, err
		}
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
		tmpl.DNSNames, tmpl.IPAddresses = dns, ips
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
		if err != nil {
			return nil, nil, err
		}
		keyPEM, err = encodeKey(key)
		return pemBlock("CERTIFICATE", der), keyPEM, err
	}
	serverCert, serverKey, err := issue(pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.ParseIP(serviceIP)})
	if err != nil {
		return nil, err
	}
	adminCert, adminKey, err := issue(pkix.Name{CommonName: "kubetest-admin", Organization: []string{"system:masters"}},
		x509.ExtKeyUsageClientAuth, nil, nil)
	if err != nil {
		return nil, err
	}
	saKey, err := newKey()
	if err != nil {
		return nil, err
	}
	saKeyPEM, err := encodeKey(saKey)
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
		caPEM:        pemBlock("CERTIFICATE", caDER),
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

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func certTemplate(subject pkix.Name) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour), // a little clock skew does no harm
		NotAfter:     now.Add(certValidity),
	}, nil
}

func encodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("kubetest: encoding a key: %w", err)
	}
	return pemBlock("PRIVATE KEY", der), nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
