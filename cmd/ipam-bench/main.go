// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Command ipam-bench measures the IPAM service as the CNI plugins of a
// cluster use it: it builds cmd/server, starts it as a separate process
// (-replicas of them) serving HTTPS with mutual TLS from a temporary CA on
// loopback, and drives it with one client certificate per node
// (CN=system:node:NAME, O=system:nodes), over kept-alive connections.
//
// Phases, in order:
//
//   - mixed: a 50/50 mix of Pod IP allocations (POST
//     /v1/nodes/{node}/leases) and releases (DELETE
//     /v1/nodes/{node}/attachments/{cid}/{if}) over -nodes nodes, whose
//     blocks (-mask) are carved on demand, at each of -concurrency-list
//     clients for -duration, -runs times; after each run the database's own
//     ceiling for a comparable workload (db-ceiling.sh, pgbench, same
//     clients and seconds) on the same PostgreSQL, and the ratio of the
//     service's operations/s to it;
//   - timeouts (-timeouts): the mix by -timeouts-concurrency clients
//     without a client timeout, then with -client-timeout per attempt
//     (clients send a timed-out call again for the same attachment, on a
//     new connection, and a 503 or 429 again after its Retry-After), and
//     the ratio of the two goodputs (timeouts.go);
//   - hot-node: the same mix with -hot-concurrency clients all on one node,
//     so blocks are carved while allocations go on; ceiling and ratio too;
//   - fill: the mix at -fill-concurrency clients for -fill-duration with
//     0, 100,000 and 550,000 (-fill) active leases bulk-loaded into the
//     tables (fill.go: 110 per node on nodes of their own, in an address
//     space of its own), and the ratio of allocation p50 at the last point to the first;
//   - shim (-shim): the CNI plugin cmd/cni-shim timed end to end, one
//     process per ADD and DEL (shim.go), also under the bridge plugin in
//     network namespaces of its own (bridge.go);
//   - cilium (-cilium): the service as Cilium's operator in crd mode
//     (cilium.go): etcd and kube-apiserver (internal/kubetest, built by
//     make tools; without them the phase is skipped with a message naming
//     make tools) with Cilium's CRDs, -cilium-replicas more server
//     processes with --cilium-ipam-mode crd (--cilium-kube-qps -cilium-qps,
//     --cilium-kube-burst -cilium-burst) serving the pool cilium-bench
//     (172.16.0.0/12, /26 blocks) of the default space, then -cilium-nodes
//     CiliumNodes created at once: the seconds from each create call until
//     a watch shows its spec.ipam.pool holding 8 addresses (p50, p90, p99,
//     max; every node within -cilium-bound), the operator's requests to
//     the API server (its counter on /metrics, sampled every second:
//     average, sustained and largest rate over a second against the QPS, and
//     a check that no window between two samples holds more requests than
//     a token bucket of that QPS and burst lets through), and at the end
//     that no address is in two nodes' pools and that every pool is what
//     the database holds for its node;
//   - lbipam (-lbipam): the service as Cilium's LB IPAM (lbipam.go):
//     -lbipam-services LoadBalancer Services created at once, then
//     -lbipam-waiting waiting for a pool created after them;
//   - takeover, at the end of both (takeover.go, with two replicas or
//     more): the leader SIGKILLed, the time until the standby leads and
//     serves every object, its writes to objects served before the kill
//     (the API server's audit log; target 0), each replica's peak RSS
//     (target <= 400 MiB).
//
// Each run prints operations/s, allocation p50/p90/p99/max, errors, the
// duplicate addresses seen so far and the server's peak RSS during the run
// (VmHWM of /proc/PID/status, reset per run, and the largest VmRSS
// sampled). At the end the database is checked for duplicate addresses and
// against the clients' own bookkeeping; a summary table follows, and -out
// writes everything as JSON.
//
// Without -database-url it starts a private, durable PostgreSQL (pgembed)
// in a temporary directory and removes it at the end. With one, it works in
// a fresh address space and deletes it at the end.
//
// It exits 1 when a run answered more than 0.1% errors, a ceiling failed,
// any duplicate address or bookkeeping mismatch was found, or the cilium
// phase failed one of its checks.
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
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/cloud/scaleout"
	"github.com/ipam-dev/ipam/internal/store"
)

// maxErrorRate is the share of failed calls above which a run fails.
const maxErrorRate = 0.001

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
		pprof.StopCPUProfile()
		stop()
		os.Exit(1)
	}
}

