// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	iputil "github.com/cilium/cilium/pkg/ip"
	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	ciliumv2alpha1 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2alpha1"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	slimv1 "github.com/cilium/cilium/pkg/k8s/slim/k8s/apis/meta/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// mpAgent plays Cilium's agent in multi-pool mode (pkg/ipam's
// multiPoolManager) as faithfully as a test needs: it asks for
// NeededIPCeil(in use, pre-allocation) addresses per pool and family in
// spec.ipam.pools.requested, hands Pods addresses only from the CIDRs the
// operator lists in spec.ipam.pools.allocated (first and last reserved
// unless the pool allows them), writes back the CIDRs it holds, leaving out
// the ones that are completely free and above its need
// (releaseExcessCIDRsMultiPool), and does not use a CIDR it left out while
// the operator still lists it, unless short of its need (then it takes it
// back, as Cilium's reclaim does). Every write carries the
// resourceVersion read. An address it uses whose CIDR leaves allocated is
// the failure the design prevents: it is recorded, and the test fails.
type mpAgent struct {
	t        testing.TB
	name     string
	client   ciliumclient.Interface
	prealloc map[string]int // pool -> pre-allocation (Cilium's --ipam-multi-pool-pre-allocation)
	families []alloc.Family

	mu sync.Mutex
	// cidrs are the usable CIDRs by pool, from the last allocated seen;
	// flags the pools' allowFirstIP/allowLastIP.
	cidrs    map[string][]netip.Prefix
	flags    map[string][2]bool
	used     map[netip.Addr]string   // address -> pool
	released map[netip.Prefix]string // left out, still listed by the operator: its pool
	lost     []string
}

func newMPAgent(t testing.TB, client ciliumclient.Interface, name string, prealloc map[string]int, families ...alloc.Family) *mpAgent {
	if len(families) == 0 {
		families = []alloc.Family{alloc.IPv4}
	}
	return &mpAgent{t: t, name: name, client: client, prealloc: prealloc, families: families,
		cidrs: map[string][]netip.Prefix{}, flags: map[string][2]bool{},
		used: map[netip.Addr]string{}, released: map[netip.Prefix]string{}}
}

// create makes the agent's CiliumNode with its first requests.
func (a *mpAgent) create(ctx context.Context) error {
	cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: a.name}}
	a.mu.Lock()
	cn.Spec.IPAM.Pools.Requested = a.requestedLocked()
	a.mu.Unlock()
	_, err := a.client.CiliumV2().CiliumNodes().Create(ctx, cn, metav1.CreateOptions{})
	return err
}

// observe takes in the CiliumNode as the operator left it.
func (a *mpAgent) observe(cn *ciliumv2.CiliumNode) {
	a.mu.Lock()
	defer a.mu.Unlock()
	listed := map[netip.Prefix]bool{}
	cidrs := map[string][]netip.Prefix{}
	for _, p := range cn.Spec.IPAM.Pools.Allocated {
		a.flags[p.Pool] = [2]bool{p.AllowFirstIP, p.AllowLastIP}
		for _, c := range p.CIDRs {
			listed[c.Prefix] = true
			if _, out := a.released[c.Prefix]; !out {
				cidrs[p.Pool] = append(cidrs[p.Pool], c.Prefix)
			}
		}
	}
	for c := range a.released {
		if !listed[c] {
			delete(a.released, c) // the operator took it back
		}
	}
	for addr, pool := range a.used {
		if !slices.ContainsFunc(cidrs[pool], func(c netip.Prefix) bool { return c.Contains(addr) }) {
			a.lost = append(a.lost, fmt.Sprintf("%s (pool %s)", addr, pool))
			delete(a.used, addr)
		}
	}
	a.cidrs = cidrs
}

// usable reports whether the agent may hand out addr of c in pool.
func (a *mpAgent) usable(pool string, c netip.Prefix, addr netip.Addr) bool {
	if c.Addr().BitLen()-c.Bits() <= 1 {
		return true
	}
	first, last := c.Masked().Addr(), alloc.AddrAt(c, alloc.BlockSize(alloc.FamilyOf(c.Addr()), c.Bits())-1)
	f := a.flags[pool]
	return (addr != first || f[0]) && (addr != last || f[1])
}

