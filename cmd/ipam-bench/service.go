package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/pgembed"
	"github.com/ipam-dev/ipam/internal/store"
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

// replica is one in-process instance of the service, wired like cmd/server:
// its own store (connection pool), HTTP server on loopback and GC loop.
type replica struct {
	store  *store.Store
	srv    *http.Server
	url    string
	stopGC context.CancelFunc
	gcDone chan struct{}
}

// gcStats counts what the replicas' GC loops did, across all replicas.
type gcStats struct {
	expired, purged, errors atomic.Int64
}

// startReplicas starts n replicas sharing dbURL. The schema must be
// migrated already.
func startReplicas(ctx context.Context, n int, dbURL string, o store.Options, gcEvery time.Duration,
	log *slog.Logger, gc *gcStats) ([]*replica, error) {
	var rs []*replica
	for range n {
		r, err := startReplica(ctx, dbURL, o, gcEvery, log, gc, nil)
		if err != nil {
			stopReplicas(rs)
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// startReplica starts one replica; with tc it serves HTTPS with that
// configuration (cmd/server's serverTLS), otherwise plain HTTP.
func startReplica(ctx context.Context, dbURL string, o store.Options, gcEvery time.Duration,
	log *slog.Logger, gc *gcStats, tc *tls.Config) (*replica, error) {
	st, err := store.Open(ctx, dbURL, o)
	if err != nil {
		return nil, err
	}
	if _, err := st.Ready(ctx); err != nil {
		st.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		st.Close()
		return nil, err
	}
	// The same timeouts as cmd/server.
	srv := &http.Server{
		Handler: api.NewHandler(st, api.Options{Logger: log, MaxBodyBytes: api.DefaultMaxBodyBytes,
			// Plain HTTP acts as admin, as with --dev-no-auth. No rate
			// limits: the shim phase drives one node with 16 parallel
			// shims, hundreds of requests per second, far beyond a real
			// node and cmd/server's default node limit (the load of many
			// nodes meets the defaults: TestDefaultRateLimitsDoNotThrottleTheBenchmark).
			AnonymousRole: alloc.RoleAdmin}),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		TLSConfig:         tc,
	}
	scheme := "http://"
	if tc != nil {
		scheme = "https://"
	}
	go func() {
		var err error
		if tc != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving", "err", err)
		}
	}()
	gcCtx, stopGC := context.WithCancel(context.Background())
	r := &replica{store: st, srv: srv, url: scheme + ln.Addr().String(), stopGC: stopGC, gcDone: make(chan struct{})}
	go func() {
		defer close(r.gcDone)
		runGC(gcCtx, st, gcEvery, log, gc)
	}()
	return r, nil
}

// stopReplicas shuts every replica down, in parallel.
func stopReplicas(rs []*replica) {
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = r.srv.Shutdown(ctx)
			r.stopGC()
			<-r.gcDone
			r.store.Close()
		})
	}
	wg.Wait()
}

// runGC is cmd/server's GC loop (store.RunMaintenance), counted for the
// report.
func runGC(ctx context.Context, st *store.Store, every time.Duration, log *slog.Logger, gc *gcStats) {
	store.RunMaintenance(ctx, st, every, time.Minute, func(_ context.Context, p store.MaintenancePass) {
		gc.expired.Add(p.Expired)
		gc.purged.Add(p.Purged)
		for _, err := range p.Errors() {
			gc.errors.Add(1)
			log.Error("store maintenance", "err", err)
		}
	})
}
