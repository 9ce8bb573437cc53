// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// serverWriteTimeout is cmd/server's write timeout: a CPU profile served
// over HTTP must end before it.
const serverWriteTimeout = 30 * time.Second

// config is every flag of the benchmark.
type config struct {
	DatabaseURL     string        `json:"-"`
	Concurrency     []int         `json:"concurrencyList"`
	Runs            []int         `json:"runs"` // per entry of Concurrency
	Duration        time.Duration `json:"-"`
	Nodes           int           `json:"nodes"`
	Prefill         int           `json:"prefill"`
	Mask            int           `json:"mask"`
	HotConcurrency  int           `json:"hotConcurrency"`
	Fill            []int         `json:"fill"`
	FillDuration    time.Duration `json:"-"`
	FillConcurrency int           `json:"fillConcurrency"`
	FillPerNode     int           `json:"fillPerNode"`
	Replicas        int           `json:"replicas"`
	MaxConns        int           `json:"maxConns"`
	Ceiling         string        `json:"ceiling"`
	Cooldown        time.Duration `json:"-"`
	LeaseExpiry     time.Duration `json:"-"`
	ServerArgs      []string      `json:"serverArgs,omitempty"`
	ServerProfile   string        `json:"-"`
	Out             string        `json:"-"`
	CPUProfile      string        `json:"-"`
	// Floor runs the mix against an in-memory server (floor.go).
	Floor bool `json:"floor"`
	// CloudScaleOut runs the simulated AWS scale-out (internal/cloud/scaleout).
	CloudScaleOut bool `json:"cloudScaleOut"`
	// GoIPAM runs the go-ipam peer (goipam.go) after the mixed runs,
	// from GoIPAMSource when set.
	GoIPAM       bool   `json:"goipam"`
	GoIPAMSource string `json:"goipamSource,omitempty"`
	// The timeouts phase (timeouts.go), after the mixed runs.
	Timeouts            bool          `json:"timeouts"`
	ClientTimeout       time.Duration `json:"-"`
	TimeoutsConcurrency int           `json:"timeoutsConcurrency"`
	TimeoutsDuration    time.Duration `json:"-"`
	// The shim phase (shim.go), after the others.
	Shim              bool `json:"shim"`
	ShimCalls         int  `json:"shimCalls"`
	ShimParallel      int  `json:"shimParallel"`
	ShimParallelCalls int  `json:"shimParallelCalls"`
	ShimBridgeCalls   int  `json:"shimBridgeCalls"`
	ShimWhereabouts   bool `json:"shimWhereabouts"`
	// The cilium phase (cilium.go), last.
	Cilium      bool          `json:"cilium"`
	CiliumNodes int           `json:"ciliumNodes"`
	CiliumQPS   float64       `json:"ciliumQPS"`
	CiliumBurst int           `json:"ciliumBurst"`
	CiliumBound time.Duration `json:"-"`
	// CiliumReplicas and LBReplicas are the phases' server processes;
	// with two or more the leader is SIGKILLed at the end (takeover.go).
	CiliumReplicas int `json:"ciliumReplicas"`
	LBReplicas     int `json:"lbipamReplicas"`
	// The lbipam phase (lbipam.go), after the cilium phase.
	LBIPAM     bool          `json:"lbipam"`
	LBServices int           `json:"lbipamServices"`
	LBWaiting  int           `json:"lbipamWaiting"`
	LBQPS      float64       `json:"lbipamQPS"`
	LBBurst    int           `json:"lbipamBurst"`
	LBBound    time.Duration `json:"-"`
}

// MarshalJSON writes the durations as Go duration strings ("20s").
func (c config) MarshalJSON() ([]byte, error) {
	type plain config // without this method
	return json.Marshal(struct {
		plain
		Duration     string `json:"duration"`
		FillDuration string `json:"fillDuration"`
		Cooldown     string `json:"cooldown"`
		LeaseExpiry  string `json:"leaseExpiry"`
		// The timeouts phase.
		ClientTimeout    string `json:"clientTimeout"`
		TimeoutsDuration string `json:"timeoutsDuration"`
		CiliumBound      string `json:"ciliumBound"`
		LBBound          string `json:"lbipamBound"`
	}{plain(c), c.Duration.String(), c.FillDuration.String(), c.Cooldown.String(), c.LeaseExpiry.String(),
		c.ClientTimeout.String(), c.TimeoutsDuration.String(), c.CiliumBound.String(), c.LBBound.String()})
}

