// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// A new leader writes nothing to the CiliumNodes the last one left
// served: its first round over every node (from its initial list) and
// its resyncs find each spec and status as they should be. At a fleet's
// size a write per node would cost minutes of the client's QPS and wake
// every agent (make bench counts them at 5,000 nodes, target 0). Counted
// twice: the nodes' resourceVersions (a write that changed something)
// and the new leader's PUT and PATCH requests (any write, one that
// changes nothing included).
func TestCRDNewLeaderWritesNothingToServedNodes(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(26, "10.20.0.0/16")})
	stopFirst := e.operator("op-first", nil)
	e.eventually(15*time.Second, "serving", func() (bool, string) { return e.op.Serving(), "not serving" })
	nodes := e.client.CiliumV2().CiliumNodes()
	const n = 12
	names := make([]string, 0, n+1)
	for i := range n {
		cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%02d", i)}}
		if i%3 == 1 {
			cn.Spec.IPAM.PreAllocate = 4 // a node's own pre-allocation
		}
		if _, err := nodes.Create(e.ctx, cn, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, cn.Name)
	}
	// A node the operator leaves alone.
	ignoredNode := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-ignored", Annotations: map[string]string{AnnotationIgnore: "true"}}}
	if _, err := nodes.Create(e.ctx, ignoredNode, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	names = append(names, ignoredNode.Name)
	want := func(name string) int {
		if name == ignoredNode.Name {
			return 0
		}
		if cn := e.get(name); cn.Spec.IPAM.PreAllocate == 4 {
			return 4
		}
		return alloc.DefaultPreAllocate
	}
	e.eventually(30*time.Second, "every node at its pre-allocation", func() (bool, string) {
		for _, name := range names[:n] {
			if got := len(e.get(name).Spec.IPAM.Pool); got != want(name) {
				return false, fmt.Sprintf("%s: %d addresses, want %d", name, got, want(name))
			}
		}
		return true, ""
	})
	// An agent reports two addresses of node-00 in use: the pool grows by
	// two, as Cilium's watermark wants.
	cn := e.get("node-00")
	used := ipamtypes.AllocationMap{}
	for ip := range cn.Spec.IPAM.Pool {
		if len(used) < 2 {
			used[ip] = ipamtypes.AllocationIP{Owner: "default/pod-" + ip}
		}
	}
	cn.Status.IPAM.Used = used
	if _, err := nodes.UpdateStatus(e.ctx, cn, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "node-00 served its use", func() (bool, string) {
		got := len(e.get("node-00").Spec.IPAM.Pool)
		return got == alloc.DefaultPreAllocate+2, fmt.Sprintf("%d addresses", got)
	})
	// Settled: the rounds that follow the last writes write nothing.
	time.Sleep(time.Second)
	stopFirst()
	before := map[string]string{}
	for _, name := range names {
		before[name] = e.get(name).ResourceVersion
	}

	var writes atomic.Int64
	e.operator("op-second", func(c *Config) {
		c.Kube = countNodeWrites(c.Kube, &writes)
		c.Resync = 300 * time.Millisecond // resyncs too, several
	})
	second := e.op
	e.eventually(30*time.Second, "the new leader's round over every node", func() (bool, string) {
		if !second.Serving() {
			return false, "not serving"
		}
		for _, name := range names[:n] {
			if _, ok := second.NeededIPs(alloc.DefaultSpace, name); !ok {
				return false, name + " not reconciled yet"
			}
		}
		return true, ""
	})
	time.Sleep(2 * time.Second) // resyncs
	for _, name := range names {
		if rv := e.get(name).ResourceVersion; rv != before[name] {
			t.Errorf("%s: resourceVersion %s, was %s before the new leader: written", name, rv, before[name])
		}
	}
	if w := writes.Load(); w != 0 {
		t.Errorf("the new leader sent %d PUT or PATCH requests for CiliumNodes served before it led; want 0", w)
	}
}

// countNodeWrites answers a copy of rc that counts in n its PUT and PATCH
// requests to CiliumNodes (the Lease's renewals are not counted).
func countNodeWrites(rc *rest.Config, n *atomic.Int64) *rest.Config {
	rc = rest.CopyConfig(rc)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if (r.Method == http.MethodPut || r.Method == http.MethodPatch) && strings.Contains(r.URL.Path, "/ciliumnodes/") {
				n.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	return rc
}
