// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import (
	"context"
	"net/netip"
	"time"

	"golang.org/x/time/rate"
)

// Cilium's operator and the VPC CNI share a cloud account's API rate
// with everything else in it; going past it throttles every caller of the
// account (amazon-vpc-cni-k8s#123). So every call of every worker takes a
// token from one bucket first.

// DefaultQPS and DefaultBurst are the bucket's defaults, Cilium's
// operator's for EC2 and Azure (--limit-ipam-api-qps, -burst).
const (
	DefaultQPS   = 4
	DefaultBurst = 20
)

// Limited is a Provider whose calls each wait for a token of one shared
// bucket. A call whose context ends while it waits fails with the
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
// operation (the wrapper's method), the time it waited for tokens, the
// time the call itself took, and its error (nil on success; a context
// error with took 0 when it never reached the cloud). The server counts
// them as metrics.
type CallObserver interface {
	ObserveCall(op string, waited, took time.Duration, err error)
}

// Option configures a limited wrapper.
type Option func(*bucket)

// WithObserver makes o hear of every call.
func WithObserver(o CallObserver) Option { return func(b *bucket) { b.observer = o } }

// bucket is the token bucket of a limited wrapper, and who hears of its
// calls.
type bucket struct {
	limiter  *rate.Limiter
	observer CallObserver
}

func newBucket(limiter *rate.Limiter, opts []Option) bucket {
	b := bucket{limiter: limiter}
	for _, o := range opts {
		o(&b)
	}
	return b
}

// call runs fn once tokens are taken, and tells the observer.
func (b *bucket) call(ctx context.Context, op string, tokens int, fn func() error) error {
	start := time.Now()
	if err := b.limiter.WaitN(ctx, min(tokens, b.limiter.Burst())); err != nil {
		b.observe(op, time.Since(start), 0, err)
		return err
	}
	waited := time.Since(start)
	err := fn()
	b.observe(op, waited, time.Since(start)-waited, err)
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

// LimitedInventory is an Inventory behind a bucket, as Limited: two
// tokens a listing, one for the instances and one for their interfaces
// (further pages are rare: a thousand instances, or interfaces, a page).
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
	err = l.call(ctx, "Instances", 2, func() error { out, err = l.inv.Instances(ctx, vpc); return err })
	return out, err
}

// NewLimited answers p behind limiter.
func NewLimited(p Provider, limiter *rate.Limiter, opts ...Option) *Limited {
	return &Limited{p: p, bucket: newBucket(limiter, opts)}
}

// NewLimitedInterfaces answers m behind limiter (share it with the
// provider's Limited).
func NewLimitedInterfaces(m InterfaceManager, limiter *rate.Limiter, opts ...Option) *LimitedInterfaces {
	return &LimitedInterfaces{m: m, bucket: newBucket(limiter, opts)}
}

func (l *Limited) Instance(ctx context.Context, id string) (out Instance, err error) {
	err = l.call(ctx, "Instance", 1, func() error { out, err = l.p.Instance(ctx, id); return err })
	return out, err
}

func (l *Limited) Assign(ctx context.Context, iface string, n int, prefixes bool) (out Assigned, err error) {
	err = l.call(ctx, "Assign", 1, func() error { out, err = l.p.Assign(ctx, iface, n, prefixes); return err })
	return out, err
}

func (l *Limited) Unassign(ctx context.Context, iface string, addrs []netip.Addr, prefixes []netip.Prefix) error {
	return l.call(ctx, "Unassign", 1, func() error { return l.p.Unassign(ctx, iface, addrs, prefixes) })
}

func (l *LimitedInterfaces) Subnets(ctx context.Context, vpc, zone string) (out []Subnet, err error) {
	err = l.call(ctx, "Subnets", 1, func() error { out, err = l.m.Subnets(ctx, vpc, zone); return err })
	return out, err
}

// CreateInterface takes the tokens of the calls it makes at least (a
// description, the create, the attach, the attribute change) before it
// starts, so a create never stops halfway for the bucket.
func (l *LimitedInterfaces) CreateInterface(ctx context.Context, spec InterfaceSpec) (out Interface, err error) {
	err = l.call(ctx, "CreateInterface", createCalls, func() error { out, err = l.m.CreateInterface(ctx, spec); return err })
	return out, err
}

// createCalls is the least number of API calls of a CreateInterface.
const createCalls = 4

func (l *LimitedInterfaces) Detached(ctx context.Context, tags map[string]string) (out []Interface, err error) {
	err = l.call(ctx, "Detached", 1, func() error { out, err = l.m.Detached(ctx, tags); return err })
	return out, err
}

// DetachInterface takes the tokens of its two calls (a description and
// the detach).
func (l *LimitedInterfaces) DetachInterface(ctx context.Context, id string) error {
	return l.call(ctx, "DetachInterface", 2, func() error { return l.m.DetachInterface(ctx, id) })
}

// SecurityGroups takes one token: the AWS provider caches its answer,
// but the limiter cannot know whether this call hits the cache.
func (l *LimitedInterfaces) SecurityGroups(ctx context.Context, vpc string, tags map[string]string) (out []string, err error) {
	err = l.call(ctx, "SecurityGroups", 1, func() error { out, err = l.m.SecurityGroups(ctx, vpc, tags); return err })
	return out, err
}

func (l *LimitedInterfaces) DeleteInterface(ctx context.Context, id string) error {
	return l.call(ctx, "DeleteInterface", 1, func() error { return l.m.DeleteInterface(ctx, id) })
}

func (l *LimitedInterfaces) AssignIPv6Prefix(ctx context.Context, iface string) (out netip.Prefix, err error) {
	err = l.call(ctx, "AssignIPv6Prefix", 1, func() error { out, err = l.m.AssignIPv6Prefix(ctx, iface); return err })
	return out, err
}
