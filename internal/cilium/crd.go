// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The states of Cilium's excess-address release handshake
// (status.ipam.release-ips), as pkg/ipam/option names them.
const (
	releaseMarked       ipamtypes.IPReleaseStatus = "marked-for-release" // operator: this one may go
	releaseReady        ipamtypes.IPReleaseStatus = "ready-for-release"  // agent: not in use, won't hand it out
	releaseDoNotRelease ipamtypes.IPReleaseStatus = "do-not-release"     // agent: in use, keep it
	releaseReleased     ipamtypes.IPReleaseStatus = "released"           // operator: gone from the pool
)

// ErrAllocatorFull is the operator-status error of a node the pool cannot
// serve, in Cilium's words.
const ErrAllocatorFull = "allocator full"

// nodeStates is the operator's memory of each node between rounds: since
// when each excess address has been excess, per node and family. It is
// lost with the leadership, which only restarts the release delays, as in
// Cilium.
type nodeStates struct {
	mu    sync.Mutex
	nodes map[nodeFamily]map[netip.Addr]time.Time
	// noFamily: when the node's pool was last found without the family.
	noFamily map[nodeFamily]time.Time
	// refused: why the restore on taking the lead refused addresses the
	// node listed, for its operator-status.
	refused map[string]string
}

type nodeFamily struct {
	node string
	f    alloc.Family
}

func newNodeStates() *nodeStates {
	return &nodeStates{nodes: map[nodeFamily]map[netip.Addr]time.Time{}, noFamily: map[nodeFamily]time.Time{},
		refused: map[string]string{}}
}

// excessSince keeps exactly the node family's addresses of excess
// (setting now for new ones) and answers their first-seen times.
func (s *nodeStates) excessSince(node string, f alloc.Family, excess []netip.Addr, now time.Time) map[netip.Addr]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := nodeFamily{node, f}
	old := s.nodes[key]
	cur := make(map[netip.Addr]time.Time, len(excess))
	for _, a := range excess {
		if t, ok := old[a]; ok {
			cur[a] = t
		} else {
			cur[a] = now
		}
	}
	if len(cur) == 0 {
		delete(s.nodes, key)
	} else {
		s.nodes[key] = cur
	}
	return maps.Clone(cur)
}

// lacksFamily says whether the node's pool was found without family f
// less than period ago.
func (s *nodeStates) lacksFamily(node string, f alloc.Family, now time.Time, period time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.noFamily[nodeFamily{node, f}]
	return ok && now.Sub(at) < period
}

// setLacksFamily records that the node's pool has no family f, as of now.
func (s *nodeStates) setLacksFamily(node string, f alloc.Family, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noFamily[nodeFamily{node, f}] = now
}

// setRefused records why the restore refused addresses the node listed.
func (s *nodeStates) setRefused(node, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refused[node] = msg
}

// refusedAtRestore is why the restore refused addresses the node listed,
// "" when it refused none.
func (s *nodeStates) refusedAtRestore(node string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused[node]
}

// restart starts an address's delay over (the agent said do-not-release).
func (s *nodeStates) restart(node string, a netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.nodes[nodeFamily{node, alloc.FamilyOf(a)}], a)
}

// forget drops a deleted node.
func (s *nodeStates) forget(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.refused, node)
	for _, f := range []alloc.Family{alloc.IPv4, alloc.IPv6} {
		delete(s.nodes, nodeFamily{node, f})
		delete(s.noFamily, nodeFamily{node, f})
	}
}

// crdReconciler plays Cilium's operator for ipam.mode=crd: the node's
// spec.ipam.pool (and ipv6-pool) holds exactly the addresses the store
// holds for it, sized by Cilium's watermark formulas, and excess ones
// leave only through the release handshake.
type crdReconciler struct{ o *Operator }

// crdFamily is one family's view of a CiliumNode.
type crdFamily struct {
	f       alloc.Family
	pool    ipamtypes.AllocationMap
	used    ipamtypes.AllocationMap
	release map[string]ipamtypes.IPReleaseStatus
	// multiPool: the agent allocates with Cilium's multi-pool allocator
	// (multiPoolAgent). It then reports no used addresses: kept is what
	// it lists in spec.ipam.pools.allocated (in use and spare) and
	// requested its demand (in use plus pre-allocate).
	multiPool bool
	kept      ipamtypes.AllocationMap
	requested int
	// releaseExcess: the node gives excess addresses back (excessReleased).
	releaseExcess bool
}

