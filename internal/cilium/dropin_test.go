// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Where this operator is to behave as Cilium's v1.20.2 operator and did
// not, read side by side with Cilium's source: one test per divergence.

package cilium

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	iputil "github.com/cilium/cilium/pkg/ip"
	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// takeoverCluster is a cluster whose CiliumNodes another operator served:
// 25 of the 50 nodes (every other one, by name) list a /24 it gave them,
// spread over the pool so that a lowest-first carve meets them, the other
// 25 are new; and two more nodes list the same /24 (a collision: a
// database restored from an older backup, or two operators at once).
type takeoverCluster struct {
	listed    map[string]netip.Prefix // node -> the CIDR it lists
	fresh     []string                // nodes that list nothing
	colliding []string                // nodes that list the same CIDR
	collided  netip.Prefix
}

func newTakeoverCluster() takeoverCluster {
	c := takeoverCluster{listed: map[string]netip.Prefix{}, colliding: []string{"dup-a", "dup-b"},
		collided: netip.MustParsePrefix("10.70.200.0/24")}
	for i := range 50 {
		name := fmt.Sprintf("node-%02d", i)
		if i%2 == 0 {
			c.listed[name] = netip.MustParsePrefix(fmt.Sprintf("10.70.%d.0/24", i/2*3))
		} else {
			c.fresh = append(c.fresh, name)
		}
	}
	return c
}

