// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// The two calls of the measured mix.
const (
	opAllocate = "allocate"
	opRelease  = "release"
)

// benchInterface is the interface name of every attachment.
const benchInterface = "eth0"

// maxSamplesPerRun bounds the error messages kept per run to show what went
// wrong.
const maxSamplesPerRun = 5

// nodeName is the name of measured node i.
func nodeName(i int) string { return fmt.Sprintf("bench-node-%04d", i) }

// hotNode is the node of the hot-node run.
const hotNode = "bench-hot-node"

// nodesFor answers the nodes worker i of c drives among n nodes. With fewer
// workers than nodes the nodes are split among them (worker i takes nodes
// i, i+c, i+2c, ...); with as many or more, worker i takes node i%n, so
// workers share nodes evenly.
func nodesFor(i, c, n int) []int {
	if c >= n {
		return []int{i % n}
	}
	var out []int
	for j := i % c; j < n; j += c {
		out = append(out, j)
	}
	return out
}

// attachment is a container interface a client holds a lease for, and
// since when (the allocation's answer, on the ledger's clock).
type attachment struct {
	node        string
	containerID string
	addr        netip.Addr
	from        time.Duration
}

// worker is one client of the benchmark, as the CNI plugin of its nodes:
// one request at a time, each node's requests with that node's certificate
// over kept-alive connections, through one server. Its measurements are
// reset before each run.
type worker struct {
	id      int
	clients map[string]*ipamclient.ClientWithResponses // node -> client with the node's certificate
	space   *string                                    // nil for the default space
	nodes   []string
	ledger  *ledger
	next    int // round-robin position in nodes for the next allocation
	held    []attachment
	closed  []hold // released since the ledger last collected
	rng     *rand.Rand

	// retry makes the worker behave as a CNI plugin under overload: a
	// call that timed out (after timeout, when set) is sent again for the
	// same attachment, and one answered 503 or 429 is sent again after its
	// Retry-After (the timeouts phase, timeouts.go). Without it, every
	// failure counts as an error.
	retry   bool
	timeout time.Duration

	// One run's measurements.
	allocs, releases []time.Duration
	errs             map[string]int64 // by cause: op, status and problem type
	samples          []string
	timedOut         int64 // attempts that timed out and were sent again
	refused          int64 // attempts answered 503 or 429 and sent again
}

// reset forgets the previous run's measurements.
func (w *worker) reset() {
	w.allocs, w.releases = w.allocs[:0], w.releases[:0]
	w.errs, w.samples = map[string]int64{}, nil
	w.timedOut, w.refused = 0, 0
}

// maxAttempts bounds the attempts of one call with retry.
const maxAttempts = 100

// send makes one call through attempt, which sends it with the context it
// is given. With retry, an attempt that timed out is sent again at once
// (a new connection: the timed-out one was closed), and one answered 503
// or 429 after its Retry-After; the answer of the last attempt is
// returned. The request is the same each time: an allocation of the same
// attachment (idempotent: a retry answers the leases an earlier attempt
// made, 200) or the same release.
func (w *worker) send(ctx context.Context, attempt func(context.Context) (*http.Response, error)) (*http.Response, error) {
	for n := 1; ; n++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if w.timeout > 0 {
			actx, cancel = context.WithTimeout(ctx, w.timeout)
		}
		res, err := attempt(actx)
		cancel()
		if !w.retry || n == maxAttempts || ctx.Err() != nil {
			return res, err
		}
		switch {
		case err != nil && errors.Is(err, context.DeadlineExceeded):
			w.timedOut++
		case err == nil && (res.StatusCode == http.StatusServiceUnavailable || res.StatusCode == http.StatusTooManyRequests):
			w.refused++
			time.Sleep(retryAfter(res.Header))
		default:
			return res, err
		}
	}
}

// retryAfter is a Retry-After header of seconds, 1 s when it is missing
// or not a number of seconds.
func retryAfter(h http.Header) time.Duration {
	if s, err := strconv.Atoi(h.Get("Retry-After")); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	return time.Second
}

