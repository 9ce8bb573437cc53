// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package pgembed runs a private, throwaway PostgreSQL cluster from the
// server binaries installed on the machine (initdb, postgres): for tests, and
// for a developer's `make run` without a database server to set up.
//
// A cluster lives in one directory of the caller's choosing:
//
//	DataDir/pgdata        the cluster's files (initdb on first Start, reused after)
//	DataDir/run           the unix socket directory
//	DataDir/postgres.log  the server's log
//
// PostgreSQL refuses to run as root. When the caller is root, pgembed runs
// initdb and postgres as the "postgres" OS user that Debian's package creates,
// hands it pgdata and run, and makes DataDir reachable for it.
package pgembed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// defaultSocketPort names the unix socket (.s.PGSQL.5432) when Options.Port
// is 0 and the server listens on no TCP port.
const defaultSocketPort = 5432

// maxSocketPath bounds the unix socket's path. The kernel allows 107 bytes;
// staying well under leaves room for the lock file's longer name.
const maxSocketPath = 99

// defaultStartTimeout bounds Start when its context has no deadline.
const defaultStartTimeout = 2 * time.Minute

// Options says where and how to run a cluster. The zero value is invalid:
// DataDir is required.
type Options struct {
	// DataDir holds the cluster (see the package documentation). It is
	// created with mode 0755 when absent; a relative path is taken from the
	// working directory. Its unix socket path must stay under 100 bytes, so
	// keep it short (a directory under /tmp is fine), and it may not hold a
	// comma.
	DataDir string
	// BinDir holds initdb and postgres. Empty means FindBinDir().
	BinDir string
	// Port is the TCP port the server also listens on, on 127.0.0.1 only.
	// 0 means unix socket only; the socket is then named after port 5432.
	Port int
	// Fast turns durability off (fsync, synchronous_commit,
	// full_page_writes): for tests, whose data may be lost on a machine
	// crash. Leave it off for a development server that keeps its data.
	Fast bool
	// Logger receives pgembed's own messages; nil discards them. The
	// server's log goes to DataDir/postgres.log.
	Logger *slog.Logger
	// Supervise restarts the server when it exits without Stop (killed,
	// crashed), after a backoff that doubles from RestartBackoff to
	// MaxRestartBackoff; Alive reports the server gone once
	// MaxRestartFailures restarts in a row have failed. Off, a server
	// that exits stays down and Alive says so at once.
	Supervise bool
}

// Restart policy of a supervised cluster.
const (
	RestartBackoff     = 100 * time.Millisecond
	MaxRestartBackoff  = 5 * time.Second
	MaxRestartFailures = 3
)

// Validate reports every problem with o at once (errors.Join).
func (o Options) Validate() error {
	var errs []error
	if o.DataDir == "" {
		errs = append(errs, errors.New("pgembed: DataDir is required"))
	} else if abs, err := filepath.Abs(o.DataDir); err != nil {
		errs = append(errs, fmt.Errorf("pgembed: DataDir: %w", err))
	} else if strings.Contains(abs, ",") {
		// libpq and pgx read a comma in host= as a list of hosts.
		errs = append(errs, fmt.Errorf("pgembed: DataDir %q has a comma, which a connection string cannot name", abs))
	} else if p := socketPath(abs, o.socketPort()); len(p) > maxSocketPath {
		errs = append(errs, fmt.Errorf("pgembed: unix socket path %q is %d bytes, more than %d: choose a shorter DataDir",
			p, len(p), maxSocketPath))
	}
	if o.Port < 0 || o.Port > 65535 {
		errs = append(errs, fmt.Errorf("pgembed: Port %d is outside 0..65535", o.Port))
	}
	return errors.Join(errs...)
}

func (o Options) socketPort() int {
	if o.Port == 0 {
		return defaultSocketPort
	}
	return o.Port
}

func socketPath(dataDir string, port int) string {
	return filepath.Join(dataDir, "run", ".s.PGSQL."+strconv.Itoa(port))
}

