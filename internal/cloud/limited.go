package cloud

import (
	"context"
	"net/netip"

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
	p       Provider
	limiter *rate.Limiter
}

// LimitedInterfaces is an InterfaceManager behind a bucket, as Limited.
type LimitedInterfaces struct {
	m       InterfaceManager
	limiter *rate.Limiter
}

var (
	_ Provider         = (*Limited)(nil)
	_ InterfaceManager = (*LimitedInterfaces)(nil)
)

// LimitedInventory is an Inventory behind a bucket, as Limited: two
// tokens a listing, one for the instances and one for their interfaces
// (further pages are rare: a thousand instances, or interfaces, a page).
type LimitedInventory struct {
	inv     Inventory
	limiter *rate.Limiter
}

var _ Inventory = (*LimitedInventory)(nil)

// NewLimitedInventory answers inv behind limiter (share it with the
// provider's Limited).
func NewLimitedInventory(inv Inventory, limiter *rate.Limiter) *LimitedInventory {
	return &LimitedInventory{inv: inv, limiter: limiter}
}

func (l *LimitedInventory) Instances(ctx context.Context, vpc string) (map[string]Instance, error) {
	if err := l.limiter.WaitN(ctx, 2); err != nil {
		return nil, err
	}
	return l.inv.Instances(ctx, vpc)
}

// NewLimited answers p behind limiter.
func NewLimited(p Provider, limiter *rate.Limiter) *Limited {
	return &Limited{p: p, limiter: limiter}
}

// NewLimitedInterfaces answers m behind limiter (share it with the
// provider's Limited).
func NewLimitedInterfaces(m InterfaceManager, limiter *rate.Limiter) *LimitedInterfaces {
	return &LimitedInterfaces{m: m, limiter: limiter}
}

func (l *Limited) Instance(ctx context.Context, id string) (Instance, error) {
	if err := l.limiter.Wait(ctx); err != nil {
		return Instance{}, err
	}
	return l.p.Instance(ctx, id)
}

func (l *Limited) Assign(ctx context.Context, iface string, n int, prefixes bool) (Assigned, error) {
	if err := l.limiter.Wait(ctx); err != nil {
		return Assigned{}, err
	}
	return l.p.Assign(ctx, iface, n, prefixes)
}

func (l *Limited) Unassign(ctx context.Context, iface string, addrs []netip.Addr, prefixes []netip.Prefix) error {
	if err := l.limiter.Wait(ctx); err != nil {
		return err
	}
	return l.p.Unassign(ctx, iface, addrs, prefixes)
}

func (l *LimitedInterfaces) Subnets(ctx context.Context, vpc, zone string) ([]Subnet, error) {
	if err := l.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	return l.m.Subnets(ctx, vpc, zone)
}

// CreateInterface takes the tokens of the calls it makes at least (a
// description, the create, the attach, the attribute change) before it
// starts, so a create never stops halfway for the bucket.
func (l *LimitedInterfaces) CreateInterface(ctx context.Context, spec InterfaceSpec) (Interface, error) {
	if err := l.limiter.WaitN(ctx, min(createCalls, l.limiter.Burst())); err != nil {
		return Interface{}, err
	}
	return l.m.CreateInterface(ctx, spec)
}

// createCalls is the least number of API calls of a CreateInterface.
const createCalls = 4

func (l *LimitedInterfaces) Detached(ctx context.Context, tags map[string]string) ([]Interface, error) {
	if err := l.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	return l.m.Detached(ctx, tags)
}

// DetachInterface takes the tokens of its two calls (a description and
// the detach).
func (l *LimitedInterfaces) DetachInterface(ctx context.Context, id string) error {
	if err := l.limiter.WaitN(ctx, min(2, l.limiter.Burst())); err != nil {
		return err
	}
	return l.m.DetachInterface(ctx, id)
}

// SecurityGroups takes one token: the AWS provider caches its answer,
// but the limiter cannot know whether this call hits the cache.
func (l *LimitedInterfaces) SecurityGroups(ctx context.Context, vpc string, tags map[string]string) ([]string, error) {
	if err := l.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	return l.m.SecurityGroups(ctx, vpc, tags)
}

func (l *LimitedInterfaces) DeleteInterface(ctx context.Context, id string) error {
	if err := l.limiter.Wait(ctx); err != nil {
		return err
	}
	return l.m.DeleteInterface(ctx, id)
}

func (l *LimitedInterfaces) AssignIPv6Prefix(ctx context.Context, iface string) (netip.Prefix, error) {
	if err := l.limiter.Wait(ctx); err != nil {
		return netip.Prefix{}, err
	}
	return l.m.AssignIPv6Prefix(ctx, iface)
}
