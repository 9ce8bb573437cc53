// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// A pool too small for every node: the node it cannot serve says
// "allocator full" in operator-status, and the error clears once an
// address is free for it again.
func TestCRDExhaustionSetsAndClearsOperatorStatus(t *testing.T) {
	// One /28 block: 16 addresses minus network, broadcast, router and
	// health (the pool's defaults) leave too few for two nodes of 8.
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(28, "10.30.0.0/28")})
	e.operator("op-1", nil)
	a := newAgent(t, e.client, "full-a", 0)
	if err := a.create(e.ctx, ipamtypes.IPAMSpec{PreAllocate: 8}, nil); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "node a served", func() (bool, string) {
		n := len(e.get("full-a").Spec.IPAM.Pool)
		return n == 8, fmt.Sprintf("%d addresses", n)
	})
	b := newAgent(t, e.client, "full-b", 0)
	if err := b.create(e.ctx, ipamtypes.IPAMSpec{PreAllocate: 8}, nil); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "allocator full on node b", func() (bool, string) {
		msg := e.get("full-b").Status.IPAM.OperatorStatus.Error
		return strings.Contains(msg, ErrAllocatorFull), fmt.Sprintf("operator-status.error %q", msg)
	})
	if got := e.get("full-a").Status.IPAM.OperatorStatus.Error; got != "" {
		t.Errorf("node a, fully served, has operator-status.error %q", got)
	}
	// Node a goes away: its addresses cool down and node b gets them.
	if err := e.client.CiliumV2().CiliumNodes().Delete(e.ctx, "full-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "node b served and its error cleared", func() (bool, string) {
		cn := e.get("full-b")
		return len(cn.Spec.IPAM.Pool) >= 8 && cn.Status.IPAM.OperatorStatus.Error == "",
			fmt.Sprintf("%d addresses, error %q", len(cn.Spec.IPAM.Pool), cn.Status.IPAM.OperatorStatus.Error)
	})
}

// Excess addresses leave the pool only through the handshake, after the
// delay; an address the agent answers do-not-release for stays, and a
// used address never leaves.
func TestCRDExcessReleaseHandshake(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(26, "10.40.0.0/16")})
	const delay = 2 * time.Second
	e.operator("op-1", func(c *Config) { c.ExcessIPReleaseDelay = delay; c.Resync = time.Second })
	ag := e.preAllocatedAgent("excess", 4)
	// Use 6: the pool grows to 10.
	ag.observe(e.get("excess"))
	var used []string
	for range 4 {
		ip, _ := ag.podStart()
		used = append(used, ip)
	}
	ag.sync(e.ctx, true)
	e.eventually(10*time.Second, "growth", func() (bool, string) {
		// One read for both: the agent must see the pool that was counted.
		cn := e.get("excess")
		ag.observe(cn)
		n := len(cn.Spec.IPAM.Pool)
		return n == 8, fmt.Sprintf("%d addresses", n)
	})
	for range 2 {
		ip, ok := ag.podStart()
		if !ok {
			t.Fatal("no free address")
		}
		used = append(used, ip)
	}
	ag.sync(e.ctx, true)
	e.eventually(10*time.Second, "growth to 10", func() (bool, string) {
		n := len(e.get("excess").Spec.IPAM.Pool)
		return n == 10, fmt.Sprintf("%d addresses", n)
	})
	// The Pods end but one: 9 reserved, 1 used; excess = 10-1-4 = 5.
	// The agent keeps one of the excess addresses for itself: it answers
	// do-not-release for it (as if a Pod had just taken it).
	ag.observe(e.get("excess"))
	for _, ip := range used[1:] {
		ag.podStop(ip)
	}
	ag.sync(e.ctx, true)
	marked := time.Now()
	var keep string
	e.eventually(10*time.Second+delay, "addresses marked for release", func() (bool, string) {
		cn := e.get("excess")
		n := 0
		for ip, st := range cn.Status.IPAM.ReleaseIPs {
			if st == releaseMarked {
				n++
				if keep == "" {
					keep = ip
				}
			}
		}
		return n > 0, fmt.Sprintf("release-ips %v", cn.Status.IPAM.ReleaseIPs)
	})
	if since := time.Since(marked); since < delay/2 {
		t.Errorf("marked %v after the addresses became excess; the delay is %v", since, delay)
	}
	// The agent takes keep into use and answers: do-not-release for it,
	// ready for the others.
	ag.mu.Lock()
	ag.used[keep] = "default/late-pod"
	ag.dirty = true
	ag.mu.Unlock()
	if _, err := ag.sync(e.ctx, true); err != nil {
		t.Fatal(err)
	}
	e.eventually(20*time.Second, "excess released", func() (bool, string) {
		ag.observe(e.get("excess"))
		ag.sync(e.ctx, true)
		cn := e.get("excess")
		return len(cn.Spec.IPAM.Pool) == 6 && len(cn.Status.IPAM.ReleaseIPs) == 0,
			fmt.Sprintf("%d addresses, release-ips %v", len(cn.Spec.IPAM.Pool), cn.Status.IPAM.ReleaseIPs)
	})
	cn := e.get("excess")
	if _, ok := cn.Spec.IPAM.Pool[keep]; !ok {
		t.Errorf("%s, answered do-not-release and in use, left the pool", keep)
	}
	if _, ok := cn.Spec.IPAM.Pool[used[0]]; !ok {
		t.Errorf("%s, in use all along, left the pool", used[0])
	}
	if lost := ag.lostAddresses(); len(lost) > 0 {
		t.Errorf("used addresses left the pool: %v", lost)
	}
	if got, want := specPool(cn), e.heldByStore("excess"); !slices.Equal(got, want) {
		t.Errorf("spec.ipam.pool %v; store holds %v", got, want)
	}
}