// podStart hands a Pod a free address of the pool's family; false when
// the node's CIDRs of the pool have none.
func (a *mpAgent) podStart(pool string, f alloc.Family) (netip.Addr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.cidrs[pool] {
		if alloc.FamilyOf(c.Addr()) != f {
			continue
		}
		for addr := c.Masked().Addr(); c.Contains(addr); addr = addr.Next() {
			if _, busy := a.used[addr]; !busy && a.usable(pool, c, addr) {
				a.used[addr] = pool
				return addr, true
			}
		}
	}
	return netip.Addr{}, false
}

func (a *mpAgent) podStop(addr netip.Addr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.used, addr)
}

func (a *mpAgent) inUse(pool string, f alloc.Family) int {
	n := 0
	for addr, p := range a.used {
		if p == pool && alloc.FamilyOf(addr) == f {
			n++
		}
	}
	return n
}

// requestedLocked is Cilium's computeNeededIPsPerPoolLocked.
func (a *mpAgent) requestedLocked() []ipamtypes.IPAMPoolRequest {
	pools := map[string]bool{}
	for p := range a.prealloc {
		pools[p] = true
	}
	for p := range a.cidrs {
		pools[p] = true
	}
	var out []ipamtypes.IPAMPoolRequest
	for _, p := range slices.Sorted(maps.Keys(pools)) {
		var d ipamtypes.IPAMPoolDemand
		for _, f := range a.families {
			n := int(alloc.NeededIPCeil(int64(a.inUse(p, f)), int64(a.prealloc[p])))
			if f == alloc.IPv4 {
				d.IPv4Addrs = n
			} else {
				d.IPv6Addrs = n
			}
		}
		if d.IPv4Addrs > 0 || d.IPv6Addrs > 0 {
			out = append(out, ipamtypes.IPAMPoolRequest{Pool: p, Needed: d})
		}
	}
	return out
}

// freeIn counts the usable addresses of c no Pod uses.
func (a *mpAgent) freeIn(pool string, c netip.Prefix) (free, used int) {
	for addr := c.Masked().Addr(); c.Contains(addr); addr = addr.Next() {
		if _, busy := a.used[addr]; busy {
			used++
		} else if a.usable(pool, c, addr) {
			free++
		}
	}
	return free, used
}

// releaseExcessLocked is Cilium's releaseExcessCIDRsMultiPool for one
// pool family: from the last CIDR backwards, one without a used address
// whose free addresses the need can spare is left out.
func (a *mpAgent) releaseExcessLocked(pool string, f alloc.Family, needed int) {
	var fam []netip.Prefix
	for _, c := range a.cidrs[pool] {
		if alloc.FamilyOf(c.Addr()) == f {
			fam = append(fam, c)
		}
	}
	neededFree := max(needed-a.inUse(pool, f), 0)
	total := 0
	for _, c := range fam {
		free, _ := a.freeIn(pool, c)
		total += free
	}
	// Short of the need: take back CIDRs left out that the operator
	// still lists, lowest first (Cilium's reclaim).
	if total < neededFree {
		for _, c := range slices.SortedFunc(maps.Keys(a.released), func(x, y netip.Prefix) int { return x.Addr().Compare(y.Addr()) }) {
			if total >= neededFree {
				break
			}
			if a.released[c] != pool || alloc.FamilyOf(c.Addr()) != f {
				continue
			}
			delete(a.released, c)
			a.cidrs[pool] = append(a.cidrs[pool], c)
			fam = append(fam, c)
			free, _ := a.freeIn(pool, c)
			total += free
		}
	}
	for _, c := range slices.Backward(fam) {
		free, used := a.freeIn(pool, c)
		if used == 0 && total-free >= neededFree {
			total -= free
			a.released[c] = pool
			a.cidrs[pool] = slices.DeleteFunc(a.cidrs[pool], func(x netip.Prefix) bool { return x == c })
		}
	}
}

