// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package pgtest

import (
	"context"
	"io/fs"
	"strconv"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/migrations"
)

// TestMigrate applies the service's schema to an empty database: every
// embedded migration is applied.
func TestMigrate(t *testing.T) {
	admin := connect(t, AdminConnString())
	name := current.prefix + "_migrate"
	if _, err := admin.Exec(t.Context(), "CREATE DATABASE "+quoteIdent(name)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE "+quoteIdent(name)+" WITH (FORCE)"); err != nil {
			t.Error(err)
		}
	})
	if err := Migrate(t.Context(), current.connString(name)); err != nil {
		t.Fatalf("Migrate: %v", err)
	}

	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]bool{}
	for _, e := range entries {
		num, _, _ := strings.Cut(e.Name(), "_")
		if n, err := strconv.ParseInt(num, 10, 64); err == nil {
			want[n] = true
		}
	}
	conn := connect(t, current.connString(name))
	rows, err := conn.Query(t.Context(), "SELECT version_id FROM goose_db_version WHERE is_applied AND version_id > 0")
	if err != nil {
		t.Fatal(err)
	}
	got := map[int64]bool{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		got[v] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 || len(got) != len(want) {
		t.Fatalf("applied migrations %v; want %v", got, want)
	}
	for v := range want {
		if !got[v] {
			t.Errorf("migration %d not applied", v)
		}
	}
}