// A CiliumNode deleted while Pods use its addresses gives every address
// back to the pool (after the cooldown), and the history says so.
func TestCRDDeletedNodeReleasesItsAddresses(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(26, "10.50.0.0/16")})
	e.operator("op-1", nil)
	ag := e.preAllocatedAgent("doomed", 4)
	ag.observe(e.get("doomed"))
	ip, _ := ag.podStart()
	ag.sync(e.ctx, true)
	e.eventually(10*time.Second, "use recorded", func() (bool, string) {
		l, err := e.st.GetAddress(e.ctx, alloc.DefaultSpace, netip.MustParseAddr(ip))
		return err == nil && l.State == alloc.StateActive && l.Owner.Namespace == "default",
			fmt.Sprintf("%+v %v", l, err)
	})
	if err := e.client.CiliumV2().CiliumNodes().Delete(e.ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "addresses released", func() (bool, string) {
		held := e.heldByStore("doomed")
		return len(held) == 0, fmt.Sprintf("still held: %v", held)
	})
	l, err := e.st.GetAddress(e.ctx, alloc.DefaultSpace, netip.MustParseAddr(ip))
	if err != nil {
		t.Fatal(err)
	}
	if l.State != alloc.StateCooling {
		t.Errorf("%s is %s after its node's deletion; want cooling", ip, l.State)
	}
}

// Fifty nodes churn Pods for a while under one operator: no address is in
// two nodes' pools, no used address ever leaves a pool, and at the end
// the store and every CiliumNode agree and the consistency check is
// clean.
func TestCRDChurnManyNodes(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(27, "10.60.0.0/16")})
	e.operator("op-1", func(c *Config) { c.ExcessIPReleaseDelay = 3 * time.Second; c.Resync = 5 * time.Second })
	const nodes = 50
	const churnFor = 60 * time.Second
	agents := make([]*agent, nodes)
	for i := range agents {
		agents[i] = newAgent(t, e.client, fmt.Sprintf("churn-%02d", i), 15*time.Second)
		if err := agents[i].create(e.ctx, ipamtypes.IPAMSpec{PreAllocate: 4, MaxAboveWatermark: 2}, nil); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, churnFor)
	defer cancel()
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Go(func() { _ = a.churn(ctx, 3+i%5, uint64(i)) })
	}
	overlapCheck := func() {
		seen := map[string]string{}
		list, err := e.client.CiliumV2().CiliumNodes().List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		for _, cn := range list.Items {
			for ip := range cn.Spec.IPAM.Pool {
				if other, dup := seen[ip]; dup {
					t.Errorf("%s is in the pools of %s and %s", ip, other, cn.Name)
				}
				seen[ip] = cn.Name
			}
		}
	}
	for ctx.Err() == nil {
		overlapCheck()
		time.Sleep(time.Second)
	}
	wg.Wait()
	// Final status writes, then the operator settles.
	for _, a := range agents {
		if _, err := a.sync(e.ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	overlapCheck()
	for _, a := range agents {
		if lost := a.lostAddresses(); len(lost) > 0 {
			t.Errorf("node %s: used addresses left its pool: %v", a.name, lost)
		}
		e.eventually(30*time.Second, "node "+a.name+" agrees with the store", func() (bool, string) {
			cn := e.get(a.name)
			got, want := specPool(cn), e.heldByStore(a.name)
			return slices.Equal(got, want), fmt.Sprintf("spec %v, store %v", got, want)
		})
		for _, ip := range a.usedAddresses() {
			l, err := e.st.GetAddress(e.ctx, alloc.DefaultSpace, netip.MustParseAddr(ip))
			if err != nil || l.State != alloc.StateActive || l.Node != a.name {
				t.Errorf("node %s uses %s; the store has %+v (%v)", a.name, ip, l, err)
			}
		}
	}
	e.consistent()
}

// A deleted Kubernetes Node takes its CiliumNode with it (Cilium's garbage
// collector, gc.go), and so its addresses; its labels, while it lived,
// chose the node's pool by the pool's nodeSelector.
func TestCRDDeletedNodeObject(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(26, "10.90.0.0/16")})
	gpu := alloc.PoolSpec{IPv4: v4(26, "10.91.0.0/16"), NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "gpu"}}}
	if _, err := e.st.CreatePool(e.ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: "gpu", Spec: gpu}); err != nil {
		t.Fatal(err)
	}
	e.operator("op-1", func(c *Config) { c.NodesGCInterval = time.Second })
	kc, err := kubernetes.NewForConfig(e.kc.Config())
	if err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-1", Labels: map[string]string{"pool": "gpu"}}}
	if _, err := kc.CoreV1().Nodes().Create(e.ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ag := newAgent(t, e.client, "gpu-1", 0)
	if err := ag.create(e.ctx, ipamtypes.IPAMSpec{PreAllocate: 4}, nil); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "pre-allocation from the gpu pool", func() (bool, string) {
		pool := specPool(e.get("gpu-1"))
		return len(pool) == 4 && strings.HasPrefix(pool[0], "10.91."), fmt.Sprintf("%v", pool)
	})
	if err := kc.CoreV1().Nodes().Delete(e.ctx, "gpu-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "CiliumNode deleted and addresses released", func() (bool, string) {
		_, err := e.client.CiliumV2().CiliumNodes().Get(e.ctx, "gpu-1", metav1.GetOptions{})
		held := e.heldByStore("gpu-1")
		return apierrors.IsNotFound(err) && len(held) == 0, fmt.Sprintf("get: %v; held %v", err, held)
	})
}