// maxConcurrency is the most clients any phase runs.
func (c config) maxConcurrency() int {
	return slices.Max(append(slices.Clone(c.Concurrency), c.HotConcurrency, c.FillConcurrency, c.TimeoutsConcurrency, 1))
}

// Validate reports every invalid flag at once.
func (c config) Validate() error {
	var errs []error
	positive := func(name string, v int) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("-%s must be positive, not %d", name, v))
		}
	}
	wholeSeconds := func(name string, d time.Duration) {
		if d < time.Second || d%time.Second != 0 {
			errs = append(errs, fmt.Errorf("-%s must be whole seconds, at least 1s (pgbench -T takes seconds), not %v", name, d))
		}
	}
	for _, n := range c.Concurrency {
		positive("concurrency-list entries", n)
	}
	for _, n := range c.Runs {
		positive("runs entries", n)
	}
	if len(c.Runs) > 1 && len(c.Runs) != len(c.Concurrency) {
		errs = append(errs, fmt.Errorf("-runs has %d entries: give one, or one per -concurrency-list entry (%d)", len(c.Runs), len(c.Concurrency)))
	}
	positive("nodes", c.Nodes)
	positive("replicas", c.Replicas)
	wholeSeconds("duration", c.Duration)
	if c.Prefill < 0 {
		errs = append(errs, fmt.Errorf("-prefill must not be negative, not %d", c.Prefill))
	}
	if c.Mask < 8 || c.Mask > 30 {
		errs = append(errs, fmt.Errorf("-mask must be within 8..30 for the pool 10.0.0.0/8, not %d", c.Mask))
	}
	if c.HotConcurrency < 0 {
		errs = append(errs, fmt.Errorf("-hot-concurrency must not be negative (0 skips the hot-node run), not %d", c.HotConcurrency))
	}
	if len(c.Fill) > 0 {
		positive("fill-concurrency", c.FillConcurrency)
		positive("fill-per-node", c.FillPerNode)
		wholeSeconds("fill-duration", c.FillDuration)
		for i := 1; i < len(c.Fill); i++ {
			if c.Fill[i] <= c.Fill[i-1] {
				errs = append(errs, fmt.Errorf("-fill points must ascend strictly (leases are only added), not %v", c.Fill))
				break
			}
		}
		if c.Fill[0] < 0 {
			errs = append(errs, fmt.Errorf("-fill points must not be negative, not %v", c.Fill))
		}
		if c.FillPerNode > 0 && c.Fill[len(c.Fill)-1]/c.FillPerNode >= 1<<14 {
			errs = append(errs, fmt.Errorf("-fill %d leases at %d per node need more than the 16,384 blocks of %s", c.Fill[len(c.Fill)-1], c.FillPerNode, fillCIDR))
		}
	}
	if c.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("-max-conns must not be negative, not %d", c.MaxConns))
	}
	if c.Cooldown < 0 {
		errs = append(errs, fmt.Errorf("-cooldown must not be negative, not %v", c.Cooldown))
	}
	if c.LeaseExpiry <= 0 {
		errs = append(errs, fmt.Errorf("-lease-expiry must be positive, not %v", c.LeaseExpiry))
	}
	if c.ServerProfile != "" && c.Duration >= serverWriteTimeout {
		errs = append(errs, fmt.Errorf("-server-cpuprofile needs -duration under %v, the server's write timeout, which bounds a profile", serverWriteTimeout))
	}
	if c.Timeouts {
		positive("timeouts-concurrency", c.TimeoutsConcurrency)
		wholeSeconds("timeouts-duration", c.TimeoutsDuration)
		if c.ClientTimeout <= 0 {
			errs = append(errs, fmt.Errorf("-client-timeout must be positive, not %v", c.ClientTimeout))
		}
	}
	if c.Shim {
		positive("shim-calls", c.ShimCalls)
		positive("shim-parallel", c.ShimParallel)
		positive("shim-parallel-calls", c.ShimParallelCalls)
		if c.ShimBridgeCalls < 0 {
			errs = append(errs, fmt.Errorf("-shim-bridge-calls must not be negative (0 skips the bridge mode), not %d", c.ShimBridgeCalls))
		}
	}
	if c.LBIPAM {
		positive("lbipam-services", c.LBServices)
		positive("lbipam-burst", c.LBBurst)
		positive("lbipam-replicas", c.LBReplicas)
		positive("lbipam-waiting", c.LBWaiting)
		if c.LBServices > 8000 || c.LBWaiting > 8000 {
			errs = append(errs, fmt.Errorf("-lbipam-services %d, -lbipam-waiting %d: at most 8,000 each (the pools %s and %s, the ClusterIPs of %s)",
				c.LBServices, c.LBWaiting, lbPoolCIDR, lbLateCIDR, lbServiceCIDR))
		}
		if c.LBQPS < 2 || c.LBBurst < 3 {
			errs = append(errs, fmt.Errorf("-lbipam-qps must be at least 2 and -lbipam-burst at least 3, not %g and %d", c.LBQPS, c.LBBurst))
		}
		if c.LBBound <= 0 {
			errs = append(errs, fmt.Errorf("-lbipam-bound must be positive, not %v", c.LBBound))
		}
	}
	if c.Cilium {
		positive("cilium-nodes", c.CiliumNodes)
		positive("cilium-burst", c.CiliumBurst)
		positive("cilium-replicas", c.CiliumReplicas)
		if !(c.CiliumQPS > 0) {
			errs = append(errs, fmt.Errorf("-cilium-qps must be positive, not %g", c.CiliumQPS))
		}
		if c.CiliumBound <= 0 {
			errs = append(errs, fmt.Errorf("-cilium-bound must be positive, not %v", c.CiliumBound))
		}
		if c.CiliumNodes > 10_000 {
			errs = append(errs, fmt.Errorf("-cilium-nodes %d: at most 10,000 (a /26 block each in %s)", c.CiliumNodes, ciliumPoolCIDR))
		}
	}
	return errors.Join(errs...)
}

