// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package pgtest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// leaked is a connection to the template that migrate leaves open on
// purpose, to show that Main closes it before tests clone the template.
var leaked *pgx.Conn

func TestMain(m *testing.M) {
	Main(m, func(ctx context.Context, connString string) error {
		conn, err := pgx.Connect(ctx, connString)
		if err != nil {
			return err
		}
		leaked = conn
		_, err = conn.Exec(ctx, `CREATE TABLE widget (name text PRIMARY KEY);
			INSERT INTO widget VALUES ('from-template')`)
		return err
	})
}

func connect(t *testing.T, connString string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), connString)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestParallelDatabases clones the template from several parallel tests:
// each gets its own migrated database.
func TestParallelDatabases(t *testing.T) {
	var seen sync.Map
	for i := range 8 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			conn := connect(t, NewDatabase(t))
			var db string
			if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&db); err != nil {
				t.Fatal(err)
			}
			if other, dup := seen.LoadOrStore(db, i); dup {
				t.Fatalf("tests %v and %d share database %s", other, i, db)
			}
			if _, err := conn.Exec(t.Context(), "INSERT INTO widget VALUES ($1)", db); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM widget").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 2 { // the template's row and this test's, none of the others'
				t.Errorf("widget has %d rows; want 2", n)
			}
		})
	}
}

func TestDatabaseDroppedAtCleanup(t *testing.T) {
	var name string
	t.Run("user", func(t *testing.T) {
		// The connection stays open: the drop must close it.
		conn, err := pgx.Connect(t.Context(), NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&name); err != nil {
			t.Fatal(err)
		}
	})
	admin := connect(t, AdminConnString())
	var exists bool
	if err := admin.QueryRow(t.Context(), "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("database %s still exists after its test's cleanup", name)
	}
}

func TestTemplateClosed(t *testing.T) {
	admin := connect(t, AdminConnString())
	var allow bool
	var sessions int
	err := admin.QueryRow(t.Context(), `SELECT datallowconn,
		(SELECT count(*) FROM pg_stat_activity WHERE datname = $1) FROM pg_database WHERE datname = $1`,
		current.template).Scan(&allow, &sessions)
	if err != nil {
		t.Fatal(err)
	}
	if allow || sessions != 0 {
		t.Errorf("template %s: datallowconn=%v, %d sessions; want false, 0", current.template, allow, sessions)
	}
	if err := leaked.Ping(t.Context()); err == nil {
		t.Error("the connection migrate leaked to the template still works")
	}
}

func TestAdminConnStringWithPsql(t *testing.T) {
	psql, err := exec.LookPath("psql")
	if err != nil {
		t.Log("psql is not installed; checking AdminConnString with pgx only")
		_ = connect(t, AdminConnString())
		return
	}
	out, err := exec.CommandContext(t.Context(), psql, "-XAtc", "SELECT 6*7", AdminConnString()).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "42" {
		t.Fatalf("psql %q: %s, %v", AdminConnString(), out, err)
	}
}

func TestWithDatabase(t *testing.T) {
	tests := []struct{ in, want string }{
		{"postgres://u:p@db:5432/postgres?sslmode=disable", "postgres://u:p@db:5432/ipamt_1?sslmode=disable"},
		{"postgresql://db", "postgresql://db/ipamt_1"},
		{"host=/tmp/run port=5432 dbname=postgres", "host=/tmp/run port=5432 dbname=postgres dbname=ipamt_1"},
	}
	for _, tt := range tests {
		got := withDatabase(tt.in, "ipamt_1")
		if got != tt.want {
			t.Errorf("withDatabase(%q) = %q; want %q", tt.in, got, tt.want)
		}
		cfg, err := pgx.ParseConfig(got)
		if err != nil || cfg.Database != "ipamt_1" {
			t.Errorf("withDatabase(%q) = %q parses to database %q, %v", tt.in, got, cfg.Database, err)
		}
	}
}
