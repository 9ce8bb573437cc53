// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

//go:build linux

package faulttest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/pgembed"
)

// formation is a local pg_auto_failover formation, as an operator runs
// one: a monitor and three PostgreSQL nodes (one primary, two standbys of
// which a commit waits for one: number_sync_standbys 1, so
// synchronous_standby_names is ANY 1 of them) on free loopback ports, each
// supervised by its own `pg_autoctl run`, as the postgres user when the
// test runs as root. pg_auto_failover was chosen over Patroni because it
// is PostgreSQL only: the monitor that decides failovers is itself a
// PostgreSQL server with an extension, so the test needs no second
// consensus system (Patroni needs etcd) and no Python, and Debian packages
// it for PostgreSQL 15 (pg-auto-failover-cli, postgresql-15-auto-failover).
type formation struct {
	t       *testing.T
	dir     string
	binDir  string
	cred    *syscall.Credential
	env     []string
	monitor *autoctl
	nodes   []*autoctl
}

// autoctl is one `pg_autoctl run` and the PostgreSQL it supervises.
type autoctl struct {
	name   string
	id     int // the monitor's node id (0 for the monitor)
	port   int
	pgdata string
	logf   string
	cmd    *exec.Cmd
	done   chan struct{}
}

// Failure detection of the formation, shortened from pg_auto_failover's
// defaults (health checks every 5 s, a node unhealthy after 20 s, 30 s for
// the old primary to demote itself) so that a failover takes seconds, not
// a minute. The old primary's keeper demotes it after
// networkPartitionTimeout without the monitor and its standbys, which is
// before the monitor promotes another node (unhealthy timeout + demote
// timeout): never two primaries taking writes.
const (
	healthCheckPeriodMs     = 1000
	unhealthyTimeoutMs      = 3000
	primaryDemoteTimeoutMs  = 5000
	networkPartitionTimeout = 3 // seconds
)

// findAutoctl reports whether pg_auto_failover is installed for the
// PostgreSQL of binDir, and why not.
func findAutoctl(binDir string) error {
	if _, err := exec.LookPath("pg_autoctl"); err != nil {
		return fmt.Errorf("pg_autoctl not found")
	}
	out, err := exec.Command(filepath.Join(binDir, "pg_config"), "--sharedir").Output()
	if err != nil {
		return fmt.Errorf("pg_config --sharedir: %v", err)
	}
	control := filepath.Join(strings.TrimSpace(string(out)), "extension", "pgautofailover.control")
	if _, err := os.Stat(control); err != nil {
		return fmt.Errorf("the pgautofailover extension is not installed (%s)", control)
	}
	return nil
}

// needAutoctl skips t on a machine without pg_auto_failover, and fails it
// under CI ($CI set), where make test has installed it.
func needAutoctl(t *testing.T, binDir string) {
	t.Helper()
	if err := findAutoctl(binDir); err != nil {
		version := filepath.Base(filepath.Dir(binDir))
		msg := fmt.Sprintf("%v: run make test (it installs it as root) or apt-get install pg-auto-failover-cli postgresql-%s-auto-failover", err, version)
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "; CI must run the failover tests, never skip them")
		}
		t.Skip(msg)
	}
}