// report is the -out file.
type report struct {
	NumCPU        int              `json:"numCPU"`
	GOMAXPROCS    int              `json:"gomaxprocs"`
	Postgres      string           `json:"postgres"`
	Private       bool             `json:"privatePostgres"`
	Params        config           `json:"params"`
	Setup         setupResult      `json:"setup"`
	Mixed         []levelResult    `json:"mixed"`
	Timeouts      *timeoutsReport  `json:"timeouts,omitempty"`
	HotNode       *levelResult     `json:"hotNode,omitempty"`
	Floor         *floorResult     `json:"floor,omitempty"`
	CloudScaleOut *scaleout.Result `json:"cloudScaleOut,omitempty"`
	GoIPAM        *goipamReport    `json:"goipam,omitempty"`
	Fill          *fillReport      `json:"fill,omitempty"`
	CeilingRan    bool             `json:"ceilingRan"`
	Shim          *shimReport      `json:"shim,omitempty"`
	Cilium        *ciliumReport    `json:"cilium,omitempty"`
	LBIPAM        *lbipamReport    `json:"lbipam,omitempty"`
	GC            gcCounts         `json:"gc"`
	// ServerPeakMiB is the largest VmHWM of a server process over its
	// whole life, read before it is stopped.
	ServerPeakMiB float64         `json:"serverPeakMiB"`
	Duplicates    duplicateReport `json:"duplicates"`
}

type setupResult struct {
	Space          string   `json:"space"`
	ServerBuildSec float64  `json:"serverBuildSeconds"`
	Servers        []string `json:"servers"`
	PrefillLeases  int      `json:"prefillLeases"`
	PrefillSeconds float64  `json:"prefillSeconds"`
}

// levelResult is the runs at one concurrency level of a phase.
type levelResult struct {
	Phase       string      `json:"phase"`
	Concurrency int         `json:"concurrency"`
	Runs        []runResult `json:"runs"`
	Median      medians     `json:"median"`
}

// fillReport is the fill curve.
type fillReport struct {
	Pool    string      `json:"pool"`
	PerNode int         `json:"perNode"`
	Points  []fillPoint `json:"points"`
	// P50Ratio is allocation p50 at the last point over the first.
	P50Ratio float64 `json:"p50Ratio"`
}

type fillPoint struct {
	Leases      int       `json:"leases"`
	Added       int       `json:"added"`
	LoadSeconds float64   `json:"loadSeconds"`
	Run         runResult `json:"run"`
}

// duplicateReport is the end-of-run check.
type duplicateReport struct {
	// Ledger counts overlapping holds of one address in the clients'
	// bookkeeping; Overlaps shows the first few.
	Ledger   int       `json:"ledger"`
	Overlaps []overlap `json:"overlaps,omitempty"`
	Holds    int       `json:"holds"`
	Database dbCheck   `json:"database"`
}

// medians are the medians over runs of each figure (the largest for RSS
// and duplicates).
type medians struct {
	OpsPerSec     float64   `json:"opsPerSec"`
	AllocPerSec   float64   `json:"allocPerSec"`
	ReleasePerSec float64   `json:"releasePerSec"`
	Alloc         latencyMS `json:"alloc"`
	Release       latencyMS `json:"release"`
	All           latencyMS `json:"all"`
	Errors        float64   `json:"errors"`
	Duplicates    int       `json:"duplicates"`
	RSSPeakMiB    float64   `json:"rssPeakMiB"`
	WALPerPair    float64   `json:"walBytesPerPair,omitempty"`
	CeilingTPS    float64   `json:"ceilingTPS,omitempty"`
	CeilingP99ms  float64   `json:"ceilingP99ms,omitempty"`
	Ratio         float64   `json:"ratio,omitempty"`

	// Carves are the median carves of the runs whose carves were read.
	Carves *carveCounts `json:"carves,omitempty"`
}

