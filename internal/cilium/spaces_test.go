// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/kubetest"
	"github.com/ipam-dev/ipam/internal/store"
)

// TestTwoClustersOneDatabase: two clusters share one database, each in
// its own address space (the server's --cluster-space), with the same node
// names and the same pod range. Each operator serves its cluster's
// CiliumNodes from its own space alone: the store holds each cluster's
// node-a apart, the history and the usage report (the metrics' source)
// say each space's own, and deleting a CiliumNode in one cluster takes
// nothing from the node of the same name in the other.
func TestTwoClustersOneDatabase(t *testing.T) {
	st, dbURL := openTestStore(t)
	pool := alloc.PoolSpec{IPv4: v4(28, "10.40.0.0/24")} // the same range in both spaces
	spaces := []string{"east", "west"}
	pods := map[string]int{"east": 1, "west": 3} // Pods per node: each cluster's own count
	names := []string{"node-a", "node-b"}
	clusters := map[string]*crdEnv{}
	for _, space := range spaces {
		if _, err := st.CreateSpace(t.Context(), space); err != nil {
			t.Fatal(err)
		}
		if _, err := st.CreatePool(t.Context(), alloc.Pool{Space: space, Name: "default", Spec: pool}); err != nil {
			t.Fatal(err)
		}
		kc := kubetest.Start(t)
		kc.InstallCiliumCRDs(t)
		client, err := ciliumclient.NewForConfig(kc.Config())
		if err != nil {
			t.Fatal(err)
		}
		e := &crdEnv{t: t, kc: kc, st: st, client: client, ctx: t.Context(), dbURL: dbURL, space: space}
		e.operator("op-"+space, nil)
		clusters[space] = e
	}

	agents := map[string]map[string]*agent{}
	for _, space := range spaces {
		e := clusters[space]
		agents[space] = map[string]*agent{}
		for _, name := range names {
			ag := e.preAllocatedAgent(name, 4)
			ag.observe(e.get(name))
			for range pods[space] {
				if _, ok := ag.podStart(); !ok {
					t.Fatalf("%s/%s: no free address for a Pod", space, name)
				}
			}
			if _, err := ag.sync(e.ctx, true); err != nil {
				t.Fatal(err)
			}
			agents[space][name] = ag
		}
	}

	// Each space holds exactly its own CiliumNodes' addresses, the Pods'
	// ones active.
	held := func(space, node string) (all, active []string) {
		as, err := st.NodeAddresses(t.Context(), space, node)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			all = append(all, a.Addr.String())
			if a.State == alloc.StateActive {
				active = append(active, a.Addr.String())
			}
		}
		slices.Sort(all)
		slices.Sort(active)
		return all, active
	}
	for _, space := range spaces {
		e := clusters[space]
		for _, name := range names {
			e.eventually(servedWithin, space+"/"+name+" held as its CiliumNode lists", func() (bool, string) {
				cn := e.get(name)
				all, active := held(space, name)
				want := agents[space][name].usedAddresses()
				return slices.Equal(all, specPool(cn)) && slices.Equal(active, want),
					fmt.Sprintf("store %v (active %v); CiliumNode %v (used %v)", all, active, specPool(cn), want)
			})
		}
	}

	// The usage report, which the metrics export per space and node,
	// counts each cluster's own Pods, and a pool grown to them plus the
	// pre-allocation of 4: once the operator has grown it, which may come
	// a round after the pool above first matched the store.
	clusters[spaces[0]].eventually(servedWithin, "the usage report per space", func() (bool, string) {
		report, err := st.UsageReport(t.Context(), time.Minute)
		if err != nil {
			return false, err.Error()
		}
		seen := map[string]store.NodeTotals{}
		for _, n := range report.Nodes {
			seen[n.Space+"/"+n.Node] = n
		}
		for _, space := range spaces {
			for _, name := range names {
				n, ok := seen[space+"/"+name]
				if want := int64(pods[space]); !ok || n.CiliumPool != want+4 || n.CiliumUsed != want {
					return false, fmt.Sprintf("usage of %s/%s: %+v (present %v); want a pool of %d, %d used", space, name, n, ok, want+4, want)
				}
			}
		}
		return true, ""
	})

	// The history of a node name in one space tells of that space alone.
	for _, space := range spaces {
		events, _, err := st.History(t.Context(), alloc.HistoryFilter{Space: space, Node: "node-a"}, alloc.Page{Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		if len(events) == 0 {
			t.Errorf("%s: no history for node-a", space)
		}
		for _, ev := range events {
			if ev.Space != space || ev.Node != "node-a" {
				t.Errorf("%s's history of node-a holds %+v", space, ev)
			}
		}
	}

	// Deleting east's node-a (no Node object: no live agent holds it)
	// gives its addresses back in east only.
	westBefore, _ := held("west", "node-a")
	westPool := maps.Clone(clusters["west"].get("node-a").Spec.IPAM.Pool)
	clusters["east"].deleteNode("node-a")
	clusters["east"].eventually(servedWithin, "east's node-a released", func() (bool, string) {
		all, _ := held("east", "node-a")
		return len(all) == 0, fmt.Sprintf("east/node-a still holds %v", all)
	})
	if after, _ := held("west", "node-a"); !slices.Equal(after, westBefore) {
		t.Errorf("west's node-a held %v before east's was deleted, %v after", westBefore, after)
	}
	if got := clusters["west"].get("node-a").Spec.IPAM.Pool; !maps.Equal(got, westPool) {
		t.Errorf("west's CiliumNode node-a changed when east's was deleted: %v, was %v", got, westPool)
	}
}
