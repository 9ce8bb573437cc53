// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/kubetest"
)

// The cilium phase runs the service as Cilium's operator in crd mode
// against a real kube-apiserver and etcd (internal/kubetest, built by make
// tools), as a cluster whose agents all start at once sees it: one extra
// server process with --cilium-ipam-mode crd leads, then -cilium-nodes
// CiliumNodes are created in parallel, and the phase measures how long
// each takes, from its create call, until its spec.ipam.pool holds
// Cilium's default pre-allocation (8 addresses), seen through a watch, as
// the agent would see it. Meanwhile the server's count of its requests to
// the API server (ipam_cilium_operator_kube_requests_total on /metrics) is
// sampled every second, to compare its request rate with its client-side
// limit (--cilium-kube-qps, --cilium-kube-burst). At the end no address
// may be in two nodes' pools, and each node's pool must be what the
// database holds for it (the API's lease list, and GET /v1/addresses/{a}
// of every address).
const (
	// ciliumPool is the operator's --default-pool, in the default space
	// (the operator's), apart from every other pool of the benchmark
	// (10.0.0.0/8 in the measured, fill and shim spaces).
	ciliumPool     = "cilium-bench"
	ciliumPoolCIDR = "172.16.0.0/12"
	ciliumPoolMask = 26
	// ciliumNodePrefix names the phase's CiliumNodes (and the service's
	// nodes): not "bench-", whose leases the end-of-run check compares
	// with the clients' books.
	ciliumNodePrefix = "cilium-bench-"
	// ciliumLeaseNamespace holds the leader election's Lease: one that
	// exists in a bare API server.
	ciliumLeaseNamespace = "default"
	// ciliumPreAllocate is the pool size a node must reach: Cilium's
	// default pre-allocation, the operator's when spec.ipam.pre-allocate
	// is unset (as the phase's nodes leave it).
	ciliumPreAllocate = alloc.DefaultPreAllocate
	// ciliumReadyAddrs is what an agent waits for before it runs Pods:
	// one address, two with health checking.
	ciliumReadyAddrs = 2
	// ciliumLeaderLimit bounds the wait for the operator to lead.
	ciliumLeaderLimit = 60 * time.Second
	// ciliumIdle and ciliumSettle are sampled before the creates and after
	// every node reached its pre-allocation: the idle request rate
	// (leader election), and the writes that follow the last pool.
	ciliumIdle   = 3 * time.Second
	ciliumSettle = 5 * time.Second
	// ciliumSampleEvery is the request counter's sampling period.
	ciliumSampleEvery = time.Second
	// ciliumCountSlack widens each window of the token-bucket check by
	// one second's worth of tokens: the operator counts a request when
	// its answer arrives, up to a request's latency after the limiter let
	// it go, and a sample's instant is only known within its scrape's
	// round trip.
	ciliumCountSlack = time.Second

	kubeRequestsMetric = "ipam_cilium_operator_kube_requests_total"
	leaderMetric       = "ipam_cilium_operator_leader"
)

// ciliumNodeName is the i-th node of the phase.
func ciliumNodeName(i int) string { return fmt.Sprintf("%s%04d", ciliumNodePrefix, i) }

