// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package pgtest gives every database test its own PostgreSQL database,
// cloned from a template database that is migrated once per test binary.
//
// A package with database tests calls Main from its TestMain, with Migrate
// for the service's schema:
//
//	func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Migrate) }
//
// and each test asks for a database of its own:
//
//	db := pgtest.NewDatabase(t) // a connection string; dropped at t.Cleanup
//
// Main starts a throwaway cluster with pgembed, or, when
// $IPAM_TEST_DATABASE_URL is set, uses that server instead. Names carry the
// process id and a random part, so test binaries of several packages can
// share one server at the same time.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ipam-dev/ipam/internal/pgembed"
)

// DatabaseURLEnv names the environment variable that points Main at an
// existing server: a connection string (URL or keyword/value) to a
// maintenance database, as a role that may CREATE DATABASE. Unset, Main
// starts its own cluster.
const DatabaseURLEnv = "IPAM_TEST_DATABASE_URL"

// setupTimeout bounds starting the cluster and migrating the template.
const setupTimeout = 3 * time.Minute

// current is the harness Main set up for this test binary; nil before.
var current *harness

// harness is one test binary's server, template and databases.
type harness struct {
	adminConnString string
	connString      func(dbname string) string // the same server, another database
	pool            *pgxpool.Pool              // to the maintenance database
	prefix          string                     // of every database name this process makes
	template        string

	// createMu serialises CREATE DATABASE ... TEMPLATE: PostgreSQL refuses
	// to copy a template that another session is using.
	createMu sync.Mutex
	next     atomic.Int64 // numbers databases: prefix_1, prefix_2, ...

	liveMu sync.Mutex          // protects live
	live   map[string]struct{} // databases made and not yet dropped
}

// Main sets up the server and the migrated template, runs the tests, drops
// every database it made, stops the cluster it started, and exits with
// m.Run's code. migrate receives the template's connection string and must
// close every connection it opens; any it leaves open are terminated (with
// a warning), since PostgreSQL cannot copy a template that is in use.
//
// A failed setup fails the whole test binary: database tests never skip.
func Main(m *testing.M, migrate func(ctx context.Context, connString string) error) {
	os.Exit(run(m, migrate))
}