// startFormation creates and starts the monitor and three nodes, makes a
// database "ipam" owned by a role "ipam" (a member of pg_monitor, so that
// the service can see its standbys) and returns once the formation has a
// primary and two secondaries. Everything is stopped and removed at
// cleanup.
func startFormation(t *testing.T) *formation {
	t.Helper()
	binDir, err := pgembed.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	needAutoctl(t, binDir)
	dir, err := os.MkdirTemp("", "ipam-pgaf-")
	if err != nil {
		t.Fatal(err)
	}
	f := &formation{t: t, dir: dir, binDir: binDir}
	t.Cleanup(f.stop)
	if f.cred = postgresCredential(t); f.cred != nil {
		if err := os.Chown(dir, int(f.cred.Uid), int(f.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	// pg_autoctl keeps its configuration and state under XDG directories:
	// private to this formation.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "XDG_") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "PATH=") {
			f.env = append(f.env, kv)
		}
	}
	f.env = append(f.env, "HOME="+dir, "XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"),
		"XDG_RUNTIME_DIR="+filepath.Join(dir, "run"), "PATH="+binDir+":"+os.Getenv("PATH"))

	f.monitor = f.newAutoctl("monitor")
	f.run("create", "monitor", "--pgdata", f.monitor.pgdata, "--pgport", strconv.Itoa(f.monitor.port),
		"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--pgctl", filepath.Join(binDir, "pg_ctl"))
	conf := fmt.Sprintf("\n# ipam failover test: detect a failure in seconds\n"+
		"pgautofailover.health_check_period = %d\npgautofailover.health_check_timeout = 1000\n"+
		"pgautofailover.health_check_max_retries = 1\npgautofailover.health_check_retry_delay = 500\n"+
		"pgautofailover.node_considered_unhealthy_timeout = %d\npgautofailover.primary_demote_timeout = %d\n",
		healthCheckPeriodMs, unhealthyTimeoutMs, primaryDemoteTimeoutMs)
	if err := appendFile(filepath.Join(f.monitor.pgdata, "postgresql.conf"), conf); err != nil {
		t.Fatal(err)
	}
	f.start(f.monitor)
	f.waitSQL(f.monitorURL())

	// The first node becomes the primary; the others join as standbys
	// (pg_basebackup from it), one at a time as pg_autoctl wants.
	for i := 1; i <= 3; i++ {
		n := f.newAutoctl("n" + strconv.Itoa(i))
		f.run("create", "postgres", "--pgdata", n.pgdata, "--pgport", strconv.Itoa(n.port), "--hostname", "127.0.0.1",
			"--name", n.name, "--auth", "trust", "--no-ssl", "--pgctl", filepath.Join(binDir, "pg_ctl"),
			"--monitor", f.monitorURL(), "--dbname", "ipam")
		f.run("config", "set", "--pgdata", n.pgdata, "timeout.network_partition_timeout", strconv.Itoa(networkPartitionTimeout))
		f.nodes = append(f.nodes, n)
		f.start(n)
		f.waitStates(90 * time.Second)
	}
	for _, n := range f.nodes {
		n.id = f.nodeID(n.name)
	}
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, f.url("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{`CREATE ROLE ipam LOGIN IN ROLE pg_monitor`, `ALTER DATABASE ipam OWNER TO ipam`} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	return f
}

func appendFile(name, s string) error {
	fh, err := os.OpenFile(name, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fh.WriteString(s)
	return errors.Join(err, fh.Close())
}

func (f *formation) newAutoctl(name string) *autoctl {
	return &autoctl{name: name, port: freePort(f.t), pgdata: filepath.Join(f.dir, name), logf: filepath.Join(f.dir, name+".log")}
}

// freePort answers a loopback TCP port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// command is pg_autoctl with args, as the postgres user, in the
// formation's environment.
func (f *formation) command(args ...string) *exec.Cmd {
	cmd := exec.Command("pg_autoctl", args...)
	cmd.Dir = f.dir
	cmd.Env = f.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred}
	return cmd
}

// run runs pg_autoctl to completion and fails t when it fails.
func (f *formation) run(args ...string) string {
	f.t.Helper()
	out, err := f.command(args...).CombinedOutput()
	if err != nil {
		f.t.Fatalf("pg_autoctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// start runs `pg_autoctl run` for a in a process group of its own, so that
// kill ends it and its PostgreSQL together, as a machine failure would.
func (f *formation) start(a *autoctl) {
	f.t.Helper()
	logf, err := os.OpenFile(a.logf, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		f.t.Fatal(err)
	}
	cmd := f.command("run", "--pgdata", a.pgdata)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		logf.Close()
		f.t.Fatal(err)
	}
	a.cmd, a.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(a.done)
	}()
}

// kill ends a's pg_autoctl and PostgreSQL with SIGKILL: the whole node
// fails at once. (Killing PostgreSQL alone makes pg_autoctl restart it in
// place within a second: a restart, which TestPostgresRestartUnderLoad
// covers, not a failover.)
func (f *formation) kill(a *autoctl) {
	postmaster := postmasterPID(a.pgdata)
	if a.cmd != nil {
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
	}
	if postmaster > 0 {
		_ = syscall.Kill(postmaster, syscall.SIGKILL)
		for end := time.Now().Add(10 * time.Second); syscall.Kill(postmaster, 0) == nil && time.Now().Before(end); {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// postmasterPID reads the postmaster's pid from pgdata, 0 if none runs.
func postmasterPID(pgdata string) int {
	b, err := os.ReadFile(filepath.Join(pgdata, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// stop kills every process of the formation and removes its files; on
// failure it first shows the last lines of each log.
func (f *formation) stop() {
	for _, a := range append(slices.Clone(f.nodes), f.monitor) {
		if a == nil {
			continue
		}
		f.kill(a)
		if f.t.Failed() {
			if b, err := os.ReadFile(a.logf); err == nil {
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				f.t.Logf("last lines of %s's pg_autoctl log:\n%s", a.name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
		}
	}
	_ = os.RemoveAll(f.dir)
}

func (f *formation) monitorURL() string {
	return fmt.Sprintf("postgres://autoctl_node@127.0.0.1:%d/pg_auto_failover?sslmode=disable", f.monitor.port)
}

// url is the libpq multi-host URL of the formation's database as user:
// every node, target_session_attrs=read-write, as `pg_autoctl show uri`
// prints it. A client connects to whichever node is the primary.
func (f *formation) url(user string) string {
	var hosts []string
	for _, n := range f.nodes {
		hosts = append(hosts, fmt.Sprintf("127.0.0.1:%d", n.port))
	}
	return fmt.Sprintf("postgres://%s@%s/ipam?target_session_attrs=read-write&sslmode=disable&connect_timeout=2", user, strings.Join(hosts, ","))
}

// waitSQL waits until url takes a connection.
func (f *formation) waitSQL(url string) {
	f.t.Helper()
	for end := time.Now().Add(60 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			conn.Close(ctx)
			cancel()
			return
		}
		cancel()
		if time.Now().After(end) {
			f.t.Fatalf("%s takes no connection within 60s: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nodeState is a node as the monitor sees it.
type nodeState struct {
	id                  int
	name                string
	reported, goal      string
	reportedLSN, health string
}

// states answers the monitor's view of the nodes.
func (f *formation) states() ([]nodeState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, f.monitorURL())
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT nodeid, nodename, reportedstate::text, goalstate::text, reportedlsn::text, health::text
		FROM pgautofailover.node ORDER BY nodeid`)
	if err != nil {
		return nil, err
	}
	var out []nodeState
	for rows.Next() {
		var s nodeState
		if err := rows.Scan(&s.id, &s.name, &s.reported, &s.goal, &s.reportedLSN, &s.health); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// settled reports whether every node has reached its goal, one primary
// (primary or single) and the rest secondaries, and answers the primary.
func settled(ss []nodeState, want int) (primary string, ok bool) {
	if len(ss) != want {
		return "", false
	}
	for _, s := range ss {
		switch {
		case s.reported != s.goal:
			return "", false
		case s.reported == "primary" || s.reported == "single":
			if primary != "" {
				return "", false
			}
			primary = s.name
		case s.reported != "secondary":
			return "", false
		}
	}
	return primary, primary != ""
}

// waitStates waits until the formation has settled with every node
// started so far, and answers its primary.
func (f *formation) waitStates(within time.Duration) string {
	f.t.Helper()
	var last []nodeState
	var err error
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if last, err = f.states(); err != nil {
			continue
		}
		if p, ok := settled(last, len(f.nodes)); ok {
			return p
		}
	}
	f.t.Fatalf("the formation did not settle within %v: %+v (%v)", within, last, err)
	return ""
}

func (f *formation) nodeID(name string) int {
	f.t.Helper()
	ss, err := f.states()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, s := range ss {
		if s.name == name {
			return s.id
		}
	}
	f.t.Fatalf("the monitor does not know node %s", name)
	return 0
}

func (f *formation) node(name string) *autoctl {
	for _, n := range f.nodes {
		if n.name == name {
			return n
		}
	}
	f.t.Fatalf("no node %s", name)
	return nil
}

// primaryWatch polls the formation's URL every 50 ms for a server that
// takes a write, and keeps the longest stretch without one and the
// primaries it saw, in order.
type primaryWatch struct {
	stop, done chan struct{}
	gap        time.Duration
	primaries  []int // the ports of the servers that answered, each change once
}

// watchPrimary returns once the first probe has found the primary.
func watchPrimary(url string) *primaryWatch {
	w := &primaryWatch{stop: make(chan struct{}), done: make(chan struct{})}
	first := make(chan struct{})
	go func() {
		defer close(w.done)
		lastOK := time.Now()
		down := false
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var port int
			conn, err := pgx.Connect(ctx, url)
			if err == nil {
				// txid_current takes a transaction id: only a primary answers.
				err = conn.QueryRow(ctx, `SELECT inet_server_port(), txid_current()`).Scan(&port, new(int64))
				conn.Close(ctx)
			}
			cancel()
			now := time.Now()
			if err == nil {
				if down {
					w.gap = max(w.gap, now.Sub(lastOK))
				}
				down, lastOK = false, now
				if len(w.primaries) == 0 || w.primaries[len(w.primaries)-1] != port {
					w.primaries = append(w.primaries, port)
				}
				if first != nil {
					close(first)
					first = nil
				}
			} else {
				down = true
			}
			select {
			case <-w.stop:
				if down {
					w.gap = max(w.gap, now.Sub(lastOK))
				}
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	select {
	case <-first:
	case <-time.After(30 * time.Second):
	}
	return w
}

// stallWatch samples a counter of answered calls every 10 ms and keeps
// the longest stretch in which it did not move: how long the clients got
// no answer at all.
type stallWatch struct {
	stop, done chan struct{}
	longest    time.Duration
}

func watchStalls(calls *atomic.Int64) *stallWatch {
	w := &stallWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		last, since := calls.Load(), time.Now()
		for {
			select {
			case <-w.stop:
				w.longest = max(w.longest, time.Since(since))
				return
			case <-time.After(10 * time.Millisecond):
			}
			if n := calls.Load(); n != last {
				w.longest = max(w.longest, time.Since(since))
				last, since = n, time.Now()
			}
		}
	}()
	return w
}

func (w *stallWatch) end() time.Duration {
	close(w.stop)
	<-w.done
	return w.longest
}

// end stops the watch and answers the longest time without a primary and
// the primaries seen.
func (w *primaryWatch) end() (time.Duration, []int) {
	close(w.stop)
	<-w.done
	return w.gap, w.primaries
}