// runCilium runs the cilium phase with a server of options so (its own
// process, sharing the benchmark's database). Measurement failures (a node
// not served within the bound, the request rate over the bucket, an
// address in two pools, a pool the database disagrees with) are added to
// failed; an error means the phase could not run.
func runCilium(ctx context.Context, cfg config, so serverOptions, probe *http.Client, admin *ipamclient.ClientWithResponses, private bool, out io.Writer, failed *[]string) (*ciliumReport, error) {
	rep := &ciliumReport{Nodes: cfg.CiliumNodes, PreAllocate: ciliumPreAllocate, QPS: cfg.CiliumQPS, Burst: cfg.CiliumBurst,
		Pool: fmt.Sprintf("%s %s /%d (default space)", ciliumPool, ciliumPoolCIDR, ciliumPoolMask), BoundSeconds: cfg.CiliumBound.Seconds()}
	began := time.Now()
	dir, audit, auditLog, err := auditedDir("ipam-bench-cilium-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	kc, err := kubetest.Launch(kubetest.WithAPIServerFlags(audit...))
	if errors.Is(err, kubetest.ErrNoBinaries) {
		rep = &ciliumReport{Skipped: err.Error()}
		fmt.Fprintf(out, "cilium: skipped: %s\n", rep.Skipped)
		return rep, nil
	} else if err != nil {
		return nil, err
	}
	defer func() {
		if err := kc.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "ipam-bench: cilium: stopping the API server:", err)
		}
	}()
	if err := kc.InstallCiliumCRDsCtx(ctx); err != nil {
		return nil, err
	}
	rep.KubeStartSeconds = time.Since(began).Seconds()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := kc.WriteKubeconfig(kc.Config(), kubeconfig); err != nil {
		return nil, err
	}

	if err := createCiliumPool(ctx, admin); err != nil {
		return nil, fmt.Errorf("setup: %w", err)
	}
	nodes := make([]string, cfg.CiliumNodes)
	for i := range nodes {
		nodes[i] = ciliumNodeName(i)
	}
	if !private {
		defer func() {
			if err := teardownCilium(context.WithoutCancel(ctx), admin, nodes); err != nil {
				fmt.Fprintln(os.Stderr, "ipam-bench: cilium teardown:", err)
			}
		}()
	}

	so.extra = append(slices.Clone(so.extra),
		"--cilium-ipam-mode", "crd", "--kubeconfig", kubeconfig,
		"--cilium-kube-qps", strconv.FormatFloat(cfg.CiliumQPS, 'f', -1, 64), "--cilium-kube-burst", strconv.Itoa(cfg.CiliumBurst),
		"--cilium-lease-namespace", ciliumLeaseNamespace, "--default-pool", ciliumPool)
	began = time.Now()
	srvs, err := startServers(ctx, cfg.CiliumReplicas, so, probe)
	if err != nil {
		return nil, fmt.Errorf("the operator's servers: %w", err)
	}
	defer stopServers(srvs)
	rss := watchRSS(serverPIDs(srvs))
	lead, err := waitLeadingAny(ctx, probe, srvs, ciliumLeaderLimit)
	if err != nil {
		rss.stop()
		return nil, err
	}
	srv := srvs[lead]
	rep.LeadSeconds = time.Since(began).Seconds()
	fmt.Fprintf(out, "cilium: etcd and kube-apiserver %s with Cilium's CRDs in %.1fs; operator %s pid %d of %d replicas (--cilium-ipam-mode crd --cilium-kube-qps %g --cilium-kube-burst %d --default-pool %s, pool %s) leading after %.1fs\n",
		kubetest.KubernetesVersion, rep.KubeStartSeconds, srv.url, srv.pid(), len(srvs), cfg.CiliumQPS, cfg.CiliumBurst, ciliumPool, rep.Pool, rep.LeadSeconds)
	killed, killedMem := -1, procMemory{}
	rssDone := false
	defer func() {
		if !rssDone {
			rss.stop()
		}
	}()

	// The phase's own client: not the operator's limit, so the creates go
	// out together.
	rc := kc.Config()
	rc.QPS, rc.Burst = 1000, 1000
	cs, err := ciliumclient.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	cn := cs.CiliumV2().CiliumNodes()

	smp := &sampler{hc: probe, url: srv.url + "/metrics", began: time.Now()}
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	if _, err := smp.mark(ctx); err != nil {
		return nil, err
	}
	sampling := make(chan struct{})
	go func() {
		defer close(sampling)
		smp.run(sctx, ciliumSampleEvery)
	}()

	nw := newNodeWatch(nodes)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watching := make(chan error, 1)
	listed := make(chan struct{})
	go func() { watching <- nw.follow(wctx, cn, listed) }()
	select {
	case <-listed:
	case err := <-watching:
		return nil, fmt.Errorf("watching CiliumNodes: %w", err)
	}

	// Idle: leading, nothing to serve.
	select {
	case <-time.After(ciliumIdle):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	busyFrom, err := smp.mark(ctx)
	if err != nil {
		return nil, err
	}
	busyStart := time.Now()
	created, createErrs := createNodes(ctx, cn, nodes)
	for i, err := range createErrs {
		if err != nil {
			rep.CreateErrors++
			if rep.CreateErrors <= 3 {
				fmt.Fprintf(out, "  create %s: %v\n", nodes[i], err)
			}
		}
	}

	bound := time.NewTimer(max(0, cfg.CiliumBound-time.Since(busyStart)))
	defer bound.Stop()
	select {
	case <-nw.all:
	case <-bound.C:
	case err := <-watching:
		return nil, fmt.Errorf("watching CiliumNodes: %w", err)
	case <-srv.done:
		return nil, srv.exited()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	busyTo, err := smp.mark(ctx)
	if err != nil {
		return nil, err
	}
	select {
	case <-time.After(ciliumSettle):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if _, err := smp.mark(ctx); err != nil {
		return nil, err
	}
	stopSampling()
	<-sampling

	// The takeover: the leader's SIGKILL, with the watch still on.
	if len(srvs) > 1 {
		late := make([]string, takeoverLate(cfg.CiliumNodes))
		for i := range late {
			late[i] = ciliumNodeName(cfg.CiliumNodes + i)
		}
		nodes = append(nodes, late...) // checked and torn down with the others
		rep.Takeover, killedMem, err = ciliumTakeover(ctx, probe, cn, nw, srvs, lead, late, auditLog, cfg.CiliumNodes)
		killed = lead
		if err != nil {
			return nil, err
		}
	}
	stopWatch()
	<-watching

	// Time to pre-allocation (and to ready) per node.
	reached, ready, restarts := nw.times()
	rep.WatchRestarts = restarts
	first := nodes[:cfg.CiliumNodes] // not the takeover's
	toPool, toReady := sinceCreated(first, created, createErrs, reached), sinceCreated(first, created, createErrs, ready)
	rep.Reached, rep.ReadyCount = countWithin(toPool, cfg.CiliumBound), len(toReady)
	rep.PreAllocation, rep.Ready = secondsOf(toPool), secondsOf(toReady)

	samples, byMethod, err := smp.result()
	if err != nil {
		return nil, err
	}
	rep.Requests = requestFigures(samples, busyFrom, busyTo, cfg.CiliumQPS, cfg.CiliumBurst, ciliumCountSlack.Seconds())
	rep.Requests.ByMethod = byMethod

	// The end: pools against each other and against the database.
	if err := checkCiliumPools(ctx, cn, admin, nodes, rep); err != nil {
		return nil, err
	}
	rssDone = true
	rep.RSS = replicaRSS(rss, killed, killedMem)
	if rep.Takeover != nil {
		rep.Takeover.RSS = rep.RSS
	}
	printCilium(out, rep)
	*failed = append(*failed, rep.failures(cfg.CiliumBound)...)
	for i, s := range srvs {
		if err := s.exited(); err != nil && i != killed {
			*failed = append(*failed, err.Error())
		}
	}
	return rep, nil
}

// serverPIDs answers the servers' process ids.
func serverPIDs(srvs []*serverProc) []int {
	pids := make([]int, len(srvs))
	for i, s := range srvs {
		pids[i] = s.pid()
	}
	return pids
}

// ciliumTakeover SIGKILLs the leading operator srvs[lead] once every node
// of nw is served, creates the late nodes at once, and measures the
// standby's takeover (takeover.go): from the kill until it serves, from
// then until each late node holds its pre-allocation and its first round
// over every node is done, and the writes, in the audit log at auditLog,
// to the nodes served before the kill. nodes is how many there were.
func ciliumTakeover(ctx context.Context, probe *http.Client, cn ciliumNodeClient, nw *nodeWatch, srvs []*serverProc, lead int,
	late []string, auditLog string, nodes int) (*takeoverReport, procMemory, error) {
	reached, _, _ := nw.times()
	t := &takeoverReport{Replicas: len(srvs), KilledPID: srvs[lead].pid(), Late: len(late), Converged: len(reached), AllServedSeconds: -1}
	standby := srvs[(lead+1)%len(srvs)]
	t.StandbyPID = standby.pid()
	// The standby's counters before it leads (it made no round yet).
	before, err := scrape(ctx, probe, standby.url+"/metrics")
	if err != nil {
		return nil, procMemory{}, err
	}
	_, reqsBefore := metricSum(before, kubeRequestsMetric, "method")

	nw.add(late)
	killedAt, mem := killLeader(srvs[lead])
	if _, errs := createNodes(ctx, cn, late); slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
		return nil, mem, fmt.Errorf("creating the takeover's nodes: %w", errors.Join(errs...))
	}
	if err := waitLeading(ctx, probe, standby, takeoverLeadLimit); err != nil {
		return nil, mem, err
	}
	ledAt := time.Now()
	t.ToLeadSeconds = ledAt.Sub(killedAt).Seconds()

	// Served: every late node at its pre-allocation, and the new leader's
	// ok rounds at least the nodes (its first pass, from the initial
	// list, over every one).
	all := nodes + len(late)
	var roundsDone time.Time
	deadline := ledAt.Add(takeoverLeadLimit)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		if roundsDone.IsZero() {
			if text, err := scrape(ctx, probe, standby.url+"/metrics"); err == nil {
				if ss, err := parseMetric(text, reconcilesMetric); err == nil {
					ok := 0.0
					for _, s := range ss {
						if s.Labels["outcome"] == "ok" {
							ok += s.Value
						}
					}
					if ok >= float64(all) {
						roundsDone = time.Now()
					}
				}
			}
		}
		at, _, _ := nw.times()
		if _, _, _, done := servedTimes(late, at, ledAt, takeoverServeBound); done && !roundsDone.IsZero() {
			break
		}
		select {
		case <-ctx.Done():
			return nil, mem, ctx.Err()
		case <-standby.done:
			return nil, mem, standby.exited()
		case <-tick.C:
		}
	}
	at, _, _ := nw.times()
	ds, within, last, done := servedTimes(late, at, ledAt, takeoverServeBound)
	t.LateServed, t.ToServed = within, secondsOf(ds)
	if done && !roundsDone.IsZero() {
		if roundsDone.After(last) {
			last = roundsDone
		}
		t.AllServedSeconds = max(0, last.Sub(ledAt).Seconds())
	}
	select {
	case <-time.After(takeoverSettle):
	case <-ctx.Done():
		return nil, mem, ctx.Err()
	}
	if text, err := scrape(ctx, probe, standby.url+"/metrics"); err == nil {
		_, after := metricSum(text, kubeRequestsMetric, "method")
		t.NewLeaderRequests = map[string]float64{}
		for m, n := range after {
			if d := n - reqsBefore[m]; d > 0 {
				t.NewLeaderRequests[m] = d
			}
		}
	}
	converged, lateSet := map[string]bool{}, map[string]bool{}
	for n := range reached {
		converged[n] = true
	}
	for _, n := range late {
		lateSet[n] = true
	}
	if err := countAuditWrites(auditLog, "ciliumnodes", killedAt, converged, lateSet, t); err != nil {
		return nil, mem, err
	}
	return t, mem, nil
}

