// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package pgembed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestOptionsValidate(t *testing.T) {
	long := "/tmp/" + strings.Repeat("d", 90)
	tests := []struct {
		name    string
		o       Options
		wantErr []string // substrings; none means valid
	}{
		{name: "minimal", o: Options{DataDir: "/tmp/pg"}},
		{name: "tcp port", o: Options{DataDir: "/tmp/pg", Port: 15432}},
		{name: "zero value", o: Options{}, wantErr: []string{"DataDir is required"}},
		{name: "socket path too long", o: Options{DataDir: long}, wantErr: []string{"choose a shorter DataDir"}},
		{name: "every problem at once", o: Options{Port: 70000},
			wantErr: []string{"DataDir is required", "Port 70000"}},
		{name: "comma", o: Options{DataDir: "/tmp/a,b"}, wantErr: []string{"comma"}},
		{name: "negative port", o: Options{DataDir: "/tmp/pg", Port: -1}, wantErr: []string{"Port -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.o.Validate()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v; want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil; want errors %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %v; want it to mention %q", err, w)
				}
			}
		})
	}
}

func TestQuoteConnValue(t *testing.T) {
	for _, v := range []string{"plain", "with space", `back\slash`, "it's", "/tmp/a b/run"} {
		cfg, err := pgconn.ParseConfig("host=/tmp port=5432 dbname=" + quoteConnValue(v))
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if cfg.Database != v {
			t.Errorf("quoteConnValue(%q) parsed back as %q", v, cfg.Database)
		}
	}
}

// dataDir returns a fresh DataDir. t.TempDir() is mode 0700 under root's
// ownership: Start has to make it reachable for the postgres user.
func dataDir(t *testing.T) string {
	return filepath.Join(t.TempDir(), "pg")
}

func startCluster(t *testing.T, o Options) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	began := time.Now()
	c, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Logf("Start took %v", time.Since(began).Round(time.Millisecond))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

