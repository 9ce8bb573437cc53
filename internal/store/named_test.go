// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// namedArgs rewrites every statement as pgx.NamedArgs does, on its first
// use and from its cache after: the same text, the same values in the same
// order, and nothing taken from an @ inside a literal or a comment. (Where
// pgx binds NULL for a name the map lacks, namedArgs refuses: see
// TestNamedArgsRefuseAMissingName.)
func TestNamedArgsRewriteAsPgxDoes(t *testing.T) {
	t.Parallel()
	statements := map[string]string{
		"lease many":    leaseManySQL,
		"release many":  releaseManySQL,
		"lease fresh":   leaseFreshSQL,
		"lease cooled":  leaseCooledSQL,
		"literals":      `SELECT '@not', "@col", $$@dollar$$, @a::text, @b -- @comment` + "\n" + `, @a, /* @c */ @_d9`,
		"no parameters": `SELECT 1`,
	}
	values := map[string]any{"a": "first", "b": 2, "_d9": []int64{3}, "space": "s", "nodes": []int64{1, 2},
		"now": "t", "node": int64(7), "pool": int64(8), "family": int16(4), "block": int64(9), "comment": "never"}
	for name, sql := range statements {
		values := maps.Clone(values)
		for _, m := range placeholder.FindAllStringSubmatch(sql, -1) {
			if _, ok := values[m[1]]; !ok {
				values[m[1]] = "value of " + m[1]
			}
		}
		want, wantArgs, err := pgx.NamedArgs(values).RewriteQuery(context.Background(), nil, sql, nil)
		if err != nil {
			t.Fatal(err)
		}
		for round := range 2 {
			got, gotArgs, err := namedArgs(values).RewriteQuery(context.Background(), nil, sql, nil)
			if err != nil {
				t.Fatalf("%s, round %d: %v", name, round, err)
			}
			if got != want {
				t.Errorf("%s, round %d: text\n%s\nwant\n%s", name, round, got, want)
			}
			if !reflect.DeepEqual(gotArgs, wantArgs) {
				t.Errorf("%s, round %d: arguments %v, want %v", name, round, gotArgs, wantArgs)
			}
		}
	}
}

// A name the statement uses and the map lacks is refused, with the name in
// the error, on the statement's first use and from the cache after: pgx
// would bind NULL. An explicit nil binds NULL.
func TestNamedArgsRefuseAMissingName(t *testing.T) {
	t.Parallel()
	sql := `SELECT @present::text, @absent_in_named_test::int`
	for round := range 2 {
		_, _, err := namedArgs{"present": "x"}.RewriteQuery(context.Background(), nil, sql, nil)
		if err == nil || !strings.Contains(err.Error(), "@absent_in_named_test") {
			t.Fatalf("round %d: error %v, want one naming @absent_in_named_test", round, err)
		}
	}
	_, args, err := namedArgs{"present": "x", "absent_in_named_test": nil}.RewriteQuery(context.Background(), nil, sql, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []any{"x", nil}; !reflect.DeepEqual(args, want) {
		t.Errorf("arguments %v, want %v", args, want)
	}
}

// A name the map holds and the statement does not use is ignored: one map
// (leaseRow.args) serves several statements, each using some of its names.
func TestNamedArgsIgnoreAnUnusedName(t *testing.T) {
	t.Parallel()
	sql, args, err := namedArgs{"used": 1, "unused": 2}.RewriteQuery(context.Background(), nil, `SELECT @used::int`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sql != `SELECT $1::int` || !reflect.DeepEqual(args, []any{1}) {
		t.Errorf("got %q %v, want SELECT $1::int [1]", sql, args)
	}
}