// reconcilesMetric counts the operator's rounds by outcome.
const reconcilesMetric = "ipam_cilium_operator_reconciles_total"

// metricSum answers the sum of a metric's series in text and the sums by
// label; nothing when it is absent or malformed.
func metricSum(text, name, label string) (float64, map[string]float64) {
	ss, err := parseMetric(text, name)
	if err != nil {
		return 0, map[string]float64{}
	}
	return sumSeries(ss, label)
}

// waitLeadingAny waits until one of srvs leads and answers its index.
func waitLeadingAny(ctx context.Context, hc *http.Client, srvs []*serverProc, limit time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	found := make(chan int, len(srvs))
	errs := make(chan error, len(srvs))
	for i, s := range srvs {
		go func() {
			if err := waitLeading(ctx, hc, s, limit); err != nil {
				errs <- err
				return
			}
			found <- i
		}()
	}
	var last error
	for range srvs {
		select {
		case i := <-found:
			return i, nil
		case err := <-errs:
			last = err
		}
	}
	return -1, last
}

// ciliumNodeClient is the part of Cilium's clientset the phase uses.
type ciliumNodeClient interface {
	ciliumNodes
	Create(ctx context.Context, cn *ciliumv2.CiliumNode, opts metav1.CreateOptions) (*ciliumv2.CiliumNode, error)
}