func connect(t *testing.T, connString string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), connString)
	if err != nil {
		t.Fatalf("connect %q: %v", connString, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func show(t *testing.T, conn *pgx.Conn, setting string) string {
	t.Helper()
	var v string
	if err := conn.QueryRow(t.Context(), "SHOW "+setting).Scan(&v); err != nil {
		t.Fatalf("SHOW %s: %v", setting, err)
	}
	return v
}

func TestStartStopReuse(t *testing.T) {
	t.Parallel()
	dir := dataDir(t)
	c := startCluster(t, Options{DataDir: dir, Fast: true})

	conn := connect(t, c.ConnString("postgres"))
	for setting, want := range map[string]string{
		"fsync": "off", "synchronous_commit": "off", "max_connections": "300",
		"shared_buffers": "128MB", "listen_addresses": "", "server_encoding": "UTF8", "lc_collate": "C",
		"unix_socket_directories": filepath.Join(dir, "run"),
	} {
		if got := show(t, conn, setting); got != want {
			t.Errorf("SHOW %s = %q; want %q", setting, got, want)
		}
	}
	if _, err := conn.Exec(t.Context(), "CREATE TABLE kept (n int); INSERT INTO kept VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	// PID is the postmaster's, whose pid postmaster.pid names: the bench
	// counts its processes' CPU by it.
	pidFile, err := os.ReadFile(filepath.Join(dir, "pgdata", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(string(pidFile), "\n"); c.PID() == 0 || strconv.Itoa(c.PID()) != first {
		t.Errorf("PID() = %d, postmaster.pid names %q", c.PID(), first)
	}
	_ = conn.Close(t.Context())
	if err := c.Stop(t.Context()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := c.Stop(t.Context()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if c.PID() != 0 {
		t.Errorf("PID() = %d after Stop, want 0", c.PID())
	}
	if _, err := os.Stat(filepath.Join(dir, "pgdata", "postmaster.pid")); !os.IsNotExist(err) {
		t.Errorf("postmaster.pid after Stop: %v; want it gone", err)
	}

	// A second Start reuses the cluster, and without Fast it is durable.
	c = startCluster(t, Options{DataDir: dir})
	conn = connect(t, c.ConnString("postgres"))
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT n FROM kept").Scan(&n); err != nil || n != 42 {
		t.Fatalf("data after restart: n=%d, %v; want 42", n, err)
	}
	if got := show(t, conn, "fsync"); got != "on" {
		t.Errorf("without Fast, fsync = %q; want on", got)
	}
	if log, err := os.ReadFile(filepath.Join(dir, "postgres.log")); err != nil || !strings.Contains(string(log), "database system is ready") {
		t.Errorf("postgres.log lacks the server's messages (err %v)", err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestStartTCP also runs from a DataDir with a space in its name, which the
// socket setting and the connection string must quote.
func TestStartTCP(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	c := startCluster(t, Options{DataDir: filepath.Join(t.TempDir(), "pg data"), Port: port, Fast: true})
	_ = connect(t, c.ConnString("postgres"))
	if want := "port=" + strconv.Itoa(port); !strings.Contains(c.ConnString("x"), want) {
		t.Errorf("ConnString = %q; want it to contain %q", c.ConnString("x"), want)
	}
	conn := connect(t, fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", port))
	if got := show(t, conn, "listen_addresses"); got != "127.0.0.1" {
		t.Errorf("listen_addresses = %q; want 127.0.0.1", got)
	}
}

func TestStartFailureShowsLog(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := dataDir(t)
	_, err = Start(t.Context(), Options{DataDir: dir, Port: l.Addr().(*net.TCPAddr).Port, Fast: true})
	if err == nil {
		t.Fatal("Start on a busy port succeeded")
	}
	for _, want := range []string{"exited during start", "postgres.log", "could not"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q; want it to mention %q", err, want)
		}
	}
	t.Logf("error as reported:\n%v", err)
}

func TestStartBadBinDir(t *testing.T) {
	_, err := Start(t.Context(), Options{DataDir: dataDir(t), BinDir: t.TempDir()})
	if !errors.Is(err, ErrNoPostgres) {
		t.Fatalf("Start with an empty BinDir = %v; want ErrNoPostgres", err)
	}
}

func TestStartAfterCrash(t *testing.T) {
	t.Parallel()
	dir := dataDir(t)
	pgdata := filepath.Join(dir, "pgdata")
	c := startCluster(t, Options{DataDir: dir, Fast: true})

	if _, err := Start(t.Context(), Options{DataDir: dir, Fast: true}); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("second Start on a running cluster = %v; want ErrDataDirInUse", err)
	}

	// Crash: kill the postmaster, then wait for its orphaned children to
	// notice and exit, as they do.
	if err := c.proc.Kill(); err != nil {
		t.Fatal(err)
	}
	<-c.exited
	deadline := time.Now().Add(20 * time.Second)
	for {
		pids, ok := processesInDir(pgdata)
		if !ok {
			t.Fatal("cannot list processes")
		}
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes %v still in %s", pids, pgdata)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.Stop(t.Context()); err == nil || !strings.Contains(err.Error(), "exited before Stop") {
		t.Errorf("Stop after a crash = %v; want it to report the early exit", err)
	}

	// Make the stale postmaster.pid name a live process that is not
	// PostgreSQL, as after a container restart reuses process ids: PostgreSQL
	// alone would refuse to start.
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() }()
	pidFile := filepath.Join(pgdata, "postmaster.pid")
	old, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("crash left no postmaster.pid: %v", err)
	}
	lines := strings.SplitN(string(old), "\n", 2)
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(sleeper.Process.Pid)+"\n"+lines[1]), 0o600); err != nil {
		t.Fatal(err)
	}

	c = startCluster(t, Options{DataDir: dir, Fast: true})
	conn := connect(t, c.ConnString("postgres"))
	if got := show(t, conn, "fsync"); got != "off" {
		t.Errorf("fsync = %q", got)
	}
}
