// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// kubeNodes creates a Kubernetes Node of each name and answers a client
// to delete them with.
func (e *crdEnv) kubeNodes(names ...string) kubernetes.Interface {
	e.t.Helper()
	kc, err := kubernetes.NewForConfig(e.kc.Config())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, n := range names {
		if _, err := kc.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			e.t.Fatal(err)
		}
	}
	return kc
}

// removeNode deletes the Kubernetes Node called name, then its CiliumNode,
// as a node leaving the cluster for good.
func (e *crdEnv) removeNode(kc kubernetes.Interface, name string) {
	e.t.Helper()
	if err := kc.CoreV1().Nodes().Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.deleteNode(name)
}

// exists says whether the CiliumNode called name exists.
func (e *crdEnv) exists(name string) bool {
	e.t.Helper()
	_, err := e.client.CiliumV2().CiliumNodes().Get(e.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	} else if err != nil {
		e.t.Fatal(err)
	}
	return true
}

// The CiliumNode garbage collector as Cilium's (cilium_node_gc.go): the
// CiliumNode of a deleted Node is deleted on a pass at least an interval
// after the one that first found it so, which gives its addresses back;
// one with ownerReferences or annotated cilium.io/do-not-gc (any case) is
// kept, as is one whose Node exists. Before, the operator deleted the
// CiliumNode at once with its Node, whatever its owners or annotations.
func TestCiliumNodeGCAsCilium(t *testing.T) {
	const interval = 2 * time.Second
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(26, "10.52.0.0/16")})
	e.operator("op-1", func(c *Config) { c.NodesGCInterval = interval })
	names := []string{"gc-gone", "gc-owned", "gc-keep", "gc-live"}
	kc := e.kubeNodes(names...)
	for _, n := range names {
		e.createNode(n, func(cn *ciliumv2.CiliumNode) {
			cn.Spec.IPAM = ipamtypes.IPAMSpec{PreAllocate: 2}
			switch n {
			case "gc-owned":
				cn.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n, UID: types.UID("0b6f3c55-6d2e-4b1a-9d0e-" + "5c1d2e3f4a5b")}}
			case "gc-keep":
				cn.Annotations = map[string]string{AnnotationDoNotGC: "True"}
			}
		})
	}
	for _, n := range names {
		e.eventually(10*time.Second, n+" pre-allocated", func() (bool, string) {
			got := len(e.get(n).Spec.IPAM.Pool)
			return got == 2, fmt.Sprintf("%d addresses", got)
		})
	}
	held := map[string][]string{}
	for _, n := range names {
		held[n] = e.heldByStore(n)
	}
	deletedAt := time.Now()
	for _, n := range names[:3] {
		if err := kc.CoreV1().Nodes().Delete(e.ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually(4*interval+10*time.Second, "gc-gone's CiliumNode collected", func() (bool, string) {
		return !e.exists("gc-gone"), "still there"
	})
	if took := time.Since(deletedAt); took < interval {
		t.Errorf("gc-gone's CiliumNode was deleted %v after its Node; Cilium waits at least nodes-gc-interval (%v)", took, interval)
	}
	e.eventually(10*time.Second, "gc-gone's addresses released", func() (bool, string) {
		h := e.heldByStore("gc-gone")
		return len(h) == 0, fmt.Sprintf("still held: %v", h)
	})
	// Two more intervals: nothing else goes.
	time.Sleep(2*interval + time.Second)
	for _, n := range names[1:] {
		if !e.exists(n) {
			t.Errorf("%s's CiliumNode was garbage collected", n)
		}
		if got := e.heldByStore(n); !slices.Equal(got, held[n]) {
			t.Errorf("%s holds %v; before the Nodes' deletion it held %v", n, got, held[n])
		}
	}
}

// A CiliumNode deleted while its Node exists keeps its addresses: the
// agent on that Node still runs, recreates its CiliumNode and gets the
// same pool back, and no address a Pod uses cools down or goes to another
// node meanwhile (before, every address went back to the pool after the
// cooldown). Once the Node is gone too, the addresses go.
func TestCRDCiliumNodeDeletedUnderLiveAgent(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(26, "10.53.0.0/16")})
	e.operator("op-1", nil)
	kc := e.kubeNodes("live")
	ag := e.preAllocatedAgent("live", 4)
	ag.observe(e.get("live"))
	ip, _ := ag.podStart()
	if _, err := ag.sync(e.ctx, true); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "use recorded", func() (bool, string) {
		l, err := e.st.GetAddress(e.ctx, alloc.DefaultSpace, netip.MustParseAddr(ip))
		return err == nil && l.State == alloc.StateActive, fmt.Sprintf("%+v %v", l, err)
	})
	// One used and four spare: the pool grows to five.
	e.eventually(10*time.Second, "the pool grown for the Pod", func() (bool, string) {
		n := len(e.get("live").Spec.IPAM.Pool)
		return n == 5, fmt.Sprintf("%d addresses", n)
	})
	before := e.heldByStore("live")
	e.deleteNode("live")
	// Past the store's cooldown (2 s) and a few rounds.
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if got := e.heldByStore("live"); !slices.Equal(got, before) {
			t.Fatalf("after its CiliumNode's deletion the live node holds %v; before, %v", got, before)
		}
	}
	l, err := e.st.GetAddress(e.ctx, alloc.DefaultSpace, netip.MustParseAddr(ip))
	if err != nil || l.State != alloc.StateActive || l.Node != "live" {
		t.Fatalf("the Pod's %s is %+v (%v); want active on live", ip, l, err)
	}

	// The agent recreates its CiliumNode and reports its Pod again.
	ag2 := newAgent(t, e.client, "live", 0)
	if err := ag2.create(e.ctx, ipamtypes.IPAMSpec{PreAllocate: 4}, nil); err != nil {
		t.Fatal(err)
	}
	e.eventually(10*time.Second, "the same pool back", func() (bool, string) {
		got := specPool(e.get("live"))
		return slices.Equal(got, before), fmt.Sprintf("spec.ipam.pool %v, held before %v", got, before)
	})

	// The Node goes, then the CiliumNode: now the addresses go back.
	e.removeNode(kc, "live")
	e.eventually(10*time.Second, "addresses released", func() (bool, string) {
		h := e.heldByStore("live")
		return len(h) == 0, fmt.Sprintf("still held: %v", h)
	})
}