// defaultRunsAt32 and defaultRunsElse are the runs per level without
// -runs: the targets are judged at 32 clients, so that level gets a median
// of three and the others one run each (docs/performance.md says how long
// the defaults take).
const (
	defaultRunsAt32 = 3
	defaultRunsElse = 1
)

// runsAt answers the runs at the i-th concurrency level.
func (c config) runsAt(i int) int {
	switch {
	case len(c.Runs) == 1:
		return c.Runs[0]
	case len(c.Runs) > 1:
		return c.Runs[i]
	case c.Concurrency[i] == 32:
		return defaultRunsAt32
	default:
		return defaultRunsElse
	}
}

// intList is a flag of comma-separated non-negative integers ("8,32,64");
// the empty string is the empty list. Underscores may group digits.
type intList []int

func (l *intList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, n := range *l {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func (l *intList) Set(v string) error {
	*l = nil
	if strings.TrimSpace(v) == "" {
		return nil
	}
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.ReplaceAll(strings.TrimSpace(f), "_", ""))
		if err != nil {
			return fmt.Errorf("%q is not an integer", f)
		}
		*l = append(*l, n)
	}
	return nil
}

func parseConfig(args []string) (config, error) {
	c := config{Concurrency: []int{8, 32, 64}, Fill: []int{0, 100_000, 550_000}}
	var serverArgs string
	fs := flag.NewFlagSet("ipam-bench", flag.ContinueOnError)
	fs.StringVar(&c.DatabaseURL, "database-url", "", "PostgreSQL URL; empty starts a private, durable PostgreSQL in a temporary directory")
	fs.Var((*intList)(&c.Concurrency), "concurrency-list", "clients of the mixed runs, one level after the other (also the ceiling's pgbench clients)")
	fs.Var((*intList)(&c.Runs), "runs", "runs per level of -concurrency-list, each followed by one of the ceiling (medians are reported): one number for every level, or one per level; default 3 at 32 clients and 1 at the others")
	fs.DurationVar(&c.Duration, "duration", 20*time.Second, "length of each mixed and hot-node run, whole seconds (also the ceiling's)")
	fs.IntVar(&c.Nodes, "nodes", 256, "nodes of the mixed runs and the fill curve, split among the clients")
	fs.IntVar(&c.Prefill, "prefill", 32, "active leases per node (and on the hot node) made through the API before measuring")
	fs.IntVar(&c.Mask, "mask", 26, "node block mask of the measured pool 10.0.0.0/8 (26: 60 leasable addresses, so blocks are carved on demand during the runs)")
	fs.IntVar(&c.HotConcurrency, "hot-concurrency", 32, "clients of the hot-node run, all on one node; 0 skips it")
	fs.Var((*intList)(&c.Fill), "fill", "fill curve: active leases in the bulk-loaded pool at each point, ascending; '' skips the curve")
	fs.DurationVar(&c.FillDuration, "fill-duration", 10*time.Second, "length of each fill-curve run")
	fs.IntVar(&c.FillConcurrency, "fill-concurrency", 32, "clients of the fill-curve runs (on the -nodes nodes)")
	fs.IntVar(&c.FillPerNode, "fill-per-node", fillPerNode, "bulk-loaded leases per fill node (550,000 = 5,000 nodes x 110)")
	fs.IntVar(&c.Replicas, "replicas", 1, "server processes sharing the database; client i uses replica i mod N")
	fs.IntVar(&c.MaxConns, "max-conns", 0, "the servers' --max-conns; 0 = the server's default")
	fs.StringVar(&c.Ceiling, "ceiling", "../shared/bench/db-ceiling.sh", "path of db-ceiling.sh; the ceiling is skipped when it is missing")
	fs.DurationVar(&c.Cooldown, "cooldown", 30*time.Second, "the servers' --cooldown of released addresses")
	fs.DurationVar(&c.LeaseExpiry, "lease-expiry", time.Hour, "the servers' --lease-expiry; longer than the benchmark, so no pending lease a client holds expires under it")
	fs.StringVar(&serverArgs, "server-args", "", "more flags for every server process, space-separated (e.g. '--gc-interval 5s')")
	fs.StringVar(&c.ServerProfile, "server-cpuprofile", "", "start the server with --pprof and write its CPU profile over the first mixed run at 32 clients (else the first) to this file")
	fs.StringVar(&c.Out, "out", "", "write the results as JSON to this file")
	fs.StringVar(&c.CPUProfile, "cpuprofile", "", "write a CPU profile of the benchmark process (the clients) to this file")
	fs.BoolVar(&c.Floor, "floor", true, "after the hot-node run, the mixed run's clients (at 32, else the first level of -concurrency-list) against a server in this process answering from memory: the CPU per operation of the mix's HTTP, TLS and JSON alone")
	fs.BoolVar(&c.CloudScaleOut, "cloud-scaleout", true, "a simulated AWS scale-out through the cloud capacity workers' passes (capacity.Worker; 1,000 nodes in two pools to 30 Pods each, then churn; the real EC2 client against the EC2 fake with 10% throttled, 2% answers lost, stale reads, 1% of instances terminated): EC2 calls per 1,000 Pods against their floor, Pods that waited after the ramp, Pods never served, leasable addresses not held, calls on unowned interfaces")
	fs.BoolVar(&c.GoIPAM, "goipam", true, "after the mixed runs, the peer go-ipam "+goipamVersion+" (its PostgreSQL storage, in a process of its own, on a database of the same PostgreSQL) with the mix's shape at 32 clients (else the first level): ops/s and the lease path's over it (target >= 5); skipped, the reason printed, when it cannot be built")
	fs.StringVar(&c.GoIPAMSource, "goipam-src", "", "a checkout of go-ipam "+goipamVersion+" to build the peer from, where the Go module proxy does not serve it")
	fs.BoolVar(&c.Timeouts, "timeouts", true, "after the mixed runs, the mix without and then with -client-timeout per attempt (clients retry a timed-out call for the same attachment, on a new connection), and the ratio of the goodputs")
	fs.DurationVar(&c.ClientTimeout, "client-timeout", 300*time.Millisecond, "the timeouts phase's client timeout per attempt")
	fs.IntVar(&c.TimeoutsConcurrency, "timeouts-concurrency", 256, "clients of the timeouts phase (on the -nodes nodes)")
	fs.DurationVar(&c.TimeoutsDuration, "timeouts-duration", 10*time.Second, "length of each of the timeouts phase's two runs, whole seconds")
	fs.BoolVar(&c.Shim, "shim", true, "at the end, time the CNI plugin cmd/cni-shim end to end (one process per ADD and DEL, mutual TLS)")
	fs.IntVar(&c.ShimCalls, "shim-calls", 200, "sequential ADD+DEL pairs of the shim phase")
	fs.IntVar(&c.ShimParallel, "shim-parallel", 16, "parallel workers of the shim phase")
	fs.IntVar(&c.ShimParallelCalls, "shim-parallel-calls", 50, "ADD+DEL pairs per parallel worker of the shim phase")
	fs.BoolVar(&c.ShimWhereabouts, "shim-whereabouts", true, "in the bridge mode, whereabouts "+whereaboutsVersion+" takes turns too, on its Kubernetes storage (needs the kube-apiserver of make tools; else skipped)")
	fs.IntVar(&c.ShimBridgeCalls, "shim-bridge-calls", 100, "ADD+DEL pairs of each IPAM plugin under the bridge plugin, a veth into a Pod namespace each, as a runtime calls them (needs root and ip; else skipped); 0 skips")
	fs.BoolVar(&c.Cilium, "cilium", true, "at the very end, the service as Cilium's operator in crd mode against a real kube-apiserver and etcd (make tools builds them; else skipped with a message): -cilium-nodes CiliumNodes created at once, the time until each holds 8 addresses, and the operator's request rate to the API server")
	fs.IntVar(&c.CiliumNodes, "cilium-nodes", 5000, "CiliumNodes the cilium phase creates at once")
	fs.Float64Var(&c.CiliumQPS, "cilium-qps", 100, "the operator's --cilium-kube-qps, the limit its request rate is checked against")
	fs.IntVar(&c.CiliumBurst, "cilium-burst", 200, "the operator's --cilium-kube-burst")
	fs.DurationVar(&c.CiliumBound, "cilium-bound", 120*time.Second, "every CiliumNode must hold its 8 addresses within this of the creates, or the phase fails")
	fs.IntVar(&c.CiliumReplicas, "cilium-replicas", 2, "operator replicas of the cilium phase (leader election through their Lease); with 2 or more the leader is SIGKILLed once every node is served: the standby's takeover time, the time until every node is served, its writes to nodes already served (target 0), each replica's peak RSS (target <= 400 MiB)")
	fs.BoolVar(&c.LBIPAM, "lbipam", true, "last, the service as Cilium's LB IPAM against a real kube-apiserver and etcd (make tools; else skipped with a message): -lbipam-services LoadBalancer Services created at once, the time until each shows its address, satisfied, and no address held twice")
	fs.IntVar(&c.LBServices, "lbipam-services", 5000, "Services the lbipam phase creates at once (at most 8,000: a /18 pool)")
	fs.IntVar(&c.LBWaiting, "lbipam-waiting", 500, "then Services created waiting for a pool created after them, timed from the pool's create (at most 8,000)")
	fs.Float64Var(&c.LBQPS, "lbipam-qps", 100, "the LB IPAM server's client-side request rate to the API server (its --cilium-kube-qps)")
	fs.IntVar(&c.LBBurst, "lbipam-burst", 200, "the LB IPAM server's request burst (its --cilium-kube-burst)")
	fs.IntVar(&c.LBReplicas, "lbipam-replicas", 2, "LB IPAM replicas of the lbipam phase; with 2 or more the leader is SIGKILLed once every Service is satisfied, measured as in the cilium phase")
	fs.DurationVar(&c.LBBound, "lbipam-bound", 180*time.Second, "every Service must be satisfied within this of the creates, or the phase fails")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	c.ServerArgs = strings.Fields(serverArgs)
	if err := c.Validate(); err != nil {
		return c, err
	}
	if len(c.Runs) == 0 { // spell the default out for the report
		runs := make([]int, len(c.Concurrency))
		for i := range runs {
			runs[i] = c.runsAt(i)
		}
		c.Runs = runs
	}
	return c, nil
}
