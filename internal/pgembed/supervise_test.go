// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package pgembed

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// waitFor polls cond until it holds or a minute passes (a deadline for a
// hung test, not a timing assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// canQuery reports whether a new connection runs a query.
func canQuery(c *Cluster) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return false
	}
	defer conn.Close(context.Background())
	var n int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&n) == nil && n == 1
}

// A supervised cluster whose postmaster is SIGKILLed starts again, keeping
// its data; Alive stays nil meanwhile.
func TestSuperviseRestartsKilledServer(t *testing.T) {
	t.Parallel()
	// Durable (not Fast): a commit must survive the kill.
	c := startCluster(t, Options{DataDir: dataDir(t), Supervise: true})
	conn := connect(t, c.ConnString("postgres"))
	for _, sql := range []string{"CREATE TABLE kept (n int)", "INSERT INTO kept VALUES (42)"} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	first := c.proc
	c.mu.Unlock()
	if err := first.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "restart", func() bool {
		c.mu.Lock()
		restarted := c.proc != first
		c.mu.Unlock()
		return restarted && canQuery(c)
	})
	if err := c.Alive(); err != nil {
		t.Fatalf("Alive after the restart: %v", err)
	}
	var n int
	if err := connect(t, c.ConnString("postgres")).QueryRow(t.Context(), "SELECT n FROM kept").Scan(&n); err != nil || n != 42 {
		t.Fatalf("after the restart: %d, %v", n, err)
	}
	if err := c.Stop(t.Context()); err != nil {
		t.Fatalf("Stop after a restart: %v", err)
	}
	if c.Alive() == nil {
		t.Fatal("Alive after Stop")
	}
}

// When restarts keep failing, Alive reports the server gone after
// MaxRestartFailures of them, and nil again once a restart succeeds. Without
// supervision, a killed server is gone at once.
func TestSuperviseReportsRepeatedFailure(t *testing.T) {
	t.Parallel()
	dir := dataDir(t)
	c := startCluster(t, Options{DataDir: dir, Fast: true, Supervise: true})
	pgData, aside := filepath.Join(dir, "pgdata"), filepath.Join(dir, "pgdata.aside")
	// Without its data directory every restart fails. The directory moves
	// aside before the kill, so no restart can win a race with the move (the
	// running server keeps working in it under its new name).
	if err := os.Rename(pgData, aside); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	proc := c.proc
	c.mu.Unlock()
	if err := proc.Kill(); err != nil {
		t.Fatal(err)
	}
	<-c.exitedOf(proc)
	waitFor(t, "liveness failure", func() bool { return c.Alive() != nil })
	c.mu.Lock()
	failures := c.failures
	c.mu.Unlock()
	if failures < MaxRestartFailures {
		t.Fatalf("Alive failed after %d failed restarts, want %d", failures, MaxRestartFailures)
	}
	if err := os.Rename(aside, pgData); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "recovery", func() bool { return c.Alive() == nil && canQuery(c) })

	plain := startCluster(t, Options{DataDir: dataDir(t), Fast: true})
	if err := plain.Alive(); err != nil {
		t.Fatalf("Alive of a running server: %v", err)
	}
	_ = plain.proc.Kill()
	<-plain.exited
	if plain.Alive() == nil {
		t.Fatal("an unsupervised server killed is still alive")
	}
}
