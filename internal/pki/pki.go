// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package pki holds the certificates of mutual TLS between the service and
// its clients: a development CA kept in the server's data directory, the
// certificates it issues, and the identity a client certificate carries.
//
// A node authenticates like a kubelet: its certificate's subject is
// CN=system:node:<node name>, O=system:nodes, and the service lets it act on
// its own node only. Node names repeat across clusters, so a node's identity
// is (space, node): the certificate names its address space in a URI SAN
// urn:ipam:space:<space>; a node certificate without one (issued before
// spaces were bound) is of the space "default". Any other verified client
// certificate is an operator (platform team, controllers) and may act on
// every node.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

const (
	// NodeCommonNamePrefix starts the common name of a node certificate.
	NodeCommonNamePrefix = "system:node:"
	// NodesOrganization is the organization of node certificates.
	NodesOrganization = "system:nodes"
	// RoleOrganizationPrefix starts the organization that names an
	// operator certificate's role: O=ipam:admin, ipam:operator or
	// ipam:viewer. A certificate naming none is an admin (internal/api).
	RoleOrganizationPrefix = "ipam:"
	// SpaceURIPrefix starts the URI SAN that binds a node certificate to
	// its address space: urn:ipam:space:NAME.
	SpaceURIPrefix = "urn:ipam:space:"
)

// CA is a certificate authority that issues the service's certificates.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA creates a self-signed CA (ECDSA P-256) valid for validity.
func NewCA(commonName string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl, err := template(pkix.Name{CommonName: commonName}, validity)
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.MaxPathLenZero = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// File names of a CA in a directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// File names of a node's credentials in its directory (/etc/ipam/pki on a
// node, next to CACertFile): what `ipam-server issue-cert --node` writes and
// the CNI configurations in deploy/cni read.
const (
	NodeCertFile = "node.crt"
	NodeKeyFile  = "node.key"
)

// LoadOrCreateCA loads the CA kept in dir, or creates one there (key file
// mode 0600) when dir holds none. A dir with only one of the two files is
// an error rather than a silent replacement.
func LoadOrCreateCA(dir, commonName string, validity time.Duration) (ca *CA, created bool, err error) {
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		ca, err := LoadCA(certPath, keyPath)
		return ca, false, err
	case !errors.Is(certErr, os.ErrNotExist) || !errors.Is(keyErr, os.ErrNotExist):
		return nil, false, fmt.Errorf("pki: %s holds one of %s and %s but not both", dir, CACertFile, CAKeyFile)
	}
	ca, err = NewCA(commonName, validity)
	if err != nil {
		return nil, false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, err
	}
	keyPEM, err := EncodeKey(ca.Key)
	if err != nil {
		return nil, false, err
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, false, err
	}
	if err := os.WriteFile(certPath, EncodeCert(ca.Cert), 0o644); err != nil {
		return nil, false, err
	}
	return ca, true, nil
}

