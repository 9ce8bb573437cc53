// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/cilium/pkg/hive"
	"github.com/cilium/cilium/pkg/ipam"
	ipamoption "github.com/cilium/cilium/pkg/ipam/option"
	"github.com/cilium/cilium/pkg/ipam/podippool"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	k8sclient "github.com/cilium/cilium/pkg/k8s/client"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	ciliumv2client "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned/typed/cilium.io/v2"
	ciliumv2alpha1client "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned/typed/cilium.io/v2alpha1"
	"github.com/cilium/cilium/pkg/k8s/resource"
	"github.com/cilium/cilium/pkg/k8s/utils"
	"github.com/cilium/cilium/pkg/node"
	nodetypes "github.com/cilium/cilium/pkg/node/types"
	"github.com/cilium/cilium/pkg/option"
	"github.com/cilium/hive/cell"
	"github.com/cilium/hive/job"
	"github.com/cilium/statedb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/util/workqueue"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// ciliumAgent is Cilium's own agent-side IPAM (pkg/ipam, v1.20.2) in
// multi-pool mode for one node, in this process: ipam.NewIPAM and
// ConfigureAllocator build the real multiPoolManager, which requests
// addresses in the node's spec.ipam.pools.requested, takes the CIDRs of
// spec.ipam.pools.allocated, hands out addresses through AllocateNext and
// ReleaseIP, and writes back the CIDRs it keeps. Around it, per node, is
// what the agent's hive would give it: a hive with its job group and
// statedb, Cilium's CiliumPodIPPool reflector (podippool.NewTableAndReflector)
// on the real API server, a CiliumNode resource watching only this node,
// and a local node store.
//
// What is not Cilium's: the clientset (ciliumOnlyClientset, only the
// cilium.io clients the path uses) and the CiliumNode resource's filter.
// The agent's own LocalCiliumNodeResource (daemon/k8s) filters on
// nodeTypes.GetName(), a process-wide name, so several agents in one
// process cannot use it; each here lists and watches its node by a
// metadata.name field selector, and filters on its name, instead. Nothing
// else on the multi-pool path reads nodeTypes.GetName(). The process-wide
// option.Config it does read (IPAMDefaultIPPool for PoolDefault, Debug,
// EnableUnreachableRoutes: off, which keeps cidrPool away from the host's
// routes) is the same for every agent, so sharing it changes nothing.
// The CiliumNode itself is created by the test, as Cilium's node
// discovery would, before the IPAM starts; Metadata is nil, so every
// call names its pool; NodeAddressing, MTUConfig, Sysctl and IPMasqAgent
// are nil, as multi-pool mode does not read them.
type ciliumAgent struct {
	name string
	h    *hive.Hive
	ipam *ipam.IPAM
	log  *slog.Logger
}

// ciliumOnlyClientset is a k8sclient.Clientset with only what the
// multi-pool path calls: the CiliumNode and CiliumPodIPPool clients of a
// real API server. Any other client is nil and would panic, which would
// show the path using it.
type ciliumOnlyClientset struct {
	k8sclient.Clientset
	cilium ciliumclient.Interface
}

func (c ciliumOnlyClientset) IsEnabled() bool { return true }

func (c ciliumOnlyClientset) CiliumV2() ciliumv2client.CiliumV2Interface {
	return c.cilium.CiliumV2()
}

func (c ciliumOnlyClientset) CiliumV2alpha1() ciliumv2alpha1client.CiliumV2alpha1Interface {
	return c.cilium.CiliumV2alpha1()
}