// A dual-stack pool: both families' addresses go into spec.ipam.pool, one
// map keyed by address, which is where Cilium's agent (v1.20.2
// pkg/ipam/crd.go) reads both; ipv6-pool stays empty.
func TestCRDDualStackInOneMap(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(26, "10.95.0.0/16"),
		IPv6: &alloc.PoolFamily{MaskSize: 120, CIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:95::/104")}}})
	e.operator("op-1", nil)
	ag := newAgent(t, e.client, "dual", 0)
	if err := ag.create(e.ctx, ipamtypes.IPAMSpec{PreAllocate: 3}, nil); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "both families pre-allocated", func() (bool, string) {
		cn := e.get("dual")
		var v4n, v6n int
		for ip := range cn.Spec.IPAM.Pool {
			if netip.MustParseAddr(ip).Is4() {
				v4n++
			} else {
				v6n++
			}
		}
		return v4n == 3 && v6n == 3, fmt.Sprintf("%d IPv4, %d IPv6 in spec.ipam.pool", v4n, v6n)
	})
	cn := e.get("dual")
	if len(cn.Spec.IPAM.IPv6Pool) != 0 {
		t.Errorf("ipv6-pool %v; the agent does not read it", cn.Spec.IPAM.IPv6Pool)
	}
	if got, want := specPool(cn), e.heldByStore("dual"); !slices.Equal(got, want) {
		t.Errorf("spec.ipam.pool %v; store holds %v", got, want)
	}
	// The agent uses an IPv6 address: it becomes the Pod's lease.
	var v6 string
	for ip := range cn.Spec.IPAM.Pool {
		if !netip.MustParseAddr(ip).Is4() {
			v6 = ip
		}
	}
	ag.observe(cn)
	ag.mu.Lock()
	ag.used[v6] = "default/v6-pod"
	ag.dirty = true
	ag.mu.Unlock()
	if _, err := ag.sync(e.ctx, true); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "IPv6 use recorded and the IPv6 need grown", func() (bool, string) {
		l, err := e.st.GetAddress(e.ctx, alloc.DefaultSpace, netip.MustParseAddr(v6))
		st, _, _ := e.op.CiliumNodeState(e.ctx, alloc.DefaultSpace, "dual")
		ok := err == nil && l.State == alloc.StateActive && l.Owner.Name == "v6-pod" && st.IPv6 != nil && st.IPv6.Used == 1 && st.IPv6.Pool == 4
		return ok, fmt.Sprintf("lease %+v (%v); state IPv6 %+v", l, err, st.IPv6)
	})
	e.consistent()
}
