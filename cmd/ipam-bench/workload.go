package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
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

// newHTTPClient answers a client for loopback load: keep-alive connections,
// enough idle ones per replica that no worker redials, no compression.
func newHTTPClient(concurrency int) *http.Client {
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        0, // no limit across replicas
			MaxIdleConnsPerHost: concurrency + 1,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
			ForceAttemptHTTP2:   false,
		},
	}
}

// nodeName is the name of node i.
func nodeName(i int) string { return fmt.Sprintf("bench-node-%04d", i) }

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

// attachment is a container interface a worker holds a lease for.
type attachment struct {
	node        string
	containerID string
}

// worker is one client of the benchmark: one request at a time, on its own
// nodes, through one replica. Its held attachments carry over from run to
// run; its measurements are reset before each run.
type worker struct {
	id     int
	client *ipamv1.ClientWithResponses
	space  *string // nil for the default space
	nodes  []string
	next   int // round-robin position in nodes for the next allocation
	held   []attachment
	rng    *rand.Rand
	seq    int

	// One run's measurements.
	allocs, releases []time.Duration
	errs             map[string]int64 // by cause: op, status and problem type
	samples          []string
}

func newWorker(id int, client *ipamv1.ClientWithResponses, space *string, nodes []string) *worker {
	return &worker{
		id: id, client: client, space: space, nodes: nodes,
		rng:  rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano()))),
		errs: map[string]int64{},
	}
}

// reset forgets the previous run's measurements.
func (w *worker) reset() {
	w.allocs, w.releases = w.allocs[:0], w.releases[:0]
	w.errs, w.samples = map[string]int64{}, nil
}

// allocate leases an address on node to a new attachment. expire asks for a
// pending lease, as a CNI ADD does.
func (w *worker) allocate(ctx context.Context, node string, expire bool) error {
	w.seq++
	cid := fmt.Sprintf("bench-w%04d-%09d", w.id, w.seq)
	body := ipamv1.LeaseRequest{
		ContainerID: cid,
		Interface:   benchInterface,
		Owner:       ipamv1.Owner{Namespace: "bench", Name: cid},
		Expire:      &expire,
	}
	start := time.Now()
	resp, err := w.client.AllocateLeaseWithResponse(ctx, node, &ipamv1.AllocateLeaseParams{Space: w.space}, body)
	d := time.Since(start)
	if err != nil {
		return transportError(opAllocate, err)
	}
	if err := statusError(opAllocate, resp.StatusCode(), resp.Body); err != nil {
		return err
	}
	w.allocs = append(w.allocs, d)
	w.held = append(w.held, attachment{node: node, containerID: cid})
	return nil
}

// release releases the held attachment at index i.
func (w *worker) release(ctx context.Context, i int) error {
	a := w.held[i]
	start := time.Now()
	resp, err := w.client.ReleaseAttachmentWithResponse(ctx, a.node, a.containerID, benchInterface,
		&ipamv1.ReleaseAttachmentParams{Space: w.space})
	d := time.Since(start)
	if err != nil {
		return transportError(opRelease, err)
	}
	if err := statusError(opRelease, resp.StatusCode(), resp.Body); err != nil {
		return err
	}
	w.releases = append(w.releases, d)
	w.held[i] = w.held[len(w.held)-1]
	w.held = w.held[:len(w.held)-1]
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
	var p ipamv1.Problem
	if json.Unmarshal(body, &p) == nil && p.Type != "" {
		cause += " " + strings.TrimPrefix(p.Type, "urn:ipam:problem:")
		if p.Detail != nil {
			detail = *p.Detail
		}
	}
	return &callErr{cause: cause, detail: detail}
}

// prefill leases count addresses per node before measuring, as active
// (confirmed) leases that never expire: the Pods already running. Each node's
// leases are split among the workers that drive it, which then hold them.
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