// bench is the state every phase shares.
type bench struct {
	cfg      config
	out      io.Writer
	db       *database
	space    string  // the measured space
	spaceArg *string // nil for the default space
	// fillSpace holds the fill curve's bulk-loaded pool, nodes and leases.
	fillSpace string
	servers   []*serverProc
	pki       *benchPKI
	admin     *ipamclient.ClientWithResponses
	fleet     *fleet
	ceil      *ceiling
	nodes     []string
	failed    []string
	profiled  bool // the server's CPU profile was taken
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
	fmt.Fprintf(out, "params: concurrency=%v duration=%v nodes=%d prefill=%d mask=/%d hot=%d fill=%v fill_clients=%d fill_duration=%v replicas=%d max_conns=%d cooldown=%v\n",
		cfg.Concurrency, cfg.Duration, cfg.Nodes, cfg.Prefill, cfg.Mask, cfg.HotConcurrency, cfg.Fill, cfg.FillConcurrency, cfg.FillDuration,
		cfg.Replicas, cfg.MaxConns, cfg.Cooldown)

	tmp, err := os.MkdirTemp("", "ipam-bench-run-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	b := &bench{cfg: cfg, out: out, db: db, space: "default", fillSpace: "bench-fill"}
	if b.pki, err = newBenchPKI(tmp); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	began := time.Now()
	bin, err := buildServer(ctx, tmp)
	if err != nil {
		return err
	}
	rep.Setup.ServerBuildSec = time.Since(began).Seconds()
	probe := b.pki.adminClient()
	serverOpts := serverOptions{
		bin: bin, databaseURL: db.url, certDir: tmp, cooldown: cfg.Cooldown, leaseExpiry: cfg.LeaseExpiry,
		maxConns: cfg.MaxConns, pprof: cfg.ServerProfile != "", extra: cfg.ServerArgs,
	}
	b.servers, err = startServers(ctx, cfg.Replicas, serverOpts, probe)
	if err != nil {
		return err
	}
	defer stopServers(b.servers)
	var urls []string
	for _, s := range b.servers {
		urls = append(urls, s.url)
		rep.Setup.Servers = append(rep.Setup.Servers, fmt.Sprintf("%s pid %d", s.url, s.pid()))
	}
	fmt.Fprintf(out, "servers: %s (built in %.1fs; serve --tls-cert-file --client-ca-file --log-level warn --cooldown %v --lease-expiry %v%s)\n",
		strings.Join(rep.Setup.Servers, ", "), rep.Setup.ServerBuildSec, cfg.Cooldown, cfg.LeaseExpiry, strings.Join(append([]string{""}, cfg.ServerArgs...), " "))
	if b.admin, err = apiClient(urls[0], probe); err != nil {
		return err
	}

	// Setup: space, pools, nodes (by the administrator), prefill (by the nodes).
	if !db.private {
		// A shared database may hold other data: work in a space of our own.
		b.space = fmt.Sprintf("bench-%d", time.Now().Unix())
		b.spaceArg, b.fillSpace = &b.space, b.space+"-fill"
	}
	rep.Setup.Space = b.space
	b.nodes = make([]string, cfg.Nodes)
	for i := range b.nodes {
		b.nodes[i] = nodeName(i)
	}
	if err := setupPool(ctx, b.admin, b.spaceArg, cfg.Mask, append(slices.Clone(b.nodes), hotNode)); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	if !db.private {
		defer b.teardown(context.WithoutCancel(ctx))
	}
	if len(cfg.Fill) > 0 {
		if err := createFillPool(ctx, b.admin, b.fillSpace); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
	}
	b.fleet = &fleet{pki: b.pki, servers: urls, space: b.spaceArg, ledger: newLedger(), perHost: cfg.maxConcurrency()}
	began = time.Now()
	if cfg.Prefill > 0 {
		ws, err := b.fleet.workers(min(32, cfg.Nodes), b.nodes)
		if err != nil {
			return err
		}
		if err := prefill(ctx, ws, cfg.Prefill); err != nil {
			return fmt.Errorf("prefill: %w", err)
		}
		b.fleet.retire(ws)
	}
	rep.Setup.PrefillLeases = cfg.Prefill * cfg.Nodes
	rep.Setup.PrefillSeconds = time.Since(began).Seconds()
	fmt.Fprintf(out, "setup: space=%s pool=default 10.0.0.0/8 mask=/%d nodes=%d+%s prefill=%d leases in %.1fs (%.0f/s) through the API, one node certificate per node\n",
		b.space, cfg.Mask, cfg.Nodes, hotNode, rep.Setup.PrefillLeases, rep.Setup.PrefillSeconds,
		float64(rep.Setup.PrefillLeases)/rep.Setup.PrefillSeconds)

	if _, err := os.Stat(cfg.Ceiling); err != nil {
		fmt.Fprintf(out, "ceiling: skipped: %v\n", err)
	} else if b.ceil, err = newCeiling(cfg.Ceiling, db.url, db.binDir); err != nil {
		return err
	}
	rep.CeilingRan = b.ceil != nil

	// Mixed runs.
	for i, c := range cfg.Concurrency {
		lv, err := b.level(ctx, "mixed", c, b.nodes, cfg.runsAt(i), cfg.Duration, true)
		if err != nil {
			return err
		}
		rep.Mixed = append(rep.Mixed, lv)
	}
	// The go-ipam peer, on the same PostgreSQL, right after the runs it
	// is compared with.
	if cfg.GoIPAM && len(rep.Mixed) > 0 {
		lv := rep.Mixed[0]
		if i := slices.Index(cfg.Concurrency, 32); i >= 0 {
			lv = rep.Mixed[i]
		}
		if rep.GoIPAM, err = goipamPhase(ctx, db.url, cfg.GoIPAMSource, tmp, lv.Concurrency, cfg.Duration, lv.Median.OpsPerSec, out); err != nil {
			return fmt.Errorf("go-ipam: %w", err)
		}
	}
	// Client timeouts.
	if cfg.Timeouts {
		if rep.Timeouts, err = b.timeoutsPhase(ctx); err != nil {
			return err
		}
	}
	// Hot node.
	if cfg.HotConcurrency > 0 {
		if cfg.Prefill > 0 {
			ws, err := b.fleet.workers(cfg.HotConcurrency, []string{hotNode})
			if err != nil {
				return err
			}
			if err := prefill(ctx, ws, cfg.Prefill); err != nil {
				return fmt.Errorf("hot-node prefill: %w", err)
			}
			b.fleet.retire(ws)
		}
		lv, err := b.level(ctx, "hot-node", cfg.HotConcurrency, []string{hotNode}, 1, cfg.Duration, true)
		if err != nil {
			return err
		}
		rep.HotNode = &lv
	}
	// The floor: the same clients against a server answering from memory.
	if cfg.Floor && len(cfg.Concurrency) > 0 {
		lv := rep.Mixed[0]
		if i := slices.Index(cfg.Concurrency, 32); i >= 0 {
			lv = rep.Mixed[i]
		}
		delay := time.Duration(lv.Median.All.P50 * float64(time.Millisecond))
		if rep.Floor, err = b.floorPhase(ctx, lv.Concurrency, b.nodes, cfg.Prefill, cfg.Duration, delay); err != nil {
			return err
		}
	}
	// The cloud capacity workers' rounds on a simulated AWS scale-out.
	if cfg.CloudScaleOut {
		sc := scaleout.DefaultConfig()
		sc.DatabaseURL = db.url
		began := time.Now()
		r, err := scaleout.Run(ctx, sc)
		if err != nil {
			return fmt.Errorf("cloud scale-out: %w", err)
		}
		rep.CloudScaleOut = &r
		fmt.Fprintf(out, "cloud scale-out (aws, through capacity.Worker; %d m5.large in two node groups/pools to 30 Pods each, /28 prefixes, WARM_PREFIX_TARGET=1, "+
			"10%% throttled, 2%% answers lost, stale reads, 1%% terminated; %s real): %s\n", sc.Nodes, time.Since(began).Round(time.Second), r)
		if !r.Met() {
			b.failed = append(b.failed, fmt.Sprintf("cloud scale-out: %d Pods failed, %d waited in steady state, %d calls against a floor of %d (target <= 1.2x), "+
				"%d leasable blocks not held, %d calls on unowned interfaces, %d blocks left to ended instances",
				r.Failed, r.SteadyWaited, r.AllCalls, r.Floor, r.LeasableNotHeld, r.UnownedCalls, r.DeadBlocks))
		}
	}
	// Fill curve.
	if len(cfg.Fill) > 0 {
		if rep.Fill, err = b.fillCurve(ctx); err != nil {
			return err
		}
	}

	if cfg.Shim {
		if rep.Shim, err = runShim(ctx, cfg, b.pki, urls[0], serverOpts, b.admin, out); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("shim: %w", err)
		}
		for _, r := range rep.Shim.results() {
			if r.ErrorRate > maxErrorRate {
				b.failed = append(b.failed, fmt.Sprintf("shim %s: %.3f%% of calls failed", r.Mode, 100*r.ErrorRate))
			}
		}
	}

	if cfg.Cilium {
		if rep.Cilium, err = runCilium(ctx, cfg, serverOpts, probe, b.admin, db.private, out, &b.failed); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("cilium: %w", err)
		}
	}
	if cfg.LBIPAM {
		if rep.LBIPAM, err = runLBIPAM(ctx, cfg, serverOpts, probe, b.admin, db.private, out, &b.failed); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("lbipam: %w", err)
		}
	}

	// The end: duplicates, the database against the clients, GC, RSS.
	open := b.fleet.open(nil)
	ov := b.fleet.ledger.overlaps(open)
	rep.Duplicates.Ledger, rep.Duplicates.Overlaps = len(ov), ov[:min(len(ov), 10)]
	rep.Duplicates.Holds = b.fleet.ledger.count() + len(open)
	if rep.Duplicates.Database, err = checkDatabase(ctx, db.url, []string{b.space, b.fillSpace}, "bench-", open); err != nil {
		return fmt.Errorf("database check: %w", err)
	}
	d := rep.Duplicates.Database
	fmt.Fprintf(out, "duplicates: clients' bookkeeping=%d (of %d holds) database=%d; database vs clients: missing=%d unknown=%d; block counters off=%d\n",
		rep.Duplicates.Ledger, rep.Duplicates.Holds, d.Duplicates, d.Missing, d.Unknown, d.Counters)
	for _, o := range rep.Duplicates.Overlaps {
		fmt.Fprintf(out, "  duplicate %s held by %s and %s at once\n", o.Addr, o.First, o.Second)
	}
	if rep.Duplicates.Ledger > 0 || d.Duplicates > 0 {
		b.failed = append(b.failed, fmt.Sprintf("%d duplicate addresses in the clients' bookkeeping, %d in the database", rep.Duplicates.Ledger, d.Duplicates))
	}
	if d.Missing > 0 || d.Counters > 0 {
		b.failed = append(b.failed, fmt.Sprintf("database disagrees: %d attachments the clients hold are missing, %d block counters are off", d.Missing, d.Counters))
	}
	for _, s := range b.servers {
		if g, err := scrapeGC(ctx, probe, s.url); err == nil {
			rep.GC.Expired, rep.GC.Purged, rep.GC.Errors = rep.GC.Expired+g.Expired, rep.GC.Purged+g.Purged, rep.GC.Errors+g.Errors
		}
		if m, err := readProcMemory(s.pid()); err == nil {
			rep.ServerPeakMiB = max(rep.ServerPeakMiB, mib(m.Peak))
		}
		if err := s.exited(); err != nil {
			b.failed = append(b.failed, err.Error())
		}
	}
	fmt.Fprintf(out, "gc: expired=%d purged=%d errors=%d; server peak RSS over its life: %.1f MiB\n", rep.GC.Expired, rep.GC.Purged, rep.GC.Errors, rep.ServerPeakMiB)
	printSummary(out, rep)

	if cfg.Out != "" {
		js, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.Out, append(js, '\n'), 0o644); err != nil {
			return err
		}
	}
	if len(b.failed) > 0 {
		return fmt.Errorf("%s (more than %.1f%% errors fails a run)", strings.Join(b.failed, "; "), 100*maxErrorRate)
	}
	return nil
}

