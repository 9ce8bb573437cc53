// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// usageError is a command line ipamctl cannot run: exit code 2. Its text
// names the flag or argument at fault.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errHelp is a request for help (-h, --help): the help is printed and the
// exit code is 0.
var errHelp = flag.ErrHelp

// connFlags are the flags every command takes: where the service is, how
// to authenticate, and how to print. given records which were on the
// command line, since a flag given with its default value still wins over
// the environment and the config file.
type connFlags struct {
	server, token, caFile, certFile, keyFile string
	insecure                                 bool
	context, configFile                      string
	output                                   string
	timeout                                  time.Duration
	pageSize                                 int
	space                                    string
	given                                    map[string]bool
}

// globalFlagHelp documents connFlags in the help of ipamctl.
const globalFlagHelp = `  --server URL                 the service, e.g. https://ipam.example:8443
  --token SECRET               an API token (prefer IPAM_TOKEN: flags show in ps)
  --ca-file FILE               CA certificates that verify the server
  --cert-file FILE, --key-file FILE
                               a client certificate for mutual TLS
  --insecure-skip-tls-verify   do not verify the server's certificate
  --context NAME               the context of the config file to use
  --config FILE                the config file
  -o, --output FORMAT          table (default), json or yaml
  --timeout DURATION           bound on each request (default 30s)
  --page-size N                items per request when paging, 1 to 1000 (default 500)
  --space NAME                 the address space, for commands that have one
`

const defaultPageSize = 500

// flagSet is one command's flags: the connection flags plus its own.
type flagSet struct {
	*flag.FlagSet
	a   *app
	use string // the usage line after "ipamctl"
}

// newFlags is the flag set of the command line use ("leases", "who
// ADDRESS"), with the connection flags bound to a.conn.
func (a *app) newFlags(name, use string) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned, help printed by printHelp
	c := &a.conn
	if c.given == nil {
		c.given = map[string]bool{}
		c.output = "table"
		c.pageSize = defaultPageSize
	}
	fs.StringVar(&c.server, "server", c.server, "the service's URL")
	fs.StringVar(&c.token, "token", c.token, "an API token")
	fs.StringVar(&c.caFile, "ca-file", c.caFile, "CA certificates that verify the server")
	fs.StringVar(&c.certFile, "cert-file", c.certFile, "a client certificate")
	fs.StringVar(&c.keyFile, "key-file", c.keyFile, "the client certificate's key")
	fs.BoolVar(&c.insecure, "insecure-skip-tls-verify", c.insecure, "do not verify the server's certificate")
	fs.StringVar(&c.context, "context", c.context, "the config file's context to use")
	fs.StringVar(&c.configFile, "config", c.configFile, "the config file")
	fs.StringVar(&c.output, "o", c.output, "output: table, json or yaml")
	fs.StringVar(&c.output, "output", c.output, "output: table, json or yaml")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "bound on each request")
	fs.IntVar(&c.pageSize, "page-size", c.pageSize, "items per request when paging (1-1000)")
	return &flagSet{FlagSet: fs, a: a, use: use}
}

// withSpace adds --space, for the commands whose API has a space.
func (f *flagSet) withSpace() *flagSet {
	f.StringVar(&f.a.conn.space, "space", f.a.conn.space, "the address space (default: the context's, else default)")
	return f
}

// parseGlobal parses the flags before the command name and answers the
// command and what follows it.
func (f *flagSet) parseGlobal(args []string) ([]string, error) {
	// --space may come before any command; one whose API has no space
	// refuses it in parse.
	f.withSpace()
	if err := f.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, usageErrorf("%v", err)
	}
	if err := f.record(); err != nil {
		return nil, err
	}
	return f.Args(), nil
}

// parse parses a command's flags and answers its positional arguments.
// Flags may follow positional ones (`who 10.0.0.1 --at ...`), as users
// type them; after "--" everything is positional.
func (f *flagSet) parse(args []string) ([]string, error) {
	var tail []string
	for i, arg := range args {
		if arg == "--" {
			args, tail = args[:i], args[i+1:]
			break
		}
	}
	var pos []string
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				f.printHelp()
				return nil, errHelp
			}
			return nil, usageErrorf("%s: %v", f.Name(), err)
		}
		if f.NArg() == 0 {
			break
		}
		pos = append(pos, f.Arg(0))
		args = f.Args()[1:]
	}
	if err := f.record(); err != nil {
		return nil, err
	}
	if f.a.conn.given["space"] && f.Lookup("space") == nil {
		return nil, usageErrorf("%s: --space: this command has no address space", f.Name())
	}
	return append(pos, tail...), nil
}

// record notes the flags given and checks the shared ones.
func (f *flagSet) record() error {
	c := &f.a.conn
	f.Visit(func(fl *flag.Flag) {
		name := fl.Name
		if name == "output" {
			name = "o"
		}
		c.given[name] = true
	})
	switch c.output {
	case "table", "json", "yaml":
	default:
		return usageErrorf("-o: want table, json or yaml, not %q", c.output)
	}
	if c.pageSize < 1 || c.pageSize > 1000 {
		return usageErrorf("--page-size: want 1 to 1000, not %d", c.pageSize)
	}
	if c.timeout < 0 {
		return usageErrorf("--timeout: want a positive duration, not %v", c.timeout)
	}
	return nil
}

// printHelp prints the command's usage and its own flags (the shared ones
// are in ipamctl --help).
func (f *flagSet) printHelp() {
	shared := map[string]bool{}
	probe := (&app{}).newFlags("", "")
	probe.VisitAll(func(fl *flag.Flag) { shared[fl.Name] = true })
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: ipamctl %s [flags]\n", f.use)
	own := false
	f.VisitAll(func(fl *flag.Flag) {
		if shared[fl.Name] {
			return
		}
		if !own {
			b.WriteString("\nFlags:\n")
			own = true
		}
		arg, usage := flag.UnquoteUsage(fl)
		line := "  --" + fl.Name
		if arg != "" {
			line += " " + arg
		}
		fmt.Fprintf(&b, "%-30s %s\n", line, usage)
	})
	b.WriteString("\nThe flags of every command (--server, --token, -o, ...): ipamctl --help\n")
	_, _ = io.WriteString(f.a.stdout, b.String())
}

// wantArgs checks the number of positional arguments, naming what is
// missing or extra.
func (f *flagSet) wantArgs(pos []string, names ...string) error {
	switch {
	case len(pos) < len(names):
		return usageErrorf("%s: missing %s", f.use, names[len(pos)])
	case len(pos) > len(names):
		return usageErrorf("%s: unexpected argument %q", f.use, pos[len(names)])
	}
	return nil
}