// LoadCA reads a CA certificate and its key from PEM files.
func LoadCA(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	cert, err := ParseCert(certPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", certPath, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("pki: %s is not a CA certificate", certPath)
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("pki: %s: %w", keyPath, err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// IssueServer issues a server certificate for hosts (DNS names or IPs).
func (ca *CA) IssueServer(hosts []string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if len(hosts) == 0 {
		return nil, nil, errors.New("pki: a server certificate needs at least one host")
	}
	return ca.issue(pkix.Name{CommonName: hosts[0]}, hosts, x509.ExtKeyUsageServerAuth, validity)
}

// IssueNode issues the client certificate of node in the space "default"
// (see IssueNodeInSpace).
func (ca *CA) IssueNode(node string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	return ca.IssueNodeInSpace(alloc.DefaultSpace, node, validity)
}

// IssueNodeInSpace issues the client certificate of node in space:
// CN=system:node:NODE, O=system:nodes and the URI SAN urn:ipam:space:SPACE
// (see the package doc). node must be a Kubernetes node name (a DNS-1123
// subdomain) and space a space name (a DNS-1123 label): a name the API
// would read differently (a percent sign, a slash) must never be certified.
func (ca *CA) IssueNodeInSpace(space, node string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if err := alloc.ValidateNodeName("node", node); err != nil {
		return nil, nil, fmt.Errorf("pki: %w", err)
	}
	if err := alloc.ValidateLabelName("space", space); err != nil {
		return nil, nil, fmt.Errorf("pki: %w", err)
	}
	name := pkix.Name{CommonName: NodeCommonNamePrefix + node, Organization: []string{NodesOrganization}}
	return ca.issueWith(name, nil, []*url.URL{SpaceURI(space)}, x509.ExtKeyUsageClientAuth, validity)
}

// SpaceURI is the URI SAN that binds a node certificate to space.
func SpaceURI(space string) *url.URL {
	u, err := url.Parse(SpaceURIPrefix + space)
	if err != nil { // a DNS label always parses
		panic(err)
	}
	return u
}

// IssueClient issues an operator's client certificate named commonName.
func (ca *CA) IssueClient(commonName string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if commonName == "" || strings.HasPrefix(commonName, NodeCommonNamePrefix) {
		return nil, nil, fmt.Errorf("pki: %q is not an operator name", commonName)
	}
	return ca.issue(pkix.Name{CommonName: commonName}, nil, x509.ExtKeyUsageClientAuth, validity)
}

// IssueOperator issues an operator's client certificate whose
// organization names its role (ipam:ROLE); the API checks the role.
func (ca *CA) IssueOperator(commonName, role string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if commonName == "" || strings.HasPrefix(commonName, NodeCommonNamePrefix) {
		return nil, nil, fmt.Errorf("pki: %q is not an operator name", commonName)
	}
	if role == "" || strings.ContainsAny(role, ":/ ") {
		return nil, nil, fmt.Errorf("pki: %q is not a role", role)
	}
	name := pkix.Name{CommonName: commonName, Organization: []string{RoleOrganizationPrefix + role}}
	return ca.issue(name, nil, x509.ExtKeyUsageClientAuth, validity)
}

// IssueKubeClient issues a client certificate in Kubernetes' convention,
// user as the common name and groups as organizations, as a
// kube-apiserver with --client-ca-file reads it (the test clusters of
// internal/kubetest sign their admin, group system:masters, with it).
func (ca *CA) IssueKubeClient(user string, groups []string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if user == "" {
		return nil, nil, errors.New("pki: a Kubernetes client certificate needs a user")
	}
	return ca.issue(pkix.Name{CommonName: user, Organization: groups}, nil, x509.ExtKeyUsageClientAuth, validity)
}

func (ca *CA) issue(subject pkix.Name, hosts []string, usage x509.ExtKeyUsage, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	return ca.issueWith(subject, hosts, nil, usage, validity)
}

func (ca *CA) issueWith(subject pkix.Name, hosts []string, uris []*url.URL, usage x509.ExtKeyUsage, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl, err := template(subject, validity)
	if err != nil {
		return nil, nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	tmpl.URIs = uris
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = EncodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

func template(subject pkix.Name, validity time.Duration) (*x509.Certificate, error) {
	if validity <= 0 {
		return nil, errors.New("pki: validity must be positive")
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    now.Add(-5 * time.Minute), // clock skew between machines
		NotAfter:     now.Add(validity),
	}, nil
}

// Identity is who a verified client certificate says the caller is.
type Identity struct {
	// Node is the node name of a node certificate; empty for an operator.
	Node string
	// Space is the address space of a node certificate (its URI SAN
	// urn:ipam:space:NAME, "default" when it has none); empty for an
	// operator, who may act in every space.
	Space string
	// Subject is the certificate's common name, for logs.
	Subject string
}

// IsNode reports whether the caller is a node (and may act on Node only).
func (id Identity) IsNode() bool { return id.Node != "" }

// MayActOn reports whether the caller may act on node's leases and blocks
// in space.
func (id Identity) MayActOn(space, node string) bool {
	return !id.IsNode() || (id.Space == space && id.Node == node)
}

// IdentityOf reads the identity of a certificate already verified against
// the CA. A common name with the node prefix must also carry the nodes
// organization and a Kubernetes node name (a DNS-1123 subdomain), else it
// is refused: a half-formed node certificate must not pass for an
// operator's, and a name the API reads differently after unescaping (a
// percent sign, a slash) must not pass for another node's. A node
// certificate names at most one space (urn:ipam:space:NAME); none means
// "default", as for the certificates issued before spaces were bound.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	cn := cert.Subject.CommonName
	node, isNode := strings.CutPrefix(cn, NodeCommonNamePrefix)
	if !isNode {
		return Identity{Subject: cn}, nil
	}
	if node == "" {
		return Identity{}, fmt.Errorf("pki: certificate %q names no node", cn)
	}
	if !slices.Contains(cert.Subject.Organization, NodesOrganization) {
		return Identity{}, fmt.Errorf("pki: node certificate %q lacks organization %s", cn, NodesOrganization)
	}
	if err := alloc.ValidateNodeName("node", node); err != nil {
		return Identity{}, fmt.Errorf("pki: node certificate %q: %w", cn, err)
	}
	space := ""
	for _, u := range cert.URIs {
		name, ok := strings.CutPrefix(u.String(), SpaceURIPrefix)
		if !ok {
			continue
		}
		if space != "" {
			return Identity{}, fmt.Errorf("pki: node certificate %q names two spaces", cn)
		}
		if err := alloc.ValidateLabelName("space", name); err != nil {
			return Identity{}, fmt.Errorf("pki: node certificate %q: %w", cn, err)
		}
		space = name
	}
	if space == "" {
		space = alloc.DefaultSpace
	}
	return Identity{Node: node, Space: space, Subject: cn}, nil
}

// EncodeCert returns cert as PEM.
func EncodeCert(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// EncodeKey returns key as PKCS #8 PEM.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseCert reads the first certificate of PEM data.
func ParseCert(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

// ParseKey reads a PKCS #8 or EC private key from PEM data.
func ParseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM key")
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
		return nil, errors.New("key cannot sign")
	}
	return x509.ParseECPrivateKey(block.Bytes)
}
