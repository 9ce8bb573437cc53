// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	iputil "github.com/cilium/cilium/pkg/ip"
	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// multiPoolSyncName prefixes the operator-status errors of multi-pool mode,
// as Cilium's operator names its node handler ("ipam-multi-pool-sync").
const multiPoolSyncName = "ipam-multi-pool-sync"

// multiPoolReconciler plays Cilium's operator for ipam.mode=multi-pool. The
// agent states what it needs per pool in spec.ipam.pools.requested (its
// neededIPCeil of its demand) and lists the blocks it holds in
// spec.ipam.pools.allocated, leaving out the ones it frees; the operator
// covers each need with blocks of the pool and writes them there. A block
// the agent left out stays the node's for --block-release-delay (taken back
// if the need grows meanwhile), then goes back to its pool. The pools are
// also CiliumPodIPPools (podippools.go), which Cilium's agent waits for.
type multiPoolReconciler struct {
	o *Operator
	// migrated and refused count this leadership's cluster-pool
	// migrations (migrate.go), for the log line after the restore.
	migrated, refused atomic.Int64
}

func (r *multiPoolReconciler) reconcile(ctx context.Context, name string, cn *ciliumv2.CiliumNode) (time.Duration, error) {
	o := r.o
	if cn == nil || !cn.DeletionTimestamp.IsZero() {
		return 0, o.releaseAgentNode(ctx, name)
	}
	if ignored(cn) {
		return 0, nil
	}
	if r.migrates(cn) {
		// Not moved yet (refused when the replica took the lead, or
		// listed since): no multi-pool round until it is.
		refused, err := r.migrate(ctx, name, cn)
		if err != nil || refused != nil {
			return retryUnserved, err
		}
		return 0, nil // the write queues the node again
	}
	report := agentPoolsOf(cn)
	st, err := o.store.SyncAgentPools(ctx, o.cfg.Space, name, report)
	if err != nil {
		return 0, fmt.Errorf("syncing the node's pools: %w", err)
	}
	desired := cn.DeepCopy()
	desired.Spec.IPAM.Pools.Allocated = allocatedOf(st, cn.Spec.IPAM.Pools.Allocated)
	desired.Status.IPAM.OperatorStatus.Error = multiPoolError(name, st.Errors)
	if err := o.write(ctx, cn, desired); err != nil {
		return 0, err
	}
	next := st.NextRelease
	if !next.IsZero() && !o.cfg.Now().Before(next) {
		// A returned block is due. cn may be older than a write of this
		// operator that gave the agent a block: only a fresh read says
		// which blocks the agent does not list.
		fresh, err := o.cilium.CiliumV2().CiliumNodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return 0, o.releaseAgentNode(ctx, name)
		} else if err != nil {
			return 0, err
		}
		var listed []netip.Prefix
		for _, cidrs := range agentPoolsOf(fresh).Allocated {
			listed = append(listed, cidrs...)
		}
		if next, err = o.store.ReleaseReturnedBlocks(ctx, o.cfg.Space, name, listed); err != nil {
			return 0, fmt.Errorf("releasing returned blocks: %w", err)
		}
	}
	var requeue time.Duration
	if !next.IsZero() {
		requeue = max(next.Sub(o.cfg.Now()), time.Millisecond)
	}
	if len(st.Errors) > 0 && (requeue == 0 || requeue > retryUnserved) {
		requeue = retryUnserved
	}
	return requeue, nil
}

// storeNodes names the store's nodes the mode serves.
func (r *multiPoolReconciler) storeNodes(ctx context.Context) ([]string, error) {
	return r.o.store.AgentNodes(ctx, r.o.cfg.Space, alloc.ModeMultiPool)
}