// createNodes creates a CiliumNode of each name, all at once (as the
// agents of nodes starting together): one goroutine per node, released
// together. It answers when each create call began, and its error.
func createNodes(ctx context.Context, cn ciliumNodeClient, nodes []string) (began []time.Time, errs []error) {
	began, errs = make([]time.Time, len(nodes)), make([]error, len(nodes))
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i, name := range nodes {
		wg.Go(func() {
			<-gate
			began[i] = time.Now()
			_, errs[i] = cn.Create(ctx, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		})
	}
	close(gate)
	wg.Wait()
	return began, errs
}

// sinceCreated answers, for each node created without error that has an
// instant in at, the time from its create call to that instant.
func sinceCreated(nodes []string, created []time.Time, errs []error, at map[string]time.Time) []time.Duration {
	var ds []time.Duration
	for i, name := range nodes {
		if t, ok := at[name]; ok && errs[i] == nil {
			ds = append(ds, t.Sub(created[i]))
		}
	}
	return ds
}

// createCiliumPool creates the operator's pool in the default space.
func createCiliumPool(ctx context.Context, admin *ipamclient.ClientWithResponses) error {
	resp, err := admin.CreatePoolWithResponse(ctx, &ipamclient.CreatePoolParams{}, ipamclient.PoolRequest{
		Name: ciliumPool,
		Spec: ipamclient.PoolSpec{Ipv4: &ipamclient.PoolFamilySpec{Cidrs: []string{ciliumPoolCIDR}, MaskSize: ciliumPoolMask}},
	})
	if err != nil {
		return fmt.Errorf("create pool: %w", err)
	}
	return statusError("create pool "+ciliumPool, resp.StatusCode(), resp.Body)
}

// teardownCilium deletes the phase's nodes (with their addresses) and
// its pool from a shared database's default space, once the operator has
// stopped.
func teardownCilium(ctx context.Context, admin *ipamclient.ClientWithResponses, nodes []string) error {
	force := true
	for _, n := range nodes {
		resp, err := admin.DeleteNodeWithResponse(ctx, n, &ipamclient.DeleteNodeParams{Force: &force})
		if err != nil {
			return fmt.Errorf("delete node: %w", err)
		}
		if resp.StatusCode() != http.StatusNotFound {
			if err := statusError("delete node "+n, resp.StatusCode(), resp.Body); err != nil {
				return err
			}
		}
	}
	resp, err := admin.DeletePoolWithResponse(ctx, ciliumPool, &ipamclient.DeletePoolParams{})
	if err != nil {
		return fmt.Errorf("delete pool: %w", err)
	}
	return statusError("delete pool "+ciliumPool, resp.StatusCode(), resp.Body)
}

// waitLeading waits until the server's ipam_cilium_operator_leader is 1,
// at most limit.
func waitLeading(ctx context.Context, hc *http.Client, srv *serverProc, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := "no scrape yet"
	for {
		text, err := scrape(ctx, hc, srv.url+"/metrics")
		if err == nil {
			ss, perr := parseMetric(text, leaderMetric)
			switch {
			case perr != nil:
				last = perr.Error()
			case len(ss) == 0:
				last = leaderMetric + " not exported"
			case ss[0].Value == 1:
				return nil
			default:
				last = fmt.Sprintf("%s %g", leaderMetric, ss[0].Value)
			}
		} else {
			last = err.Error()
		}
		select {
		case <-srv.done:
			return srv.exited()
		case <-ctx.Done():
			return fmt.Errorf("the operator does not lead within %v (%s): %s", limit, last, lastLines(srv.stderr.String(), 10))
		case <-tick.C:
		}
	}
}

// scrape answers the text of GET url.
func scrape(ctx context.Context, hc *http.Client, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// sampler reads the operator's request counter from /metrics.
type sampler struct {
	hc    *http.Client
	url   string
	began time.Time

	mu      sync.Mutex // held through a scrape: samples stay in order
	samples []counterSample
	// firstBy and lastBy are the counts by method at the first and the
	// last sample.
	firstBy, lastBy map[string]float64
	err             error // the first failed scrape
}

// mark takes a sample now and answers its index.
func (s *sampler) mark(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sent := time.Now()
	text, err := scrape(ctx, s.hc, s.url)
	if err != nil {
		return 0, fmt.Errorf("sampling %s: %w", kubeRequestsMetric, err)
	}
	// The counter was read somewhere within the round trip: its middle,
	// and the trip's ends for the bucket check.
	recv := time.Now()
	at := sent.Add(recv.Sub(sent) / 2).Sub(s.began)
	ss, err := parseMetric(text, kubeRequestsMetric)
	if err == nil && len(ss) == 0 {
		err = fmt.Errorf("not exported by %s", s.url)
	}
	if err != nil {
		return 0, fmt.Errorf("sampling %s: %w", kubeRequestsMetric, err)
	}
	total, by := sumSeries(ss, "method")
	s.samples = append(s.samples, counterSample{Sec: at.Seconds(), Count: total,
		SentSec: sent.Sub(s.began).Seconds(), RecvSec: recv.Sub(s.began).Seconds()})
	if s.firstBy == nil {
		s.firstBy = by
	}
	s.lastBy = by
	return len(s.samples) - 1, nil
}

// run samples every period until ctx ends, keeping the first error.
func (s *sampler) run(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if _, err := s.mark(ctx); err != nil && ctx.Err() == nil {
			s.mu.Lock()
			if s.err == nil {
				s.err = err
			}
			s.mu.Unlock()
		}
	}
}

// result answers the samples and the requests by method from the first
// sample to the last.
func (s *sampler) result() ([]counterSample, map[string]float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	by := map[string]float64{}
	for m, n := range s.lastBy {
		by[m] = n - s.firstBy[m]
	}
	return slices.Clone(s.samples), by, s.err
}

// nodeWatch follows the phase's CiliumNodes and records when each first
// held ciliumReadyAddrs and ciliumPreAllocate addresses in spec.ipam.pool.
type nodeWatch struct {
	all chan struct{} // closed when every node reached ciliumPreAllocate

	mu      sync.Mutex // protects the fields below
	want    map[string]bool
	ready   map[string]time.Time
	reached map[string]time.Time
	closed  bool // all is closed
	// restartWhy says why each watch ended before the phase did.
	restartWhy []string
}

func newNodeWatch(nodes []string) *nodeWatch {
	w := &nodeWatch{all: make(chan struct{}), want: map[string]bool{}, ready: map[string]time.Time{}, reached: map[string]time.Time{}}
	for _, n := range nodes {
		w.want[n] = true
	}
	return w
}

// add follows more nodes (created after all may have closed).
func (w *nodeWatch) add(nodes []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range nodes {
		w.want[n] = true
	}
}

// observe records what cn shows, seen at at.
func (w *nodeWatch) observe(cn *ciliumv2.CiliumNode, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.want[cn.Name] {
		return
	}
	n := len(cn.Spec.IPAM.Pool)
	if _, ok := w.ready[cn.Name]; !ok && n >= ciliumReadyAddrs {
		w.ready[cn.Name] = at
	}
	if _, ok := w.reached[cn.Name]; !ok && n >= ciliumPreAllocate {
		w.reached[cn.Name] = at
		if len(w.reached) == len(w.want) && !w.closed {
			close(w.all)
			w.closed = true
		}
	}
}

// times answers copies of the instants each node was ready and reached
// its pre-allocation, and why each watch restart happened.
func (w *nodeWatch) times() (reached, ready map[string]time.Time, restarts []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.reached), maps.Clone(w.ready), slices.Clone(w.restartWhy)
}