// level runs one concurrency level of a phase: runs measured runs of the
// mix by c clients over nodes, each followed by the ceiling when ceiling
// is set and the script is present.
func (b *bench) level(ctx context.Context, phase string, c int, nodes []string, runs int, d time.Duration, ceiling bool) (levelResult, error) {
	lv := levelResult{Phase: phase, Concurrency: c}
	ws, err := b.fleet.workers(c, nodes)
	if err != nil {
		return lv, err
	}
	defer b.fleet.retire(ws)
	for i := 1; i <= runs; i++ {
		r, err := b.measured(ctx, phase, ws, len(nodes), i, d)
		if err != nil {
			return lv, err
		}
		if ceiling && b.ceil != nil {
			b.db.settle(ctx, b.out)
			cr, err := b.ceil.run(ctx, c, int(d/time.Second))
			if ctx.Err() != nil {
				return lv, ctx.Err()
			}
			if err != nil {
				r.CeilingError = err.Error()
				b.failed = append(b.failed, fmt.Sprintf("%s ceiling c=%d run %d: %v", phase, c, i, err))
				fmt.Fprintf(b.out, "  ceiling error: %v\n", err)
			} else {
				r.Ceiling, r.Ratio = &cr, r.OpsPerSec/cr.TPS
				fmt.Fprintf(b.out, "  ceiling clients=%d ceiling_tps=%.1f ceiling_p99_ms=%.2f ratio=%.3f\n", c, cr.TPS, cr.P99ms, r.Ratio)
			}
		}
		lv.Runs = append(lv.Runs, r)
	}
	lv.Median = medianOf(lv.Runs)
	if runs > 1 {
		printMedians(b.out, lv)
	}
	return lv, nil
}