// TestTakeoverRestoresBeforeAllocating migrates a cluster from another
// operator in cluster-pool and multi-pool modes: every listed CIDR is
// occupied by its node before any is carved for a new one (as Cilium's
// allocators restore every node first), so no CIDR is in two nodes, no
// node is renumbered, every listed CIDR is the store's block of the node
// that lists it (and in its history); the colliding pair is reported in
// operator-status and neither gets a second CIDR.
func TestTakeoverRestoresBeforeAllocating(t *testing.T) {
	pool := alloc.PoolSpec{IPv4: v4(24, "10.70.0.0/16")}
	for _, mode := range []Mode{ModeClusterPool, ModeMultiPool} {
		t.Run(string(mode), func(t *testing.T) {
			spec := pool
			if mode == ModeClusterPool {
				spec.Mode = alloc.ModeClusterPool
			}
			e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{"default": spec})
			c := newTakeoverCluster()
			list := func(cn *ciliumv2.CiliumNode, cidr netip.Prefix) {
				if mode == ModeClusterPool {
					cn.Spec.IPAM.PodCIDRs = []iputil.Prefix{iputil.PrefixFrom(cidr)}
					return
				}
				cn.Spec.IPAM.Pools.Allocated = []ipamtypes.IPAMPoolAllocation{{Pool: "default", CIDRs: []iputil.Prefix{iputil.PrefixFrom(cidr)}}}
			}
			request := func(cn *ciliumv2.CiliumNode) {
				if mode == ModeMultiPool {
					cn.Spec.IPAM.Pools.Requested = []ipamtypes.IPAMPoolRequest{{Pool: "default", Needed: ipamtypes.IPAMPoolDemand{IPv4Addrs: 16}}}
				}
			}
			// The other operator's cluster, created before this operator
			// starts, in name order (new and served nodes interleaved).
			names := slices.Sorted(func(yield func(string) bool) {
				for n := range c.listed {
					yield(n)
				}
				for _, n := range c.fresh {
					yield(n)
				}
			})
			for _, name := range names {
				e.createNode(name, func(cn *ciliumv2.CiliumNode) {
					if cidr, ok := c.listed[name]; ok {
						list(cn, cidr)
					}
					request(cn)
				})
			}
			for _, name := range c.colliding {
				e.createNode(name, func(cn *ciliumv2.CiliumNode) { list(cn, c.collided); request(cn) })
			}
			e.blockOperator(mode, nil)

			cidrsOf := func(cn *ciliumv2.CiliumNode) []string {
				if mode == ModeClusterPool {
					return prefixStrings(cn.Spec.IPAM.PodCIDRs)
				}
				return allocatedCIDRs(cn, "default")
			}
			e.eventually(60*time.Second, "every node served", func() (bool, string) {
				l, err := e.client.CiliumV2().CiliumNodes().List(e.ctx, metav1.ListOptions{})
				if err != nil {
					return false, err.Error()
				}
				for _, cn := range l.Items {
					if len(cidrsOf(&cn)) == 0 {
						return false, cn.Name + " has no CIDR"
					}
				}
				return true, ""
			})
			// Let the operator go on a little: a wrong carve would show.
			time.Sleep(2 * time.Second)

			l, err := e.client.CiliumV2().CiliumNodes().List(e.ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			holders := map[string][]string{}
			for _, cn := range l.Items {
				got := cidrsOf(&cn)
				for _, cidr := range got {
					holders[cidr] = append(holders[cidr], cn.Name)
				}
				if want, ok := c.listed[cn.Name]; ok && !slices.Equal(got, []string{want.String()}) {
					t.Errorf("%s listed %s and now lists %v: renumbered", cn.Name, want, got)
				}
				// Nothing is pulled from under the colliding pair's agents.
				// In cluster-pool mode the refused one gets no other block
				// either (its one block per family is the listed one); in
				// multi-pool mode it gets blocks for its need, as Cilium's
				// allocator allocates past a CIDR it could not occupy.
				if slices.Contains(c.colliding, cn.Name) && (!slices.Contains(got, c.collided.String()) ||
					(mode == ModeClusterPool && len(got) != 1)) {
					t.Errorf("%s of the colliding pair now lists %v; want %s kept", cn.Name, got, c.collided)
				}
			}
			duplicates := 0
			for cidr, nodes := range holders {
				if len(nodes) > 1 && cidr != c.collided.String() {
					duplicates++
					t.Errorf("%s is in %v", cidr, nodes)
				}
			}
			// Every listed CIDR is the store's block of the node that lists
			// it, and in that node's history.
			for name, cidr := range c.listed {
				if got := e.storeBlocks(name); !slices.Contains(got, cidr.String()) {
					t.Errorf("the store holds %v for %s, which lists %s", got, name, cidr)
				}
				events, _, err := e.st.History(e.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: name}, alloc.Page{Limit: 100})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.ContainsFunc(events, func(ev alloc.Event) bool { return ev.Block == cidr }) {
					t.Errorf("%s's history has no event of its block %s: %+v", name, cidr, events)
				}
			}
			// The collision: one of the pair holds the CIDR in the store,
			// the other is told why it holds nothing.
			var holder, refused []string
			for _, name := range c.colliding {
				if slices.Contains(e.storeBlocks(name), c.collided.String()) {
					holder = append(holder, name)
				} else {
					refused = append(refused, name)
				}
			}
			if len(holder) != 1 || len(refused) != 1 {
				t.Fatalf("the colliding pair: %v hold %s, %v do not; want one each", holder, c.collided, refused)
			}
			e.eventually(10*time.Second, "the collision reported", func() (bool, string) {
				msg := e.get(refused[0]).Status.IPAM.OperatorStatus.Error
				return strings.Contains(msg, c.collided.String()) && strings.Contains(msg, holder[0]), fmt.Sprintf("operator-status %q", msg)
			})
			if b := e.storeBlocks(refused[0]); mode == ModeClusterPool && len(b) != 0 {
				t.Errorf("%s, refused its listed CIDR, holds %v in the store", refused[0], b)
			}
			t.Logf("%s: %d nodes, %d listed CIDRs restored, %d new nodes served, %d CIDRs in two nodes", mode,
				len(l.Items), len(c.listed), len(c.fresh), duplicates)
			e.consistent()
		})
	}
}