// ciliumNodes is the part of Cilium's clientset the watch uses.
type ciliumNodes interface {
	List(ctx context.Context, opts metav1.ListOptions) (*ciliumv2.CiliumNodeList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// follow lists the CiliumNodes (then closes listed) and watches them from
// the list's resourceVersion until ctx ends; when the API server ends the
// watch, it lists again (counting what the list shows at its instant) and
// watches on. It answers nil when ctx ends, else the error that stopped it.
func (w *nodeWatch) follow(ctx context.Context, nodes ciliumNodes, listed chan<- struct{}) error {
	list := func() (string, error) {
		l, err := nodes.List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		now := time.Now()
		for i := range l.Items {
			w.observe(&l.Items[i], now)
		}
		return l.ResourceVersion, nil
	}
	rv, err := list()
	if err != nil {
		return err
	}
	close(listed)
	for {
		wi, err := nodes.Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		why := "the API server ended the watch"
		for ev := range wi.ResultChan() {
			if cn, ok := ev.Object.(*ciliumv2.CiliumNode); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				w.observe(cn, time.Now())
			}
			if ev.Type == watch.Error {
				why = fmt.Sprintf("error event %v", apierrors.FromObject(ev.Object))
				break
			}
		}
		wi.Stop()
		if ctx.Err() != nil {
			return nil
		}
		w.mu.Lock()
		w.restartWhy = append(w.restartWhy, why)
		w.mu.Unlock()
		if rv, err = list(); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// checkCiliumPools reads every phase node's pool and compares the pools
// with each other and with the database: its leases of the pool (through
// the API's lease list) and, per address, GET /v1/addresses/{a}.
func checkCiliumPools(ctx context.Context, cn ciliumNodes, admin *ipamclient.ClientWithResponses, nodes []string, rep *ciliumReport) error {
	l, err := cn.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing CiliumNodes: %w", err)
	}
	want := map[string]bool{}
	for _, n := range nodes {
		want[n] = true
	}
	kube := map[string][]string{}
	for _, n := range l.Items {
		if !want[n.Name] {
			continue
		}
		for ip := range n.Spec.IPAM.Pool {
			a, err := leaseAddr(ip)
			if err != nil {
				return fmt.Errorf("CiliumNode %s: %w", n.Name, err)
			}
			kube[n.Name] = append(kube[n.Name], a)
			rep.PoolAddresses++
		}
	}
	rep.PoolNodes, rep.Duplicates = len(kube), len(poolDuplicates(kube))

	db := map[string][]string{}
	pool := ciliumPool
	limit := 1000
	var cont *string
	for {
		resp, err := admin.ListLeasesWithResponse(ctx, &ipamclient.ListLeasesParams{Pool: &pool, Limit: &limit, Continue: cont})
		if err != nil {
			return fmt.Errorf("listing the pool's leases: %w", err)
		}
		if err := statusError("list leases of pool "+ciliumPool, resp.StatusCode(), resp.Body); err != nil {
			return err
		}
		for _, ls := range resp.JSON200.Items {
			if ls.State != ipamclient.Cooling {
				a, err := leaseAddr(ls.Address)
				if err != nil {
					return err
				}
				db[ls.Node] = append(db[ls.Node], a)
			}
		}
		if cont = resp.JSON200.Continue; cont == nil || *cont == "" {
			break
		}
	}
	mm := poolMismatches(kube, db)
	rep.Mismatches, rep.MismatchSamples = len(mm), mm[:min(len(mm), 5)]

	// Every address, one by one, as an operator would look one up.
	type job struct{ node, addr string }
	jobs := make(chan job)
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for j := range jobs {
				resp, err := admin.GetAddressWithResponse(ctx, j.addr, &ipamclient.GetAddressParams{})
				mu.Lock()
				switch {
				case err != nil:
					firstErr = cmp.Or(firstErr, err)
				case resp.JSON200 == nil || resp.JSON200.Node != j.node || resp.JSON200.Pool != ciliumPool:
					rep.AddressMismatches++
					if len(rep.MismatchSamples) < 10 {
						rep.MismatchSamples = append(rep.MismatchSamples, fmt.Sprintf("GET /v1/addresses/%s: %d %s; want node %s pool %s",
							j.addr, resp.StatusCode(), strings.TrimSpace(string(resp.Body)), j.node, ciliumPool))
					}
				}
				mu.Unlock()
			}
		})
	}
	for _, n := range slices.Sorted(maps.Keys(kube)) {
		for _, a := range kube[n] {
			jobs <- job{n, a}
		}
	}
	close(jobs)
	wg.Wait()
	return firstErr
}

