// Command ipam-bench measures the IPAM service over real HTTP on loopback:
// a 50/50 mix of Pod IP allocations (POST /v1/nodes/{node}/leases) and
// releases (DELETE /v1/nodes/{node}/attachments/{cid}/{if}) from
// -concurrency clients, against -replicas in-process servers that share one
// PostgreSQL. After each run it runs the database's own ceiling for a
// comparable workload (db-ceiling.sh, pgbench) against the same PostgreSQL
// and prints the service's rate as a ratio of it.
//
// Then (-shim, default on) it builds the CNI plugin cmd/cni-shim into a
// temporary directory and times it end to end as a runtime runs it: one process
// per ADD and per DEL (process start, mutual-TLS handshake, request) of a
// fresh container, cniVersion 1.1.0, against an in-process HTTPS server of
// its own in an address space of its own, -shim-calls pairs in sequence and
// -shim-parallel workers of -shim-parallel-calls pairs each.
//
// Without -database-url it starts a private, durable PostgreSQL (pgembed)
// in a temporary directory and removes it at the end. With one, it works in
// a fresh address space and deletes it at the end.
//
// It exits 1 when a run or a shim mode answered more than 0.1% errors or
// the ceiling failed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/store"
)

// maxErrorRate is the share of failed calls above which a run fails.
const maxErrorRate = 0.001

// gcInterval is cmd/server's default -gc-interval.
const gcInterval = 10 * time.Second

// config is every flag of the benchmark.
type config struct {
	DatabaseURL string        `json:"-"`
	Concurrency int           `json:"concurrency"`
	Duration    time.Duration `json:"-"`
	Runs        int           `json:"runs"`
	Nodes       int           `json:"nodes"`
	Prefill     int           `json:"prefill"`
	Mask        int           `json:"mask"`
	Replicas    int           `json:"replicas"`
	MaxConns    int           `json:"maxConns"`
	Ceiling     string        `json:"ceiling"`
	Cooldown    time.Duration `json:"-"`
	Out         string        `json:"-"`
	CPUProfile  string        `json:"-"`
	// The shim phase (shim.go), after the service's runs.
	Shim              bool `json:"shim"`
	ShimCalls         int  `json:"shimCalls"`
	ShimParallel      int  `json:"shimParallel"`
	ShimParallelCalls int  `json:"shimParallelCalls"`
}

// MarshalJSON writes the durations as Go duration strings ("20s").
func (c config) MarshalJSON() ([]byte, error) {
	type plain config // without this method
	return json.Marshal(struct {
		plain
		Duration string `json:"duration"`
		Cooldown string `json:"cooldown"`
	}{plain(c), c.Duration.String(), c.Cooldown.String()})
}

// Validate reports every invalid flag at once.
func (c config) Validate() error {
	var errs []error
	positive := func(name string, v int) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("-%s must be positive, not %d", name, v))
		}
	}
	positive("concurrency", c.Concurrency)
	positive("runs", c.Runs)
	positive("nodes", c.Nodes)
	positive("replicas", c.Replicas)
	if c.Duration < time.Second || c.Duration%time.Second != 0 {
		errs = append(errs, fmt.Errorf("-duration must be whole seconds, at least 1s (pgbench -T takes seconds), not %v", c.Duration))
	}
	if c.Prefill < 0 {
		errs = append(errs, fmt.Errorf("-prefill must not be negative, not %d", c.Prefill))
	}
	if c.Mask < 8 || c.Mask > 30 {
		errs = append(errs, fmt.Errorf("-mask must be within 8..30 for the pool 10.0.0.0/8, not %d", c.Mask))
	}
	if c.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("-max-conns must not be negative, not %d", c.MaxConns))
	}
	if c.Shim {
		positive("shim-calls", c.ShimCalls)
		positive("shim-parallel", c.ShimParallel)
		positive("shim-parallel-calls", c.ShimParallelCalls)
	}
	if c.Cooldown < 0 {
		errs = append(errs, fmt.Errorf("-cooldown must not be negative, not %v", c.Cooldown))
	}
	return errors.Join(errs...)
}