// agentPoolsOf reads what the agent reports in spec.ipam.pools.
func agentPoolsOf(cn *ciliumv2.CiliumNode) alloc.AgentPools {
	r := alloc.AgentPools{Allocated: map[string][]netip.Prefix{}}
	for _, a := range cn.Spec.IPAM.Pools.Allocated {
		for _, c := range a.CIDRs {
			if c.IsValid() {
				r.Allocated[a.Pool] = append(r.Allocated[a.Pool], c.Masked())
			}
		}
	}
	for _, q := range cn.Spec.IPAM.Pools.Requested {
		r.Requested = append(r.Requested, alloc.PoolRequest{Pool: q.Pool,
			IPv4: int64(max(q.Needed.IPv4Addrs, 0)), IPv6: int64(max(q.Needed.IPv6Addrs, 0))})
	}
	return r
}

// allocatedOf is spec.ipam.pools.allocated as the operator writes it: the
// blocks the store holds for the agent, by pool, each pool's CIDRs IPv4
// first and in address order. A CIDR the agent lists that the store does
// not hold for it is one the store refused to adopt (another node's, or of
// no pool: a listed CIDR is never a returned one). It stays listed, as
// Cilium's operator keeps orphaned CIDRs: removing it would pull it from
// under the agent's Pods; operator-status says why.
func allocatedOf(st alloc.AgentPoolsState, listed []ipamtypes.IPAMPoolAllocation) []ipamtypes.IPAMPoolAllocation {
	held := map[netip.Prefix]bool{}
	byPool := map[string]ipamtypes.IPAMPoolAllocation{}
	for _, p := range st.Pools {
		a := ipamtypes.IPAMPoolAllocation{Pool: p.Pool, AllowFirstIP: p.AllowFirstIP, AllowLastIP: p.AllowLastIP}
		for _, c := range p.CIDRs {
			held[c] = true
			a.CIDRs = append(a.CIDRs, iputil.PrefixFrom(c))
		}
		byPool[p.Pool] = a
	}
	for _, l := range listed {
		for _, c := range l.CIDRs {
			if !c.IsValid() || held[c.Masked()] {
				continue
			}
			held[c.Masked()] = true
			a, ok := byPool[l.Pool]
			if !ok {
				a = ipamtypes.IPAMPoolAllocation{Pool: l.Pool, AllowFirstIP: l.AllowFirstIP, AllowLastIP: l.AllowLastIP}
			}
			a.CIDRs = append(a.CIDRs, iputil.PrefixFrom(c.Masked()))
			byPool[l.Pool] = a
		}
	}
	if len(byPool) == 0 {
		return nil
	}
	out := make([]ipamtypes.IPAMPoolAllocation, 0, len(byPool))
	for _, a := range byPool {
		slices.SortFunc(a.CIDRs, func(x, y iputil.Prefix) int {
			if x.Addr().Is4() != y.Addr().Is4() {
				if x.Addr().Is4() {
					return -1
				}
				return 1
			}
			return x.Addr().Compare(y.Addr())
		})
		out = append(out, a)
	}
	slices.SortFunc(out, func(x, y ipamtypes.IPAMPoolAllocation) int { return strings.Compare(x.Pool, y.Pool) })
	return out
}

// multiPoolError is operator-status.error for what the store could not do,
// in the words of Cilium's multi-pool operator ("" when everything was).
func multiPoolError(node string, errs []*alloc.Error) string {
	if len(errs) == 0 {
		return ""
	}
	lines := make([]string, 0, len(errs))
	for _, e := range errs {
		switch {
		case e.Field == "cidr" && e.Kind == alloc.KindNotFound:
			lines = append(lines, e.Detail)
		case e.Field == "cidr":
			lines = append(lines, fmt.Sprintf("unable to reuse from pool %s: %s", e.Pool, e.Detail))
		default:
			lines = append(lines, fmt.Sprintf("failed to allocate %s address for node %q from pool %q: %s", e.Family, node, e.Pool, e.Detail))
		}
	}
	return multiPoolSyncName + " allocation failed: " + strings.Join(lines, "\n")
}