// The ignore annotation's value counts in any letter case, as Cilium's
// operator lowers it before comparing.
func TestIgnoreAnnotationIsCaseInsensitive(t *testing.T) {
	for value, want := range map[string]bool{
		"true": true, "True": true, "TRUE": true, "tRuE": true,
		"false": false, "": false, "yes": false, "1": false, " true": false,
	} {
		cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{AnnotationIgnore: value}}}
		if got := ignored(cn); got != want {
			t.Errorf("ignored with %s=%q: %v, want %v", AnnotationIgnore, value, got, want)
		}
	}
	if ignored(&ciliumv2.CiliumNode{}) || ignored(nil) {
		t.Error("a node without the annotation is ignored")
	}
}

// A round that changes both writes status first, then spec, as Cilium's
// operator does (nodemanager's syncToAPIServer: the status the agent
// needs for an address, its ENI or interface, is there before the
// address is in the pool). Here: a node the pool can only partly serve
// gets "allocator full" in status before the addresses in spec.
func TestStatusIsWrittenBeforeSpec(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(28, "10.31.0.0/28")})
	w, err := e.client.CiliumV2().CiliumNodes().Watch(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	e.createNode("partly", func(cn *ciliumv2.CiliumNode) { cn.Spec.IPAM.PreAllocate = 16 })
	e.operator("op-1", nil)
	var seen []string
	deadline := time.After(20 * time.Second)
	for {
		select {
		case ev := <-w.ResultChan():
			cn, ok := ev.Object.(*ciliumv2.CiliumNode)
			if !ok {
				continue
			}
			pool, msg := len(cn.Spec.IPAM.Pool), cn.Status.IPAM.OperatorStatus.Error
			seen = append(seen, fmt.Sprintf("%s: %d addresses, error %q", ev.Type, pool, msg))
			if pool > 0 && msg == "" {
				t.Fatalf("the addresses reached spec before the status of their round: %v", seen)
			}
			if pool > 0 {
				t.Logf("events: %v", seen)
				return
			}
		case <-deadline:
			t.Fatalf("no addresses within 20s: %v", seen)
		}
	}
}

// An entry of spec.ipam.pool pinned to a Pod (owner "namespace/pod") keeps
// its owner through the operator's writes, and is never excess: Cilium's
// crd-mode agent hands it to that Pod alone (pkg/ipam/crd.go,
// allocateNext). Before, every write replaced the entries with
// {resource} only, dropping the pin, and the address could be released
// as excess.
func TestCRDOwnerPinningKept(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(26, "10.54.0.0/16")})
	e.operator("op-1", func(c *Config) { c.ExcessIPReleaseDelay = time.Second })
	ag := e.preAllocatedAgent("pins", 4)
	const owner = "default/web-0"
	var pin string
	// Pin the highest address (excess release takes the lowest first),
	// and lower the pre-allocation to 1: three addresses become excess.
	for {
		cn := e.get("pins")
		pool := specPool(cn)
		pin = pool[len(pool)-1]
		entry := cn.Spec.IPAM.Pool[pin]
		entry.Owner = owner
		cn.Spec.IPAM.Pool[pin] = entry
		cn.Spec.IPAM.PreAllocate = 1
		_, err := e.client.CiliumV2().CiliumNodes().Update(e.ctx, cn, metav1.UpdateOptions{})
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "modified") {
			t.Fatal(err)
		}
	}
	// The agent answers the handshake; the excess goes, the pin stays.
	e.eventually(30*time.Second, "excess released around the pin", func() (bool, string) {
		ag.observe(e.get("pins"))
		ag.mu.Lock()
		ag.dirty = true
		ag.mu.Unlock()
		if _, err := ag.sync(e.ctx, true); err != nil {
			return false, err.Error()
		}
		cn := e.get("pins")
		return len(cn.Spec.IPAM.Pool) == 1 && len(cn.Status.IPAM.ReleaseIPs) == 0,
			fmt.Sprintf("pool %v, release-ips %v", cn.Spec.IPAM.Pool, cn.Status.IPAM.ReleaseIPs)
	})
	cn := e.get("pins")
	entry, ok := cn.Spec.IPAM.Pool[pin]
	if !ok || entry.Owner != owner {
		t.Fatalf("the pinned %s is %+v (in the pool: %v); want owner %s", pin, entry, ok, owner)
	}
	if entry.Resource == "" {
		t.Errorf("the pinned entry lost its resource: %+v", entry)
	}
}

