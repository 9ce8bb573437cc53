// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/pgtest"
)

// A database without standbys: nothing waits for one, and the store says
// so (the server logs it and exports it as ipam_db_synchronous 0).
func TestDurabilityWithoutStandby(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	d, err := f.s.Durability(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d.Synchronous() || d.SynchronousStandbyNames != "" || d.Standbys != 0 || d.SyncStandbys != 0 || !d.Visible {
		t.Errorf("durability of a lone server: %+v, synchronous %v", d, d.Synchronous())
	}
	var want string
	if err := f.s.db.QueryRow(f.ctx, `SHOW synchronous_commit`).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if d.SynchronousCommit != want {
		t.Errorf("synchronous_commit = %q, the session has %q", d.SynchronousCommit, want)
	}
}

// Synchronous is true only when a commit waits for a standby.
func TestDurabilitySynchronous(t *testing.T) {
	for _, c := range []struct {
		names, commit string
		want          bool
	}{
		{"", "on", false},
		{"  ", "on", false},
		{"ANY 1 (a, b)", "on", true},
		{"FIRST 1 (a)", "remote_apply", true},
		{"*", "remote_write", true},
		{"ANY 1 (a, b)", "local", false},
		{"ANY 1 (a, b)", "off", false},
	} {
		d := Durability{SynchronousStandbyNames: c.names, SynchronousCommit: c.commit}
		if got := d.Synchronous(); got != c.want {
			t.Errorf("names %q, synchronous_commit %s: Synchronous() = %v, want %v", c.names, c.commit, got, c.want)
		}
	}
}

// A server that takes no writes (here: default_transaction_read_only, as a
// failover manager sets on a primary it demotes) is refused at connection
// acquire: every call, /readyz's included, fails as unavailable (503) and
// writes nothing, instead of failing with a read-only error that the API
// would answer 500. When the server takes writes again, the same store
// recovers by itself.
func TestReadOnlyServerIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	setReadOnly := func(on bool) {
		t.Helper()
		v := "off"
		if on {
			v = "on"
		}
		if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET default_transaction_read_only = `+v); err != nil {
			t.Fatal(err)
		}
	}
	setReadOnly(true)
	s, err := Open(ctx, dsn, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Ready(ctx); err == nil || !IsUnavailable(err) || !errors.Is(err, errReadOnlyServer) {
		t.Errorf("Ready on a read-only server: %v, want unavailable (read-only server)", err)
	}
	_, err = s.Durability(ctx)
	if err == nil || !IsUnavailable(err) {
		t.Errorf("a statement on a read-only server: %v, want unavailable", err)
	}
	// The pool destroys a refused connection in the background.
	for end := time.Now().Add(10 * time.Second); s.Stat().TotalConns() != 0 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.Stat().TotalConns(); n != 0 {
		t.Errorf("the pool keeps %d connections to the read-only server", n)
	}
	setReadOnly(false)
	if _, err := s.Ready(ctx); err != nil {
		t.Errorf("Ready once the server takes writes again: %v", err)
	}
}