// sync writes spec.ipam.pools as the agent does (requested, and the CIDRs
// it keeps), from a fresh read, retrying on conflicts.
func (a *mpAgent) sync(ctx context.Context) error {
	for {
		cn, err := a.client.CiliumV2().CiliumNodes().Get(ctx, a.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		a.observe(cn)
		a.mu.Lock()
		requested := a.requestedLocked()
		for _, r := range requested {
			for _, f := range a.families {
				n := r.Needed.IPv4Addrs
				if f == alloc.IPv6 {
					n = r.Needed.IPv6Addrs
				}
				a.releaseExcessLocked(r.Pool, f, n)
			}
		}
		for p := range a.cidrs { // pools no longer requested
			if !slices.ContainsFunc(requested, func(r ipamtypes.IPAMPoolRequest) bool { return r.Pool == p }) {
				for _, f := range a.families {
					a.releaseExcessLocked(p, f, 0)
				}
			}
		}
		var allocated []ipamtypes.IPAMPoolAllocation
		for _, p := range slices.Sorted(maps.Keys(a.cidrs)) {
			if len(a.cidrs[p]) == 0 {
				continue
			}
			pa := ipamtypes.IPAMPoolAllocation{Pool: p, AllowFirstIP: a.flags[p][0], AllowLastIP: a.flags[p][1]}
			for _, c := range a.cidrs[p] {
				pa.CIDRs = append(pa.CIDRs, iputil.PrefixFrom(c))
			}
			allocated = append(allocated, pa)
		}
		a.mu.Unlock()
		cn.Spec.IPAM.Pools = ipamtypes.IPAMPoolSpec{Requested: requested, Allocated: allocated}
		_, err = a.client.CiliumV2().CiliumNodes().Update(ctx, cn, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		return err
	}
}

// refresh reads the CiliumNode and takes it in.
func (a *mpAgent) refresh(ctx context.Context) *ciliumv2.CiliumNode {
	a.t.Helper()
	cn, err := a.client.CiliumV2().CiliumNodes().Get(ctx, a.name, metav1.GetOptions{})
	if err != nil {
		a.t.Fatal(err)
	}
	a.observe(cn)
	return cn
}

func (a *mpAgent) lostAddresses() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.lost)
}

// allocatedOf lists a node's allocated CIDRs of a pool.
func allocatedCIDRs(cn *ciliumv2.CiliumNode, pool string) []string {
	for _, p := range cn.Spec.IPAM.Pools.Allocated {
		if p.Pool == pool {
			return prefixStrings(p.CIDRs)
		}
	}
	return nil
}

func v6(mask int, cidr string) *alloc.PoolFamily {
	return &alloc.PoolFamily{MaskSize: mask, CIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}}
}

// A new node's requests are met with blocks of each requested pool and
// family, which the operator writes to spec.ipam.pools.allocated with the
// pool's allowFirstIP/allowLastIP; the store holds exactly those.
func TestMultiPoolNodeGetsBlocksForItsRequest(t *testing.T) {
	e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{
		"default": {IPv4: v4(27, "10.100.0.0/16"), IPv6: v6(123, "fd00:100::/112")},
		"mars":    {IPv4: v4(28, "10.101.0.0/16"), AllowFirstIP: true},
	})
	e.blockOperator(ModeMultiPool, nil)
	ag := newMPAgent(t, e.client, "mp-new", map[string]int{"default": 8, "mars": 20}, alloc.IPv4)
	if err := ag.create(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "blocks for the requests", func() (bool, string) {
		cn := e.get("mp-new")
		return len(allocatedCIDRs(cn, "default")) == 1 && len(allocatedCIDRs(cn, "mars")) == 2,
			fmt.Sprintf("allocated %+v, operator-status %q", cn.Spec.IPAM.Pools.Allocated, cn.Status.IPAM.OperatorStatus.Error)
	})
	cn := e.get("mp-new")
	// mars: 20 addresses, /28 blocks of 15 (first allowed): two.
	for _, p := range cn.Spec.IPAM.Pools.Allocated {
		if p.Pool == "mars" && (!p.AllowFirstIP || p.AllowLastIP) || p.Pool == "default" && (p.AllowFirstIP || p.AllowLastIP) {
			t.Errorf("pool %s listed with allowFirstIP %v, allowLastIP %v", p.Pool, p.AllowFirstIP, p.AllowLastIP)
		}
	}
	var all []string
	for _, p := range []string{"default", "mars"} {
		all = append(all, allocatedCIDRs(cn, p)...)
	}
	slices.SortFunc(all, comparePrefixStrings)
	if got := e.storeBlocks("mp-new"); !slices.Equal(got, all) {
		t.Errorf("allocated %v; the store holds %v", all, got)
	}
	if msg := cn.Status.IPAM.OperatorStatus.Error; msg != "" {
		t.Errorf("operator-status.error %q on a served node", msg)
	}
	// A dual-stack agent gets an IPv6 block too.
	ag6 := newMPAgent(t, e.client, "mp-dual", map[string]int{"default": 8}, alloc.IPv4, alloc.IPv6)
	if err := ag6.create(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "dual-stack blocks", func() (bool, string) {
		got := allocatedCIDRs(e.get("mp-dual"), "default")
		return len(got) == 2 && strings.HasPrefix(got[0], "10.100.") && strings.HasPrefix(got[1], "fd00:100:"),
			fmt.Sprintf("allocated %v", got)
	})
}