// Cluster is a running PostgreSQL server started by Start. Its methods are
// safe for concurrent use.
type Cluster struct {
	pgData  string
	runDir  string
	logPath string
	port    int // the TCP port, or the socket's name when not listening on TCP
	log     *slog.Logger

	// proc, exited and waitErr are the current postmaster's; a
	// supervised cluster replaces them on restart, holding mu.
	proc   *os.Process
	exited chan struct{} // closed once the postmaster has exited and waitErr is set
	// waitErr is the postmaster's exit status; read it only after exited is closed.
	waitErr error

	mu       sync.Mutex // protects stopped, stopErr, proc, exited, waitErr (on restart) and down; serialises Stop and restarts
	stopped  bool
	stopErr  error
	logStart int64 // the log's size when the server started, for error messages

	supervised bool
	restart    func() error // starts a new postmaster and waits for it; holding mu
	// down is the error of the last failed restart, failures the number of
	// restarts that failed in a row (0 while the server runs).
	down     error
	failures int
}

// Alive answers nil while the server runs, or while a supervised server
// that exited is being restarted and fewer than MaxRestartFailures
// restarts in a row have failed; else why it is gone. After Stop it answers
// an error.
func (c *Cluster) Alive() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return errors.New("pgembed: PostgreSQL stopped")
	}
	select {
	case <-c.exited:
	default:
		return nil
	}
	if c.supervised && c.failures < MaxRestartFailures {
		return nil
	}
	if c.down != nil {
		return fmt.Errorf("pgembed: PostgreSQL exited (%v) and %d restarts failed, the last: %w", c.waitErr, c.failures, c.down)
	}
	return fmt.Errorf("pgembed: PostgreSQL exited: %v", c.waitErr)
}

// Start runs a PostgreSQL server on o.DataDir and returns once it accepts
// connections. It runs initdb first when DataDir/pgdata holds no cluster
// (superuser "postgres", trust authentication, UTF8, locale C) and reuses an
// existing one otherwise. A postmaster.pid left by a crashed server is removed
// when no process works in the data directory any more; if one does, Start
// fails with ErrDataDirInUse.
//
// ctx bounds the start only (2 minutes when it has no deadline); cancelling
// it later does not stop the server: call Stop. If the Go program exits
// without Stop, the server gets an immediate shutdown (Linux).
func Start(ctx context.Context, o Options) (*Cluster, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultStartTimeout)
		defer cancel()
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	binDir := o.BinDir
	if binDir == "" {
		var err error
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	} else if err := checkBinDir(binDir); err != nil {
		return nil, fmt.Errorf("pgembed: BinDir %q: %w", binDir, err)
	}
	dataDir, err := filepath.Abs(o.DataDir)
	if err != nil {
		return nil, fmt.Errorf("pgembed: DataDir: %w", err)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		// Said up front: a root user who sees files owned by postgres, or a
		// permission error from initdb, should know why.
		log.Info("pgembed: running as root, so PostgreSQL runs as the postgres OS user (initdb and postgres refuse root)",
			"uid", cred.Uid, "data_dir", dataDir)
	}
	c := &Cluster{
		pgData:  filepath.Join(dataDir, "pgdata"),
		runDir:  filepath.Join(dataDir, "run"),
		logPath: filepath.Join(dataDir, "postgres.log"),
		port:    o.socketPort(),
		log:     log,
		exited:  make(chan struct{}),
	}
	began := time.Now()
	if err := c.prepareDirs(dataDir, cred); err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgembed: %w", err)
	}
	defer logFile.Close() // the server keeps its own descriptor
	if err := c.initdb(ctx, binDir, dataDir, cred, logFile); err != nil {
		return nil, err
	}
	if fi, err := logFile.Stat(); err == nil {
		c.logStart = fi.Size()
	}
	if err := c.removeStaleLockFiles(); err != nil {
		return nil, err
	}
	if err := c.startServer(binDir, dataDir, o, cred, logFile); err != nil {
		return nil, err
	}
	if err := c.waitReady(ctx); err != nil {
		c.kill()
		return nil, err
	}
	log.Info("pgembed: PostgreSQL started", "data_dir", dataDir, "pid", c.proc.Pid,
		"port", o.Port, "bin_dir", binDir, "elapsed", time.Since(began).Round(time.Millisecond))
	if o.Supervise {
		c.supervised = true
		c.restart = func() error {
			lf, err := os.OpenFile(c.logPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
			if err != nil {
				return err
			}
			defer lf.Close()
			if fi, err := lf.Stat(); err == nil {
				c.logStart = fi.Size()
			}
			// A killed postmaster's backends notice and exit soon; until
			// then this refuses (ErrDataDirInUse) and the next try comes.
			if err := c.removeStaleLockFiles(); err != nil {
				return err
			}
			if err := c.startServer(binDir, dataDir, o, cred, lf); err != nil {
				return err
			}
			rctx, cancel := context.WithTimeout(context.Background(), defaultStartTimeout)
			defer cancel()
			if err := c.waitReady(rctx); err != nil {
				c.kill()
				return err
			}
			return nil
		}
		go c.supervise()
	}
	return c, nil
}