// allocate leases an address on node to a new attachment. expire asks for a
// pending lease, as a CNI ADD does.
func (w *worker) allocate(ctx context.Context, node string, expire bool) error {
	cid := w.ledger.containerID()
	body := ipamclient.LeaseRequest{
		ContainerID: cid,
		Interface:   benchInterface,
		Owner:       ipamclient.Owner{Namespace: "bench", Name: cid},
		Expire:      &expire,
	}
	start := time.Now()
	var resp *ipamclient.AllocateLeaseResponse
	_, err := w.send(ctx, func(ctx context.Context) (*http.Response, error) {
		var err error
		resp, err = w.clients[node].AllocateLeaseWithResponse(ctx, node, &ipamclient.AllocateLeaseParams{Space: w.space}, body)
		if err != nil {
			return nil, err
		}
		return resp.HTTPResponse, nil
	})
	d := time.Since(start)
	got := w.ledger.now()
	if err != nil {
		return transportError(opAllocate, err)
	}
	if err := statusError(opAllocate, resp.StatusCode(), resp.Body); err != nil {
		return err
	}
	a := attachment{node: node, containerID: cid, from: got}
	answer := resp.JSON201
	if answer == nil && w.retry {
		// An earlier attempt leased it and timed out before its answer:
		// the retry answers those leases.
		answer = resp.JSON200
	}
	if answer == nil || len(answer.Addresses) != 1 {
		return &callErr{cause: opAllocate + " answer", detail: fmt.Sprintf("status %d, want 201 with one address: %s", resp.StatusCode(), resp.Body)}
	}
	p, err := netip.ParsePrefix(answer.Addresses[0].Address)
	if err != nil {
		return &callErr{cause: opAllocate + " answer", detail: err.Error()}
	}
	a.addr = p.Addr()
	w.allocs = append(w.allocs, d)
	w.held = append(w.held, a)
	return nil
}

// release releases the held attachment at index i. The attachment stops
// holding its address when the request is sent, as far as the duplicate
// check is concerned: the server may hand it out once it has answered.
func (w *worker) release(ctx context.Context, i int) error {
	a := w.held[i]
	w.closed = append(w.closed, hold{addr: a.addr, node: a.node, containerID: a.containerID, from: a.from, to: w.ledger.now()})
	w.held[i] = w.held[len(w.held)-1]
	w.held = w.held[:len(w.held)-1]
	start := time.Now()
	var resp *ipamclient.ReleaseAttachmentResponse
	_, err := w.send(ctx, func(ctx context.Context) (*http.Response, error) {
		var err error
		resp, err = w.clients[a.node].ReleaseAttachmentWithResponse(ctx, a.node, a.containerID, benchInterface,
			&ipamclient.ReleaseAttachmentParams{Space: w.space})
		if err != nil {
			return nil, err
		}
		return resp.HTTPResponse, nil
	})
	d := time.Since(start)
	if err != nil {
		return transportError(opRelease, err)
	}
	if err := statusError(opRelease, resp.StatusCode(), resp.Body); err != nil {
		return err
	}
	w.releases = append(w.releases, d)
	return nil
}

// step does one call of the mix: allocate or release with equal odds, or
// allocate when nothing is held. A failure is counted, not returned.
func (w *worker) step(ctx context.Context) {
	var err error
	if len(w.held) == 0 || w.rng.IntN(2) == 0 {
		node := w.nodes[w.next]
		w.next = (w.next + 1) % len(w.nodes)
		err = w.allocate(ctx, node, true)
	} else {
		err = w.release(ctx, w.rng.IntN(len(w.held)))
	}
	w.count(err)
}

// count records a failed call.
func (w *worker) count(err error) {
	var ce *callErr
	if errors.As(err, &ce) {
		w.errs[ce.cause]++
		if len(w.samples) < maxSamplesPerRun {
			w.samples = append(w.samples, ce.Error())
		}
	}
}

// callErr is a failed call: a transport error or a non-2xx answer.
type callErr struct {
	cause  string // "allocate 503 unavailable", "release transport"
	detail string
}

