// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"
)

// namedArgs rewrites every statement as pgx.NamedArgs does, on its first
// use and from its cache after: the same text, the same values in the same
// order, NULL for a name the map lacks, and nothing taken from an @ inside
// a literal or a comment.
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