// The agent's Pods grow its need: blocks are added, every Pod's address
// is in a listed CIDR; when the Pods go the agent leaves the free blocks
// out, and each goes back to its pool only after the hold-off, while no
// used address ever leaves allocated.
func TestMultiPoolGrowsAndReturnsBlocksAfterHoldOff(t *testing.T) {
	const holdOff = 3 * time.Second
	e := newBlockEnv(t, holdOff, map[string]alloc.PoolSpec{"default": {IPv4: v4(27, "10.102.0.0/16")}})
	e.blockOperator(ModeMultiPool, nil)
	ag := newMPAgent(t, e.client, "mp-grow", map[string]int{"default": 8})
	if err := ag.create(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "pre-allocation", func() (bool, string) {
		got := allocatedCIDRs(ag.refresh(e.ctx), "default")
		return len(got) == 1, fmt.Sprintf("allocated %v", got)
	})
	// 40 Pods, in steps as the blocks come: need NeededIPCeil(40, 8) = 48,
	// two /27 blocks of 30.
	var pods []netip.Addr
	for len(pods) < 40 {
		if addr, ok := ag.podStart("default", alloc.IPv4); ok {
			pods = append(pods, addr)
			continue
		}
		if err := ag.sync(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.eventually(10*time.Second, "growth", func() (bool, string) {
			ag.refresh(e.ctx)
			ag.mu.Lock()
			defer ag.mu.Unlock()
			n := len(ag.cidrs["default"])
			return n*30 > len(pods), fmt.Sprintf("%d blocks for %d Pods", n, len(pods))
		})
	}
	if err := ag.sync(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "two blocks", func() (bool, string) {
		got := allocatedCIDRs(ag.refresh(e.ctx), "default")
		return len(got) == 2, fmt.Sprintf("allocated %v", got)
	})
	two := allocatedCIDRs(e.get("mp-grow"), "default")
	// The Pods go: the need is 8, one block does. The operator can record
	// the return only after the agent's write: returned is no later.
	for _, p := range pods {
		ag.podStop(p)
	}
	returned := time.Now()
	if err := ag.sync(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "one block listed", func() (bool, string) {
		got := allocatedCIDRs(ag.refresh(e.ctx), "default")
		return len(got) == 1, fmt.Sprintf("allocated %v", got)
	})
	if got := e.storeBlocks("mp-grow"); len(got) != 2 && time.Since(returned) < holdOff {
		t.Fatalf("the store holds %v within the hold-off; want both of %v", got, two)
	}
	e.eventually(holdOff+10*time.Second, "returned block released", func() (bool, string) {
		got := e.storeBlocks("mp-grow")
		return len(got) == 1, fmt.Sprintf("store holds %v", got)
	})
	if took := time.Since(returned); took < holdOff {
		t.Errorf("the returned block went back to the pool after %v; the hold-off is %v", took, holdOff)
	}
	if got, want := e.storeBlocks("mp-grow"), allocatedCIDRs(e.get("mp-grow"), "default"); !slices.Equal(got, want) {
		t.Errorf("store %v, allocated %v", got, want)
	}
	if lost := ag.lostAddresses(); len(lost) > 0 {
		t.Errorf("used addresses left allocated: %v", lost)
	}
}

// Within the hold-off, a growing need takes the returned block back
// instead of carving another.
func TestMultiPoolRetakesReturnedBlock(t *testing.T) {
	e := newBlockEnv(t, time.Hour, map[string]alloc.PoolSpec{"default": {IPv4: v4(27, "10.103.0.0/16")}})
	e.blockOperator(ModeMultiPool, nil)
	ag := newMPAgent(t, e.client, "mp-back", map[string]int{"default": 40}) // 40 asks two /27
	if err := ag.create(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "two blocks", func() (bool, string) {
		got := allocatedCIDRs(ag.refresh(e.ctx), "default")
		return len(got) == 2, fmt.Sprintf("allocated %v", got)
	})
	two := allocatedCIDRs(e.get("mp-back"), "default")
	ag.mu.Lock()
	ag.prealloc["default"] = 8
	ag.mu.Unlock()
	if err := ag.sync(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "one block listed", func() (bool, string) {
		got := allocatedCIDRs(ag.refresh(e.ctx), "default")
		return len(got) == 1, fmt.Sprintf("allocated %v", got)
	})
	if got := e.storeBlocks("mp-back"); !slices.Equal(got, two) {
		t.Fatalf("the store holds %v within the hold-off; want %v", got, two)
	}
	ag.mu.Lock()
	ag.prealloc["default"] = 40
	ag.mu.Unlock()
	if err := ag.sync(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "the returned block back", func() (bool, string) {
		got := allocatedCIDRs(ag.refresh(e.ctx), "default")
		return slices.Equal(got, two), fmt.Sprintf("allocated %v, want %v", got, two)
	})
	if got := e.storeBlocks("mp-back"); !slices.Equal(got, two) {
		t.Fatalf("the store holds %v; want %v and no new block", got, two)
	}
	// The agent uses it again: 35 Pods need both blocks, and its next
	// write keeps both.
	for i := range 35 {
		if _, ok := ag.podStart("default", alloc.IPv4); !ok {
			t.Fatalf("Pod %d: no address in %v", i, two)
		}
	}
	if err := ag.sync(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := allocatedCIDRs(ag.refresh(e.ctx), "default"); !slices.Equal(got, two) {
		t.Fatalf("after the agent's write: allocated %v, want %v", got, two)
	}
	if lost := ag.lostAddresses(); len(lost) > 0 {
		t.Errorf("used addresses left allocated: %v", lost)
	}
}

// A pool that cannot meet a need: operator-status.error in Cilium's words;
// another node's deletion gives its blocks back to the pool at once, and
// the node is served and its error cleared.
func TestMultiPoolExhaustionAndDeletedNode(t *testing.T) {
	e := newBlockEnv(t, time.Hour, map[string]alloc.PoolSpec{"default": {IPv4: v4(27, "10.104.0.0/26")}}) // two blocks
	e.blockOperator(ModeMultiPool, nil)
	a := newMPAgent(t, e.client, "mp-a", map[string]int{"default": 40})
	if err := a.create(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "mp-a takes the pool", func() (bool, string) {
		got := allocatedCIDRs(a.refresh(e.ctx), "default")
		return len(got) == 2, fmt.Sprintf("allocated %v", got)
	})
	aBlocks := allocatedCIDRs(e.get("mp-a"), "default")
	b := newMPAgent(t, e.client, "mp-b", map[string]int{"default": 8})
	if err := b.create(e.ctx); err != nil {
		t.Fatal(err)
	}
	want := `ipam-multi-pool-sync allocation failed: failed to allocate ipv4 address for node "mp-b" from pool "default": pool empty`
	e.eventually(10*time.Second, "mp-b's operator-status", func() (bool, string) {
		msg := e.get("mp-b").Status.IPAM.OperatorStatus.Error
		return strings.HasPrefix(msg, want), fmt.Sprintf("operator-status %q", msg)
	})
	e.deleteNode("mp-a")
	e.eventually(10*time.Second, "mp-a's blocks released", func() (bool, string) {
		got := e.storeBlocks("mp-a")
		return got == nil, fmt.Sprintf("store holds %v", got)
	})
	e.eventually(20*time.Second, "mp-b served, error cleared", func() (bool, string) {
		cn := e.get("mp-b")
		got := allocatedCIDRs(cn, "default")
		return len(got) == 1 && slices.Contains(aBlocks, got[0]) && cn.Status.IPAM.OperatorStatus.Error == "",
			fmt.Sprintf("allocated %v, operator-status %q", got, cn.Status.IPAM.OperatorStatus.Error)
	})
}

// A pool the store lacks: the node says so in Cilium's words. A
// CiliumPodIPPool created for it is imported as a store pool (and marked
// as exported), and the node is served from it; pools are exported as
// CiliumPodIPPools, and follow the store's changes.
func TestMultiPoolPodIPPools(t *testing.T) {
	three := 3
	e := newBlockEnv(t, time.Hour, map[string]alloc.PoolSpec{
		"default": {IPv4: v4(27, "10.105.0.0/16"), IPv6: v6(120, "fd00:105::/104"), PreAllocate: &three},
		"jupiter": {IPv4: v4(28, "10.106.0.0/24"), AllowLastIP: true, SkipMasquerade: true,
			PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "j"}}},
		"cluster": {Mode: alloc.ModeClusterPool, IPv4: v4(26, "10.107.0.0/24")},
	})
	e.blockOperator(ModeMultiPool, func(c *Config) { c.Resync = time.Second })
	pools := e.client.CiliumV2alpha1().CiliumPodIPPools()
	e.eventually(10*time.Second, "exported pools", func() (bool, string) {
		list, err := pools.List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var names []string
		for _, c := range list.Items {
			names = append(names, c.Name)
		}
		slices.Sort(names)
		return slices.Equal(names, []string{"default", "jupiter"}), fmt.Sprintf("CiliumPodIPPools %v", names)
	})
	j, err := pools.Get(e.ctx, "jupiter", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Spec.IPv4 == nil || j.Spec.IPv4.MaskSize != 28 || !slices.Equal(j.Spec.IPv4.CIDRs, []ciliumv2alpha1.PoolCIDR{"10.106.0.0/24"}) ||
		j.Spec.IPv6 != nil || !j.Spec.AllowLastIP || j.Spec.AllowFirstIP || j.Spec.PodSelector == nil ||
		j.Spec.PodSelector.MatchLabels["app"] != "j" || j.Annotations[alloc.AnnotationSkipMasquerade] != "true" ||
		j.Labels[labelManagedBy] != managedByIPAM {
		t.Errorf("jupiter exported as %+v (labels %v, annotations %v)", j.Spec, j.Labels, j.Annotations)
	}
	// The store's change reaches the CiliumPodIPPool; a user's edit of
	// an exported one is set back.
	if _, err := e.st.UpdatePool(e.ctx, alloc.DefaultSpace, "jupiter", nil, alloc.PoolSpec{
		IPv4:        &alloc.PoolFamily{MaskSize: 28, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.106.0.0/24"), netip.MustParsePrefix("10.106.1.0/24")}},
		AllowLastIP: true, SkipMasquerade: true, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "j"}}}); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "jupiter's new CIDR exported", func() (bool, string) {
		c, err := pools.Get(e.ctx, "jupiter", metav1.GetOptions{})
		return err == nil && len(c.Spec.IPv4.CIDRs) == 2, fmt.Sprintf("%+v %v", c.Spec.IPv4, err)
	})
	d, err := pools.Get(e.ctx, "default", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.Spec.PodSelector = &slimv1.LabelSelector{MatchLabels: map[string]string{"edited": "by-hand"}}
	if _, err := pools.Update(e.ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "the hand edit set back", func() (bool, string) {
		c, err := pools.Get(e.ctx, "default", metav1.GetOptions{})
		return err == nil && c.Spec.PodSelector == nil, fmt.Sprintf("podSelector %v %v", c.Spec.PodSelector, err)
	})

	// A node asks for mars, which does not exist yet.
	ag := newMPAgent(t, e.client, "mp-mars", map[string]int{"default": 3, "mars": 4})
	if err := ag.create(e.ctx); err != nil {
		t.Fatal(err)
	}
	want := `failed to allocate ipv4 address for node "mp-mars" from pool "mars": cannot allocate from non-existing pool: mars`
	e.eventually(10*time.Second, "the missing pool in operator-status", func() (bool, string) {
		cn := e.get("mp-mars")
		return strings.Contains(cn.Status.IPAM.OperatorStatus.Error, want) && len(allocatedCIDRs(cn, "default")) == 1,
			fmt.Sprintf("operator-status %q, allocated %v", cn.Status.IPAM.OperatorStatus.Error, cn.Spec.IPAM.Pools.Allocated)
	})
	mars := &ciliumv2alpha1.CiliumPodIPPool{ObjectMeta: metav1.ObjectMeta{Name: "mars"}}
	mars.Spec.IPv4 = &ciliumv2alpha1.IPv4PoolSpec{CIDRs: []ciliumv2alpha1.PoolCIDR{"10.108.0.0/16"}, MaskSize: 29}
	if _, err := pools.Create(e.ctx, mars, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(15*time.Second, "mp-mars served from the imported pool", func() (bool, string) {
		cn := e.get("mp-mars")
		got := allocatedCIDRs(cn, "mars")
		return len(got) == 1 && strings.HasPrefix(got[0], "10.108.") && cn.Status.IPAM.OperatorStatus.Error == "",
			fmt.Sprintf("mars %v, operator-status %q", got, cn.Status.IPAM.OperatorStatus.Error)
	})
	p, err := e.st.GetPool(e.ctx, alloc.DefaultSpace, "mars")
	if err != nil || p.Spec.EffectiveMode() != alloc.ModeMultiPool || p.Spec.IPv4 == nil || p.Spec.IPv4.MaskSize != 29 {
		t.Fatalf("imported pool %+v, %v", p.Spec, err)
	}
	e.eventually(10*time.Second, "mars marked as exported", func() (bool, string) {
		c, err := pools.Get(e.ctx, "mars", metav1.GetOptions{})
		return err == nil && c.Labels[labelManagedBy] == managedByIPAM, fmt.Sprintf("labels %v %v", c.Labels, err)
	})
	// A pool deleted in the store takes its CiliumPodIPPool with it.
	if _, err := e.st.DeletePool(e.ctx, alloc.DefaultSpace, "jupiter"); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "jupiter's CiliumPodIPPool deleted", func() (bool, string) {
		_, err := pools.Get(e.ctx, "jupiter", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// Many agents grow and shrink their Pods at once: no CIDR is ever listed
// on two nodes, no used address leaves its node, and at the end every
// node's allocated is what the store holds for it, and the consistency
// check is clean.
func TestMultiPoolChurn(t *testing.T) {
	e := newBlockEnv(t, time.Second, map[string]alloc.PoolSpec{"default": {IPv4: v4(28, "10.109.0.0/20")}})
	e.blockOperator(ModeMultiPool, nil)
	const nodes = 12
	agents := make([]*mpAgent, nodes)
	for i := range agents {
		agents[i] = newMPAgent(t, e.client, fmt.Sprintf("mp-churn-%02d", i), map[string]int{"default": 4})
		if err := agents[i].create(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Go(func() {
			var pods []netip.Addr
			// Waves of Pods: up to 10+i, then down to none. The sync
			// reads the node (and takes it in) before it writes.
			for step := 0; ctx.Err() == nil; step++ {
				if (step/12)%2 == 0 && len(pods) < 10+i {
					if addr, ok := a.podStart("default", alloc.IPv4); ok {
						pods = append(pods, addr)
					}
				} else if len(pods) > 0 {
					a.podStop(pods[len(pods)-1])
					pods = pods[:len(pods)-1]
				}
				if err := a.sync(e.ctx); err != nil {
					t.Errorf("%s: %v", a.name, err)
					return
				}
				time.Sleep(300 * time.Millisecond)
			}
		})
	}
	for ctx.Err() == nil {
		e.noCIDROnTwoNodes("default")
		time.Sleep(200 * time.Millisecond)
	}
	wg.Wait()
	e.noCIDROnTwoNodes("default")
	for _, a := range agents {
		if lost := a.lostAddresses(); len(lost) > 0 {
			t.Errorf("%s: used addresses left allocated: %v", a.name, lost)
		}
		e.eventually(20*time.Second, a.name+" agrees with the store", func() (bool, string) {
			if err := a.sync(e.ctx); err != nil {
				return false, err.Error()
			}
			got, want := e.storeBlocks(a.name), allocatedCIDRs(e.get(a.name), "default")
			return slices.Equal(got, want), fmt.Sprintf("store %v, allocated %v", got, want)
		})
	}
	// The waves did make blocks come and go.
	kinds := map[alloc.EventKind]int{}
	for _, a := range agents {
		events, _, err := e.st.History(e.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: a.name}, alloc.Page{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events {
			kinds[ev.Kind]++
		}
	}
	if kinds[alloc.EventBlockRelease] == 0 || kinds[alloc.EventBlockCarve] <= nodes {
		t.Errorf("block events %v: the churn neither grew nor returned blocks", kinds)
	}
	t.Logf("block events over the churn: %v", kinds)
	e.consistent()
}

// A copy of the CiliumNode older than the operator's own write of its
// blocks makes them look returned; without a hold-off they are due at
// once. The release reads the node afresh, finds them listed, and
// releases nothing; the next round takes them back.
func TestMultiPoolStaleCopyReleasesNothing(t *testing.T) {
	e := newBlockEnv(t, 0, map[string]alloc.PoolSpec{"default": {IPv4: v4(27, "10.110.0.0/16")}})
	op, err := New(Config{Mode: ModeMultiPool, Space: alloc.DefaultSpace, DefaultPool: "default", Kube: e.kc.Config(),
		LeaseNamespace: "default", Identity: "direct"}, e.st)
	if err != nil {
		t.Fatal(err)
	}
	r := &multiPoolReconciler{o: op}
	e.createNode("mp-stale", func(cn *ciliumv2.CiliumNode) {
		cn.Spec.IPAM.Pools.Requested = []ipamtypes.IPAMPoolRequest{{Pool: "default", Needed: ipamtypes.IPAMPoolDemand{IPv4Addrs: 40}}}
	})
	first := e.get("mp-stale")
	if _, err := r.reconcile(e.ctx, "mp-stale", first); err != nil {
		t.Fatal(err)
	}
	two := allocatedCIDRs(e.get("mp-stale"), "default")
	if len(two) != 2 {
		t.Fatalf("allocated %v; want two blocks", two)
	}
	// The stale copy: no blocks listed, and (as the agent might have
	// written meanwhile) nothing requested, so the operator has nothing
	// to write to it either.
	stale := first.DeepCopy()
	stale.Spec.IPAM.Pools.Requested = nil
	if _, err := r.reconcile(e.ctx, "mp-stale", stale); err != nil {
		t.Fatal(err)
	}
	if got := e.storeBlocks("mp-stale"); !slices.Equal(got, two) {
		t.Fatalf("after a round on a stale copy the store holds %v; want %v", got, two)
	}
	if _, err := r.reconcile(e.ctx, "mp-stale", e.get("mp-stale")); err != nil {
		t.Fatal(err)
	}
	if got, listed := e.storeBlocks("mp-stale"), allocatedCIDRs(e.get("mp-stale"), "default"); !slices.Equal(got, two) || !slices.Equal(listed, two) {
		t.Fatalf("after a fresh round: store %v, allocated %v; want %v", got, listed, two)
	}
	// The agent's own return (it leaves a block out) goes at once.
	cn := e.get("mp-stale")
	cn.Spec.IPAM.Pools.Allocated[0].CIDRs = cn.Spec.IPAM.Pools.Allocated[0].CIDRs[:1]
	cn.Spec.IPAM.Pools.Requested = nil
	cn, err = e.client.CiliumV2().CiliumNodes().Update(e.ctx, cn, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.reconcile(e.ctx, "mp-stale", cn); err != nil {
		t.Fatal(err)
	}
	if got := e.storeBlocks("mp-stale"); !slices.Equal(got, two[:1]) {
		t.Fatalf("after the agent's return the store holds %v; want %v", got, two[:1])
	}
}

// The operator's state is the store's: an API server killed and started
// again, then the leader stopped, and the other replica serves a new
// node and keeps the old one's blocks as they were.
func TestMultiPoolAPIServerRestartAndTakeover(t *testing.T) {
	e := newBlockEnv(t, time.Hour, map[string]alloc.PoolSpec{"default": {IPv4: v4(27, "10.111.0.0/16")}})
	tweak := func(c *Config) { c.Mode = ModeMultiPool }
	stops := map[string]func(){"op-1": e.operator("op-1", tweak), "op-2": e.operator("op-2", tweak)}
	a := newMPAgent(t, e.client, "mp-before", map[string]int{"default": 40})
	if err := a.create(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(15*time.Second, "mp-before served", func() (bool, string) {
		got := allocatedCIDRs(e.get("mp-before"), "default")
		return len(got) == 2, fmt.Sprintf("allocated %v", got)
	})
	before := allocatedCIDRs(e.get("mp-before"), "default")
	e.kc.KillAPIServer(t)
	e.kc.StartAPIServer(t)
	var leader string
	e.eventually(30*time.Second, "a leader after the restart", func() (bool, string) {
		leader = e.leader()
		return stops[leader] != nil, fmt.Sprintf("leader %q", leader)
	})
	stops[leader]()
	b := newMPAgent(t, e.client, "mp-after", map[string]int{"default": 8})
	if err := b.create(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "mp-after served by the other replica", func() (bool, string) {
		got := allocatedCIDRs(e.get("mp-after"), "default")
		return len(got) == 1 && !slices.Contains(before, got[0]), fmt.Sprintf("allocated %v (leader %q)", got, e.leader())
	})
	if got := allocatedCIDRs(e.get("mp-before"), "default"); !slices.Equal(got, before) {
		t.Errorf("mp-before's allocated went from %v to %v", before, got)
	}
	for _, n := range []string{"mp-before", "mp-after"} {
		if got, want := e.storeBlocks(n), allocatedCIDRs(e.get(n), "default"); !slices.Equal(got, want) {
			t.Errorf("%s: store %v, allocated %v", n, got, want)
		}
	}
}

// noCIDROnTwoNodes fails the test when one CIDR of pool is in two
// CiliumNodes' spec.ipam.pools.allocated.
func (e *crdEnv) noCIDROnTwoNodes(pool string) {
	e.t.Helper()
	list, err := e.client.CiliumV2().CiliumNodes().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	seen := map[string]string{}
	for _, cn := range list.Items {
		for _, c := range allocatedCIDRs(&cn, pool) {
			if other, dup := seen[c]; dup {
				e.t.Errorf("%s is listed on %s and %s", c, other, cn.Name)
			}
			seen[c] = cn.Name
		}
	}
}
