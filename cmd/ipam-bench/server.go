// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/pgembed"
)

// database is the PostgreSQL that the service and the ceiling both use.
type database struct {
	url string
	// binDir holds the binaries of a private cluster, so the ceiling's
	// pgbench and psql match its server; empty for a -database-url.
	binDir string
	// private is true when the benchmark started the cluster itself.
	private bool
	// dataDir is the private cluster's directory; empty otherwise.
	dataDir string
	cluster *pgembed.Cluster
}

// openDatabase answers url when it is set; otherwise it starts a private,
// durable (Fast=false, like a real server) PostgreSQL in a new temporary
// directory. Call close when done.
func openDatabase(ctx context.Context, url string, log *slog.Logger) (*database, error) {
	if url != "" {
		return &database{url: url}, nil
	}
	binDir, err := pgembed.FindBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "ipam-bench-")
	if err != nil {
		return nil, err
	}
	cl, err := pgembed.Start(ctx, pgembed.Options{DataDir: dir, BinDir: binDir, Fast: false, Logger: log})
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("private PostgreSQL: %w", err)
	}
	return &database{url: cl.ConnString("postgres"), binDir: binDir, private: true, dataDir: dir, cluster: cl}, nil
}

// postmaster answers the private cluster's postmaster pid; 0 for a
// -database-url, whose processes are found by name (cpu.go), or no
// database (the floor phase's tests).
func (d *database) postmaster() int {
	if d == nil || !d.private {
		return 0
	}
	return d.cluster.PID()
}

// close stops a private cluster and removes its directory.
func (d *database) close() {
	if !d.private {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.cluster.Stop(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-bench: stopping PostgreSQL:", err)
	}
	if err := os.RemoveAll(d.dataDir); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-bench: removing", d.dataDir+":", err)
	}
}

// version answers SELECT version().
func (d *database) version(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, d.url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var v string
	err = conn.QueryRow(ctx, `SELECT version()`).Scan(&v)
	return v, err
}

// serverPackage is the service the benchmark drives, built from this module.
const serverPackage = "github.com/ipam-dev/ipam/cmd/server"

// serverReadyLimit bounds how long a started server may take to answer
// /readyz.
const serverReadyLimit = 60 * time.Second

// serverOptions are what the benchmark passes to every server process.
type serverOptions struct {
	bin         string
	databaseURL string
	certDir     string // holds ca.crt, server.crt and server.key
	cooldown    time.Duration
	leaseExpiry time.Duration
	maxConns    int      // 0: the server's default
	pprof       bool     // --pprof: the profiler at /debug/pprof/, for admins
	extra       []string // -server-args
	// start starts the process; nil is cmd.Start (the shim's bridge mode
	// starts its server in the node's network namespace).
	start func(cmd *exec.Cmd) error
}

// args are the command line of one server listening on listen.
func (o serverOptions) args(listen string) []string {
	a := []string{"serve",
		"--database-url", o.databaseURL,
		"--listen", listen,
		"--tls-cert-file", filepath.Join(o.certDir, "server.crt"),
		"--tls-key-file", filepath.Join(o.certDir, "server.key"),
		"--client-ca-file", filepath.Join(o.certDir, "ca.crt"),
		"--log-level", "warn",
		"--cooldown", o.cooldown.String(),
		"--lease-expiry", o.leaseExpiry.String(),
		// The hot-node run sends a thousand requests a second with one
		// node's certificate, 20 times the default per-node limit: the
		// bench measures allocation, not the limiter.
		"--node-rate-limit", "0", "--client-rate-limit", "0",
	}
	if o.maxConns > 0 {
		a = append(a, "--max-conns", strconv.Itoa(o.maxConns))
	}
	if o.pprof {
		a = append(a, "--pprof")
	}
	return append(a, o.extra...)
}

// serverProc is one running ipam-server process.
type serverProc struct {
	cmd    *exec.Cmd
	url    string // https://127.0.0.1:PORT
	stderr *tailWriter
	done   chan struct{} // closed when the process has exited
	err    error         // Wait's answer, set before done closes
}

// pid is the process id.
func (s *serverProc) pid() int { return s.cmd.Process.Pid }

// buildServer builds cmd/server into dir and answers the binary's path.
func buildServer(ctx context.Context, dir string) (string, error) {
	return goBuild(ctx, dir, "ipam-server", serverPackage)
}

