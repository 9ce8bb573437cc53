// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Cilium's operator and the VPC CNI share a cloud account's API rate
// with everything else in it; going past it throttles every caller of the
// account (amazon-vpc-cni-k8s#123). So every request of every worker
// takes a token from one bucket first. The cloud counts requests, not the
// provider's calls: a CreateInterface is a create, an attach and an
// attribute change, a listing is as many requests as pages, an Azure
// write is a read, the write and the polls of its operation, and each
// retry of the SDK is one more. So the server takes the tokens where the
// SDK sends each request (Budget, the clients' HTTP client), and the
// limited wrappers below only bound and observe each call; a wrapper
// given a bucket of its own takes an estimate of each call's requests
// instead, for a provider whose client is not behind a Budget.
//
// Every call is bounded in time too (WithCallTimeout): a request the
// cloud never answers (a lost connection, a hung endpoint) would stall
// the pass, and with it the cloud lock a standby replica waits for.

// DefaultQPS and DefaultBurst are the bucket's defaults, Cilium's
// operator's for EC2 and Azure (--limit-ipam-api-qps, -burst).
const (
	DefaultQPS   = 4
	DefaultBurst = 20
)

// Limited is a Provider whose calls are bounded by the call timeout and
// observed, and wait for a token of the bucket when it was given one. A
// call whose context ends while it waits for tokens fails with the
// context's error and never reaches the cloud.
type Limited struct {
	p Provider
	bucket
}

// LimitedInterfaces is an InterfaceManager behind a bucket, as Limited.
type LimitedInterfaces struct {
	m InterfaceManager
	bucket
}

// CallObserver hears of every call a limited wrapper makes: the
// operation (the wrapper's method), the time it waited for tokens (the
// wrapper's, and its requests' at a Budget), the time the call itself
// took, and its error (nil on success; a context error with took 0 when
// it never reached the cloud). The server counts them as metrics.
type CallObserver interface {
	ObserveCall(op string, waited, took time.Duration, err error)
}

// Option configures a limited wrapper.
type Option func(*bucket)

// WithObserver makes o hear of every call.
func WithObserver(o CallObserver) Option { return func(b *bucket) { b.observer = o } }

// WithCallTimeout bounds every call of the wrapper to d (0: unbounded),
// its SDK's retries and its requests' waits at a Budget included (the
// wait for a wrapper's own bucket is not: the pass's context bounds
// that). A call that runs out fails with context.DeadlineExceeded; what
// it changed in the cloud before is read by the next pass, as after any
// failure.
func WithCallTimeout(d time.Duration) Option { return func(b *bucket) { b.timeout = d } }

// DefaultCallTimeout is the server's call timeout (--cloud-call-timeout):
// above the SDKs' own retries of a throttled or failed request (the
// VPC CNI bounds each EC2 request to 10 s) and an Azure write's
// operation, far below what holds a standby replica back for long.
const DefaultCallTimeout = 30 * time.Second

// bucket is the token bucket of a limited wrapper (nil when a Budget
// takes the tokens), its call timeout, and who hears of its calls.
type bucket struct {
	limiter  *rate.Limiter
	observer CallObserver
	timeout  time.Duration
}

func newBucket(limiter *rate.Limiter, opts []Option) bucket {
	b := bucket{limiter: limiter}
	for _, o := range opts {
		o(&b)
	}
	return b
}

// call runs fn once tokens are taken (with a bucket of the wrapper's
// own), within the call timeout, and tells the observer.
func (b *bucket) call(ctx context.Context, op string, tokens int, fn func(context.Context) error) error {
	start := time.Now()
	if b.limiter != nil {
		if err := b.limiter.WaitN(ctx, min(tokens, b.limiter.Burst())); err != nil {
			b.observe(op, time.Since(start), 0, err)
			return err
		}
	}
	if b.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.timeout)
		defer cancel()
	}
	st := &callStats{}
	ctx = context.WithValue(ctx, callStatsKey{}, st)
	began := time.Now()
	err := fn(ctx)
	took := time.Since(began)
	waited, sent, refused := st.get()
	if err != nil && sent == 0 && refused {
		took = 0 // the Budget kept it from the cloud
	}
	b.observe(op, began.Sub(start)+waited, max(took-waited, 0), err)
	return err
}

func (b *bucket) observe(op string, waited, took time.Duration, err error) {
	if b.observer != nil {
		b.observer.ObserveCall(op, waited, took, err)
	}
}

var (
	_ Provider         = (*Limited)(nil)
	_ InterfaceManager = (*LimitedInterfaces)(nil)
)

// LimitedInventory is an Inventory behind a bucket, as Limited: with a
// bucket of its own, two tokens a listing, one for the instances and one
// for their interfaces (further pages are rare: a thousand instances, or
// interfaces, a page; a Budget counts them).
type LimitedInventory struct {
	inv Inventory
	bucket
}

var _ Inventory = (*LimitedInventory)(nil)

// NewLimitedInventory answers inv behind limiter (share it with the
// provider's Limited).
func NewLimitedInventory(inv Inventory, limiter *rate.Limiter, opts ...Option) *LimitedInventory {
	return &LimitedInventory{inv: inv, bucket: newBucket(limiter, opts)}
}

func (l *LimitedInventory) Instances(ctx context.Context, vpc string) (out map[string]Instance, err error) {
	err = l.call(ctx, "Instances", 2, func(ctx context.Context) error { out, err = l.inv.Instances(ctx, vpc); return err })
	return out, err
}

// NewLimited answers p behind limiter: nil when p's client sends its
// requests through a Budget, which takes the tokens.
func NewLimited(p Provider, limiter *rate.Limiter, opts ...Option) *Limited {
	return &Limited{p: p, bucket: newBucket(limiter, opts)}
}