// crdFamilies splits the node's maps by family. Cilium's agent in crd mode
// (v1.20.2 pkg/ipam/crd.go) keeps both families in one map each: it
// counts IPv4 and IPv6 keys of spec.ipam.pool, reports both in
// status.ipam.used and answers both in status.ipam.release-ips; the
// ipv6-pool, ipv6-used and release-ipv6s fields of the type are not read
// by it, so the operator leaves them alone.
//
// An agent in ipam.mode=eni (v1.20) leaves status.ipam.used empty, writes
// its demand to spec.ipam.pools.requested and lists what it keeps, used
// and spare alike, in spec.ipam.pools.allocated: no address is known to
// be a Pod's then, and the use is a count (Watermarks.UsedFromRequested).
func crdFamilies(cn *ciliumv2.CiliumNode) []crdFamily {
	fams := []crdFamily{
		{f: alloc.IPv4, pool: ofFamily(cn.Spec.IPAM.Pool, alloc.IPv4), used: ofFamily(cn.Status.IPAM.Used, alloc.IPv4), release: ofFamily(cn.Status.IPAM.ReleaseIPs, alloc.IPv4)},
		{f: alloc.IPv6, pool: ofFamily(cn.Spec.IPAM.Pool, alloc.IPv6), used: ofFamily(cn.Status.IPAM.Used, alloc.IPv6), release: ofFamily(cn.Status.IPAM.ReleaseIPs, alloc.IPv6)},
	}
	if !multiPoolAgent(cn) {
		return fams
	}
	kept := ipamtypes.AllocationMap{}
	for _, a := range allocatedUse(cn.Spec.IPAM.Pools) {
		kept[a.String()] = ipamtypes.AllocationIP{}
	}
	req4, req6 := agentDemand(cn)
	for i := range fams {
		fams[i].multiPool = true
		fams[i].kept = ofFamily(kept, fams[i].f)
		fams[i].requested = req4
		if fams[i].f == alloc.IPv6 {
			fams[i].requested = req6
		}
	}
	return fams
}

// agentDemand is a multi-pool agent's demand for the default pool, per
// family (Cilium's poolRequestedIPs).
func agentDemand(cn *ciliumv2.CiliumNode) (v4, v6 int) {
	for _, r := range cn.Spec.IPAM.Pools.Requested {
		if r.Pool == defaultAgentPool {
			return r.Needed.IPv4Addrs, r.Needed.IPv6Addrs
		}
	}
	return 0, 0
}

// multiPoolAgent: the node's agent allocates with Cilium's multi-pool
// allocator (ipam.mode=eni since v1.20), as Cilium's operator tells it
// (nodemanager isMultiPoolNodeLocked): it asks for the default pool in
// spec.ipam.pools.requested and leaves status.ipam.used empty. Such an
// agent answers no release handshake: it releases an address by leaving
// it out of spec.ipam.pools.allocated, and the operator gives it back
// once it stayed out for the release delay.
func multiPoolAgent(cn *ciliumv2.CiliumNode) bool {
	if len(cn.Status.IPAM.Used) > 0 {
		return false
	}
	for _, r := range cn.Spec.IPAM.Pools.Requested {
		if r.Pool == defaultAgentPool {
			return true
		}
	}
	return false
}

// defaultAgentPool is the pool a Cilium agent in ipam.mode=eni asks for
// (defaults.IPAMDefaultIPPool).
const defaultAgentPool = "default"

// ofFamily keeps the entries of m keyed by an address of family f; a key
// that is no address goes to IPv4's share, where it is reported and
// dropped.
func ofFamily[M ~map[string]V, V any](m M, f alloc.Family) M {
	out := M{}
	for k, v := range m {
		fk := alloc.IPv4
		if a, err := netip.ParseAddr(k); err == nil {
			fk = alloc.FamilyOf(a)
		}
		if fk == f {
			out[k] = v
		}
	}
	return out
}