// printCilium prints the phase's figures.
func printCilium(out io.Writer, r *ciliumReport) {
	q := r.Requests
	fmt.Fprintf(out, "cilium nodes=%d reached_%d=%d/%d within %.0fs: p50=%.2fs p90=%.2fs p99=%.2fs max=%.2fs; ready(>=%d) p50=%.2fs p99=%.2fs; create_errors=%d watch_restarts=%d %v\n",
		r.Nodes, r.PreAllocate, r.Reached, r.Nodes, r.BoundSeconds, r.PreAllocation.P50, r.PreAllocation.P90, r.PreAllocation.P99, r.PreAllocation.Max,
		ciliumReadyAddrs, r.Ready.P50, r.Ready.P99, r.CreateErrors, len(r.WatchRestarts), r.WatchRestarts)
	fmt.Fprintf(out, "cilium kube requests: total=%.0f %s idle=%.1f/s busy %.0f in %.1fs avg=%.1f/s (x%.2f qps) sustained=%.1f/s (x%.2f) max_1s=%.1f/s (x%.2f); bucket check: worst window %.1f-%.1fs %.0f requests, allowed %.0f (burst %d + qps %g x (t + %v)) %s\n",
		q.Total, methods(q.ByMethod), q.IdlePerSec, q.BusyRequests, q.BusySeconds, q.AvgPerSec, q.AvgRatio, q.SustainedPerSec, q.SustainedRatio,
		q.MaxPerSec, q.MaxRatio, q.Worst.FromSec, q.Worst.ToSec, q.Worst.Requests, q.Worst.Allowed, r.Burst, r.QPS, ciliumCountSlack, okOver(q.Worst.ok()))
	fmt.Fprintf(out, "cilium pools: %d addresses in %d nodes' pools; in two pools=%d; pools differing from the database=%d; GET /v1/addresses mismatches=%d\n",
		r.PoolAddresses, r.PoolNodes, r.Duplicates, r.Mismatches, r.AddressMismatches)
	for _, s := range r.MismatchSamples {
		fmt.Fprintf(out, "  mismatch: %s\n", s)
	}
	printTakeover(out, "cilium", r.Takeover, r.RSS)
}