// goBuild builds pkg into dir/name with this program's toolchain.
func goBuild(ctx context.Context, dir, name, pkg string) (string, error) {
	tool, err := goTool()
	if err != nil {
		return "", fmt.Errorf("go tool: %w", err)
	}
	out := filepath.Join(dir, name)
	cmd := exec.CommandContext(ctx, tool, "build", "-o", out, pkg)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", pkg, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// startServers starts n servers; on error none is left running.
func startServers(ctx context.Context, n int, o serverOptions, probe *http.Client) ([]*serverProc, error) {
	var ss []*serverProc
	for range n {
		s, err := startServer(ctx, o, probe)
		if err != nil {
			stopServers(ss)
			return nil, err
		}
		ss = append(ss, s)
	}
	return ss, nil
}

// startServer starts one server on a free loopback port and waits until
// /readyz answers 200 through probe. A port taken between choosing and
// binding it makes the server exit; it is then tried again on another.
func startServer(ctx context.Context, o serverOptions, probe *http.Client) (*serverProc, error) {
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s, err := spawnServer(o, "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			return nil, err
		}
		if lastErr = s.waitReady(ctx, probe); lastErr == nil {
			return s, nil
		}
		s.stop()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	return nil, lastErr
}

// freePort answers a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// spawnServer starts the process. Its environment is the benchmark's
// without IPAM_* variables, so only the flags above configure it.
func spawnServer(o serverOptions, listen string) (*serverProc, error) {
	cmd := exec.Command(o.bin, o.args(listen)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IPAM_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	s := &serverProc{cmd: cmd, url: "https://" + listen, stderr: &tailWriter{max: 64 << 10}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = s.stderr, s.stderr
	start := cmd.Start
	if o.start != nil {
		start = func() error { return o.start(cmd) }
	}
	if err := start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", o.bin, err)
	}
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	return s, nil
}

// waitReady polls /readyz until it answers 200, the process exits or the
// limit passes.
func (s *serverProc) waitReady(ctx context.Context, probe *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, serverReadyLimit)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/readyz", nil)
		if err != nil {
			return err
		}
		if resp, err := probe.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.done:
			return fmt.Errorf("ipam-server exited before it was ready (%v): %s", s.err, lastLines(s.stderr.String(), 10))
		case <-ctx.Done():
			return fmt.Errorf("ipam-server not ready within %v: %s", serverReadyLimit, lastLines(s.stderr.String(), 10))
		case <-tick.C:
		}
	}
}

// exited answers the process's exit when it has ended unasked, else nil.
func (s *serverProc) exited() error {
	select {
	case <-s.done:
		return fmt.Errorf("ipam-server %s exited during the benchmark (%v): %s", s.url, s.err, lastLines(s.stderr.String(), 10))
	default:
		return nil
	}
}

// stop sends SIGTERM, as a supervisor does, and waits for the exit; after
// 30 s it kills the process.
func (s *serverProc) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// stopServers stops every server, in parallel.
func stopServers(ss []*serverProc) {
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Go(s.stop)
	}
	wg.Wait()
}

// tailWriter keeps the last max bytes written to it (a server's log).
type tailWriter struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailWriter) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// gcCounts are the server's maintenance counters, read from /metrics.
type gcCounts struct {
	Expired int64 `json:"expired"`
	Purged  int64 `json:"purged"`
	Errors  int64 `json:"errors"`
}

// scrapeGC reads ipam_gc_{expired,purged,errors}_total from the server's
// /metrics (which needs no client certificate).
func scrapeGC(ctx context.Context, hc *http.Client, url string) (gcCounts, error) {
	var c gcCounts
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return c, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return c, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return c, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return c, err
	}
	return parseGCMetrics(string(b)), nil
}

// parseGCMetrics sums the GC counters of a Prometheus text exposition.
func parseGCMetrics(text string) gcCounts {
	var c gcCounts
	for line := range strings.Lines(text) {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
			if j := strings.LastIndexByte(line, '}'); j >= 0 {
				rest = strings.TrimSpace(line[j+1:])
			}
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		switch name {
		case "ipam_gc_expired_total":
			c.Expired += int64(v)
		case "ipam_gc_purged_total":
			c.Purged += int64(v)
		case "ipam_gc_errors_total":
			c.Errors += int64(v)
		}
	}
	return c
}

// settle writes the database's dirty pages out (CHECKPOINT) before a
// measured run, the service's and the ceiling's alike, so that each starts
// from the same state: without it, a run that follows the ceiling's bulk
// load and its database drop pays for their checkpoint and the full-page
// images after it, and the ratio measures the order of the phases. A
// database user that may not checkpoint leaves the state as it is, with a
// note.
func (d *database) settle(ctx context.Context, out io.Writer) {
	conn, err := pgx.Connect(ctx, d.url)
	if err == nil {
		_, err = conn.Exec(ctx, "CHECKPOINT")
		conn.Close(ctx)
	}
	if err != nil && ctx.Err() == nil {
		fmt.Fprintf(out, "  checkpoint before the run: %v\n", err)
	}
}

// walLSN answers the database's current WAL insert position.
func (d *database) walLSN(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, d.url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var lsn string
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// walSince answers the WAL bytes written since lsn (every writer's: the
// servers' requests and their background passes, GC and top-up).
func (d *database) walSince(ctx context.Context, lsn string) (int64, error) {
	conn, err := pgx.Connect(ctx, d.url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n float64
	err = conn.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)`, lsn).Scan(&n)
	return int64(n), err
}