// Pods waiting on a node make an allocation round ask for more than the
// need: needed + max-above-watermark + (pending − needed), Cilium's surge
// (operator/pkg/ipam/nodemanager/node.go). Ten Pods pending on a node
// with pre-allocate 4 give it ten addresses at once; before, the round
// passed no pending count and asked for four.
func TestCRDSurgeForPendingPods(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(26, "10.55.0.0/16")})
	e.kc.CreateNamespace(t, "surge", nil, nil)
	for i := range 10 {
		e.kc.CreatePod(t, "surge", fmt.Sprintf("web-%d", i), "surge-1", nil, nil)
	}
	// A Pending Pod on another node counts for that node only.
	e.kc.CreatePod(t, "surge", "elsewhere", "surge-2", nil, nil)
	e.operator("op-1", nil)
	for _, n := range []string{"surge-1", "surge-2"} {
		ag := newAgent(t, e.client, n, 0)
		if err := ag.create(e.ctx, ipamtypes.IPAMSpec{PreAllocate: 4}, nil); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually(10*time.Second, "surge-1 sized for its pending Pods", func() (bool, string) {
		n := len(e.get("surge-1").Spec.IPAM.Pool)
		return n == 10, fmt.Sprintf("%d addresses", n)
	})
	e.eventually(10*time.Second, "surge-2 sized for its pre-allocation", func() (bool, string) {
		n := len(e.get("surge-2").Spec.IPAM.Pool)
		return n == 4, fmt.Sprintf("%d addresses", n)
	})
}