// measured warms the workers' connections and does one measured run,
// watching the servers' memory, and checks the bookkeeping after it.
func (b *bench) measured(ctx context.Context, phase string, ws []*worker, nodes, run int, d time.Duration) (runResult, error) {
	if err := warm(ctx, ws); err != nil {
		return runResult{}, fmt.Errorf("%s warm-up: %w", phase, err)
	}
	b.db.settle(ctx, b.out)
	var pids []int
	for _, s := range b.servers {
		pids = append(pids, s.pid())
	}
	carvesBefore, carvesErr := b.scrapeCarves(ctx)
	profile := b.startServerProfile(ctx, len(ws), d)
	batchesBefore, batchErr := b.scrapeWriteBatches(ctx)
	hs := b.pki.handshakes.Load()
	rss := watchRSS(pids)
	cpuBefore := takeCPUSnapshot(pids, b.db.postmaster())
	lsn, walErr := b.db.walLSN(ctx)
	r := measure(ctx, ws, d)
	if walErr == nil {
		r.WALBytes, walErr = b.db.walSince(ctx, lsn)
	}
	if walErr == nil && r.Allocs+r.Releases > 0 {
		r.WALPerPair = float64(r.WALBytes) / (float64(r.Allocs+r.Releases) / 2)
	} else if walErr != nil && ctx.Err() == nil {
		fmt.Fprintf(b.out, "  wal: not read: %v\n", walErr)
	}
	if c, ok := cpuSince(cpuBefore, takeCPUSnapshot(pids, b.db.postmaster()), int(r.Allocs+r.Releases)); ok {
		r.CPU = &c
	}
	r.RSS = rss.stop()
	r.Handshakes = b.pki.handshakes.Load() - hs
	if carvesErr == nil {
		var after carveCounts
		if after, carvesErr = b.scrapeCarves(ctx); carvesErr == nil {
			c := after.minus(carvesBefore)
			r.Carves = &c
		}
	}
	if carvesErr != nil && ctx.Err() == nil {
		fmt.Fprintf(b.out, "  carves: not read: %v\n", carvesErr)
	}
	if profile != nil {
		if err := <-profile; err != nil {
			fmt.Fprintf(b.out, "  server CPU profile: %v\n", err)
		} else {
			fmt.Fprintf(b.out, "  server CPU profile written to %s\n", b.cfg.ServerProfile)
		}
	}
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	for _, s := range b.servers {
		if err := s.exited(); err != nil {
			return r, err
		}
	}
	if batchErr == nil {
		if after, err := b.scrapeWriteBatches(ctx); err == nil {
			w := after.plus(batchesBefore, -1)
			r.WriteBatches = &w
		}
	}
	r.Phase, r.Nodes, r.Run, r.RSSPeakMiB = phase, nodes, run, maxPeak(r.RSS)
	b.fleet.ledger.collect(ws)
	r.Duplicates = len(b.fleet.ledger.overlaps(b.fleet.open(ws)))
	printRun(b.out, r)
	printWriteBatches(b.out, r.WriteBatches)
	if r.Errors > 0 {
		// A 500 is logged by the server with its cause: show where.
		for _, s := range b.servers {
			fmt.Fprintf(b.out, "  server %s log, last lines:\n%s\n", s.url, lastLines(s.stderr.String(), 12))
		}
	}
	if r.ErrorRate > maxErrorRate {
		b.failed = append(b.failed, fmt.Sprintf("%s c=%d run %d: %.3f%% of calls failed", phase, r.Concurrency, run, 100*r.ErrorRate))
	}
	return r, nil
}

