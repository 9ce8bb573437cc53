// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ipam-dev/ipam/internal/pgtest"
)

// What IsUnavailable answers for the errors a restarting or crashing
// PostgreSQL produces, and for those it must leave alone.
func TestIsUnavailableClasses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, true},
		{"crash shutdown", &pgconn.PgError{Code: "57P02"}, true},
		{"starting up", &pgconn.PgError{Code: "57P03"}, true},
		{"connection failure", &pgconn.PgError{Code: "08006"}, true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, true},
		{"read-only server (demoted primary, standby)", &pgconn.PgError{Code: "25006"}, true},
		{"connection to a read-only server refused", fmt.Errorf("acquire: %w", errReadOnlyServer), true},
		{"closed connection, wrapped", fmt.Errorf("allocate: %w", pgconn.ErrConnClosed), true},
		{"unique violation", &pgconn.PgError{Code: "23505"}, false},
		{"serialization failure", &pgconn.PgError{Code: "40001"}, false},
		{"no rows", pgx.ErrNoRows, false},
		{"canceled", context.Canceled, false},
	}
	for _, c := range cases {
		if got := IsUnavailable(c.err); got != c.want {
			t.Errorf("%s: IsUnavailable(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// A connection the server terminated fails its next statement with an
// error IsUnavailable recognises, and every statement after that with
// pgconn's "conn closed", which it must recognise too: before it did, a
// PostgreSQL restart answered some lease calls 500 instead of 503.
func TestIsUnavailableAfterTermination(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	victim, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close(ctx)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var terminated bool
	if err := admin.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, victim.PgConn().PID()).Scan(&terminated); err != nil || !terminated {
		t.Fatalf("pg_terminate_backend: %v %v", terminated, err)
	}
	_, first := victim.Exec(ctx, `SELECT 1`)
	_, second := victim.Exec(ctx, `SELECT 1`)
	for i, err := range []error{first, second} {
		if err == nil || !IsUnavailable(err) {
			t.Errorf("statement %d on a terminated connection: %v (%T), IsUnavailable = false", i+1, err, err)
		}
	}
	if !errors.Is(second, pgconn.ErrConnClosed) {
		t.Logf("the second statement failed with %v, not conn closed", second)
	}
}

// The store's connections never JIT-compile: with enable_seqscan off, the
// readiness query's sequential scan of goose_db_version cost more than
// jit_above_cost, and /readyz took 0.25 s of CPU idle and seconds under
// load.
func TestReadyDoesNotJIT(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	var jit string
	if err := f.s.db.QueryRow(f.ctx, `SHOW jit`).Scan(&jit); err != nil {
		t.Fatal(err)
	}
	if jit != "off" {
		t.Errorf("jit = %q on the store's connections", jit)
	}
	rows, err := f.s.db.Query(f.ctx, `EXPLAIN (ANALYZE, FORMAT TEXT) SELECT coalesce(max(version_id), 0) FROM goose_db_version WHERE is_applied`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(strings.TrimSpace(line), "JIT:") {
			t.Errorf("the readiness query is JIT-compiled")
		}
	}
	if _, err := f.s.Ready(f.ctx); err != nil {
		t.Fatal(err)
	}
}