// NewLimitedInterfaces answers m behind limiter (share it with the
// provider's Limited).
func NewLimitedInterfaces(m InterfaceManager, limiter *rate.Limiter, opts ...Option) *LimitedInterfaces {
	return &LimitedInterfaces{m: m, bucket: newBucket(limiter, opts)}
}

func (l *Limited) Instance(ctx context.Context, id string) (out Instance, err error) {
	err = l.call(ctx, "Instance", 1, func(ctx context.Context) error { out, err = l.p.Instance(ctx, id); return err })
	return out, err
}

func (l *Limited) Assign(ctx context.Context, iface string, n int, prefixes bool) (out Assigned, err error) {
	err = l.call(ctx, "Assign", 1, func(ctx context.Context) error { out, err = l.p.Assign(ctx, iface, n, prefixes); return err })
	return out, err
}

func (l *Limited) Unassign(ctx context.Context, iface string, addrs []netip.Addr, prefixes []netip.Prefix) error {
	return l.call(ctx, "Unassign", 1, func(ctx context.Context) error { return l.p.Unassign(ctx, iface, addrs, prefixes) })
}

func (l *LimitedInterfaces) Subnets(ctx context.Context, vpc, zone string) (out []Subnet, err error) {
	err = l.call(ctx, "Subnets", 1, func(ctx context.Context) error { out, err = l.m.Subnets(ctx, vpc, zone); return err })
	return out, err
}

// CreateInterface takes the tokens of the calls it makes at least (a
// description, the create, the attach, the attribute change) before it
// starts, so a create never stops halfway for the bucket.
func (l *LimitedInterfaces) CreateInterface(ctx context.Context, spec InterfaceSpec) (out Interface, err error) {
	err = l.call(ctx, "CreateInterface", createCalls, func(ctx context.Context) error { out, err = l.m.CreateInterface(ctx, spec); return err })
	return out, err
}

// createCalls is the least number of API calls of a CreateInterface.
const createCalls = 4

func (l *LimitedInterfaces) Detached(ctx context.Context, tags map[string]string) (out []Interface, err error) {
	err = l.call(ctx, "Detached", 1, func(ctx context.Context) error { out, err = l.m.Detached(ctx, tags); return err })
	return out, err
}

// DetachInterface takes the tokens of its two calls (a description and
// the detach).
func (l *LimitedInterfaces) DetachInterface(ctx context.Context, id string) error {
	return l.call(ctx, "DetachInterface", 2, func(ctx context.Context) error { return l.m.DetachInterface(ctx, id) })
}

// SecurityGroups takes one token: the AWS provider caches its answer,
// but the limiter cannot know whether this call hits the cache.
func (l *LimitedInterfaces) SecurityGroups(ctx context.Context, vpc string, tags map[string]string) (out []string, err error) {
	err = l.call(ctx, "SecurityGroups", 1, func(ctx context.Context) error { out, err = l.m.SecurityGroups(ctx, vpc, tags); return err })
	return out, err
}

func (l *LimitedInterfaces) DeleteInterface(ctx context.Context, id string) error {
	return l.call(ctx, "DeleteInterface", 1, func(ctx context.Context) error { return l.m.DeleteInterface(ctx, id) })
}

func (l *LimitedInterfaces) AssignIPv6Prefix(ctx context.Context, iface string) (out netip.Prefix, err error) {
	err = l.call(ctx, "AssignIPv6Prefix", 1, func(ctx context.Context) error { out, err = l.m.AssignIPv6Prefix(ctx, iface); return err })
	return out, err
}

// Doer sends HTTP requests: what the AWS SDK takes as its HTTPClient and
// azcore as its policy.Transporter (an *http.Client is one).
type Doer interface {
	Do(*http.Request) (*http.Response, error)
}

// Budget is a Doer that takes a token of its bucket for each request
// before it sends it, so that the bucket counts what the cloud counts:
// every page, every request of a multi-request call, every retry. Give
// every client of one account (EC2's; Azure's network and compute
// clients of one subscription) the same bucket, and the credential's own
// requests (to STS, to Entra ID) none: they count against other limits.
type Budget struct {
	next    Doer
	limiter *rate.Limiter
}

var _ Doer = (*Budget)(nil)

// NewBudget answers next behind limiter.
func NewBudget(next Doer, limiter *rate.Limiter) *Budget {
	return &Budget{next: next, limiter: limiter}
}

// Do waits for a token, then sends req. A request whose context ends
// first is not sent: Do answers the context's error, which both SDKs
// take as the end of the call, not as a failure to retry.
func (b *Budget) Do(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	st, _ := ctx.Value(callStatsKey{}).(*callStats)
	start := time.Now()
	r := b.limiter.Reserve()
	if !r.OK() {
		// A bucket of burst 0: it never gives a token.
		st.add(0, false)
		return nil, errors.New("cloud request bucket: burst 0 gives no token")
	}
	if d := r.Delay(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			r.Cancel()
			st.add(time.Since(start), false)
			return nil, ctx.Err()
		}
	}
	st.add(time.Since(start), true)
	return b.next.Do(req)
}

// callStats is what a call's requests met at a Budget: the time they
// waited for tokens, how many were sent, and whether one was kept back.
type callStats struct {
	mu      sync.Mutex
	waited  time.Duration
	sent    int
	refused bool
}

type callStatsKey struct{}

// add counts a request that waited d and was sent (or not); st may be
// nil (a request outside a limited wrapper's call).
func (st *callStats) add(d time.Duration, sent bool) {
	if st == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.waited += d
	if sent {
		st.sent++
	} else {
		st.refused = true
	}
}

func (st *callStats) get() (waited time.Duration, sent int, refused bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.waited, st.sent, st.refused
}