// runResult is the outcome of one measured run of the service, and of the
// ceiling run that followed it.
type runResult struct {
	Run           int              `json:"run"`
	Seconds       float64          `json:"seconds"`
	Allocs        int64            `json:"allocs"`
	Releases      int64            `json:"releases"`
	Errors        int64            `json:"errors"`
	ErrorRate     float64          `json:"errorRate"`
	OpsPerSec     float64          `json:"opsPerSec"`
	AllocPerSec   float64          `json:"allocPerSec"`
	ReleasePerSec float64          `json:"releasePerSec"`
	AllocP50ms    float64          `json:"allocP50ms"`
	AllocP99ms    float64          `json:"allocP99ms"`
	AllocMaxms    float64          `json:"allocMaxMs"`
	ReleaseP50ms  float64          `json:"releaseP50ms"`
	ReleaseP99ms  float64          `json:"releaseP99ms"`
	ReleaseMaxms  float64          `json:"releaseMaxMs"`
	ErrorsByCause map[string]int64 `json:"errorsByCause,omitempty"`
	ErrorSamples  []string         `json:"errorSamples,omitempty"`
	Held          int              `json:"heldAfter"`

	Ceiling      *ceilingResult `json:"ceiling,omitempty"`
	CeilingError string         `json:"ceilingError,omitempty"`
	// Ratio is OpsPerSec / Ceiling.TPS.
	Ratio float64 `json:"ratio,omitempty"`
}

// measure runs the mix on every worker for d and summarizes the run. Workers
// start no call after d; the calls in flight then finish and count.
func measure(ctx context.Context, run int, workers []*worker, d time.Duration) runResult {
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

	r := runResult{Run: run, Seconds: elapsed.Seconds(), ErrorsByCause: map[string]int64{}}
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
	}
	r.Allocs, r.Releases = int64(len(allocs)), int64(len(releases))
	r.ErrorRate = errorRate(r.Allocs+r.Releases, r.Errors)
	r.AllocPerSec = float64(r.Allocs) / elapsed.Seconds()
	r.ReleasePerSec = float64(r.Releases) / elapsed.Seconds()
	r.OpsPerSec = r.AllocPerSec + r.ReleasePerSec
	a, rel := summarize(allocs), summarize(releases)
	r.AllocP50ms, r.AllocP99ms, r.AllocMaxms = ms(a.P50), ms(a.P99), ms(a.Max)
	r.ReleaseP50ms, r.ReleaseP99ms, r.ReleaseMaxms = ms(rel.P50), ms(rel.P99), ms(rel.Max)
	return r
}

// setupPool creates (in a fresh space, when space is set) the pool
// "default" over 10.0.0.0/8 with node blocks of mask bits, and registers the
// nodes.
func setupPool(ctx context.Context, c *ipamv1.ClientWithResponses, space *string, mask int, nodes []string) error {
	if space != nil {
		resp, err := c.CreateSpaceWithResponse(ctx, ipamv1.SpaceRequest{Name: *space})
		if err != nil {
			return fmt.Errorf("create space: %w", err)
		}
		if err := statusError("create space "+*space, resp.StatusCode(), resp.Body); err != nil {
			return err
		}
	}
	pool, err := c.CreatePoolWithResponse(ctx, &ipamv1.CreatePoolParams{Space: space}, ipamv1.PoolRequest{
		Name: "default",
		Spec: ipamv1.PoolSpec{Ipv4: &ipamv1.PoolFamilySpec{Cidrs: []string{"10.0.0.0/8"}, MaskSize: mask}},
	})
	if err != nil {
		return fmt.Errorf("create pool: %w", err)
	}
	if err := statusError("create pool default", pool.StatusCode(), pool.Body); err != nil {
		return err
	}
	for _, n := range nodes {
		resp, err := c.PutNodeWithResponse(ctx, n, &ipamv1.PutNodeParams{Space: space}, ipamv1.NodeSpec{})
		if err != nil {
			return fmt.Errorf("register node: %w", err)
		}
		if err := statusError("register node "+n, resp.StatusCode(), resp.Body); err != nil {
			return err
		}
	}
	return nil
}

// teardown deletes the nodes, the pool and the space setupPool made in a
// space of its own.
func teardown(ctx context.Context, c *ipamv1.ClientWithResponses, space string, nodes []string) error {
	force := true
	for _, n := range nodes {
		resp, err := c.DeleteNodeWithResponse(ctx, n, &ipamv1.DeleteNodeParams{Space: &space, Force: &force})
		if err != nil {
			return fmt.Errorf("delete node: %w", err)
		}
		if err := statusError("delete node "+n, resp.StatusCode(), resp.Body); err != nil {
			return err
		}
	}
	pool, err := c.DeletePoolWithResponse(ctx, "default", &ipamv1.DeletePoolParams{Space: &space})
	if err != nil {
		return fmt.Errorf("delete pool: %w", err)
	}
	if err := statusError("delete pool default", pool.StatusCode(), pool.Body); err != nil {
		return err
	}
	resp, err := c.DeleteSpaceWithResponse(ctx, space)
	if err != nil {
		return fmt.Errorf("delete space: %w", err)
	}
	return statusError("delete space "+space, resp.StatusCode(), resp.Body)
}