// exitedOf is the exit channel of proc when it is the current postmaster,
// else a closed channel (it has been replaced, so it exited).
func (c *Cluster) exitedOf(proc *os.Process) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == proc {
		return c.exited
	}
	done := make(chan struct{})
	close(done)
	return done
}

// supervise restarts the server each time it exits without Stop, with a
// doubling backoff between failed attempts, until Stop.
func (c *Cluster) supervise() {
	for {
		c.mu.Lock()
		exited := c.exited
		c.mu.Unlock()
		<-exited
		backoff := RestartBackoff
		for {
			c.mu.Lock()
			if c.stopped {
				c.mu.Unlock()
				return
			}
			c.log.Warn("pgembed: PostgreSQL exited; restarting", "err", c.waitErr, "failures", c.failures)
			err := c.restart()
			if err == nil {
				c.failures, c.down = 0, nil
				c.log.Info("pgembed: PostgreSQL restarted", "pid", c.proc.Pid)
				c.mu.Unlock()
				break
			}
			c.failures++
			c.down = err
			c.log.Error("pgembed: restarting PostgreSQL failed", "err", err, "failures", c.failures, "retry_in", backoff)
			c.mu.Unlock()
			time.Sleep(backoff)
			backoff = min(2*backoff, MaxRestartBackoff)
		}
	}
}

// PID answers the current postmaster's process id (0 when none runs):
// its backends are its children, and an exited backend's CPU time goes to
// its cutime.
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil || c.stopped {
		return 0
	}
	return c.proc.Pid
}

// ConnString returns a libpq keyword/value connection string (which pgx and
// psql accept) for database dbname as superuser "postgres" over the unix
// socket.
func (c *Cluster) ConnString(dbname string) string {
	return fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable",
		quoteConnValue(c.runDir), c.port, quoteConnValue(dbname))
}

// Stop shuts the server down (fast shutdown: open transactions are rolled
// back, connections closed) and waits for it to exit. If ctx ends first it
// escalates to an immediate shutdown, then SIGKILL, waits for the exit, and
// returns an error. Stop is idempotent: later calls return the first call's
// result. It also returns an error when the server had exited on its own.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return c.stopErr
	}
	c.stopped = true
	c.stopErr = c.stopLocked(ctx)
	return c.stopErr
}

func (c *Cluster) stopLocked(ctx context.Context) error {
	select {
	case <-c.exited:
		return fmt.Errorf("pgembed: PostgreSQL exited before Stop: %v%s", c.waitErr, c.logTail())
	default:
	}
	_ = c.proc.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-c.exited:
		c.log.Info("pgembed: PostgreSQL stopped", "data_dir", filepath.Dir(c.pgData))
		return nil
	case <-ctx.Done():
	}
	c.kill()
	return fmt.Errorf("pgembed: fast shutdown unfinished (%w); sent immediate shutdown", context.Cause(ctx))
}

// kill ends the server at once, immediate shutdown first, and waits for it.
func (c *Cluster) kill() {
	_ = c.proc.Signal(syscall.SIGQUIT)
	select {
	case <-c.exited:
		return
	case <-time.After(5 * time.Second):
	}
	_ = c.proc.Kill()
	<-c.exited
}

