// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"fmt"
	"regexp"
	"sync"

	"github.com/jackc/pgx/v5"
)

// namedArgs are pgx.NamedArgs whose statement is rewritten to positional
// parameters once per statement text rather than on every call: pgx's
// rewrite scans the whole text, and the lease statements are long and run
// for every allocation and release. The rewrite itself is pgx's, so the
// statements mean what they would with pgx.NamedArgs, with one difference:
// a name the statement uses and the map lacks is an error, not NULL, so a
// misspelt or forgotten name cannot bind NULL unseen. A statement that
// means NULL says so with an explicit nil in the map. Names the statement
// does not use are ignored: leaseRow.args binds one map to several
// statements, each using some of its names.
type namedArgs pgx.NamedArgs

// positional is a statement rewritten by pgx: its text with $n
// placeholders and the name each $n binds.
type positional struct {
	sql   string
	names []string
}

// rewritten caches positional per statement text. The store's statements
// are a fixed set, so it stays small.
var rewritten sync.Map // string -> *positional

// placeholder matches what may be a named parameter. It also matches
// inside literals and comments, which only makes the probe below name
// more than the statement uses.
var placeholder = regexp.MustCompile(`@([a-zA-Z_][a-zA-Z0-9_]*)`)

// RewriteQuery implements pgx.QueryRewriter.
func (a namedArgs) RewriteQuery(ctx context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, error) {
	p, err := compileNamed(ctx, conn, sql)
	if err != nil {
		return "", nil, err
	}
	out := make([]any, len(p.names))
	for i, name := range p.names {
		v, ok := a[name]
		if !ok {
			return "", nil, fmt.Errorf("store: statement parameter @%s has no value (pass nil for NULL)", name)
		}
		out[i] = v
	}
	return p.sql, out, nil
}

// compileNamed rewrites sql once: pgx binds every name it finds to the
// name itself, which then reads back as the order of the parameters.
func compileNamed(ctx context.Context, conn *pgx.Conn, sql string) (*positional, error) {
	if p, ok := rewritten.Load(sql); ok {
		return p.(*positional), nil
	}
	probe := pgx.NamedArgs{}
	for _, m := range placeholder.FindAllStringSubmatch(sql, -1) {
		probe[m[1]] = m[1]
	}
	text, order, err := probe.RewriteQuery(ctx, conn, sql, nil)
	if err != nil {
		return nil, err
	}
	p := &positional{sql: text, names: make([]string, len(order))}
	for i, name := range order {
		s, ok := name.(string)
		if !ok {
			return nil, fmt.Errorf("store: parameter $%d of a statement has no name the probe found", i+1)
		}
		p.names[i] = s
	}
	rewritten.Store(sql, p)
	return p, nil
}