func run(m *testing.M, migrate func(ctx context.Context, connString string) error) int {
	if !flag.Parsed() {
		flag.Parse() // as m.Run would, so that testing.Verbose works here
	}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	began := time.Now()
	h, teardown, err := setup(ctx, migrate)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: setup failed: %v\n", err)
		if terr := teardown(); terr != nil {
			fmt.Fprintf(os.Stderr, "pgtest: %v\n", terr)
		}
		return 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "pgtest: server and template %s ready in %v\n", h.template, time.Since(began).Round(time.Millisecond))
	}
	current = h
	code := m.Run()
	current = nil
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: teardown: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// setup returns the harness and a teardown that undoes whatever part of the
// setup succeeded; call teardown even when setup fails.
func setup(ctx context.Context, migrate func(context.Context, string) error) (*harness, func() error, error) {
	var undo []func() error // run in reverse
	teardown := func() error {
		var errs []error
		for i := len(undo) - 1; i >= 0; i-- {
			errs = append(errs, undo[i]())
		}
		return errors.Join(errs...)
	}

	prefix, err := namePrefix()
	if err != nil {
		return nil, teardown, err
	}
	h := &harness{prefix: prefix, template: prefix + "_tpl", live: map[string]struct{}{}}

	if url := os.Getenv(DatabaseURLEnv); url != "" {
		h.adminConnString = url
		h.connString = func(dbname string) string { return withDatabase(url, dbname) }
	} else {
		dir, err := os.MkdirTemp("", "ipam-pg-")
		if err != nil {
			return nil, teardown, err
		}
		undo = append(undo, func() error { return os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o755); err != nil { // reachable for the postgres user when root
			return nil, teardown, err
		}
		cluster, err := pgembed.Start(ctx, pgembed.Options{
			DataDir: dir,
			Fast:    true,
			Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
		if err != nil {
			return nil, teardown, err
		}
		undo = append(undo, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			return cluster.Stop(ctx)
		})
		h.adminConnString = cluster.ConnString("postgres")
		h.connString = cluster.ConnString
	}

	cfg, err := pgxpool.ParseConfig(h.adminConnString)
	if err != nil {
		return nil, teardown, fmt.Errorf("$%s: %w", DatabaseURLEnv, err)
	}
	cfg.MaxConns = 4
	if h.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, teardown, err
	}
	undo = append(undo, func() error { h.pool.Close(); return nil })

	if _, err := h.pool.Exec(ctx, "CREATE DATABASE "+quoteIdent(h.template)); err != nil {
		return nil, teardown, fmt.Errorf("creating template: %w", err)
	}
	undo = append(undo, h.dropAll)
	if err := migrate(ctx, h.connString(h.template)); err != nil {
		return nil, teardown, fmt.Errorf("migrating template %s: %w", h.template, err)
	}
	if err := h.closeTemplate(ctx); err != nil {
		return nil, teardown, err
	}
	return h, teardown, nil
}

// closeTemplate makes sure no session uses the template, now or later:
// connections are refused from now on (CREATE DATABASE ... TEMPLATE still
// works), and those migrate left open are terminated.
func (h *harness) closeTemplate(ctx context.Context) error {
	if _, err := h.pool.Exec(ctx, "ALTER DATABASE "+quoteIdent(h.template)+" WITH ALLOW_CONNECTIONS false"); err != nil {
		return fmt.Errorf("closing template: %w", err)
	}
	var n int
	err := h.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = $1 AND pid <> pg_backend_pid()`, h.template).Scan(&n)
	if err != nil {
		return fmt.Errorf("closing template: %w", err)
	}
	if n > 0 {
		fmt.Fprintf(os.Stderr, "pgtest: warning: migrate left %d connection(s) to the template open; terminated them\n", n)
	}
	return nil
}

// NewDatabase creates a database cloned from the migrated template and
// returns its connection string; t.Cleanup drops it, closing any connection
// still open to it (DROP DATABASE ... WITH (FORCE)). Safe for parallel tests.
// It fails t when the package's TestMain did not call Main.
func NewDatabase(t testing.TB) string {
	t.Helper()
	h := current
	if h == nil {
		t.Fatal("pgtest: NewDatabase needs pgtest.Main in the package's TestMain")
	}
	name := fmt.Sprintf("%s_%d", h.prefix, h.next.Add(1))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := h.create(ctx, name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := h.drop(ctx, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return h.connString(name)
}

// AdminConnString returns the connection string of the server's maintenance
// database as its administrator (superuser "postgres" on the embedded
// cluster), for tests that run psql or pgbench or create databases of their
// own. psql and pgbench accept it as their database name argument. It panics
// when the package's TestMain did not call Main.
func AdminConnString() string {
	if current == nil {
		panic("pgtest: AdminConnString needs pgtest.Main in the package's TestMain")
	}
	return current.adminConnString
}

func (h *harness) create(ctx context.Context, name string) error {
	h.createMu.Lock()
	defer h.createMu.Unlock()
	if _, err := h.pool.Exec(ctx, "CREATE DATABASE "+quoteIdent(name)+" TEMPLATE "+quoteIdent(h.template)); err != nil {
		return fmt.Errorf("creating database %s from %s: %w", name, h.template, err)
	}
	h.liveMu.Lock()
	h.live[name] = struct{}{}
	h.liveMu.Unlock()
	return nil
}

func (h *harness) drop(ctx context.Context, name string) error {
	if _, err := h.pool.Exec(ctx, "DROP DATABASE IF EXISTS "+quoteIdent(name)+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("dropping database %s: %w", name, err)
	}
	h.liveMu.Lock()
	delete(h.live, name)
	h.liveMu.Unlock()
	return nil
}

// dropAll drops the databases whose tests did not clean up, then the
// template.
func (h *harness) dropAll() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	h.liveMu.Lock()
	names := make([]string, 0, len(h.live))
	for name := range h.live {
		names = append(names, name)
	}
	h.liveMu.Unlock()
	var errs []error
	for _, name := range append(names, h.template) {
		errs = append(errs, h.drop(ctx, name))
	}
	return errors.Join(errs...)
}

// namePrefix returns a prefix for this process's database names: unique
// among processes on one machine (pid) and, with high probability, among
// machines sharing a server (random part).
func namePrefix() (string, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return fmt.Sprintf("ipamt_%d_%s", os.Getpid(), hex.EncodeToString(b)), nil
}

// withDatabase returns connString (a postgres:// URL or a keyword/value
// string) with its database replaced by dbname.
func withDatabase(connString, dbname string) string {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		if u, err := url.Parse(connString); err == nil {
			u.Path = "/" + dbname
			u.RawPath = ""
			return u.String()
		}
	}
	// In a keyword/value string the last setting of a keyword wins.
	return connString + " dbname=" + dbname
}

func quoteIdent(name string) string { return pgx.Identifier{name}.Sanitize() }