// serverCredential returns the OS user to run initdb and postgres as: nil
// (the caller) unless the caller is root, then the "postgres" user.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgembed: running as root needs a %q OS user to run PostgreSQL as "+
			"(scripts/ensure-postgres.sh or `useradd --system --no-create-home postgres` creates it): %w", "postgres", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgembed: user postgres: uid %q: %w", u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgembed: user postgres: gid %q: %w", u.Gid, err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// prepareDirs creates DataDir (0755), pgdata (0700) and run (0755); when
// running as another user (cred != nil), it gives that user pgdata and run
// and lets it traverse DataDir and its parents.
func (c *Cluster) prepareDirs(dataDir string, cred *syscall.Credential) error {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	if err := mkdirIfAbsent(c.pgData, 0o700); err != nil {
		return err
	}
	if err := mkdirIfAbsent(c.runDir, 0o755); err != nil {
		return err
	}
	if cred == nil {
		return nil
	}
	for _, d := range []string{c.pgData, c.runDir} {
		if err := os.Chown(d, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgembed: %w", err)
		}
	}
	return c.makeTraversable(dataDir, cred)
}

func mkdirIfAbsent(dir string, perm fs.FileMode) error {
	if err := os.Mkdir(dir, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("pgembed: %w", err)
	}
	return nil
}

