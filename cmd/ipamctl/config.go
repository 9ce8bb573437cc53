// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// configFile is ~/.config/ipamctl/config.yaml: named contexts, each a
// server with its credentials, and the one used by default. It is shaped
// like a kubeconfig reduced to what one service needs (a context is its
// cluster and user in one).
//
//	current-context: prod
//	contexts:
//	- name: prod
//	  server: https://ipam.example:8443
//	  token: ipam_...
//	  ca-file: /etc/ipam/ca.crt
//	- name: local
//	  server: http://localhost:8080
type configFile struct {
	CurrentContext string          `json:"current-context,omitempty"`
	Contexts       []configContext `json:"contexts"`
}

// configContext is one context. Relative file names are relative to the
// config file's directory, as kubeconfig's are.
type configContext struct {
	Name     string `json:"name"`
	Server   string `json:"server,omitempty"`
	Token    string `json:"token,omitempty"`
	CAFile   string `json:"ca-file,omitempty"`
	CertFile string `json:"cert-file,omitempty"`
	KeyFile  string `json:"key-file,omitempty"`
	Insecure bool   `json:"insecure-skip-tls-verify,omitempty"`
	Space    string `json:"space,omitempty"`
}

// context returns the context of that name, or nil.
func (f *configFile) context(name string) *configContext {
	for i := range f.Contexts {
		if f.Contexts[i].Name == name {
			return &f.Contexts[i]
		}
	}
	return nil
}

func (f *configFile) names() string {
	var n []string
	for _, c := range f.Contexts {
		n = append(n, c.Name)
	}
	if len(n) == 0 {
		return "none"
	}
	return strings.Join(n, ", ")
}

// defaultServer is make run's address, so that a first try needs no
// configuration.
const defaultServer = "http://localhost:8080"

// Environment variables, below flags and above the config file.
const (
	envServer   = "IPAM_SERVER"
	envToken    = "IPAM_TOKEN"
	envCAFile   = "IPAM_CA_FILE"
	envCertFile = "IPAM_CERT_FILE"
	envKeyFile  = "IPAM_KEY_FILE"
	envConfig   = "IPAMCTL_CONFIG"
)

// configPath is the config file to read and write: --config, else
// $IPAMCTL_CONFIG, else ipamctl/config.yaml under $XDG_CONFIG_HOME or
// ~/.config. explicit says the user named it, so that its absence is worth
// saying.
func (a *app) configPath() (path string, explicit bool, err error) {
	if a.conn.given["config"] {
		return a.conn.configFile, true, nil
	}
	if p := a.getenv(envConfig); p != "" {
		return p, true, nil
	}
	if d := a.getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "ipamctl", "config.yaml"), false, nil
	}
	home := a.getenv("HOME")
	if home == "" {
		return "", false, nil // no config file to look for
	}
	return filepath.Join(home, ".config", "ipamctl", "config.yaml"), false, nil
}

// loadConfig reads the config file; a missing file is an empty one.
func (a *app) loadConfig() (*configFile, string, error) {
	path, _, err := a.configPath()
	if err != nil || path == "" {
		return &configFile{}, path, err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &configFile{}, path, nil
	}
	if err != nil {
		return nil, path, fmt.Errorf("config file: %w", err)
	}
	var f configFile
	// Strict, so that a misspelt key (certfile) is an error rather than a
	// setting silently left out.
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, path, fmt.Errorf("config file %s: %w", path, err)
	}
	seen := map[string]bool{}
	for i, c := range f.Contexts {
		if c.Name == "" {
			return nil, path, fmt.Errorf("config file %s: contexts[%d] has no name", path, i)
		}
		if seen[c.Name] {
			return nil, path, fmt.Errorf("config file %s: context %q is there twice", path, c.Name)
		}
		seen[c.Name] = true
	}
	return &f, path, nil
}

// saveConfig writes f to path, readable by its owner only since contexts
// hold tokens, through a temporary file so that a failed write leaves the
// old file whole.
func saveConfig(path string, f *configFile) error {
	if path == "" {
		return errors.New("no config file: set HOME, IPAMCTL_CONFIG or --config")
	}
	b, err := yaml.Marshal(f)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// settings is what a command connects with, and where each value came
// from (for `config view` and for errors).
type settings struct {
	client ipamclient.Config
	space  string
	// context is the name of the context used, or "".
	context string
	// serverFrom says where the server came from ("--server",
	// "$IPAM_SERVER", a context, "the default"), for errors.
	serverFrom string
}

// resolve applies the precedence flags > environment > config file >
// defaults to each setting.
func (a *app) resolve() (settings, error) {
	f, path, err := a.loadConfig()
	if err != nil {
		return settings{}, err
	}
	c := &a.conn
	var ctx *configContext
	name := f.CurrentContext
	if c.given["context"] {
		name = c.context
	}
	if name != "" {
		ctx = f.context(name)
		if ctx == nil {
			if c.given["context"] {
				return settings{}, usageErrorf("--context: no context %q in %s (contexts: %s)", name, path, f.names())
			}
			return settings{}, fmt.Errorf("config file %s: current-context %q is not among its contexts (%s)", path, name, f.names())
		}
	}
	if ctx == nil {
		ctx = &configContext{}
	}
	// pick is the value of one setting and where it came from.
	pick := func(flag string, flagValue string, env string, file string) (string, string) {
		if c.given[flag] {
			return flagValue, "--" + flag
		}
		if v := a.getenv(env); v != "" {
			return v, "$" + env
		}
		return file, fmt.Sprintf("context %q of %s", ctx.Name, path)
	}
	s := settings{context: ctx.Name}
	s.client.Server, s.serverFrom = pick("server", c.server, envServer, ctx.Server)
	if s.client.Server == "" {
		s.client.Server, s.serverFrom = defaultServer, "the default"
	}
	// A context's credentials are for its own server: pointed elsewhere by
	// a flag or the environment, they are not sent there.
	own := *ctx
	if ctx.Server == "" || strings.TrimRight(ctx.Server, "/") != strings.TrimRight(s.client.Server, "/") {
		own = configContext{Space: ctx.Space}
	}
	dir := filepath.Dir(path)
	s.client.Token, _ = pick("token", c.token, envToken, own.Token)
	s.client.CAFile, _ = pick("ca-file", c.caFile, envCAFile, relTo(dir, own.CAFile))
	s.client.CertFile, _ = pick("cert-file", c.certFile, envCertFile, relTo(dir, own.CertFile))
	s.client.KeyFile, _ = pick("key-file", c.keyFile, envKeyFile, relTo(dir, own.KeyFile))
	s.client.Insecure = own.Insecure
	if c.given["insecure-skip-tls-verify"] {
		s.client.Insecure = c.insecure
	}
	s.client.Timeout = c.timeout
	s.client.UserAgent = "ipamctl"
	s.space = ctx.Space
	if c.given["space"] {
		s.space = c.space
	}
	return s, nil
}

// relTo resolves a file name of the config file against its directory.
func relTo(dir, name string) string {
	if name == "" || filepath.IsAbs(name) {
		return name
	}
	return filepath.Join(dir, name)
}

// client connects with the resolved settings.
func (a *app) client() (*ipamclient.ClientWithResponses, settings, error) {
	s, err := a.resolve()
	if err != nil {
		return nil, s, err
	}
	a.server = s.client.Server + " (from " + s.serverFrom + ")"
	c, err := s.client.NewClient()
	return c, s, err
}

// spaceParam is the space to send: nil for the default, so that requests
// carry no parameter the user did not ask for.
func (s settings) spaceParam() *string {
	if s.space == "" {
		return nil
	}
	return &s.space
}