// startServerProfile fetches a CPU profile of the first server over the
// coming run, once: at the first run with 32 clients, or the first run
// when no level has 32.
func (b *bench) startServerProfile(ctx context.Context, clients int, d time.Duration) <-chan error {
	if b.cfg.ServerProfile == "" || b.profiled || (clients != 32 && slices.Contains(b.cfg.Concurrency, 32)) {
		return nil
	}
	b.profiled = true
	done := make(chan error, 1)
	go func() {
		// The profiler answers admins only: the administrator's certificate.
		url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", b.servers[0].url, int(d/time.Second))
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			done <- err
			return
		}
		resp, err := b.pki.adminClient().Do(req)
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			done <- fmt.Errorf("GET %s: %s", url, resp.Status)
			return
		}
		f, err := os.Create(b.cfg.ServerProfile)
		if err == nil {
			_, err = io.Copy(f, resp.Body)
			err = errors.Join(err, f.Close())
		}
		done <- err
	}()
	return done
}

// fillCurve loads each fill point and measures the mix on the measured
// nodes against it.
func (b *bench) fillCurve(ctx context.Context) (*fillReport, error) {
	cfg := b.cfg
	rep := &fillReport{Pool: fillPool, PerNode: cfg.FillPerNode}
	conn, err := pgx.Connect(ctx, b.db.url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	fmt.Fprintf(b.out, "fill: space %s pool %s %s /%d, %d active leases per node on fill-node-NNNNN, bulk-loaded in SQL (fill.go), then ANALYZE\n",
		b.fillSpace, fillPool, fillCIDR, fillMask, cfg.FillPerNode)
	for _, n := range cfg.Fill {
		began := time.Now()
		added, err := loadFill(ctx, conn, b.fillSpace, fillPool, cfg.FillPerNode, n)
		if err != nil {
			return nil, err
		}
		p := fillPoint{Leases: n, Added: added, LoadSeconds: time.Since(began).Seconds()}
		if err := verifyFill(ctx, b.admin, b.fillSpace, cfg.FillPerNode, n); err != nil {
			return nil, fmt.Errorf("fill %d: the service does not see what was loaded: %w", n, err)
		}
		fmt.Fprintf(b.out, "fill: %d leases (%d added in %.1fs; the service's pool status and lease list agree)\n", n, added, p.LoadSeconds)
		lv, err := b.level(ctx, fmt.Sprintf("fill=%d", n), cfg.FillConcurrency, b.nodes, 1, cfg.FillDuration, false)
		if err != nil {
			return nil, err
		}
		p.Run = lv.Runs[0]
		p.Run.FillLeases = n
		rep.Points = append(rep.Points, p)
		if sz, err := readSizes(ctx, conn); err == nil {
			fmt.Fprintf(b.out, "fill: %d leases: %s\n", n, sz)
		} else if ctx.Err() == nil {
			fmt.Fprintf(b.out, "fill: %d leases: sizes not read: %v\n", n, err)
		}
	}
	first, last := rep.Points[0].Run.Alloc.P50, rep.Points[len(rep.Points)-1].Run.Alloc.P50
	if first > 0 {
		rep.P50Ratio = last / first
	}
	fmt.Fprintf(b.out, "fill: allocation p50 at %d leases / p50 at %d = %.2f\n", cfg.Fill[len(cfg.Fill)-1], cfg.Fill[0], rep.P50Ratio)
	return rep, nil
}

// teardown removes what the benchmark made in a shared database's space.
func (b *bench) teardown(ctx context.Context) {
	if len(b.cfg.Fill) > 0 {
		conn, err := pgx.Connect(ctx, b.db.url)
		if err == nil {
			err = dropFill(ctx, conn, b.fillSpace, fillPool)
			conn.Close(ctx)
		}
		if err == nil {
			err = teardown(ctx, b.admin, b.fillSpace, nil, []string{fillPool})
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "ipam-bench: teardown of the fill:", err)
		}
	}
	if err := teardown(ctx, b.admin, b.space, append(slices.Clone(b.nodes), hotNode), []string{"default"}); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-bench: teardown:", err)
	}
}