// makeTraversable adds the search (x) permission that cred's user lacks on
// dir and each of its parents, for the class (owner, group or other) that
// user falls in, and logs each change. A t.TempDir(), made with mode 0700, is
// the usual case.
func (c *Cluster) makeTraversable(dir string, cred *syscall.Credential) error {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("pgembed: %w", err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		var bit fs.FileMode = 0o001
		switch {
		case st.Uid == cred.Uid:
			bit = 0o100
		case st.Gid == cred.Gid:
			bit = 0o010
		}
		if fi.Mode().Perm()&bit == 0 {
			mode := fi.Mode().Perm() | bit
			if err := os.Chmod(d, mode); err != nil {
				return fmt.Errorf("pgembed: letting user postgres reach %s: %w", dir, err)
			}
			c.log.Info("pgembed: made directory traversable for user postgres", "dir", d, "mode", mode)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// initdb creates the cluster unless pgdata already holds one. It refuses a
// non-empty pgdata without PG_VERSION rather than guess what it holds, and
// empties pgdata again when initdb fails.
func (c *Cluster) initdb(ctx context.Context, binDir, dataDir string, cred *syscall.Credential, logFile *os.File) error {
	if _, err := os.Stat(filepath.Join(c.pgData, "PG_VERSION")); err == nil {
		c.log.Debug("pgembed: reusing initialised cluster", "pgdata", c.pgData)
		return nil
	}
	entries, err := os.ReadDir(c.pgData)
	if err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	if len(entries) > 0 {
		return fmt.Errorf("pgembed: %s is neither empty nor an initialised cluster (no PG_VERSION); remove it", c.pgData)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"),
		"-D", c.pgData, "--auth=trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C")
	cmd.Dir = dataDir
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.CombinedOutput()
	_, _ = logFile.Write(out)
	if err != nil {
		c.emptyPgData()
		return fmt.Errorf("pgembed: initdb %s: %w\n%s", c.pgData, err, lastLines(out, 30))
	}
	c.log.Info("pgembed: initialised cluster", "pgdata", c.pgData)
	return nil
}

func (c *Cluster) emptyPgData() {
	entries, _ := os.ReadDir(c.pgData)
	for _, e := range entries {
		_ = os.RemoveAll(filepath.Join(c.pgData, e.Name()))
	}
}

// removeStaleLockFiles removes postmaster.pid and the socket's lock file
// left by a server that crashed, once no process works in pgdata any more.
// PostgreSQL removes such files itself when their process id is free, but
// not when the id has since been reused by another process, as happens after
// a container restart. Where processes cannot be listed, the files stay and
// PostgreSQL decides.
func (c *Cluster) removeStaleLockFiles() error {
	pidFile := filepath.Join(c.pgData, "postmaster.pid")
	sock := filepath.Join(c.runDir, ".s.PGSQL."+strconv.Itoa(c.port))
	stale := []string{pidFile, sock + ".lock"}
	found := false
	for _, f := range stale {
		if _, err := os.Lstat(f); err == nil {
			found = true
		}
	}
	if !found {
		return nil
	}
	pids, ok := processesInDir(c.pgData)
	if !ok {
		return nil
	}
	if len(pids) > 0 {
		return fmt.Errorf("%w: processes %v work in %s (a running server or orphans of a crashed one); stop them first",
			ErrDataDirInUse, pids, c.pgData)
	}
	for _, f := range append(stale, sock) {
		if err := os.Remove(f); err == nil {
			c.log.Warn("pgembed: removed stale file of a crashed server", "file", f)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("pgembed: %w", err)
		}
	}
	return nil
}

// startServer starts the postmaster with its output appended to the log, and
// a goroutine that reaps it.
func (c *Cluster) startServer(binDir, dataDir string, o Options, cred *syscall.Credential, logFile *os.File) error {
	listen := ""
	if o.Port != 0 {
		listen = "127.0.0.1"
	}
	settings := []string{
		"listen_addresses=" + listen,
		"port=" + strconv.Itoa(c.port),
		"unix_socket_directories=" + quoteGUCListItem(c.runDir),
		"max_connections=300",
		"shared_buffers=128MB",
		"logging_collector=off",
		"log_destination=stderr",
	}
	if o.Fast {
		settings = append(settings, "fsync=off", "synchronous_commit=off", "full_page_writes=off")
	}
	args := []string{"-D", c.pgData}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(binDir, "postgres"), args...)
	cmd.Dir = dataDir
	cmd.Env = childEnv()
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = serverSysProcAttr(cred)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgembed: starting postgres: %w", err)
	}
	// A new exit channel per postmaster: a restart must not reuse the
	// closed one of the process before.
	exited := make(chan struct{})
	c.proc, c.exited = cmd.Process, exited
	go func() {
		err := cmd.Wait()
		c.waitErr = err
		close(exited)
	}()
	return nil
}

// waitReady polls until the server accepts a connection, exits, or ctx ends.
func (c *Cluster) waitReady(ctx context.Context) error {
	connString := c.ConnString("postgres")
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgconn.Connect(attempt, connString)
		cancel()
		if err == nil {
			return conn.Close(ctx)
		}
		select {
		case <-c.exited:
			return fmt.Errorf("pgembed: PostgreSQL exited during start (%v); log %s:%s", c.waitErr, c.logPath, c.logTail())
		case <-ctx.Done():
			return fmt.Errorf("pgembed: PostgreSQL not ready (%w; last attempt: %v); log %s:%s",
				context.Cause(ctx), err, c.logPath, c.logTail())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// logTail returns the last lines the server logged since this Start, each
// indented, for error messages.
func (c *Cluster) logTail() string {
	f, err := os.Open(c.logPath)
	if err != nil {
		return " (unreadable: " + err.Error() + ")"
	}
	defer f.Close()
	const maxBytes = 8 << 10
	from := c.logStart
	if fi, err := f.Stat(); err == nil && fi.Size()-from > maxBytes {
		from = fi.Size() - maxBytes
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	tail := lastLines(b, 30)
	if tail == "" {
		return " (empty)"
	}
	return "\n    " + strings.ReplaceAll(tail, "\n", "\n    ")
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// childEnv is the caller's environment without PG* variables, which would
// otherwise change what initdb and postgres do.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	return env
}

// quoteConnValue quotes a value of a libpq keyword/value string when needed.
func quoteConnValue(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t\n\r\\'") {
		return v
	}
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	return "'" + r.Replace(v) + "'"
}

// quoteGUCListItem double-quotes one item of a list setting such as
// unix_socket_directories when it holds a comma, space or double quote.
// (Validate rejects commas, for connection strings' sake.)
func quoteGUCListItem(v string) string {
	if !strings.ContainsAny(v, ", \t\"") {
		return v
	}
	return `"` + strings.ReplaceAll(v, `"`, `""`) + `"`
}