func parseConfig(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("ipam-bench", flag.ContinueOnError)
	fs.StringVar(&c.DatabaseURL, "database-url", "", "PostgreSQL URL; empty starts a private, durable PostgreSQL in a temporary directory")
	fs.IntVar(&c.Concurrency, "concurrency", 32, "clients, each with one request in flight (also the ceiling's pgbench clients)")
	fs.DurationVar(&c.Duration, "duration", 20*time.Second, "length of each run, whole seconds (also the ceiling's)")
	fs.IntVar(&c.Runs, "runs", 3, "runs of the service, each followed by one of the ceiling; medians are reported")
	fs.IntVar(&c.Nodes, "nodes", 64, "nodes, split among the clients")
	fs.IntVar(&c.Prefill, "prefill", 256, "addresses leased per node before measuring")
	fs.IntVar(&c.Mask, "mask", 20, "node block mask (20: 4096 addresses per block, like the ceiling's pools)")
	fs.IntVar(&c.Replicas, "replicas", 1, "in-process service instances sharing the database")
	fs.IntVar(&c.MaxConns, "max-conns", 0, "database connections per replica; 0 = the server's default (store.DefaultMaxConns)")
	fs.StringVar(&c.Ceiling, "ceiling", "../shared/bench/db-ceiling.sh", "path of db-ceiling.sh; the ceiling is skipped when it is missing")
	fs.DurationVar(&c.Cooldown, "cooldown", store.DefaultOptions().Cooldown, "the service's cooldown of released addresses")
	fs.StringVar(&c.Out, "out", "", "write the results as JSON to this file")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the whole program (client and service) to this file")
	fs.BoolVar(&c.Shim, "shim", true, "after the runs, time the CNI plugin cmd/cni-shim end to end (one process per ADD and DEL, mutual TLS)")
	fs.IntVar(&c.ShimCalls, "shim-calls", 200, "sequential ADD+DEL pairs of the shim phase")
	fs.IntVar(&c.ShimParallel, "shim-parallel", 16, "parallel workers of the shim phase")
	fs.IntVar(&c.ShimParallelCalls, "shim-parallel-calls", 50, "ADD+DEL pairs per parallel worker of the shim phase")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if c.MaxConns == 0 {
		c.MaxConns = int(store.DefaultMaxConns())
	}
	return c, c.Validate()
}

func main() {
	cfg, err := parseConfig(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "ipam-bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "ipam-bench:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-bench:", err)
		stop()
		os.Exit(1)
	}
}

// report is the -out file.
type report struct {
	NumCPU     int         `json:"numCPU"`
	GOMAXPROCS int         `json:"gomaxprocs"`
	Postgres   string      `json:"postgres"`
	Private    bool        `json:"privatePostgres"`
	Params     config      `json:"params"`
	Setup      setupResult `json:"setup"`
	Runs       []runResult `json:"runs"`
	Median     medians     `json:"median"`
	CeilingRan bool        `json:"ceilingRan"`
	Shim       *shimReport `json:"shim,omitempty"`
	GC         struct {
		Expired int64 `json:"expired"`
		Purged  int64 `json:"purged"`
		Errors  int64 `json:"errors"`
	} `json:"gc"`
}

type setupResult struct {
	Space          string  `json:"space"`
	PrefillLeases  int     `json:"prefillLeases"`
	PrefillSeconds float64 `json:"prefillSeconds"`
}