func printRun(out io.Writer, r runResult) {
	fmt.Fprintf(out, "%s clients=%d run=%d ops/s=%.1f alloc/s=%.1f release/s=%.1f alloc_ms p50=%.2f p90=%.2f p99=%.2f max=%.2f release_ms p50=%.2f p99=%.2f errors=%d duplicates=%d rss_peak_mib=%.1f tls_handshakes=%d\n",
		r.Phase, r.Concurrency, r.Run, r.OpsPerSec, r.AllocPerSec, r.ReleasePerSec, r.Alloc.P50, r.Alloc.P90, r.Alloc.P99, r.Alloc.Max,
		r.Release.P50, r.Release.P99, r.Errors, r.Duplicates, r.RSSPeakMiB, r.Handshakes)
	if r.CPU != nil {
		fmt.Fprintf(out, "  cpu: %s\n", r.CPU)
	}
	if r.WALBytes > 0 {
		fmt.Fprintf(out, "  wal: %d bytes, %.0f per allocation+release pair\n", r.WALBytes, r.WALPerPair)
	}
	if c := r.Carves; c != nil {
		fmt.Fprintf(out, "  blocks carved: inline=%d top-up=%d rebalance=%d\n", c.Inline, c.TopUp, c.Rebalance)
	}
	if r.TimedOut > 0 || r.Refused > 0 {
		fmt.Fprintf(out, "  attempts sent again: %d timed out, %d refused (503 or 429)\n", r.TimedOut, r.Refused)
	}
	for _, cause := range slices.Sorted(maps.Keys(r.ErrorsByCause)) {
		fmt.Fprintf(out, "  errors %q=%d\n", cause, r.ErrorsByCause[cause])
	}
	for _, s := range r.ErrorSamples {
		fmt.Fprintf(out, "  error sample: %s\n", s)
	}
}

func printMedians(out io.Writer, lv levelResult) {
	m := lv.Median
	fmt.Fprintf(out, "%s clients=%d median of %d: ops/s=%.1f alloc_ms p50=%.2f p90=%.2f p99=%.2f max=%.2f errors=%.0f rss_peak_mib=%.1f",
		lv.Phase, lv.Concurrency, len(lv.Runs), m.OpsPerSec, m.Alloc.P50, m.Alloc.P90, m.Alloc.P99, m.Alloc.Max, m.Errors, m.RSSPeakMiB)
	if m.CeilingTPS > 0 {
		fmt.Fprintf(out, " ceiling_tps=%.1f ratio=%.3f", m.CeilingTPS, m.Ratio)
	}
	fmt.Fprintln(out)
}