func (r *crdReconciler) reconcile(ctx context.Context, name string, cn *ciliumv2.CiliumNode) (time.Duration, error) {
	o := r.o
	if cn == nil || !cn.DeletionTimestamp.IsZero() {
		if o.liveAgent(name) {
			return 0, nil
		}
		n, err := o.store.ReleaseAllNodeAddresses(ctx, o.cfg.Space, name)
		if err != nil {
			return 0, err
		}
		o.stateOf().forget(name)
		o.needs.Delete(name)
		if n > 0 {
			o.log.Info("CiliumNode deleted: its addresses cool down and go back to their pools", "node", name, "addresses", n)
		}
		return 0, nil
	}
	if ignored(cn) {
		return 0, nil
	}
	now := o.cfg.Now()
	w := watermarks(cn)
	cloud, err := o.cloudOf(ctx, name, cn)
	if err != nil {
		return 0, err
	}
	seed, seeded := preAllocateSeed(cloud.provider, cn, cloud.reading.Limits)
	if seeded {
		w.PreAllocate = seed
	}

	// 1. What Pods use, as the agent last reported it.
	used := map[netip.Addr]alloc.Owner{}
	fams := crdFamilies(cn)
	for i := range fams {
		fams[i].releaseExcess = o.excessReleased(cloud.provider)
	}
	for _, fam := range fams {
		if fam.multiPool {
			for _, a := range countedUse(fam.kept, w.UsedFromRequested(fam.requested)) {
				used[a] = eniPodOwner
			}
			continue
		}
		for ip, a := range fam.used {
			addr, err := netip.ParseAddr(ip)
			if err != nil || alloc.FamilyOf(addr) != fam.f {
				o.log.Warn("CiliumNode reports a used address that is none", "node", name, "address", ip)
				continue
			}
			used[addr] = alloc.CiliumOwner(a.Owner)
		}
	}
	change, err := o.store.SyncNodeUse(ctx, o.cfg.Space, name, used)
	if err != nil {
		return 0, fmt.Errorf("recording the node's used addresses: %w", err)
	}
	if len(change.Unknown) > 0 {
		o.log.Warn("the agent uses addresses the node does not hold", "node", name, "addresses", change.Unknown)
	}
	held, err := o.store.NodeAddresses(ctx, o.cfg.Space, name)
	if err != nil {
		return 0, err
	}

	desired := cn.DeepCopy()
	if seeded {
		desired.Spec.IPAM.PreAllocate = seed
	}
	var opErrs []string
	var requeue time.Duration
	var need int64
	var pool ipamtypes.AllocationMap
	var release map[string]ipamtypes.IPReleaseStatus
	for _, fam := range fams {
		st := r.family(ctx, name, cn, fam, w, held, now, &opErrs)
		if st.err != nil {
			return 0, st.err
		}
		need += int64(st.needed)
		if st.requeue > 0 && (requeue == 0 || st.requeue < requeue) {
			requeue = st.requeue
		}
		pool, release = mergeInto(pool, st.pool), mergeInto(release, st.release)
	}
	desired.Spec.IPAM.Pool, desired.Status.IPAM.ReleaseIPs = pool, release
	if err := o.cloudRound(ctx, name, cn, desired, cloud, withKept(used, fams)); err != nil {
		return 0, err
	}
	o.needs.Store(name, need)
	desired.Status.IPAM.OperatorStatus.Error = strings.Join(opErrs, "; ")
	if msg := o.stateOf().refusedAtRestore(name); msg != "" {
		// Not among opErrs: nothing comes of looking again soon.
		desired.Status.IPAM.OperatorStatus.Error = strings.Join(append([]string{msg}, opErrs...), "; ")
	}
	if len(opErrs) > 0 && (requeue == 0 || requeue > retryUnserved) {
		// Addresses come back as other nodes release theirs and their
		// blocks return: look again soon rather than at the next resync.
		requeue = retryUnserved
	}
	return requeue, o.write(ctx, cn, desired)
}

// familyResult is what one family's round decided.
type familyResult struct {
	pool    ipamtypes.AllocationMap
	release map[string]ipamtypes.IPReleaseStatus
	requeue time.Duration
	// needed is what the node still lacks after the round (0 when the
	// pool could serve it).
	needed int
	err    error
}