// TestCRDTakeoverRestoresBeforeAllocating migrates a crd-mode cluster from
// another operator: 25 CiliumNodes list 8 addresses each in spec.ipam.pool
// (some pinned to a Pod, some in status.ipam.used), 25 are new. Every
// listed address is occupied by its node before any is reserved for a new
// one, so no address is in two nodes, no listed address is renumbered,
// each is held by its node in the store and in that node's history. Of
// two nodes listing one address the older keeps it and the other is told
// why; an address of no pool is refused and reported too.
func TestCRDTakeoverRestoresBeforeAllocating(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(28, "10.71.0.0/16")})
	base := netip.MustParseAddr("10.71.0.0").As4()
	addrAt := func(off int) netip.Addr {
		a := base
		v := int(a[2])<<8 | int(a[3]) + off
		a[2], a[3] = byte(v>>8), byte(v)
		return netip.AddrFrom4(a)
	}
	// listed: node -> its addresses; every other node by name, each in a
	// /28 of its own, spread (every third block) so that the lowest-first
	// reservation for the new nodes meets them.
	listed := map[string][]netip.Addr{}
	used := map[string]map[netip.Addr]string{} // node -> address -> owner
	var fresh []string
	for i := range 50 {
		name := fmt.Sprintf("node-%02d", i)
		if i%2 == 1 {
			fresh = append(fresh, name)
			continue
		}
		for k := range 8 {
			listed[name] = append(listed[name], addrAt(i/2*3*16+2+k))
		}
		if i%3 == 0 {
			used[name] = map[netip.Addr]string{listed[name][0]: "default/pod-" + name}
		}
	}
	const otherResource = "another-operator"
	pinnedNodes := map[string]bool{}
	create := func(name string, addrs []netip.Addr, pinned bool) {
		e.createNode(name, func(cn *ciliumv2.CiliumNode) {
			// A new node asks for 8; a served one for 4, so its 8 listed
			// addresses (one of them maybe used) cover it and none is
			// added: what it lists is exactly what it keeps.
			cn.Spec.IPAM.PreAllocate = 8
			if len(addrs) == 0 {
				return
			}
			cn.Spec.IPAM.PreAllocate = 4
			cn.Spec.IPAM.Pool = ipamtypes.AllocationMap{}
			for k, a := range addrs {
				entry := ipamtypes.AllocationIP{Resource: otherResource}
				if pinned && k < 2 {
					pinnedNodes[name] = true
					entry.Owner = fmt.Sprintf("default/pinned-%s-%d", name, k)
				}
				cn.Spec.IPAM.Pool[a.String()] = entry
			}
		})
		if u := used[name]; len(u) > 0 {
			cn := e.get(name)
			cn.Status.IPAM.Used = ipamtypes.AllocationMap{}
			for a, owner := range u {
				cn.Status.IPAM.Used[a.String()] = ipamtypes.AllocationIP{Owner: owner, Resource: otherResource}
			}
			if _, err := e.client.CiliumV2().CiliumNodes().UpdateStatus(e.ctx, cn, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 50 {
		name := fmt.Sprintf("node-%02d", i)
		create(name, listed[name], i%4 == 0)
	}
	// The collision (created after the others: dup-a is the older) and
	// an address of no pool beside a good one.
	collided := netip.MustParseAddr("10.71.200.5")
	create("dup-a", []netip.Addr{collided}, false)
	create("dup-b", []netip.Addr{collided}, false)
	stray, strayGood := netip.MustParseAddr("192.168.9.9"), netip.MustParseAddr("10.71.210.2")
	create("stray", []netip.Addr{stray, strayGood}, false)

	e.operator("op-1", nil)

	// Every observation counts addresses in two nodes' pools: a duplicate
	// the operator wrote and took back later shows too. The collided
	// address is in two from the start (the input); it is checked below.
	maxDup := 0
	dupsOf := func(items []ciliumv2.CiliumNode) (int, []string) {
		holders := map[string][]string{}
		for _, cn := range items {
			for ip := range cn.Spec.IPAM.Pool {
				holders[ip] = append(holders[ip], cn.Name)
			}
		}
		var out []string
		for ip, nodes := range holders {
			if len(nodes) > 1 && ip != collided.String() {
				out = append(out, fmt.Sprintf("%s in %v", ip, nodes))
			}
		}
		slices.Sort(out)
		return len(out), out
	}
	var items []ciliumv2.CiliumNode
	e.eventually(60*time.Second, "every node served", func() (bool, string) {
		l, err := e.client.CiliumV2().CiliumNodes().List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		items = l.Items
		n, _ := dupsOf(items)
		maxDup = max(maxDup, n)
		for _, cn := range items {
			if len(cn.Spec.IPAM.Pool) < cn.Spec.IPAM.PreAllocate {
				return false, fmt.Sprintf("%s has %d addresses", cn.Name, len(cn.Spec.IPAM.Pool))
			}
		}
		return true, ""
	})
	// Let the operator go on a little: a wrong reservation would show.
	time.Sleep(2 * time.Second)
	l, err := e.client.CiliumV2().CiliumNodes().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	items = l.Items
	n, dups := dupsOf(items)
	maxDup = max(maxDup, n)
	if maxDup > 0 {
		t.Errorf("%d addresses were in two nodes' pools at once (at the end: %v)", maxDup, dups)
	}

	renumbered := 0
	byName := map[string]ciliumv2.CiliumNode{}
	for _, cn := range items {
		byName[cn.Name] = cn
	}
	for name, addrs := range listed {
		cn := byName[name]
		want := make([]string, len(addrs))
		for k, a := range addrs {
			want[k] = a.String()
		}
		slices.Sort(want)
		got := specPool(&cn)
		for _, a := range want {
			if !slices.Contains(got, a) {
				renumbered++
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s listed %v and now lists %v", name, want, got)
		}
		for k, a := range addrs {
			if pinnedNodes[name] && k < 2 && cn.Spec.IPAM.Pool[a.String()].Owner == "" {
				t.Errorf("%s: the pinned %s lost its owner", name, a)
			}
		}
		if held := e.heldByStore(name); !slices.Equal(held, want) {
			t.Errorf("the store holds %v for %s, which lists %v", held, name, want)
		}
		events, _, err := e.st.History(e.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: name}, alloc.Page{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if !slices.ContainsFunc(events, func(ev alloc.Event) bool { return ev.Address == a && ev.Node == name }) {
				t.Errorf("%s's history has no event of its address %s", name, a)
			}
		}
	}
	// What Pods used is the store's active lease of that Pod.
	for name, u := range used {
		as, err := e.st.NodeAddresses(e.ctx, alloc.DefaultSpace, name)
		if err != nil {
			t.Fatal(err)
		}
		for a, owner := range u {
			i := slices.IndexFunc(as, func(h alloc.HeldAddress) bool { return h.Addr == a })
			if i < 0 || as[i].State != alloc.StateActive || as[i].Owner != alloc.CiliumOwner(owner) {
				t.Errorf("%s uses %s for %s; the store has %+v", name, a, owner, as)
			}
		}
	}
	// New nodes get fresh addresses of the pool, none listed before.
	all := map[netip.Addr]bool{collided: true, strayGood: true}
	for _, addrs := range listed {
		for _, a := range addrs {
			all[a] = true
		}
	}
	for _, name := range fresh {
		cn := byName[name]
		for ip := range cn.Spec.IPAM.Pool {
			if all[netip.MustParseAddr(ip)] {
				t.Errorf("new node %s was given %s, which another node listed", name, ip)
			}
		}
		if len(cn.Spec.IPAM.Pool) != 8 {
			t.Errorf("new node %s has %d addresses, want 8", name, len(cn.Spec.IPAM.Pool))
		}
	}
	// The collision: dup-a (the older) holds the address, dup-b is told
	// why and gets fresh ones; the stray address is refused and reported.
	if held := e.heldByStore("dup-a"); !slices.Contains(held, collided.String()) {
		t.Errorf("dup-a holds %v; want %s among them", held, collided)
	}
	if held := e.heldByStore("dup-b"); slices.Contains(held, collided.String()) {
		t.Errorf("dup-b holds %v, with dup-a's %s", held, collided)
	}
	if _, ok := byName["dup-b"].Spec.IPAM.Pool[collided.String()]; ok {
		t.Errorf("dup-b still lists dup-a's %s", collided)
	}
	if _, ok := byName["dup-a"].Spec.IPAM.Pool[collided.String()]; !ok {
		t.Errorf("dup-a no longer lists its %s", collided)
	}
	if held := e.heldByStore("stray"); !slices.Contains(held, strayGood.String()) || slices.Contains(held, stray.String()) {
		t.Errorf("stray holds %v; want %s and not %s", held, strayGood, stray)
	}
	e.eventually(10*time.Second, "the refusals reported", func() (bool, string) {
		b, s := e.get("dup-b").Status.IPAM.OperatorStatus.Error, e.get("stray").Status.IPAM.OperatorStatus.Error
		return strings.Contains(b, collided.String()) && strings.Contains(b, "dup-a") && strings.Contains(s, stray.String()),
			fmt.Sprintf("dup-b: %q, stray: %q", b, s)
	})
	t.Logf("%d nodes, %d listed addresses on %d nodes, %d new nodes; %d addresses renumbered, at most %d in two nodes at once",
		len(items), 8*len(listed), len(listed), len(fresh), renumbered, maxDup)
	e.consistent()
}