// medians are the medians over runs of each figure.
type medians struct {
	OpsPerSec     float64 `json:"opsPerSec"`
	AllocPerSec   float64 `json:"allocPerSec"`
	ReleasePerSec float64 `json:"releasePerSec"`
	AllocP50ms    float64 `json:"allocP50ms"`
	AllocP99ms    float64 `json:"allocP99ms"`
	ReleaseP50ms  float64 `json:"releaseP50ms"`
	ReleaseP99ms  float64 `json:"releaseP99ms"`
	Errors        float64 `json:"errors"`
	CeilingTPS    float64 `json:"ceilingTPS,omitempty"`
	CeilingP99ms  float64 `json:"ceilingP99ms,omitempty"`
	Ratio         float64 `json:"ratio,omitempty"`
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rep := report{NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), Params: cfg}

	db, err := openDatabase(ctx, cfg.DatabaseURL, log)
	if err != nil {
		return err
	}
	defer db.close()
	if _, err := store.Migrate(ctx, db.url); err != nil {
		return err
	}
	if rep.Postgres, err = db.version(ctx); err != nil {
		return fmt.Errorf("SELECT version(): %w", err)
	}
	rep.Private = db.private

	where := "private (pgembed, durable: Fast=false, unix socket)"
	if !db.private {
		where = "from -database-url"
	}
	fmt.Fprintf(out, "machine: NumCPU=%d GOMAXPROCS=%d %s %s/%s\n", rep.NumCPU, rep.GOMAXPROCS, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(out, "postgres: %s; %s\n", rep.Postgres, where)
	fmt.Fprintf(out, "params: concurrency=%d duration=%v runs=%d nodes=%d prefill=%d mask=%d replicas=%d max_conns=%d cooldown=%v gc_every=%v\n",
		cfg.Concurrency, cfg.Duration, cfg.Runs, cfg.Nodes, cfg.Prefill, cfg.Mask, cfg.Replicas, cfg.MaxConns, cfg.Cooldown, gcInterval)

	var gc gcStats
	so := store.DefaultOptions()
	so.Cooldown, so.MaxConns = cfg.Cooldown, int32(cfg.MaxConns)
	replicas, err := startReplicas(ctx, cfg.Replicas, db.url, so, gcInterval, log, &gc)
	if err != nil {
		return err
	}
	defer stopReplicas(replicas)

	hc := newHTTPClient(cfg.Concurrency)
	clients := make([]*ipamv1.ClientWithResponses, len(replicas))
	for i, r := range replicas {
		if clients[i], err = ipamv1.NewClientWithResponses(r.url, ipamv1.WithHTTPClient(hc)); err != nil {
			return err
		}
	}

	// Setup: pool, nodes, workers, prefill.
	var space *string
	rep.Setup.Space = "default"
	if !db.private {
		// A shared database may hold other data: work in a space of our own.
		s := fmt.Sprintf("bench-%d", time.Now().Unix())
		space, rep.Setup.Space = &s, s
	}
	nodes := make([]string, cfg.Nodes)
	for i := range nodes {
		nodes[i] = nodeName(i)
	}
	if err := setupPool(ctx, clients[0], space, cfg.Mask, nodes); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if space != nil {
		defer func() {
			if err := teardown(context.WithoutCancel(ctx), clients[0], *space, nodes); err != nil {
				fmt.Fprintln(os.Stderr, "ipam-bench: teardown:", err)
			}
		}()
	}
	workers := make([]*worker, cfg.Concurrency)
	for i := range workers {
		var names []string
		for _, n := range nodesFor(i, cfg.Concurrency, cfg.Nodes) {
			names = append(names, nodes[n])
		}
		workers[i] = newWorker(i, clients[i%len(clients)], space, names)
	}
	began := time.Now()
	if err := prefill(ctx, workers, cfg.Prefill); err != nil {
		return fmt.Errorf("prefill: %w", err)
	}
	rep.Setup.PrefillLeases = cfg.Prefill * cfg.Nodes
	rep.Setup.PrefillSeconds = time.Since(began).Seconds()
	fmt.Fprintf(out, "setup: space=%s pool=default 10.0.0.0/8 mask=/%d nodes=%d prefill=%d leases in %.1fs (%.0f/s)\n",
		rep.Setup.Space, cfg.Mask, cfg.Nodes, rep.Setup.PrefillLeases, rep.Setup.PrefillSeconds,
		float64(rep.Setup.PrefillLeases)/rep.Setup.PrefillSeconds)

	var ceil *ceiling
	if _, err := os.Stat(cfg.Ceiling); err != nil {
		fmt.Fprintf(out, "ceiling: skipped: %v\n", err)
	} else if ceil, err = newCeiling(cfg.Ceiling, db.url, db.binDir); err != nil {
		return err
	}
	rep.CeilingRan = ceil != nil

	// Interleave service run i and ceiling run i, so noise hits both.
	seconds := int(cfg.Duration / time.Second)
	var failed []string
	for i := 1; i <= cfg.Runs; i++ {
		r := measure(ctx, i, workers, cfg.Duration)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		printRun(out, r)
		if r.ErrorRate > maxErrorRate {
			failed = append(failed, fmt.Sprintf("run %d: %.3f%% of calls failed", i, 100*r.ErrorRate))
		}
		if ceil != nil {
			c, err := ceil.run(ctx, cfg.Concurrency, seconds)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				r.CeilingError = err.Error()
				failed = append(failed, fmt.Sprintf("ceiling run %d: %v", i, err))
				fmt.Fprintf(out, "ceiling run=%d error: %v\n", i, err)
			} else {
				r.Ceiling, r.Ratio = &c, r.OpsPerSec/c.TPS
				fmt.Fprintf(out, "ceiling run=%d ceiling_tps=%.1f ceiling_p99_ms=%.2f ratio=%.3f\n", i, c.TPS, c.P99ms, r.Ratio)
			}
		}
		rep.Runs = append(rep.Runs, r)
	}
	rep.Median = medianOf(rep.Runs)
	printMedians(out, rep.Median, ceil != nil)
	rep.GC.Expired, rep.GC.Purged, rep.GC.Errors = gc.expired.Load(), gc.purged.Load(), gc.errors.Load()
	fmt.Fprintf(out, "gc: expired=%d purged=%d errors=%d\n", rep.GC.Expired, rep.GC.Purged, rep.GC.Errors)

	if cfg.Shim {
		if rep.Shim, err = runShim(ctx, cfg, db.url, so, log, out); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("shim: %w", err)
		}
		for _, r := range []shimResult{rep.Shim.Sequential, rep.Shim.Parallel} {
			if r.ErrorRate > maxErrorRate {
				failed = append(failed, fmt.Sprintf("shim %s: %.3f%% of calls failed", r.Mode, 100*r.ErrorRate))
			}
		}
	}

	if cfg.Out != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.Out, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s (more than %.1f%% errors fails a run)", strings.Join(failed, "; "), 100*maxErrorRate)
	}
	return nil
}

