// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// Defaults of the ipam section.
const (
	defaultTimeout = 10 * time.Second
	minTimeout     = 100 * time.Millisecond
	maxTimeout     = 5 * time.Minute
	// fallbackNamespace is the owner namespace when the runtime names none.
	fallbackNamespace = "cni"
)

// netConf is the part of the network configuration on stdin the shim reads.
type netConf struct {
	CNIVersion string          `json:"cniVersion"`
	Name       string          `json:"name"`
	IPAM       json.RawMessage `json:"ipam"`
	DNS        types.DNS       `json:"dns"`
	Args       *struct {
		CNI map[string]any `json:"cni"`
	} `json:"args"`
	// Present only on GC; nil when absent, empty when the runtime lists none.
	ValidAttachments  *[]types.GCAttachment `json:"cni.dev/valid-attachments"`
	LegacyAttachments *[]types.GCAttachment `json:"cni.dev/attachments"`
}

// ipamSection is the ipam section as written.
type ipamSection struct {
	Type         string            `json:"type"`
	Server       string            `json:"server"`
	CAFile       string            `json:"caFile"`
	CertFile     string            `json:"certFile"`
	KeyFile      string            `json:"keyFile"`
	Pool         string            `json:"pool"`
	Pools        map[string]string `json:"pools"`
	Families     []string          `json:"families"`
	Routes       []json.RawMessage `json:"routes"`
	DefaultRoute *bool             `json:"defaultRoute"`
	Timeout      string            `json:"timeout"`
	Node         string            `json:"node"`
	Space        string            `json:"space"`
	Reserve      *int              `json:"reserve"`
	DataDir      string            `json:"dataDir"`
	SyncLinger   string            `json:"syncLinger"`

	// SessionCacheFile: nil means sessionFileName next to KeyFile; "" turns
	// TLS session resumption off.
	SessionCacheFile *string `json:"sessionCacheFile"`
}

// config is the validated configuration of one call.
type config struct {
	net          netConf
	server       *url.URL
	tls          *tls.Config // nil for http://
	pool         string      // empty: the service's selection rules
	pools        map[ipamclient.Family]string
	families     []ipamclient.Family
	routes       []*types.Route
	defaultRoute bool
	timeout      time.Duration
	node         string
	space        string        // empty: the service's default
	reserve      int           // addresses (per family) leased to the node in advance; 0: none
	dataDir      string        // the node-local reserve file's directory
	syncLinger   time.Duration // how long the reserve's idle sync waits for more work
}

// configError is CNI code 7 naming the field at fault.
func configError(field, format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, "invalid ipam configuration: "+field+": "+fmt.Sprintf(format, a...), "")
}

