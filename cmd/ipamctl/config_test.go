// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// writeConfig writes a config file into a fresh HOME and answers HOME and
// the file's directory.
func writeConfig(t *testing.T, content string) (home, dir string) {
	t.Helper()
	home = t.TempDir()
	dir = filepath.Join(home, ".config", "ipamctl")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return home, dir
}

// resolveWith resolves the settings of a command line and an environment
// as a command would.
func resolveWith(env map[string]string, args ...string) (settings, error) {
	a := newApp(context.Background(), &bytes.Buffer{}, &bytes.Buffer{}, func(k string) string { return env[k] })
	f := a.newFlags("test", "test").withSpace()
	if _, err := f.parse(args); err != nil {
		return settings{}, err
	}
	return a.resolve()
}

// Each setting comes from its flag, else the environment, else the config
// file's context, else the default; a context's credentials go only to
// its own server.
func TestConfigPrecedence(t *testing.T) {
	home, dir := writeConfig(t, `current-context: file
contexts:
- name: file
  server: https://file.example:8443
  token: ipam_file
  ca-file: ca.crt
  cert-file: /abs/client.crt
  key-file: /abs/client.key
  space: file-space
- name: other
  server: https://other.example
  token: ipam_other
`)
	other := filepath.Join(t.TempDir(), "other.yaml")
	if err := os.WriteFile(other, []byte("contexts:\n- name: x\n  server: https://x.example\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type want struct{ server, from, token, ca, cert, space, context string }
	fileCtx := `context "file" of ` + filepath.Join(dir, "config.yaml")
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want want
	}{
		{"the file's current context", nil, nil,
			want{"https://file.example:8443", fileCtx, "ipam_file", filepath.Join(dir, "ca.crt"), "/abs/client.crt", "file-space", "file"}},
		{"environment over file", map[string]string{"IPAM_TOKEN": "ipam_env", "IPAM_CA_FILE": "/env/ca.crt"}, nil,
			want{"https://file.example:8443", fileCtx, "ipam_env", "/env/ca.crt", "/abs/client.crt", "file-space", "file"}},
		{"flag over environment", map[string]string{"IPAM_TOKEN": "ipam_env", "IPAM_SERVER": "https://env.example"},
			[]string{"--token", "ipam_flag", "--server", "https://flag.example", "--space", "s1"},
			want{"https://flag.example", "--server", "ipam_flag", "", "", "s1", "file"}},
		{"the environment's server gets none of the context's credentials", map[string]string{"IPAM_SERVER": "https://env.example"}, nil,
			want{"https://env.example", "$IPAM_SERVER", "", "", "", "file-space", "file"}},
		{"the context's own server named again keeps them", map[string]string{"IPAM_SERVER": "https://file.example:8443/"}, nil,
			want{"https://file.example:8443/", "$IPAM_SERVER", "ipam_file", filepath.Join(dir, "ca.crt"), "/abs/client.crt", "file-space", "file"}},
		{"--context", nil, []string{"--context", "other"},
			want{"https://other.example", `context "other" of ` + filepath.Join(dir, "config.yaml"), "ipam_other", "", "", "", "other"}},
		{"IPAMCTL_CONFIG", map[string]string{"IPAMCTL_CONFIG": other}, nil,
			want{"http://localhost:8080", "the default", "", "", "", "", ""}},
		{"--config over IPAMCTL_CONFIG", map[string]string{"IPAMCTL_CONFIG": other}, []string{"--config", filepath.Join(dir, "config.yaml")},
			want{"https://file.example:8443", fileCtx, "ipam_file", filepath.Join(dir, "ca.crt"), "/abs/client.crt", "file-space", "file"}},
		{"no file at all", map[string]string{"HOME": t.TempDir()}, nil,
			want{"http://localhost:8080", "the default", "", "", "", "", ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := map[string]string{"HOME": home}
			for k, v := range c.env {
				env[k] = v
			}
			s, err := resolveWith(env, c.args...)
			if err != nil {
				t.Fatal(err)
			}
			got := want{s.client.Server, s.serverFrom, s.client.Token, s.client.CAFile, s.client.CertFile, s.space, s.context}
			if got != c.want {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}

	if _, err := resolveWith(map[string]string{"HOME": home}, "--context", "nope"); err == nil ||
		!strings.Contains(err.Error(), `--context: no context "nope"`) || !strings.Contains(err.Error(), "contexts: file, other") {
		t.Errorf("--context nope: %v", err)
	}
	bad, _ := writeConfig(t, "contexts:\n- name: a\n  certfile: x\n")
	if _, err := resolveWith(map[string]string{"HOME": bad}); err == nil || !strings.Contains(err.Error(), "certfile") {
		t.Errorf("a misspelt key: %v", err)
	}
	lost, _ := writeConfig(t, "current-context: gone\ncontexts:\n- name: a\n")
	if _, err := resolveWith(map[string]string{"HOME": lost}); err == nil || !strings.Contains(err.Error(), `current-context "gone"`) {
		t.Errorf("a current context that is not there: %v", err)
	}
}

// The same precedence against a real TLS server: the file alone
// authenticates; a bad token in the environment beats it and a good one
// on the command line beats that; a server named by the environment
// beats the file's and --server beats the environment.
func TestConfigPrecedenceAgainstServer(t *testing.T) {
	s := newService(t, true)
	s.seed(t)
	home, _ := writeConfig(t, "current-context: test\ncontexts:\n- name: test\n  server: "+s.url+"\n  token: "+s.token+"\n  ca-file: "+s.caFile+"\n")
	env := func(kv ...string) map[string]string {
		e := map[string]string{"HOME": home}
		for i := 0; i+1 < len(kv); i += 2 {
			e[kv[i]] = kv[i+1]
		}
		return e
	}
	const badToken = "ipam_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	for _, c := range []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stderr string
	}{
		{"file", env(), nil, 0, ""},
		{"env token over file", env("IPAM_TOKEN", badToken), nil, 1, "ipamctl: Unauthenticated"},
		{"flag token over env", env("IPAM_TOKEN", badToken), []string{"--token", s.token}, 0, ""},
		{"env server over file", env("IPAM_SERVER", "http://127.0.0.1:1"), nil, 1, "The server was http://127.0.0.1:1 (from $IPAM_SERVER)."},
		{"flag server over env", env("IPAM_SERVER", "http://127.0.0.1:1"), []string{"--server", s.url}, 0, ""},
		{"--context of a missing context", env(), []string{"--context", "prod"}, 2, `--context: no context "prod"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := ctlEnv(t, c.env, append([]string{"pools"}, c.args...)...)
			if r.code != c.code || !strings.Contains(r.stderr, c.stderr) || (c.code == 0 && !strings.Contains(r.stdout, "default")) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d and %q", r.code, r.stdout, r.stderr, c.code, c.stderr)
			}
		})
	}
}

// config set-context writes a context (only the flags given change it,
// files made absolute, the file readable by its owner only), use-context
// switches, view hides tokens, delete-context removes one.
func TestConfigCommands(t *testing.T) {
	home := t.TempDir()
	env := map[string]string{"HOME": home}
	ok := func(args ...string) string {
		t.Helper()
		r := ctlEnv(t, env, args...)
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("%v: exit %d, stderr %q", args, r.code, r.stderr)
		}
		return r.stdout
	}
	path := filepath.Join(home, ".config", "ipamctl", "config.yaml")
	if out := ok("config", "set-context", "prod", "--server", "https://ipam.example:8443", "--token", "ipam_secret", "--ca-file", "ca.crt"); out != `context "prod" created in `+path+"\n" {
		t.Errorf("set-context: %q", out)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("config file: %v, %v", fi, err)
	}
	ok("config", "set-context", "dev", "--server", "http://localhost:8080", "--space", "dev")
	ok("config", "set-context", "prod", "--token", "ipam_rotated")
	out := ok("config", "get-contexts")
	for _, re := range []string{`(?m)^CURRENT\s+NAME\s+SERVER\s+SPACE\s+AUTH$`, `(?m)^\*\s+prod\s+https://ipam\.example:8443\s+-\s+token$`, `(?m)^-\s+dev\s+http://localhost:8080\s+dev\s+-$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("get-contexts: no match for %s in\n%s", re, out)
		}
	}
	if out := ok("config", "current-context"); out != "prod\n" {
		t.Errorf("current-context: %q", out)
	}
	out = ok("config", "view")
	cwd, _ := os.Getwd()
	if !strings.Contains(out, "token: REDACTED") || strings.Contains(out, "ipam_rotated") || !strings.Contains(out, "ca-file: "+filepath.Join(cwd, "ca.crt")) {
		t.Errorf("view:\n%s", out)
	}
	if out := ok("config", "view", "--raw"); !strings.Contains(out, "token: ipam_rotated") || !strings.Contains(out, "server: https://ipam.example:8443") {
		t.Errorf("view --raw:\n%s", out)
	}
	ok("config", "use-context", "dev")
	s, err := resolveWith(env)
	if err != nil || s.client.Server != "http://localhost:8080" || s.space != "dev" {
		t.Errorf("after use-context dev: %+v, %v", s, err)
	}
	ok("config", "delete-context", "dev")
	if out := ok("config", "get-contexts"); strings.Contains(out, "dev") {
		t.Errorf("dev is still there:\n%s", out)
	}
	for _, c := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"config", "use-context", "dev"}, 1, `no context "dev"`},
		{[]string{"config", "current-context"}, 1, "no current context"},
		{[]string{"config", "set-context"}, 2, "missing NAME"},
		{[]string{"config", "frob"}, 2, `unknown subcommand "frob"`},
		{[]string{"config"}, 2, "missing subcommand"},
	} {
		if r := ctlEnv(t, env, c.args...); r.code != c.code || !strings.Contains(r.stderr, c.stderr) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, r.code, r.stderr, c.code, c.stderr)
		}
	}
}