// The same in cluster-pool mode: the blocks of a CiliumNode deleted while
// its Node exists stay the node's, and the recreated CiliumNode lists the
// same podCIDRs (before, they went back to the pool at once and the
// recreated node could get another CIDR while its Pods used the old one).
func TestClusterPoolCiliumNodeDeletedUnderLiveAgent(t *testing.T) {
	e := newBlockEnv(t, time.Minute, map[string]alloc.PoolSpec{"default": clusterPool})
	e.blockOperator(ModeClusterPool, nil)
	kc := e.kubeNodes("cp-live", "cp-other")
	e.createNode("cp-live", nil)
	var cidrs []string
	e.eventually(10*time.Second, "cp-live served", func() (bool, string) {
		cidrs = prefixStrings(e.get("cp-live").Spec.IPAM.PodCIDRs)
		return len(cidrs) == 2, fmt.Sprintf("podCIDRs %v", cidrs)
	})
	e.deleteNode("cp-live")
	// A new node arrives meanwhile: it must not get cp-live's blocks.
	e.createNode("cp-other", nil)
	e.eventually(10*time.Second, "cp-other served", func() (bool, string) {
		got := prefixStrings(e.get("cp-other").Spec.IPAM.PodCIDRs)
		return len(got) == 2, fmt.Sprintf("podCIDRs %v", got)
	})
	for _, c := range prefixStrings(e.get("cp-other").Spec.IPAM.PodCIDRs) {
		if slices.Contains(cidrs, c) {
			t.Errorf("cp-other was given %s, which cp-live's running agent uses", c)
		}
	}
	if got := e.storeBlocks("cp-live"); !slices.Equal(got, cidrs) {
		t.Errorf("cp-live holds %v after its CiliumNode's deletion; before, %v", got, cidrs)
	}
	e.createNode("cp-live", nil)
	e.eventually(10*time.Second, "cp-live's podCIDRs back", func() (bool, string) {
		got := prefixStrings(e.get("cp-live").Spec.IPAM.PodCIDRs)
		return slices.Equal(got, cidrs), fmt.Sprintf("podCIDRs %v, want %v", got, cidrs)
	})
	e.removeNode(kc, "cp-live")
	e.eventually(10*time.Second, "cp-live's blocks released", func() (bool, string) {
		b := e.storeBlocks("cp-live")
		return b == nil, fmt.Sprintf("store holds %v", b)
	})
}