// ciliumLogger is the slog logger given to Cilium's code: warnings only.
func ciliumLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// startCiliumAgent starts node's agent IPAM with the pre-allocation per
// pool (--ipam-multi-pool-pre-allocation) and CiliumNode update rate
// (--ipam-cilium-node-update-rate). It returns once ConfigureAllocator
// has, that is once the operator has given every pre-allocated pool a
// CIDR; the node's CiliumNode must exist.
func startCiliumAgent(ctx context.Context, client ciliumclient.Interface, name string, prealloc map[string]string, updateRate time.Duration) (*ciliumAgent, error) {
	log := ciliumLogger()
	cs := ciliumOnlyClientset{cilium: client}
	var (
		jg         job.Group
		db         *statedb.DB
		pools      statedb.Table[podippool.LocalPodIPPool]
		nodeEvents resource.FilteredResource[*ciliumv2.CiliumNode]
	)
	h := hive.New(
		cell.Provide(
			func() k8sclient.Clientset { return cs },
			podippool.NewTableAndReflector,
			func(lc cell.Lifecycle, mp workqueue.MetricsProvider) resource.FilteredResource[*ciliumv2.CiliumNode] {
				lw := utils.ListerWatcherWithFields(
					utils.ListerWatcherFromTyped(client.CiliumV2().CiliumNodes()),
					fields.OneTermEqualSelector("metadata.name", name))
				all := resource.New[*ciliumv2.CiliumNode](lc, lw, mp, resource.WithMetric("CiliumNode"))
				return resource.NewFilteringResource(all, func(cn *ciliumv2.CiliumNode) bool { return cn.Name == name })
			},
		),
		cell.Invoke(func(jg_ job.Group, db_ *statedb.DB, pools_ statedb.Table[podippool.LocalPodIPPool],
			nodeEvents_ resource.FilteredResource[*ciliumv2.CiliumNode]) {
			jg, db, pools, nodeEvents = jg_, db_, pools_, nodeEvents_
		}),
	)
	if err := h.Start(log, ctx); err != nil {
		return nil, fmt.Errorf("agent %s: hive: %w", name, err)
	}
	cfg := &option.DaemonConfig{
		IPAM:                       ipamoption.IPAMMultiPool,
		EnableIPv4:                 true,
		IPAMMultiPoolPreAllocation: prealloc,
		IPAMCiliumNodeUpdateRate:   updateRate,
		IPAMDefaultIPPool:          "default",
	}
	a := &ciliumAgent{name: name, h: h, log: log}
	a.ipam = ipam.NewIPAM(ipam.NewIPAMParams{
		Logger:         log,
		AgentConfig:    cfg,
		LocalNodeStore: node.NewTestLocalNodeStore(node.LocalNode{Node: nodetypes.Node{Name: name}}),
		NodeResource:   nodeEvents,
		Clientset:      cs,
		JobGroup:       jg,
		DB:             db,
		PodIPPools:     pools,
	})
	configured := make(chan struct{})
	go func() {
		defer close(configured)
		a.ipam.ConfigureAllocator()
	}()
	select {
	case <-configured:
	case <-ctx.Done():
		// ConfigureAllocator waits on for the pool: its watches end
		// with the hive, its goroutine with the test binary.
		a.stop()
		return nil, fmt.Errorf("agent %s: ConfigureAllocator: %w", name, ctx.Err())
	}
	// As the agent does once it has restored its endpoints' addresses
	// (none here): from now on it releases the CIDRs it does not need.
	a.ipam.RestoreFinished()
	return a, nil
}

// stop stops the agent's jobs and watches.
func (a *ciliumAgent) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.h.Stop(a.log, ctx); err != nil {
		a.log.Warn("agent hive stop", "node", a.name, "error", err)
	}
}

// addressLedger is every address Cilium's agents hand out, by node, for
// as long as the Pod holds it: an address handed out while another node
// (or the same) holds it is a duplicate.
type addressLedger struct {
	// quiet is held shared by an agent's allocation or release together
	// with its entry here, exclusively by a check: a check sees every
	// address either held (and so in its node's CIDRs) or not at all.
	quiet sync.RWMutex
	mu    sync.Mutex
	held  map[netip.Addr]string
	dups  []string
	total int
}

func (l *addressLedger) took(node string, addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if other, dup := l.held[addr]; dup {
		l.dups = append(l.dups, fmt.Sprintf("%s handed to %s while %s holds it", addr, node, other))
	}
	l.held[addr] = node
	l.total++
}

func (l *addressLedger) gave(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.held, addr)
}

// byNode is the held addresses of each node.
func (l *addressLedger) byNode() map[string][]netip.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]netip.Addr{}
	for a, n := range l.held {
		out[n] = append(out[n], a)
	}
	return out
}

// outsideAllocated is every held address not in its node's
// spec.ipam.pools.allocated as the API server has it now: a used
// address whose CIDR was taken away.
func (l *addressLedger) outsideAllocated(ctx context.Context, client ciliumclient.Interface) ([]string, error) {
	l.quiet.Lock()
	defer l.quiet.Unlock()
	held := l.byNode()
	list, err := client.CiliumV2().CiliumNodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, cn := range list.Items {
		var cidrs []netip.Prefix
		for _, c := range allocatedCIDRs(&cn, "default") {
			cidrs = append(cidrs, netip.MustParsePrefix(c))
		}
		for _, a := range held[cn.Name] {
			if !slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Contains(a) }) {
				out = append(out, fmt.Sprintf("%s of %s (allocated %v)", a, cn.Name, cidrs))
			}
		}
	}
	return out, nil
}