// family runs one round for one family: grow the pool to the watermark,
// find the excess, and move the release handshake one step.
func (r *crdReconciler) family(ctx context.Context, name string, cn *ciliumv2.CiliumNode, fam crdFamily, w alloc.Watermarks,
	all []alloc.HeldAddress, now time.Time, opErrs *[]string) familyResult {
	o := r.o
	held := map[netip.Addr]alloc.HeldAddress{}
	for _, a := range all {
		if a.Family == fam.f {
			held[a.Addr] = a
		}
	}
	usedN := len(fam.used)
	if fam.multiPool {
		usedN = w.UsedFromRequested(fam.requested)
	}

	// Grow. IPv6 is asked for only of a pool that has it: the store
	// answers nothing (and no error) for a family the pool lacks.
	needed := w.Needed(len(held), usedN)
	// A family the node's pool lacks is asked for again only once a
	// resync period: every status write of the agent starts a round, and
	// most pools have one family.
	unserved := len(held) == 0 && o.stateOf().lacksFamily(name, fam.f, now, o.cfg.Resync)
	if needed > 0 && unserved {
		needed = 0
	}
	if needed > 0 {
		// The surge: Pods waiting on the node beyond the need. Cilium's
		// operator counts it into IPv4 rounds only (nodemanager/node.go).
		pending := 0
		if fam.f == alloc.IPv4 {
			pending = o.pendingPods(name)
		}
		n := w.ToAllocate(len(held), usedN, pending)
		added, err := o.store.ReserveNodeAddresses(ctx, o.cfg.Space, name, o.nodeLabels(name, cn), o.cfg.DefaultPool, fam.f, n)
		for _, a := range added {
			held[a.Addr] = a
		}
		var ae *alloc.Error
		switch {
		case errors.As(err, &ae) && (ae.Kind == alloc.KindPoolExhausted || ae.Kind == alloc.KindNodeBlockLimit):
			if w.Needed(len(held), usedN) > 0 {
				msg := ae.Detail
				if !strings.Contains(msg, ErrAllocatorFull) {
					msg = ErrAllocatorFull + ": " + msg
				}
				*opErrs = append(*opErrs, msg)
			}
		case err != nil:
			return familyResult{err: fmt.Errorf("reserving %s addresses: %w", fam.f, err)}
		}
		if len(added) == 0 && err == nil && len(held) == 0 {
			o.stateOf().setLacksFamily(name, fam.f, now)
		}
		needed = w.Needed(len(held), usedN)
		if len(added) == 0 && err == nil {
			// The node's pool has no such family: nothing is lacking.
			needed = 0
		}
	}

	// Excess: reserved, unused, not cooling addresses beyond the
	// watermark, the ones already in a handshake first.
	var excess []netip.Addr
	switch {
	case !fam.releaseExcess:
		// Kept, as Cilium's operator keeps them (excessReleased).
	case fam.multiPool:
		// Cilium's operator gives back what a multi-pool agent leaves out
		// of spec.ipam.pools.allocated once it stayed out for the delay,
		// whatever the count (trackMultiPoolAllocatedLocked,
		// handleMultiPoolCIDRRelease): the agent decides its spare.
		for _, a := range held {
			if a.Releasable(now) && !inMap(fam.kept, a.Addr) && !pinned(fam.pool, a.Addr) {
				excess = append(excess, a.Addr)
			}
		}
		slices.SortFunc(excess, netip.Addr.Compare)
	case needed == 0:
		if n := w.Excess(len(held), usedN); n > 0 {
			var cands []alloc.HeldAddress
			for _, a := range held {
				if a.Releasable(now) && !inMap(fam.used, a.Addr) && !pinned(fam.pool, a.Addr) {
					cands = append(cands, a)
				}
			}
			slices.SortFunc(cands, func(x, y alloc.HeldAddress) int {
				_, hx := fam.release[x.Addr.String()]
				_, hy := fam.release[y.Addr.String()]
				if hx != hy {
					if hx {
						return -1
					}
					return 1
				}
				return x.Addr.Compare(y.Addr)
			})
			for _, a := range cands[:min(n, len(cands))] {
				excess = append(excess, a.Addr)
			}
		}
	}
	since := o.stateOf().excessSince(name, fam.f, excess, now)

	// The handshake, one step.
	release := map[string]ipamtypes.IPReleaseStatus{}
	var toRelease []netip.Addr
	for ip, st := range fam.release {
		addr, err := netip.ParseAddr(ip)
		if err != nil {
			continue // not ours to keep: a malformed entry goes
		}
		_, isHeld := held[addr]
		_, isExcess := since[addr]
		switch st {
		case releaseReleased:
			// The agent drops it once the address left the pool; an
			// address back in the pool ends it.
			if !isHeld {
				release[ip] = st
			}
		case releaseDoNotRelease:
			o.stateOf().restart(name, addr)
		case releaseReady:
			switch {
			case !isHeld && !inMap(fam.used, addr):
				release[ip] = releaseReleased // released in an earlier round
			case isExcess && !inMap(fam.used, addr):
				toRelease = append(toRelease, addr)
			}
			// otherwise needed again: aborted by leaving it out
		case releaseMarked:
			if isExcess {
				release[ip] = st
			}
		}
	}
	var requeue time.Duration
	multiPool := multiPoolAgent(cn)
	for _, a := range excess {
		if _, busy := fam.release[a.String()]; busy && !multiPool {
			continue
		}
		if wait := since[a].Add(o.cfg.ExcessIPReleaseDelay).Sub(now); wait > 0 {
			if requeue == 0 || wait < requeue {
				requeue = wait
			}
			continue
		}
		if multiPool {
			// Out of spec.ipam.pools.allocated for the whole delay: the
			// agent released it, as Cilium's operator takes it.
			toRelease = append(toRelease, a)
			continue
		}
		release[a.String()] = releaseMarked
	}
	if len(toRelease) > 0 {
		slices.SortFunc(toRelease, netip.Addr.Compare)
		if _, err := o.store.ReleaseNodeAddresses(ctx, o.cfg.Space, name, toRelease); err != nil {
			// Nothing was released; abort these handshakes (an address
			// taken into use since is the likely cause) and let the next
			// round start over.
			o.log.Warn("releasing excess addresses", "node", name, "addresses", toRelease, "err", err)
		} else {
			for _, a := range toRelease {
				delete(held, a)
				release[a.String()] = releaseReleased
			}
			o.log.Info("released excess addresses", "node", name, "addresses", toRelease)
		}
	}

	// The pool is what the store holds. An address the agent uses stays
	// even when the store does not know it (written by someone before
	// this operator): removing it would pull it from under a Pod. An
	// entry's owner stays as written: Cilium's crd-mode agent hands an
	// address pinned to "namespace/pod" to that Pod only
	// (pkg/ipam/crd.go, allocateNext).
	pool := make(ipamtypes.AllocationMap, len(held))
	for addr, a := range held {
		pool[addr.String()] = ipamtypes.AllocationIP{Owner: fam.pool[addr.String()].Owner, Resource: a.Pool + "/" + a.Block.String()}
	}
	for ip, a := range fam.pool {
		if _, ok := pool[ip]; !ok && (inMapString(fam.used, ip) || inMapString(fam.kept, ip)) {
			pool[ip] = a
		}
	}
	if len(pool) == 0 {
		pool = nil
	}
	if len(release) == 0 || multiPool {
		// A multi-pool agent reads no release-ips.
		release = nil
	}
	return familyResult{pool: pool, release: release, requeue: requeue, needed: needed}
}

