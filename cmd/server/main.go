// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Command server runs the IPAM service.
//
//	server [serve] [flags]   serve the REST API (default)
//	server migrate [flags]   apply database migrations and exit
//	server check [flags]     verify the database's invariants in one snapshot,
//	                          print the report as JSON, exit 2 if anything is found
//	server issue-cert [flags] issue a server, node or operator certificate
//	                          from a CA directory (created when empty)
//	server token create|list|revoke [flags]
//	                          manage API tokens in the database
//
// With no database URL, serve starts a private PostgreSQL from the locally
// installed binaries under the data directory and stops it on exit.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/pgembed"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/telemetry"
	"github.com/ipam-dev/ipam/internal/ui"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, nil); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-server:", err)
		if errors.As(err, new(findingsError)) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// run is main without the process: tests call it with their own context,
// environment and a channel that receives the bound address.
func run(ctx context.Context, args []string, getenv func(string) string, bound chan<- string) error {
	cmd := "serve"
	if len(args) > 0 && args[0] == "issue-cert" {
		return issueCert(args[1:], os.Stdout)
	}
	if len(args) > 0 && args[0] == "token" {
		return tokenCommand(ctx, args[1:], getenv, os.Stdout)
	}
	if len(args) > 0 && args[0] == "check" {
		return check(ctx, args[1:], getenv, os.Stdout)
	}
	if len(args) > 0 && (args[0] == "serve" || args[0] == "migrate") {
		cmd, args = args[0], args[1:]
	}
	cfg, err := parseConfig(cmd, args, getenv)
	if err != nil {
		return err
	}
	// The standard OTEL_* variables turn tracing on (read through getenv,
	// like every setting, so tests decide).
	cfg.Tracing = telemetry.TracingRequested(getenv)
	log := slog.New(telemetry.LogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel})))

	dbURL, dbAlive, stopDB, err := database(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer stopDB()

	if cmd == "migrate" || cfg.Migrate {
		v, err := store.Migrate(ctx, dbURL)
		if err != nil {
			return err
		}
		log.Info("schema migrated", "version", v)
		if cmd == "migrate" {
			return nil
		}
	}
	return serve(ctx, cfg, dbURL, dbAlive, log, bound)
}

// database returns the URL to use, starting the embedded PostgreSQL when no
// URL is configured; stop shuts it down again. alive is nil for a database
// of the URL; for the embedded one it reports the server gone once
// pgembed's restarts (it supervises the server) have failed repeatedly,
// which /healthz answers 503.
func database(ctx context.Context, cfg config, log *slog.Logger) (url string, alive func() error, stop func(), err error) {
	if cfg.DatabaseURL != "" {
		return cfg.DatabaseURL, nil, func() {}, nil
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return "", nil, nil, err
	}
	log.Info("starting embedded PostgreSQL", "dataDir", cfg.DataDir)
	cl, err := pgembed.Start(ctx, pgembed.Options{DataDir: cfg.DataDir, Logger: log, Supervise: true})
	if err != nil {
		return "", nil, nil, fmt.Errorf("embedded PostgreSQL: %w", err)
	}
	const dbname = "postgres"
	log.Info("embedded PostgreSQL ready", "dataDir", cfg.DataDir, "connString", cl.ConnString(dbname))
	return cl.ConnString(dbname), cl.Alive, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := cl.Stop(sctx); err != nil {
			log.Error("stopping embedded PostgreSQL", "err", err)
		}
	}, nil
}

