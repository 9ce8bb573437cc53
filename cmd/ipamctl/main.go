// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Command ipamctl is the command-line client of the IPAM service: pools,
// their capacity and a map of their blocks, nodes, leases, who holds an
// address (now or at an instant), the address history, the consistency
// check and API tokens. It talks to the service over its REST API only,
// through the generated client api/ipamclient, so it is built and shipped
// apart from the server.
//
// One file per command group: pools.go (pools, pool capacity, with the map
// in poolmap.go), nodes.go, leases.go (leases, who), history.go, check.go,
// tokens.go and configcmd.go; flags.go, config.go, output.go, pages.go and
// progress.go are what they share.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"
)

// Exit codes: scripts tell a refused or failed request (1) from a command
// line that could not be understood (2), as the flag package does.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runContext(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// run is main without the process, for tests: the arguments after the
// program name, the two outputs and the environment's lookup. It answers
// the exit code.
func run(args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return runContext(context.Background(), args, stdout, stderr, getenv)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	return newApp(ctx, stdout, stderr, getenv).main(args)
}

func newApp(ctx context.Context, stdout, stderr io.Writer, getenv func(string) string) *app {
	return &app{ctx: ctx, stdout: stdout, stderr: stderr, getenv: getenv, isTerminal: isTerminal, now: time.Now,
		progressDelay: 300 * time.Millisecond}
}

// app is one run of ipamctl: its outputs, environment and the settings of
// the command line. Nothing about a run lives in package variables, so
// tests run commands side by side.
type app struct {
	ctx            context.Context
	stdout, stderr io.Writer
	getenv         func(string) string
	// isTerminal reports whether w is a terminal: progress goes to stderr
	// only then, and the map of a pool fits the width of stdout's.
	isTerminal func(w io.Writer) bool
	now        func() time.Time
	// progressDelay is how long a single request runs before a spinner
	// shows, so that quick answers do not flicker.
	progressDelay time.Duration

	conn connFlags
	// server is the URL the command talks to and where it came from, once
	// resolved, for the hint when it cannot be reached.
	server string
}

// command is one verb (or verb group) of the command line.
type command struct {
	name    string
	args    string // the positional arguments, for the usage line
	summary string
	// run parses its own flags (with newFlags) and runs; an error of
	// kind usageError exits 2.
	run func(a *app, name string, args []string) error
}

// commands lists every command in the order the help shows them; each
// group's functions live in the file of its name.
func commands() []command {
	return []command{
		{"pools", "", "list pools with their status", runPools},
		{"pool", "capacity NAME", "a pool's capacity per family and a map of its carved and free blocks", runPool},
		{"nodes", "", "list nodes", runNodes},
		{"node", "NAME", "a node: its blocks and its demand in each pool", runNode},
		{"leases", "", "list leases (--node, --pool, --owner, --namespace, --state)", runLeases},
		{"who", "ADDRESS", "who holds an address now, or held it at --at TIME", runWho},
		{"history", "[ADDRESS]", "the history of an address, an owner (--owner) or a node (--node)", runHistory},
		{"check", "", "verify every invariant of the database (GET /v1/consistency)", runCheck},
		{"tokens", "[list|create NAME|revoke NAME]", "API tokens (admin only)", runTokens},
		{"config", "SUBCOMMAND", "contexts of the config file: view, get-contexts, current-context, use-context, set-context, delete-context", runConfig},
	}
}

func (a *app) main(args []string) int {
	if len(args) == 0 {
		a.usage(a.stderr)
		return exitUsage
	}
	// Global flags may come before the command, as in `ipamctl --context
	// prod pools`; every command accepts them after its name too.
	rest, err := a.newFlags("", "").parseGlobal(args)
	if errors.Is(err, errHelp) {
		a.usage(a.stdout)
		return exitOK
	}
	if err != nil {
		return a.fail(err)
	}
	if len(rest) == 0 {
		return a.fail(usageErrorf("no command"))
	}
	name := rest[0]
	if name == "help" {
		a.usage(a.stdout)
		return exitOK
	}
	for _, c := range commands() {
		if c.name == name {
			// The flags before the command were parsed into a.conn already;
			// its own flag set shares those settings.
			return a.fail(c.run(a, name, rest[1:]))
		}
	}
	return a.fail(usageErrorf("unknown command %q", name))
}

// fail prints err, if any, and answers the exit code for it.
func (a *app) fail(err error) int {
	if err == nil {
		return exitOK
	}
	if errors.Is(err, errHelp) {
		return exitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(a.stderr, "ipamctl: %v\nRun 'ipamctl --help' for usage.\n", err)
		return exitUsage
	}
	fmt.Fprintf(a.stderr, "ipamctl: %v\n", err)
	var urlErr *url.Error
	if a.server != "" && errors.As(err, &urlErr) && !urlErr.Timeout() {
		// Most often the server is not the one meant: say which it was
		// and where that came from.
		fmt.Fprintf(a.stderr, "The server was %s.\n", a.server)
	}
	return exitError
}

func (a *app) usage(w io.Writer) {
	var b strings.Builder
	b.WriteString(`ipamctl: the command-line client of the IPAM service.

Usage:
  ipamctl [flags] COMMAND [flags] [args]

Commands:
`)
	for _, c := range commands() {
		use := c.name
		if c.args != "" {
			use += " " + c.args
		}
		fmt.Fprintf(&b, "  %-40s %s\n", use, c.summary)
	}
	b.WriteString(`
Flags of every command (before or after it):
`)
	b.WriteString(globalFlagHelp)
	b.WriteString(`
Configuration: each setting is taken from the first of
  1. its flag          --server, --token, --ca-file, --cert-file, --key-file,
                       --insecure-skip-tls-verify, --space
  2. the environment   IPAM_SERVER, IPAM_TOKEN, IPAM_CA_FILE, IPAM_CERT_FILE,
                       IPAM_KEY_FILE
  3. the config file   the context named by --context, else its
                       current-context; the file is --config, else
                       $IPAMCTL_CONFIG, else $XDG_CONFIG_HOME/ipamctl/config.yaml
                       (~/.config/ipamctl/config.yaml)
  4. the default       server http://localhost:8080 (make run), no credentials,
                       space "default"
A context's token, certificates and CA go only to the context's own
server: with another server from a flag or the environment they are left
out. Write contexts with 'ipamctl config set-context'.

Output: a table, or -o json / -o yaml of the API's objects (lists with
every page in "items"). Errors print the service's problem (title, detail,
field). Exit codes: 0 ok, 1 an error (also findings of check), 2 usage.
Progress of long operations goes to stderr when it is a terminal.

'ipamctl COMMAND --help' shows a command's flags; docs/ipamctl.md has examples.
`)
	_, _ = io.WriteString(w, b.String())
}

// isTerminal reports whether w is a file that is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// termWidth is the width to draw for on stdout: the terminal's, else
// $COLUMNS, else 80.
func (a *app) termWidth() int {
	if f, ok := a.stdout.(*os.File); ok && a.isTerminal(a.stdout) {
		if w, _, err := term.GetSize(int(f.Fd())); err == nil && w > 0 {
			return w
		}
	}
	var n int
	if _, err := fmt.Sscanf(a.getenv("COLUMNS"), "%d", &n); err == nil && n > 0 {
		return n
	}
	return 80
}

// sortedKeys returns m's keys in order, for stable label output.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