func (e *callErr) Error() string { return e.cause + ": " + e.detail }

// transportError is a call that got no HTTP answer.
func transportError(op string, err error) error {
	return &callErr{cause: op + " transport", detail: err.Error()}
}

// statusError answers nil for a 2xx status, else a *callErr naming what was
// called, the status and the problem type of body.
func statusError(what string, code int, body []byte) error {
	if code >= 200 && code < 300 {
		return nil
	}
	cause := fmt.Sprintf("%s %d", what, code)
	detail := strings.TrimSpace(string(body))
	var p ipamclient.Problem
	if json.Unmarshal(body, &p) == nil && p.Type != "" {
		cause += " " + strings.TrimPrefix(p.Type, "urn:ipam:problem:")
		if p.Detail != nil {
			detail = *p.Detail
		}
	}
	return &callErr{cause: cause, detail: detail}
}

// fleet makes the workers of each phase and keeps what they hold between
// phases: a worker set is retired after its phase, and the next one takes
// over the attachments of its nodes, so every release in the mix is of a
// lease some client really holds.
type fleet struct {
	pki     *benchPKI
	servers []string // base URLs; worker i uses servers[i%len]
	space   *string
	ledger  *ledger
	perHost int          // idle connections kept per node and server
	parked  []attachment // held by no current worker
}

// spaceName is the space the fleet's nodes live in, and their certificates
// name.
func (f *fleet) spaceName() string {
	if f.space == nil {
		return alloc.DefaultSpace
	}
	return *f.space
}

// workers makes c workers over nodes (split by nodesFor) and hands them the
// parked attachments of their nodes.
func (f *fleet) workers(c int, nodes []string) ([]*worker, error) {
	ws := make([]*worker, c)
	drivers := map[string][]*worker{}
	for i := range ws {
		w := &worker{id: i, space: f.space, ledger: f.ledger, clients: map[string]*ipamclient.ClientWithResponses{},
			rng: rand.New(rand.NewPCG(uint64(i), uint64(time.Now().UnixNano()))), errs: map[string]int64{}}
		server := f.servers[i%len(f.servers)]
		for _, n := range nodesFor(i, c, len(nodes)) {
			node := nodes[n]
			hc, err := f.pki.nodeClient(f.spaceName(), node, f.perHost)
			if err != nil {
				return nil, err
			}
			if w.clients[node], err = apiClient(server, hc); err != nil {
				return nil, err
			}
			w.nodes = append(w.nodes, node)
			drivers[node] = append(drivers[node], w)
		}
		ws[i] = w
	}
	var keep []attachment
	turn := map[string]int{}
	for _, a := range f.parked {
		ds := drivers[a.node]
		if len(ds) == 0 {
			keep = append(keep, a)
			continue
		}
		w := ds[turn[a.node]%len(ds)]
		turn[a.node]++
		w.held = append(w.held, a)
	}
	f.parked = keep
	return ws, nil
}

// retire parks what the workers hold and hands their released holds to
// the ledger.
func (f *fleet) retire(ws []*worker) {
	for _, w := range ws {
		f.parked = append(f.parked, w.held...)
		w.held = nil
	}
	f.ledger.collect(ws)
}

// open answers every attachment held now, parked or by ws.
func (f *fleet) open(ws []*worker) []attachment {
	out := slices.Clone(f.parked)
	for _, w := range ws {
		out = append(out, w.held...)
	}
	return out
}

