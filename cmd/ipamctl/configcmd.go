// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
)

// runConfig is `ipamctl config SUBCOMMAND`: reads and writes the contexts
// of the config file, as `kubectl config` does a kubeconfig's.
func runConfig(a *app, name string, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprint(a.stdout, configHelp)
			return errHelp
		}
		return usageErrorf("config: missing subcommand (view, get-contexts, current-context, use-context, set-context, delete-context)")
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "view":
		return configView(a, args)
	case "get-contexts":
		return configGetContexts(a, args)
	case "current-context":
		return configCurrentContext(a, args)
	case "use-context":
		return configUseContext(a, args)
	case "set-context":
		return configSetContext(a, args)
	case "delete-context":
		return configDeleteContext(a, args)
	}
	return usageErrorf("config: unknown subcommand %q (view, get-contexts, current-context, use-context, set-context, delete-context)", sub)
}

const configHelp = `Usage: ipamctl config SUBCOMMAND

  view [--raw]                 the config file (tokens hidden unless --raw)
  get-contexts                 the contexts, the current one marked
  current-context              the current context's name
  use-context NAME             make NAME the current context
  set-context NAME [--server URL] [--token SECRET] [--ca-file FILE]
              [--cert-file FILE --key-file FILE] [--insecure-skip-tls-verify]
              [--space NAME] [--use]
                               create or change a context (only the flags
                               given change); --use makes it current
  delete-context NAME          remove a context

The file is --config, else $IPAMCTL_CONFIG, else ~/.config/ipamctl/config.yaml.
`

func configView(a *app, args []string) error {
	f := a.newFlags("config view", "config view")
	raw := f.Bool("raw", false, "show tokens")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos); err != nil {
		return err
	}
	cf, _, err := a.loadConfig()
	if err != nil {
		return err
	}
	v := *cf
	v.Contexts = append([]configContext(nil), cf.Contexts...)
	if !*raw {
		// Redacted so that the output can be pasted into a ticket.
		for i := range v.Contexts {
			if v.Contexts[i].Token != "" {
				v.Contexts[i].Token = "REDACTED"
			}
		}
	}
	if a.conn.output == "json" {
		_, err := a.structured(v)
		return err
	}
	b, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	_, err = a.stdout.Write(b)
	return err
}

func configGetContexts(a *app, args []string) error {
	f := a.newFlags("config get-contexts", "config get-contexts")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos); err != nil {
		return err
	}
	cf, _, err := a.loadConfig()
	if err != nil {
		return err
	}
	t := newTable(a.stdout, "CURRENT", "NAME", "SERVER", "SPACE", "AUTH")
	for _, c := range cf.Contexts {
		cur := ""
		if c.Name == cf.CurrentContext {
			cur = "*"
		}
		var auth []string
		if c.Token != "" {
			auth = append(auth, "token")
		}
		if c.CertFile != "" {
			auth = append(auth, "certificate")
		}
		t.row(cur, c.Name, c.Server, c.Space, strings.Join(auth, "+"))
	}
	return t.flush()
}

func configCurrentContext(a *app, args []string) error {
	f := a.newFlags("config current-context", "config current-context")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos); err != nil {
		return err
	}
	cf, path, err := a.loadConfig()
	if err != nil {
		return err
	}
	if cf.CurrentContext == "" {
		return fmt.Errorf("no current context in %s", path)
	}
	_, err = fmt.Fprintln(a.stdout, cf.CurrentContext)
	return err
}

func configUseContext(a *app, args []string) error {
	f := a.newFlags("config use-context", "config use-context NAME")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos, "NAME"); err != nil {
		return err
	}
	cf, path, err := a.loadConfig()
	if err != nil {
		return err
	}
	if cf.context(pos[0]) == nil {
		return fmt.Errorf("no context %q in %s (contexts: %s)", pos[0], path, cf.names())
	}
	cf.CurrentContext = pos[0]
	if err := saveConfig(path, cf); err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "switched to context %q\n", pos[0])
	return err
}

func configSetContext(a *app, args []string) error {
	f := a.newFlags("config set-context", "config set-context NAME").withSpace()
	use := f.Bool("use", false, "make it the current context")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos, "NAME"); err != nil {
		return err
	}
	cf, path, err := a.loadConfig()
	if err != nil {
		return err
	}
	ctx := cf.context(pos[0])
	verb := "changed"
	if ctx == nil {
		cf.Contexts = append(cf.Contexts, configContext{Name: pos[0]})
		ctx = &cf.Contexts[len(cf.Contexts)-1]
		verb = "created"
	}
	// Only what the command line gives changes: set-context prod --token
	// NEW rotates a token and keeps the rest. Files are kept as absolute
	// names, so the context works from any directory.
	c, given := &a.conn, a.conn.given
	abs := func(p string) (string, error) {
		if p == "" {
			return "", nil
		}
		return filepath.Abs(p)
	}
	for _, s := range []struct {
		flag string
		val  string
		dst  *string
		file bool
	}{
		{"server", c.server, &ctx.Server, false},
		{"token", c.token, &ctx.Token, false},
		{"ca-file", c.caFile, &ctx.CAFile, true},
		{"cert-file", c.certFile, &ctx.CertFile, true},
		{"key-file", c.keyFile, &ctx.KeyFile, true},
		{"space", c.space, &ctx.Space, false},
	} {
		if !given[s.flag] {
			continue
		}
		v := s.val
		if s.file {
			if v, err = abs(v); err != nil {
				return fmt.Errorf("--%s: %w", s.flag, err)
			}
		}
		*s.dst = v
	}
	if given["insecure-skip-tls-verify"] {
		ctx.Insecure = c.insecure
	}
	if *use || cf.CurrentContext == "" {
		cf.CurrentContext = ctx.Name
	}
	if err := saveConfig(path, cf); err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "context %q %s in %s\n", ctx.Name, verb, path)
	return err
}

func configDeleteContext(a *app, args []string) error {
	f := a.newFlags("config delete-context", "config delete-context NAME")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos, "NAME"); err != nil {
		return err
	}
	cf, path, err := a.loadConfig()
	if err != nil {
		return err
	}
	kept := cf.Contexts[:0]
	for _, c := range cf.Contexts {
		if c.Name != pos[0] {
			kept = append(kept, c)
		}
	}
	if len(kept) == len(cf.Contexts) {
		return fmt.Errorf("no context %q in %s (contexts: %s)", pos[0], path, cf.names())
	}
	cf.Contexts = kept
	if cf.CurrentContext == pos[0] {
		cf.CurrentContext = ""
	}
	if err := saveConfig(path, cf); err != nil {
		return err
	}
	_, err = fmt.Fprintf(a.stdout, "context %q deleted\n", pos[0])
	return err
}