func printRun(out io.Writer, r runResult) {
	fmt.Fprintf(out, "run=%d ops/s=%.1f alloc/s=%.1f release/s=%.1f alloc_p50_ms=%.2f alloc_p99_ms=%.2f release_p50_ms=%.2f release_p99_ms=%.2f errors=%d\n",
		r.Run, r.OpsPerSec, r.AllocPerSec, r.ReleasePerSec, r.AllocP50ms, r.AllocP99ms, r.ReleaseP50ms, r.ReleaseP99ms, r.Errors)
	for _, cause := range slices.Sorted(maps.Keys(r.ErrorsByCause)) {
		fmt.Fprintf(out, "  errors run=%d %q=%d\n", r.Run, cause, r.ErrorsByCause[cause])
	}
	for _, s := range r.ErrorSamples {
		fmt.Fprintf(out, "  error sample: %s\n", s)
	}
}

func printMedians(out io.Writer, m medians, ceiling bool) {
	fmt.Fprintf(out, "median ops/s=%.1f alloc/s=%.1f release/s=%.1f alloc_p50_ms=%.2f alloc_p99_ms=%.2f release_p50_ms=%.2f release_p99_ms=%.2f errors=%.0f\n",
		m.OpsPerSec, m.AllocPerSec, m.ReleasePerSec, m.AllocP50ms, m.AllocP99ms, m.ReleaseP50ms, m.ReleaseP99ms, m.Errors)
	if ceiling {
		fmt.Fprintf(out, "median ceiling_tps=%.1f ceiling_p99_ms=%.2f ratio=%.3f\n", m.CeilingTPS, m.CeilingP99ms, m.Ratio)
	}
}

// medianOf answers the median over runs of each figure; the ceiling's over
// the runs where it succeeded.
func medianOf(runs []runResult) medians {
	of := func(f func(runResult) float64) float64 {
		var xs []float64
		for _, r := range runs {
			if v := f(r); !math.IsNaN(v) {
				xs = append(xs, v)
			}
		}
		return median(xs)
	}
	ceilingOf := func(f func(ceilingResult) float64) func(runResult) float64 {
		return func(r runResult) float64 {
			if r.Ceiling == nil {
				return math.NaN()
			}
			return f(*r.Ceiling)
		}
	}
	return medians{
		OpsPerSec:     of(func(r runResult) float64 { return r.OpsPerSec }),
		AllocPerSec:   of(func(r runResult) float64 { return r.AllocPerSec }),
		ReleasePerSec: of(func(r runResult) float64 { return r.ReleasePerSec }),
		AllocP50ms:    of(func(r runResult) float64 { return r.AllocP50ms }),
		AllocP99ms:    of(func(r runResult) float64 { return r.AllocP99ms }),
		ReleaseP50ms:  of(func(r runResult) float64 { return r.ReleaseP50ms }),
		ReleaseP99ms:  of(func(r runResult) float64 { return r.ReleaseP99ms }),
		Errors:        of(func(r runResult) float64 { return float64(r.Errors) }),
		CeilingTPS:    of(ceilingOf(func(c ceilingResult) float64 { return c.TPS })),
		CeilingP99ms:  of(ceilingOf(func(c ceilingResult) float64 { return c.P99ms })),
		Ratio: of(func(r runResult) float64 {
			if r.Ceiling == nil {
				return math.NaN()
			}
			return r.Ratio
		}),
	}
}