// printTakeover prints a phase's takeover, or its replica's RSS without
// one.
func printTakeover(out io.Writer, phase string, t *takeoverReport, rss []rssSample) {
	if t == nil {
		fmt.Fprintf(out, "%s: server peak RSS %.1f MiB (target <= %d MiB)\n", phase, maxPeak(rss), rssLimitMiB)
		return
	}
	fmt.Fprintln(out, t.line(phase))
	for _, s := range t.WriteSamples {
		fmt.Fprintf(out, "  write: %s\n", s)
	}
}

// methods prints requests by method, sorted.
func methods(by map[string]float64) string {
	var parts []string
	for _, m := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%s=%.0f", m, by[m]))
	}
	return "(" + strings.Join(parts, " ") + ")"
}

func okOver(ok bool) string {
	if ok {
		return "ok"
	}
	return "OVER"
}

// printCiliumSummary prints the phase's lines of the summary.
func printCiliumSummary(out io.Writer, r *ciliumReport) {
	if r == nil {
		return
	}
	if r.Skipped != "" {
		fmt.Fprintf(out, "cilium: skipped: %s\n", r.Skipped)
		return
	}
	q := r.Requests
	fmt.Fprintf(out, "cilium crd: %d CiliumNodes at once, %d/%d at %d addresses within %.0fs: p50 %.2fs p99 %.2fs (p90 %.2fs, max %.2fs); kube requests avg %.1f/s sustained %.1f/s max 1 s %.1f/s vs qps %g burst %d: %s; dups %d, pool/database mismatches %d+%d\n",
		r.Nodes, r.Reached, r.Nodes, r.PreAllocate, r.BoundSeconds, r.PreAllocation.P50, r.PreAllocation.P99, r.PreAllocation.P90, r.PreAllocation.Max,
		q.AvgPerSec, q.SustainedPerSec, q.MaxPerSec, r.QPS, r.Burst, okOver(q.Worst.ok()), r.Duplicates, r.Mismatches, r.AddressMismatches)
	printTakeover(out, "cilium", r.Takeover, r.RSS)
}