// printSummary prints one table row per level and fill point.
func printSummary(out io.Writer, rep report) {
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tclients\truns\tops/s\talloc p50\tp90\tp99\tmax ms\trelease p99\terrors\tdups\tRSS peak MiB\tceiling tps\tratio\tcarves inline/top-up\t")
	row := func(name string, c, runs int, m medians) {
		ceil, ratio, carves := "-", "-", "-"
		if m.CeilingTPS > 0 {
			ceil, ratio = fmt.Sprintf("%.0f", m.CeilingTPS), fmt.Sprintf("%.3f", m.Ratio)
		}
		if m.Carves != nil {
			carves = fmt.Sprintf("%d/%d", m.Carves.Inline, m.Carves.TopUp)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%d\t%.1f\t%s\t%s\t%s\t\n",
			name, c, runs, m.OpsPerSec, m.Alloc.P50, m.Alloc.P90, m.Alloc.P99, m.Alloc.Max, m.Release.P99, m.Errors, m.Duplicates, m.RSSPeakMiB, ceil, ratio, carves)
	}
	for _, lv := range rep.Mixed {
		row("mixed", lv.Concurrency, len(lv.Runs), lv.Median)
	}
	if t := rep.Timeouts; t != nil {
		row("timeouts=none", t.Concurrency, 1, medianOf([]runResult{t.Without}))
		row("timeouts="+t.Timeout, t.Concurrency, 1, medianOf([]runResult{t.With}))
	}
	if rep.HotNode != nil {
		row("hot-node", rep.HotNode.Concurrency, len(rep.HotNode.Runs), rep.HotNode.Median)
	}
	if rep.Fill != nil {
		for _, p := range rep.Fill.Points {
			row(fmt.Sprintf("fill=%d", p.Leases), p.Run.Concurrency, 1, medianOf([]runResult{p.Run}))
		}
	}
	tw.Flush()
	var wal []string
	for _, lv := range rep.Mixed {
		if w := lv.Median.WALPerPair; w > 0 && !math.IsNaN(w) {
			wal = append(wal, fmt.Sprintf("%d clients %.0f", lv.Concurrency, w))
		}
	}
	if len(wal) > 0 {
		fmt.Fprintf(out, "wal: bytes per allocation+release pair (median of the mixed runs, each right after a checkpoint): %s\n", strings.Join(wal, ", "))
	}
	if t := rep.Timeouts; t != nil {
		fmt.Fprintf(out, "client timeouts: goodput with %s / without = %.3f (target >= %.2f)\n", t.Timeout, t.Ratio, t.Target)
	}
	if rep.Fill != nil && len(rep.Fill.Points) > 1 {
		fmt.Fprintf(out, "fill curve: alloc p50 at %d leases / at %d = %.2f\n", rep.Fill.Points[len(rep.Fill.Points)-1].Leases, rep.Fill.Points[0].Leases, rep.Fill.P50Ratio)
	}
	if rep.GoIPAM != nil {
		fmt.Fprintln(out, rep.GoIPAM.line())
	}
	printShimSummary(out, rep.Shim)
	printCiliumSummary(out, rep.Cilium)
	if l := rep.LBIPAM; l != nil && l.Skipped == "" {
		fmt.Fprintf(out, "lbipam: %d Services at once, time to ingress p99 %.2fs (p50 %.2fs); %d waiting, from their pool's create to ingress p99 %.2fs (p50 %.2fs); %d duplicates\n",
			l.Services, l.ToIngress.P99, l.ToIngress.P50, l.Waited, l.AfterPool.P99, l.AfterPool.P50, l.Duplicates)
		printTakeover(out, "lbipam", l.Takeover, l.RSS)
	}
	d := rep.Duplicates
	fmt.Fprintf(out, "duplicates: %d (bookkeeping) + %d (database); server peak RSS %.1f MiB\n", d.Ledger, d.Database.Duplicates, rep.ServerPeakMiB)
}

// medianOf answers the median over runs of each figure; the ceiling's over
// the runs where it succeeded; the largest RSS and duplicate count.
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
	lat := func(f func(runResult) latencyMS) latencyMS {
		return latencyMS{
			P50: of(func(r runResult) float64 { return f(r).P50 }),
			P90: of(func(r runResult) float64 { return f(r).P90 }),
			P99: of(func(r runResult) float64 { return f(r).P99 }),
			Max: of(func(r runResult) float64 { return f(r).Max }),
		}
	}
	ceilingOf := func(f func(ceilingResult) float64) func(runResult) float64 {
		return func(r runResult) float64 {
			if r.Ceiling == nil {
				return math.NaN()
			}
			return f(*r.Ceiling)
		}
	}
	m := medians{
		OpsPerSec:     of(func(r runResult) float64 { return r.OpsPerSec }),
		AllocPerSec:   of(func(r runResult) float64 { return r.AllocPerSec }),
		ReleasePerSec: of(func(r runResult) float64 { return r.ReleasePerSec }),
		Alloc:         lat(func(r runResult) latencyMS { return r.Alloc }),
		Release:       lat(func(r runResult) latencyMS { return r.Release }),
		All:           lat(func(r runResult) latencyMS { return r.All }),
		Errors:        of(func(r runResult) float64 { return float64(r.Errors) }),
		WALPerPair: of(func(r runResult) float64 {
			if r.WALBytes == 0 {
				return math.NaN()
			}
			return r.WALPerPair
		}),
		CeilingTPS:   of(ceilingOf(func(c ceilingResult) float64 { return c.TPS })),
		CeilingP99ms: of(ceilingOf(func(c ceilingResult) float64 { return c.P99ms })),
		Ratio: of(func(r runResult) float64 {
			if r.Ceiling == nil {
				return math.NaN()
			}
			return r.Ratio
		}),
	}
	for _, r := range runs {
		m.RSSPeakMiB = max(m.RSSPeakMiB, r.RSSPeakMiB)
		m.Duplicates = max(m.Duplicates, r.Duplicates)
	}
	carves := func(f func(carveCounts) int64) func(runResult) float64 {
		return func(r runResult) float64 {
			if r.Carves == nil {
				return math.NaN()
			}
			return float64(f(*r.Carves))
		}
	}
	if inline := of(carves(func(c carveCounts) int64 { return c.Inline })); !math.IsNaN(inline) {
		m.Carves = &carveCounts{Inline: int64(inline),
			TopUp:     int64(of(carves(func(c carveCounts) int64 { return c.TopUp }))),
			Rebalance: int64(of(carves(func(c carveCounts) int64 { return c.Rebalance })))}
	}
	return m
}