func serve(ctx context.Context, cfg config, dbURL string, dbAlive func() error, log *slog.Logger, bound chan<- string) error {
	tracing := &telemetry.Tracing{}
	if cfg.Tracing {
		var err error
		if tracing, err = telemetry.NewTracing(ctx); err != nil {
			return err
		}
		log.Info("tracing on: spans are exported as the OTEL_* variables say")
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tracing.Shutdown(sctx); err != nil {
			log.Error("flushing traces", "err", err)
		}
	}()
	st, err := store.Open(ctx, dbURL, store.Options{
		TracerProvider:      tracing.Provider(),
		LeaseExpiry:         cfg.LeaseExpiry,
		Cooldown:            cfg.Cooldown,
		AutoRegisterNodes:   cfg.AutoRegisterNodes,
		MaxConns:            int32(cfg.MaxConns),
		BatchWriters:        cfg.BatchWriters,
		DefaultPool:         cfg.DefaultPool,
		BlockReleaseHoldOff: cfg.BlockReleaseDelay,
		AgentPoolsSpace:     agentPoolsSpace(cfg),
		ReconcileMinAge:     cfg.ReconcileMinAge,
		StickyRetention:     cfg.StickyRetention,
		HistoryRetention:    cfg.HistoryRetention,
		TopUp:               cfg.BlockTopUp,
	})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := bootstrapToken(ctx, st, cfg, log); err != nil {
		return err
	}

	metrics, err := telemetry.New(telemetry.CiliumPrefix(cfg.MetricsPrefix))
	if err != nil {
		return err
	}
	defer func() {
		if err := metrics.Shutdown(context.Background()); err != nil {
			log.Error("stopping metrics", "err", err)
		}
	}()
	if _, err := observePool(metrics.Meter(), st.Stat); err != nil {
		return err
	}
	if _, err := observeBatches(metrics.Meter(), writeBatchMetrics, st.WriteBatchStats); err != nil {
		return err
	}
	if _, err := observeBatches(metrics.Meter(), lookupBatchMetrics, st.LookupBatchStats); err != nil {
		return err
	}
	gcm, err := newGCMetrics(metrics.Meter())
	if err != nil {
		return err
	}
	if _, err := observeCarves(metrics.Meter(), st.Carves); err != nil {
		return err
	}
	durability := &durabilityWatch{read: st.Durability, log: log}
	durability.check(ctx)
	if _, err := observeDurability(metrics.Meter(), durability); err != nil {
		return err
	}
	durabilityCtx, stopDurability := context.WithCancel(ctx)
	durabilityDone := make(chan struct{})
	go func() {
		defer close(durabilityDone)
		durability.run(durabilityCtx, cfg.DurabilityInterval)
	}()
	defer func() { stopDurability(); <-durabilityDone }()

	if !cfg.InsecureHTTP && cfg.TLSCertFile == "" {
		if cfg, err = withDevelopmentPKI(cfg, log); err != nil {
			return err
		}
	}
	if err := checkClusterSpace(ctx, cfg, st.GetSpace); err != nil {
		return err
	}
	pods, err := startKube(ctx, cfg, log)
	if err != nil {
		return err
	}
	operatorCtx, stopOperator := context.WithCancel(ctx)
	defer stopOperator()
	operator, operatorDone, err := startCiliumOperator(operatorCtx, cfg, st, metrics.Meter(), log)
	if err != nil {
		return err
	}
	// Stopping gives the leader lease up, so another replica takes over
	// at once instead of after the lease expires.
	defer func() { stopOperator(); <-operatorDone }()
	lbCtx, stopLB := context.WithCancel(ctx)
	defer stopLB()
	lbDone, err := startLBIPAM(lbCtx, cfg, st, log)
	if err != nil {
		return err
	}
	defer func() { stopLB(); <-lbDone }()
	reports := &usageReports{read: st.UsageReport, refresh: cfg.UsageMetricsRefresh, timeout: 10 * time.Second, log: log, now: time.Now}
	var ciliumNodes api.CiliumNodeSource
	if operator != nil {
		ciliumNodes, reports.crdNeeded = operator, operator.NeededIPs
	}
	if err := observeUsage(metrics.CiliumMeter(), metrics.Meter(), reports); err != nil {
		return err
	}
	var webView http.Handler // nil (--ui=false): no /ui routes, and no session cookie counts
	if cfg.UI {
		webView = ui.Handler()
	}
	handler := api.NewHandler(api.StoresOf(st), api.Options{
		Logger: log, MaxBodyBytes: cfg.MaxBodyBytes, Meter: metrics.Meter(), CiliumMeter: metrics.CiliumMeter(), TracerProvider: tracing.Provider(), IsUnavailable: store.IsUnavailable,
		PodMetadata: pods, KubeSpace: cfg.ClusterSpace, CiliumNodes: ciliumNodes, RateLimits: cfg.RateLimits,
		AnonymousRole: anonymousRole(cfg), AnonymousLoopbackOnly: true, Liveness: dbAlive,
		Pprof: cfg.Pprof, Admission: cfg.admission(), UI: webView,
	})
	srv := &http.Server{
		Handler:           withMetrics(handler, metrics.Handler()),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		// The handler refuses headers over api.DefaultMaxHeaderBytes with
		// a 431 problem; Go's own limit, which answers in text/plain, is
		// only a backstop far above it.
		MaxHeaderBytes: 16 * api.DefaultMaxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	if cfg.TLSCertFile != "" {
		tc, err := serverTLS(cfg)
		if err != nil {
			ln.Close()
			return err
		}
		ln = tls.NewListener(ln, tc)
	}
	if cfg.InsecureHTTP {
		logInsecure(log, cfg, ln.Addr().String())
	} else {
		log.Info("serving", "addr", ln.Addr().String(), "tls", true, "clientCertificates", cfg.ClientCAFile != "")
	}
	if cfg.UI {
		log.Info("web view at /ui/ (read-only; sign in with a viewer token or a client certificate)", "addr", ln.Addr().String())
	}
	if bound != nil {
		bound <- ln.Addr().String()
	}

	gcCtx, stopGC := context.WithCancel(ctx)
	gcDone := make(chan struct{})
	go func() {
		defer close(gcDone)
		runGC(gcCtx, st, cfg.GCInterval, cfg.UsageSampleEvery, log, gcm)
	}()
	cloudCtx, stopCloud := context.WithCancel(ctx)
	cloudDone, err := startCloud(cloudCtx, cfg, st, log, metrics.Meter())
	if err != nil {
		stopCloud()
		stopGC()
		<-gcDone
		return err
	}
	defer func() {
		stopCloud()
		if cloudDone != nil {
			<-cloudDone
		}
	}()
	if cfg.BlockTopUp {
		// It ends with ctx, the transaction of a carve under way rolled
		// back (what it leaves undone, Rebalance does), and serve returns
		// only once it has.
		topUpCtx, stopTopUp := context.WithCancel(ctx)
		topUpDone := make(chan struct{})
		go func() {
			defer close(topUpDone)
			runTopUps(topUpCtx, st, cfg.BlockTopUpInterval, log)
		}()
		defer func() { stopTopUp(); <-topUpDone }()
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		stopGC()
		<-gcDone
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	stopGC()
	<-gcDone
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// runGC runs the store's maintenance until ctx ends, logging and counting
// what each pass released, purged and failed at.
func runGC(ctx context.Context, st store.Maintainer, every, sampleEvery time.Duration, log *slog.Logger, m gcMetrics) {
	store.RunMaintenance(ctx, st, every, sampleEvery, func(ctx context.Context, p store.MaintenancePass) {
		for _, err := range p.Errors() {
			log.Error("store maintenance", "err", err)
			m.errors.Add(ctx, 1)
		}
		if r := p.Rebalanced; r.Carved > 0 || r.Released > 0 || r.InDeficit > 0 {
			log.Info("rebalanced multi-pool blocks", "carved", r.Carved, "released", r.Released, "nodePoolsInDeficit", r.InDeficit)
		}
		if p.Expired > 0 {
			log.Info("released expired pending leases", "count", p.Expired)
			m.expired.Add(ctx, p.Expired)
		}
		if p.Purged > 0 {
			log.Debug("purged cooled addresses", "count", p.Purged)
			m.purged.Add(ctx, p.Purged)
		}
		if p.Pruned > 0 {
			log.Debug("pruned address history", "count", p.Pruned)
		}
	})
}

// runTopUps runs the store's top-up until ctx ends. A failed pass is
// logged once until a pass succeeds again (its work is kept for the next
// pass, and the GC's Rebalance tops up as well); what passes carve is
// logged at debug level.
func runTopUps(ctx context.Context, st *store.Store, every time.Duration, log *slog.Logger) {
	failing := false
	st.RunTopUps(ctx, every, func(ctx context.Context, r store.ToppedUp, err error) {
		switch {
		case err != nil && !failing:
			log.Error("block top-up failed; logged again once it has worked", "err", err)
		case err == nil && failing:
			log.Info("block top-up works again")
		}
		failing = err != nil
		if r.Carved > 0 || r.InDeficit > 0 {
			log.Debug("topped up multi-pool blocks", "nodePools", r.NodePools, "carved", r.Carved, "nodePoolsInDeficit", r.InDeficit)
		}
	})
}

// serverTLS is the TLS configuration of the listener: the server's
// certificate and, with a client CA, mutual TLS that refuses any client
// without a certificate of that CA.
func serverTLS(cfg config) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls-cert-file/tls-key-file: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if cfg.ClientCAFile != "" {
		pemData, err := os.ReadFile(cfg.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("client-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemData) {
			return nil, fmt.Errorf("client-ca-file %s holds no PEM certificate", cfg.ClientCAFile)
		}
		// Verified when given, not required by TLS: a request may carry a
		// bearer token instead, and probes and scrapers carry nothing
		// (/healthz, /readyz, /metrics). The API answers 401 to any other
		// request without credentials.
		tc.ClientCAs, tc.ClientAuth = pool, tls.VerifyClientCertIfGiven
	}
	return tc, nil
}