// Usage errors exit 2 and name the flag or argument; help exits 0.
func TestUsage(t *testing.T) {
	env := map[string]string{"HOME": t.TempDir()}
	for _, c := range []struct {
		args   []string
		stderr string
	}{
		{nil, "Usage:"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"pools", "--bogus"}, "-bogus"},
		{[]string{"--bogus", "pools"}, "-bogus"},
		{[]string{"pools", "-o", "xml"}, `-o: want table, json or yaml, not "xml"`},
		{[]string{"pools", "--page-size", "0"}, "--page-size: want 1 to 1000"},
		{[]string{"--timeout", "soon", "pools"}, "-timeout"},
		{[]string{"pools", "extra"}, `unexpected argument "extra"`},
		{[]string{"who"}, "who ADDRESS: missing ADDRESS"},
		{[]string{"who", "10.0.0.1", "10.0.0.2"}, `unexpected argument "10.0.0.2"`},
		{[]string{"who", "10.0.0.1", "--at", "-1h"}, "--at: a duration is how long ago"},
		{[]string{"check", "--space", "x"}, "-space"},
		{[]string{"--space", "x", "check"}, "--space: this command has no address space"},
		{[]string{"pool"}, "pool: missing subcommand"},
		{[]string{"pool", "capacity"}, "missing NAME"},
		{[]string{"node"}, "missing NAME"},
		{[]string{"tokens", "frob"}, `tokens: unknown subcommand "frob"`},
		{[]string{"tokens", "create", "x", "--role", "viewer", "--expires-in", "1h", "--expires-at", "2030-01-01T00:00:00Z"}, "not both"},
		{[]string{"leases", "--namespace", "a", "--owner", "b/c"}, "two namespaces"},
	} {
		r := ctlEnv(t, env, c.args...)
		if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, c.stderr) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and %q", c.args, r.code, r.stdout, r.stderr, c.stderr)
		}
	}
	for _, c := range []struct {
		args   []string
		stdout string
	}{
		{[]string{"--help"}, "Configuration: each setting is taken from the first of"},
		{[]string{"help"}, "IPAM_SERVER, IPAM_TOKEN, IPAM_CA_FILE, IPAM_CERT_FILE,"},
		{[]string{"-h"}, "pool capacity NAME"},
		{[]string{"leases", "--help"}, "--owner string"},
		{[]string{"who", "-h"}, "--at string"},
		{[]string{"pool", "--help"}, "pool capacity NAME"},
		{[]string{"config", "--help"}, "set-context NAME"},
	} {
		r := ctlEnv(t, env, c.args...)
		if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, c.stdout) {
			t.Errorf("%v: exit %d, stderr %q, stdout %q; want 0 and %q", c.args, r.code, r.stderr, r.stdout, c.stdout)
		}
	}
}