// The multi-pool operator serves Cilium's own agent IPAM (ciliumAgent:
// Cilium v1.20.2's ipam.NewIPAM, ConfigureAllocator, AllocateNextFamily,
// ReleaseIP, in this process, one per node) on a real API server, and
// midway the operator stops and a second replica takes over (see
// ciliumAgentChurn for what holds throughout).
func TestMultiPoolWithCiliumAgent(t *testing.T) {
	ciliumAgentChurn(t, "10.112.0.0/20", 12*time.Second, func(e *crdEnv) (handOver func()) {
		multiPool := func(c *Config) { c.Mode = ModeMultiPool }
		stopFirst := e.operator("op-1", multiPool)
		return func() {
			stopFirst()
			e.operator("op-2", multiPool)
		}
	})
}

// As TestMultiPoolWithCiliumAgent, the leader a process of its own that
// is SIGKILLed mid-churn, its Lease left to expire: the agents run short
// of blocks until the other replica takes over, and nothing is handed out
// twice meanwhile.
func TestMultiPoolLeaderKilledWithCiliumAgent(t *testing.T) {
	e := ciliumAgentChurn(t, "10.113.0.0/20", 8*time.Second, func(e *crdEnv) (handOver func()) {
		replica := func(identity string) *exec.Cmd {
			return e.startOperatorProcessOf(operatorProcess{Database: e.dbURL, Identity: identity, Cooldown: time.Second,
				Mode: ModeMultiPool, BlockReleaseHoldOff: time.Second})
		}
		first := replica("replica-a")
		e.eventually(20*time.Second, "replica-a leads", func() (bool, string) { l := e.leader(); return l == "replica-a", "leader " + l })
		replica("replica-b")
		return func() {
			if err := first.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	})
	if l := e.leader(); l != "replica-b" {
		t.Errorf("leader %q after replica-a's SIGKILL; want replica-b", l)
	}
}

// ciliumAgentChurn runs the operator (started by operators, on a store
// whose pool default is /28 blocks of pool) with 20 Cilium agents for
// 25 s, calling handOver takeover into it. On each node Pods come and go
// in waves of up to 30 (pre-allocation 8, /28 blocks of 14 usable
// addresses: a wave top needs three blocks, its bottom one), so the
// agents request blocks and give them back. Throughout, no address is
// handed out twice across the agents and no used address's CIDR leaves
// its node's allocated; blocks never overlap between nodes; after the
// hand-over the agents still grow to the wave top and blocks are carved.
// Once settled every node's allocated is what the store holds for it,
// every agent's own record (Dump) is the Pods' addresses, and the
// store's consistency check is clean.
func ciliumAgentChurn(t *testing.T, pool string, takeover time.Duration, operators func(*crdEnv) (handOver func())) *crdEnv {
	const (
		nodes    = 20
		peak     = 30
		wave     = 5 * time.Second // growing, then as long shrinking
		churnFor = 25 * time.Second
	)
	e := newBlockEnv(t, time.Second, map[string]alloc.PoolSpec{"default": {IPv4: v4(28, pool)}})
	handOver := operators(e)

	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("cilium-agent-%02d", i)
		// As Cilium's node discovery does before the IPAM starts.
		e.createNode(names[i], nil)
	}
	agents := make([]*ciliumAgent, nodes)
	startCtx, cancelStart := context.WithTimeout(e.ctx, 30*time.Second)
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Go(func() {
			// Its own client, with its own request budget, as every
			// agent has.
			client, err := ciliumclient.NewForConfig(e.kc.Config())
			if err != nil {
				t.Error(err)
				return
			}
			a, err := startCiliumAgent(startCtx, client, name, map[string]string{"default": "8"}, 100*time.Millisecond)
			if err != nil {
				t.Error(err)
				return
			}
			agents[i] = a
		})
	}
	wg.Wait()
	cancelStart()
	for _, a := range agents {
		if a != nil {
			t.Cleanup(a.stop)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	ledger := &addressLedger{held: map[netip.Addr]string{}}
	began := time.Now()
	ctx, cancel := context.WithTimeout(e.ctx, churnFor)
	defer cancel()
	var (
		handedOver     time.Time
		handedOverMu   sync.Mutex
		topAfterChange = make([]bool, nodes)
		waits          atomic.Int64
	)
	afterHandOver := func() bool {
		handedOverMu.Lock()
		defer handedOverMu.Unlock()
		return !handedOver.IsZero()
	}
	for i, a := range agents {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 34))
			var pods []netip.Addr
			for step := 0; ctx.Err() == nil; step++ {
				growing := (time.Since(began)/wave)%2 == 0
				switch {
				case growing && len(pods) < peak:
					ledger.quiet.RLock()
					res, err := a.ipam.AllocateNextFamily(ipam.IPv4, fmt.Sprintf("churn/%s-%d", a.name, step), "default")
					if err == nil {
						ledger.took(a.name, res.IP)
						pods = append(pods, res.IP)
					}
					ledger.quiet.RUnlock()
					if err != nil {
						// Out of addresses: the agent has asked for more.
						waits.Add(1)
						time.Sleep(100 * time.Millisecond)
					}
				case growing:
					if afterHandOver() {
						topAfterChange[i] = true
					}
				case len(pods) > 0:
					k := rng.IntN(len(pods))
					ledger.quiet.RLock()
					if err := a.ipam.ReleaseIP(pods[k], "default"); err != nil {
						t.Errorf("%s: release %s: %v", a.name, pods[k], err)
					}
					ledger.gave(pods[k])
					ledger.quiet.RUnlock()
					pods = slices.Delete(pods, k, k+1)
				}
				time.Sleep(40 * time.Millisecond)
			}
		})
	}
	checks := 0
	check := func() {
		checks++
		e.noCIDROnTwoNodes("default")
		lost, err := ledger.outsideAllocated(e.ctx, e.client)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lost {
			t.Errorf("used address outside its node's CIDRs: %s", l)
		}
	}
	for ctx.Err() == nil {
		if !afterHandOver() && time.Since(began) > takeover {
			handOver()
			handedOverMu.Lock()
			handedOver = time.Now()
			handedOverMu.Unlock()
		}
		check()
		time.Sleep(250 * time.Millisecond)
	}
	wg.Wait()
	check()
	if len(ledger.dups) > 0 {
		t.Errorf("addresses handed out twice: %v", ledger.dups)
	}
	for i, top := range topAfterChange {
		if !top {
			t.Errorf("%s did not reach %d Pods after the hand-over", names[i], peak)
		}
	}

	held := ledger.byNode()
	for _, a := range agents {
		e.eventually(20*time.Second, a.name+" agrees with the store", func() (bool, string) {
			got, want := e.storeBlocks(a.name), allocatedCIDRs(e.get(a.name), "default")
			return slices.Equal(got, want), fmt.Sprintf("store %v, allocated %v", got, want)
		})
		dump, _, _ := a.ipam.Dump()
		var recorded, pods []string
		for ip := range dump {
			recorded = append(recorded, ip)
		}
		for _, p := range held[a.name] {
			pods = append(pods, p.String())
		}
		slices.Sort(recorded)
		slices.Sort(pods)
		if !slices.Equal(recorded, pods) {
			t.Errorf("%s: Cilium's record %v, the Pods' addresses %v", a.name, recorded, pods)
		}
	}
	check()

	kinds := map[alloc.EventKind]int{}
	carvedAfter := 0
	for _, n := range names {
		events, _, err := e.st.History(e.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: n}, alloc.Page{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events {
			kinds[ev.Kind]++
			if ev.Kind == alloc.EventBlockCarve && ev.At.After(handedOver) {
				carvedAfter++
			}
		}
	}
	if kinds[alloc.EventBlockRelease] == 0 || kinds[alloc.EventBlockCarve] <= nodes || carvedAfter == 0 {
		t.Errorf("block events %v, %d carves after the hand-over: the churn did not make blocks come and go", kinds, carvedAfter)
	}
	t.Logf("%d nodes, %v: %d addresses handed out, %d waits for a block, %d checks; block events %v, %d carves after the hand-over",
		nodes, churnFor, ledger.total, waits.Load(), checks, kinds, carvedAfter)
	e.consistent()
	return e
}