// loadConfig parses and validates stdin. It reads the TLS files, so a
// missing or unreadable certificate is a configuration error too.
func loadConfig(stdin []byte) (*config, error) {
	var nc netConf
	if err := json.Unmarshal(stdin, &nc); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("invalid network configuration: %s: %v", te.Field, err), "")
		}
		return nil, types.NewError(types.ErrDecodingFailure, "cannot decode network configuration: "+err.Error(), "")
	}
	if len(nc.IPAM) == 0 || string(nc.IPAM) == "null" {
		return nil, configError("ipam", "missing")
	}
	var s ipamSection
	dec := json.NewDecoder(bytes.NewReader(nc.IPAM))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te):
			return nil, configError("ipam."+te.Field, "wrong type: %v", err)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			// CNI's code 2: unsupported field in network configuration.
			field := "ipam." + strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			return nil, types.NewError(types.ErrUnsupportedField, "unsupported field in network configuration: "+field+": unknown key", "")
		default:
			return nil, configError("ipam", "%v", err)
		}
	}
	c := &config{net: nc, pool: s.Pool, defaultRoute: true, timeout: defaultTimeout, node: s.Node, space: s.Space}
	if err := c.setServer(s); err != nil {
		return nil, err
	}
	for k, name := range s.Pools {
		fam := ipamclient.Family(k)
		switch {
		case fam != ipamclient.Ipv4 && fam != ipamclient.Ipv6:
			return nil, configError("ipam.pools."+k, "unknown family; the keys are \"ipv4\" and \"ipv6\"")
		case name == "":
			return nil, configError("ipam.pools."+k, "empty; omit it to let the service choose")
		}
		if c.pools == nil {
			c.pools = map[ipamclient.Family]string{}
		}
		c.pools[fam] = name
	}
	seen := map[ipamclient.Family]bool{}
	if s.Families != nil && len(s.Families) == 0 {
		return nil, configError("ipam.families", "empty; omit it to lease every family of the pool")
	}
	for i, f := range s.Families {
		fam := ipamclient.Family(f)
		if fam != ipamclient.Ipv4 && fam != ipamclient.Ipv6 {
			return nil, configError(fmt.Sprintf("ipam.families[%d]", i), "%q is neither \"ipv4\" nor \"ipv6\"", f)
		}
		if seen[fam] {
			return nil, configError(fmt.Sprintf("ipam.families[%d]", i), "%q listed twice", f)
		}
		seen[fam] = true
		c.families = append(c.families, fam)
	}
	for i, raw := range s.Routes {
		var r types.Route
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, configError(fmt.Sprintf("ipam.routes[%d]", i), "%v", err)
		}
		if r.Dst.IP == nil {
			return nil, configError(fmt.Sprintf("ipam.routes[%d].dst", i), "missing")
		}
		if r.GW != nil && (r.GW.To4() == nil) != (r.Dst.IP.To4() == nil) {
			return nil, configError(fmt.Sprintf("ipam.routes[%d].gw", i), "%s is not of the family of dst %s", r.GW, r.Dst.String())
		}
		c.routes = append(c.routes, &r)
	}
	if s.DefaultRoute != nil {
		c.defaultRoute = *s.DefaultRoute
	}
	if s.Timeout != "" {
		d, err := time.ParseDuration(s.Timeout)
		if err != nil {
			return nil, configError("ipam.timeout", "%q is not a duration such as \"10s\"", s.Timeout)
		}
		if d < minTimeout || d > maxTimeout {
			return nil, configError("ipam.timeout", "%v is outside %v to %v", d, minTimeout, maxTimeout)
		}
		c.timeout = d
	}
	if c.node == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return nil, configError("ipam.node", "not set and the host name is unknown: %v", err)
		}
		c.node = strings.ToLower(h)
	}
	if strings.ContainsAny(c.node, "/?#% ") {
		return nil, configError("ipam.node", "%q is not a node name", c.node)
	}
	if err := c.setReserve(s); err != nil {
		return nil, err
	}
	if strings.ContainsAny(c.space, "/?#%& ") {
		return nil, configError("ipam.space", "%q is not a space name", c.space)
	}
	if strings.ContainsAny(c.pool, "/?#%& ") {
		return nil, configError("ipam.pool", "%q is not a pool name", c.pool)
	}
	for f, name := range c.pools {
		if strings.ContainsAny(name, "/?#%& ") {
			return nil, configError("ipam.pools."+string(f), "%q is not a pool name", name)
		}
	}
	return c, nil
}

// setServer validates the server URL and loads the TLS material.
func (c *config) setServer(s ipamSection) error {
	if s.Server == "" {
		return configError("ipam.server", "missing")
	}
	u, err := url.Parse(s.Server)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return configError("ipam.server", "%q is not a URL such as https://ipam.example:8443", s.Server)
	}
	c.server = u
	switch u.Scheme {
	case "http":
		// In a fixed order, so the same configuration always names the
		// same field.
		for _, k := range []struct{ field, v string }{{"ipam.caFile", s.CAFile}, {"ipam.certFile", s.CertFile}, {"ipam.keyFile", s.KeyFile}, {"ipam.sessionCacheFile", ptrValue(s.SessionCacheFile)}} {
			if k.v != "" {
				return configError(k.field, "set, but the server %s is plain http", s.Server)
			}
		}
		return nil
	case "https":
	default:
		return configError("ipam.server", "scheme %q: use https (http only for local development)", u.Scheme)
	}
	if s.CertFile == "" {
		return configError("ipam.certFile", "missing: an https server needs the node's client certificate")
	}
	if s.KeyFile == "" {
		return configError("ipam.keyFile", "missing: an https server needs the key of the client certificate")
	}
	if _, err := os.Stat(s.CertFile); err != nil {
		return configError("ipam.certFile", "%v", err)
	}
	if _, err := os.Stat(s.KeyFile); err != nil {
		return configError("ipam.keyFile", "%v", err)
	}
	cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
	if err != nil {
		return configError("ipam.certFile", "with ipam.keyFile: %v", err)
	}
	c.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	sessions := filepath.Join(filepath.Dir(s.KeyFile), sessionFileName)
	if s.SessionCacheFile != nil {
		sessions = *s.SessionCacheFile
		if sessions != "" && !filepath.IsAbs(sessions) {
			return configError("ipam.sessionCacheFile", "%q is not an absolute path", sessions)
		}
	}
	var caPEM []byte
	if s.CAFile != "" {
		pem, err := os.ReadFile(s.CAFile)
		if err != nil {
			return configError("ipam.caFile", "%v", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return configError("ipam.caFile", "%s holds no PEM certificate", s.CAFile)
		}
		c.tls.RootCAs = roots
		caPEM = pem
	}
	if sessions != "" {
		// Each process resumes the TLS session of the one before, made
		// with the same certificate and CA.
		c.tls.ClientSessionCache = newFileSessionCache(sessions, cert.Certificate[0], caPEM)
	}
	return nil
}