// warm makes one call per worker and node it drives, all workers at once,
// so the connections (and their TLS handshakes) exist before a measured
// run: GET /v1/nodes/NODE/blocks, a read the node's certificate may make.
// A call refused by the server's admission control (503) is sent again
// after its Retry-After, on the same connection.
func warm(ctx context.Context, ws []*worker) error {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for _, w := range ws {
		wg.Go(func() {
			for _, n := range w.nodes {
				var resp *ipamclient.ListBlocksResponse
				var err error
				for range maxAttempts {
					resp, err = w.clients[n].ListBlocksWithResponse(ctx, n, &ipamclient.ListBlocksParams{Space: w.space})
					if err != nil || resp.StatusCode() != http.StatusServiceUnavailable {
						break
					}
					time.Sleep(retryAfter(resp.HTTPResponse.Header))
				}
				if err == nil {
					err = statusError("warm-up GET blocks of "+n, resp.StatusCode(), resp.Body)
				}
				if err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return firstErr
}

// prefill leases count addresses per node before measuring, as active
// (confirmed) leases: the Pods already running. Each node's leases are
// split among the workers that drive it, which then hold them.
func prefill(ctx context.Context, workers []*worker, count int) error {
	share := map[string]int{} // node -> workers driving it
	for _, w := range workers {
		for _, n := range w.nodes {
			share[n]++
		}
	}
	seen := map[string]int{} // node -> workers given their part so far
	todo := make([][]string, len(workers))
	for i, w := range workers {
		for _, n := range w.nodes {
			k, m := seen[n], share[n]
			seen[n]++
			part := count / m
			if k < count%m {
				part++
			}
			for range part {
				todo[i] = append(todo[i], n)
			}
		}
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for i, w := range workers {
		wg.Go(func() {
			for _, n := range todo[i] {
				if err := w.allocate(ctx, n, false); err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	for _, w := range workers {
		w.reset()
	}
	return firstErr
}

// latencyMS is the latency of one kind of call in milliseconds.
type latencyMS struct {
	P50 float64 `json:"p50ms"`
	P90 float64 `json:"p90ms"`
	P99 float64 `json:"p99ms"`
	Max float64 `json:"maxMs"`
}

func latencyOf(ds []time.Duration) latencyMS {
	l := summarize(ds)
	return latencyMS{P50: ms(l.P50), P90: ms(l.P90), P99: ms(l.P99), Max: ms(l.Max)}
}

// runResult is the outcome of one measured run of the service, and of the
// ceiling run that followed it.
type runResult struct {
	Phase string `json:"phase"` // mixed, hot-node, fill
	// WriteBatches is what the servers' store batcher did during the run.
	WriteBatches  *writeBatches    `json:"writeBatches,omitempty"`
	Concurrency   int              `json:"concurrency"`
	Nodes         int              `json:"nodes"`
	Run           int              `json:"run"`
	FillLeases    int              `json:"fillLeases,omitempty"`
	Seconds       float64          `json:"seconds"`
	Allocs        int64            `json:"allocs"`
	Releases      int64            `json:"releases"`
	Errors        int64            `json:"errors"`
	ErrorRate     float64          `json:"errorRate"`
	OpsPerSec     float64          `json:"opsPerSec"`
	AllocPerSec   float64          `json:"allocPerSec"`
	ReleasePerSec float64          `json:"releasePerSec"`
	Alloc         latencyMS        `json:"alloc"`
	Release       latencyMS        `json:"release"`
	All           latencyMS        `json:"all"`
	ErrorsByCause map[string]int64 `json:"errorsByCause,omitempty"`
	ErrorSamples  []string         `json:"errorSamples,omitempty"`
	Held          int              `json:"heldAfter"`
	// WALBytes is the WAL the database wrote during the run (right after
	// a checkpoint, so full-page images included), and WALPerPair that
	// per allocation and release: WALBytes / ((Allocs+Releases)/2).
	WALBytes   int64   `json:"walBytes,omitempty"`
	WALPerPair float64 `json:"walBytesPerPair,omitempty"`
	// Handshakes counts the TLS connections opened during the run (0 when
	// every request reused a warm connection).
	Handshakes int64 `json:"tlsHandshakes"`
	// TimedOut and Refused count the attempts sent again after a client
	// timeout, or after a 503 or 429 (the timeouts phase only).
	TimedOut int64 `json:"timedOut,omitempty"`
	Refused  int64 `json:"refused,omitempty"`
	// DBSessions counts the PostgreSQL sessions opened during the run,
	// DBSessionsAbandoned those the server dropped (the timeouts phase
	// only).
	DBSessions          int64 `json:"dbSessions,omitempty"`
	DBSessionsAbandoned int64 `json:"dbSessionsAbandoned,omitempty"`
	// Duplicates is the number of overlapping holds of one address in the
	// clients' bookkeeping so far (must be 0).
	Duplicates int `json:"duplicates"`
	// Carves are the servers' carves during the run (nil when their
	// counters could not be read).
	Carves *carveCounts `json:"carves,omitempty"`
	// RSS is each server process's memory during the run.
	RSS        []rssSample `json:"rss"`
	RSSPeakMiB float64     `json:"rssPeakMiB"`
	// CPU is who spent the machine's CPU during the run, per operation
	// (nil when /proc could not be read).
	CPU *cpuPerOp `json:"cpu,omitempty"`

	Ceiling      *ceilingResult `json:"ceiling,omitempty"`
	CeilingError string         `json:"ceilingError,omitempty"`
	// Ratio is OpsPerSec / Ceiling.TPS.
	Ratio float64 `json:"ratio,omitempty"`
}

// measure runs the mix on every worker for d and summarizes the run. Workers
// start no call after d; the calls in flight then finish and count.
func measure(ctx context.Context, workers []*worker, d time.Duration) runResult {
	for _, w := range workers {
		w.reset()
	}
	var wg sync.WaitGroup
	start := time.Now()
	until := start.Add(d)
	for _, w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(until) {
				w.step(ctx)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	r := runResult{Concurrency: len(workers), Seconds: elapsed.Seconds(), ErrorsByCause: map[string]int64{}}
	var allocs, releases []time.Duration
	for _, w := range workers {
		allocs = append(allocs, w.allocs...)
		releases = append(releases, w.releases...)
		for cause, n := range w.errs {
			r.ErrorsByCause[cause] += n
			r.Errors += n
		}
		for _, s := range w.samples {
			if len(r.ErrorSamples) < maxSamplesPerRun && !slices.Contains(r.ErrorSamples, s) {
				r.ErrorSamples = append(r.ErrorSamples, s)
			}
		}
		r.Held += len(w.held)
		r.TimedOut += w.timedOut
		r.Refused += w.refused
	}
	r.Allocs, r.Releases = int64(len(allocs)), int64(len(releases))
	r.ErrorRate = errorRate(r.Allocs+r.Releases, r.Errors)
	r.AllocPerSec = float64(r.Allocs) / elapsed.Seconds()
	r.ReleasePerSec = float64(r.Releases) / elapsed.Seconds()
	r.OpsPerSec = r.AllocPerSec + r.ReleasePerSec
	all := append(slices.Clone(allocs), releases...)
	r.Alloc, r.Release, r.All = latencyOf(allocs), latencyOf(releases), latencyOf(all)
	return r
}

// ledger is the clients' bookkeeping of who held which address when, for
// the duplicate check, and the source of container IDs.
type ledger struct {
	epoch time.Time
	seq   atomic.Int64
	mu    sync.Mutex
	holds []hold // released holds of retired workers
}

func newLedger() *ledger { return &ledger{epoch: time.Now()} }

// now is the time since the ledger began, on the monotonic clock.
func (l *ledger) now() time.Duration { return time.Since(l.epoch) }

// containerID answers a container ID no attachment had before.
func (l *ledger) containerID() string { return fmt.Sprintf("bench-%010d", l.seq.Add(1)) }

// collect takes the released holds of ws.
func (l *ledger) collect(ws []*worker) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range ws {
		l.holds = append(l.holds, w.closed...)
		w.closed = nil
	}
}

// count answers the released holds collected so far.
func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.holds)
}

// overlaps answers every pair of holds of one address that overlap in time,
// counting the released holds collected so far and the open attachments.
func (l *ledger) overlaps(open []attachment) []overlap {
	l.mu.Lock()
	all := slices.Clone(l.holds)
	l.mu.Unlock()
	for _, a := range open {
		all = append(all, hold{addr: a.addr, node: a.node, containerID: a.containerID, from: a.from, to: stillHeld})
	}
	return findOverlaps(all)
}