// mergeInto adds src's entries to dst, making dst when needed; nil stays
// nil while both are empty (an empty map is written as none).
func mergeInto[M ~map[string]V, V any](dst, src M) M {
	if len(src) == 0 {
		return dst
	}
	if dst == nil {
		dst = M{}
	}
	maps.Copy(dst, src)
	return dst
}

// watermarks are the node's sizing knobs from its spec.
func watermarks(cn *ciliumv2.CiliumNode) alloc.Watermarks {
	s := cn.Spec.IPAM
	return alloc.Watermarks{PreAllocate: s.PreAllocate, MinAllocate: s.MinAllocate, MaxAllocate: s.MaxAllocate, MaxAboveWatermark: s.MaxAboveWatermark}
}

func inMap(m ipamtypes.AllocationMap, a netip.Addr) bool { return inMapString(m, a.String()) }

func inMapString(m ipamtypes.AllocationMap, ip string) bool {
	_, ok := m[ip]
	return ok
}

// pinned says whether the pool entry of addr names an owner: the agent
// keeps such an address for that Pod alone, so it is never excess.
func pinned(pool ipamtypes.AllocationMap, addr netip.Addr) bool {
	return pool[addr.String()].Owner != ""
}

// withKept is used plus what a multi-pool agent keeps: addresses no
// reading may pull from the node's pool. For other agents it is used.
func withKept(used map[netip.Addr]alloc.Owner, fams []crdFamily) map[netip.Addr]alloc.Owner {
	if !slices.ContainsFunc(fams, func(f crdFamily) bool { return len(f.kept) > 0 }) {
		return used
	}
	out := maps.Clone(used)
	for _, fam := range fams {
		for ip := range fam.kept {
			if a, err := netip.ParseAddr(ip); err == nil {
				if _, ok := out[a]; !ok {
					out[a] = alloc.Owner{}
				}
			}
		}
	}
	return out
}

// eniPodOwner holds the addresses counted as used on a node whose agent
// runs Cilium's multi-pool allocator (countedUse).
var eniPodOwner = alloc.CiliumOwner("eni-pod")

// countedUse picks n of the addresses a multi-pool agent keeps (the
// lowest) to record as used. Such an agent says how many addresses its
// Pods use (its demand less the pre-allocation) but not which: the store
// records that many as in use by eniPodOwner and the others as the
// node's reserve, so that the count of used addresses (ipam_used_ips,
// the cloud workers' sizing) is the agent's and its spare addresses are
// no Pod's leases.
func countedUse(kept ipamtypes.AllocationMap, n int) []netip.Addr {
	var addrs []netip.Addr
	for ip := range kept {
		if a, err := netip.ParseAddr(ip); err == nil {
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return addrs[:min(n, len(addrs))]
}