// cniArgs are the CNI_ARGS keys the shim reads; others are ignored.
type cniArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE types.UnmarshallableString //nolint:revive // the CNI_ARGS key
	K8S_POD_NAME      types.UnmarshallableString //nolint:revive // the CNI_ARGS key
	K8S_POD_UID       types.UnmarshallableString //nolint:revive // the CNI_ARGS key
}

// owner is the lease owner from CNI_ARGS, then args.cni, then the fallback
// (namespace "cni", name from the container ID).
func (c *config) owner(envArgs, containerID string) (ipamclient.Owner, error) {
	a := cniArgs{CommonArgs: types.CommonArgs{IgnoreUnknown: true}}
	if err := types.LoadArgs(envArgs, &a); err != nil {
		return ipamclient.Owner{}, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS: "+err.Error(), "")
	}
	pick := func(env types.UnmarshallableString, key string) string {
		if env != "" {
			return string(env)
		}
		if c.net.Args != nil {
			if v, ok := c.net.Args.CNI[key].(string); ok {
				return v
			}
		}
		return ""
	}
	o := ipamclient.Owner{
		Namespace: pick(a.K8S_POD_NAMESPACE, "K8S_POD_NAMESPACE"),
		Name:      pick(a.K8S_POD_NAME, "K8S_POD_NAME"),
	}
	if uid := pick(a.K8S_POD_UID, "K8S_POD_UID"); uid != "" {
		o.Uid = &uid
	}
	if o.Namespace == "" {
		o.Namespace = fallbackNamespace
	}
	if o.Name == "" {
		o.Name = containerLabel(containerID)
	}
	return o, nil
}

// containerLabel makes a DNS label of a container ID: lower case, every
// character outside a-z, 0-9 replaced by '-', at most 63 characters, no '-'
// at either end; "container" when nothing is left.
func containerLabel(id string) string {
	b := []byte(strings.ToLower(id))
	for i, ch := range b {
		if (ch < 'a' || ch > 'z') && (ch < '0' || ch > '9') {
			b[i] = '-'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	s := strings.Trim(string(b), "-")
	if s == "" {
		return "container"
	}
	return s
}

// setReserve validates the reserve's size and directory (see reserve.go).
func (c *config) setReserve(s ipamSection) error {
	c.reserve = defaultReserve
	if s.Reserve != nil {
		c.reserve = *s.Reserve
	}
	if c.reserve < 0 || c.reserve > maxReserve {
		return configError("ipam.reserve", "%d is outside 0 (no reserve) to %d", c.reserve, maxReserve)
	}
	c.syncLinger = defaultSyncLinger
	if s.SyncLinger != "" {
		d, err := time.ParseDuration(s.SyncLinger)
		if err != nil || d < 0 || d > maxSyncLinger {
			return configError("ipam.syncLinger", "%q is not a duration from 0s to %v", s.SyncLinger, maxSyncLinger)
		}
		c.syncLinger = d
	}
	c.dataDir = s.DataDir
	if c.dataDir == "" {
		name := c.net.Name
		if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
			name = "_unnamed"
		}
		c.dataDir = filepath.Join(defaultDataDir, name)
	} else if !filepath.IsAbs(c.dataDir) {
		return configError("ipam.dataDir", "%q is not an absolute path", c.dataDir)
	}
	return nil
}

// ptrValue is *p, or "" for nil.
func ptrValue(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
