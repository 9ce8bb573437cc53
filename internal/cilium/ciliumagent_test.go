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
	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
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
	"github.com/ipam-dev/ipam/internal/kubetest"
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

func (a *ciliumAgent) nodeName() string { return a.name }

func (a *ciliumAgent) allocate(owner string) (netip.Addr, error) {
	res, err := a.ipam.AllocateNextFamily(ipam.IPv4, owner, "default")
	if err != nil {
		return netip.Addr{}, err
	}
	return res.IP, nil
}

func (a *ciliumAgent) release(addr netip.Addr) error { return a.ipam.ReleaseIP(addr, "default") }

func (a *ciliumAgent) recorded() ([]string, error) {
	dump, _, _ := a.ipam.Dump()
	out := make([]string, 0, len(dump))
	for ip := range dump {
		out = append(out, ip)
	}
	slices.Sort(out)
	return out, nil
}

// outOfAddresses: every error of AllocateNextFamily in multi-pool mode
// says the node's CIDRs are full (the agent has asked for more).
func (a *ciliumAgent) outOfAddresses(error) bool { return true }

// agentIPAM is one node's Cilium agent IPAM as the churn drives it:
// ciliumAgent (multi-pool, in this process) or crdAgent (crd, a process
// of its own).
type agentIPAM interface {
	nodeName() string
	// allocate hands the Pod owner an address of the node's.
	allocate(owner string) (netip.Addr, error)
	// release takes back an address allocate gave.
	release(addr netip.Addr) error
	// recorded is the agent's own record of the addresses in use (Dump),
	// sorted.
	recorded() ([]string, error)
	// outOfAddresses tells whether allocate's error means the node has
	// no free address now (wait for the operator) rather than a failure.
	outOfAddresses(err error) bool
}

// addressLedger is every address Cilium's agents hand out, by node, for
// as long as the Pod holds it: an address handed out while another node
// (or the same) holds it is a duplicate.
type addressLedger struct {
	// quiet is held shared by an agent's allocation or release together
	// with its entry here, exclusively by a check: a check sees every
	// address either held (and so in its node's CiliumNode) or not at all.
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

// outsideNode is every held address that its node's CiliumNode, as the
// API server has it now, no longer gives it (mode.gives): a used address
// taken away. It also returns the CiliumNodes it read.
func (l *addressLedger) outsideNode(ctx context.Context, client ciliumclient.Interface, mode agentMode) ([]string, []ciliumv2.CiliumNode, error) {
	l.quiet.Lock()
	defer l.quiet.Unlock()
	held := l.byNode()
	list, err := client.CiliumV2().CiliumNodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	var out []string
	for _, cn := range list.Items {
		for _, a := range held[cn.Name] {
			if !mode.gives(&cn, a) {
				out = append(out, fmt.Sprintf("%s of %s (node has %s)", a, cn.Name, mode.describe(&cn)))
			}
		}
	}
	return out, list.Items, nil
}

// agentMode is what differs between the IPAM modes in
// ciliumAgentThroughFaults: how the operator replicas and the agents
// start, what a CiliumNode gives its node, and what "the store and the
// CiliumNode agree" means.
type agentMode struct {
	// replica is the settings of an operator replica process.
	replica operatorProcess
	// peak is the Pods a node grows to in a wave.
	peak int
	// startAgents creates the nodes' CiliumNodes, as Cilium's node
	// discovery does, and starts their agents, returning once every
	// agent's allocator is configured.
	startAgents func(e *crdEnv, names []string) []agentIPAM
	// gives tells whether cn gives its node addr to hand out.
	gives func(cn *ciliumv2.CiliumNode, addr netip.Addr) bool
	// describe is what cn gives, for a failure.
	describe func(cn *ciliumv2.CiliumNode) string
	// onTwoNodes lists what two CiliumNodes give at once (a CIDR, an
	// address): the duplicate of tomorrow.
	onTwoNodes func(nodes []ciliumv2.CiliumNode) []string
	// agrees tells whether the store holds for node what its CiliumNode
	// gives it.
	agrees func(e *crdEnv, node string) (bool, string)
	// churned checks, from the store's history, that the churn made the
	// nodes' addresses come and go, also after the faults.
	churned func(e *crdEnv, kinds, afterFaults map[alloc.EventKind]int, handshakeAnswers int)
}

// The acceptance scenario of multi-pool mode with Cilium's own agent
// IPAM (ciliumAgent: Cilium v1.20.2's ipam.NewIPAM, ConfigureAllocator,
// AllocateNextFamily, ReleaseIP, in this process, one per node):
// see ciliumAgentThroughFaults. On each node Pods come and go in waves of
// up to 30 (pre-allocation 8, /28 blocks of 14 usable addresses: a wave
// top needs three blocks, its bottom one), so the agents request blocks
// and give them back.
func TestMultiPoolWithCiliumAgentThroughFaults(t *testing.T) {
	e := newBlockEnv(t, time.Second, map[string]alloc.PoolSpec{"default": {IPv4: v4(28, "10.112.0.0/18")}}, apiServerEndsWatches)
	ciliumAgentThroughFaults(t, e, agentMode{
		replica: operatorProcess{Cooldown: time.Second, Mode: ModeMultiPool, BlockReleaseHoldOff: time.Second},
		peak:    30,
		startAgents: func(e *crdEnv, names []string) []agentIPAM {
			agents := make([]agentIPAM, len(names))
			startCtx, cancelStart := context.WithTimeout(e.ctx, 60*time.Second)
			defer cancelStart()
			var wg sync.WaitGroup
			for i, name := range names {
				e.createNode(name, nil)
				wg.Go(func() {
					// Its own client, with its own request budget, as every
					// agent has.
					client, err := ciliumclient.NewForConfig(e.kc.Config())
					if err != nil {
						t.Error(err)
						return
					}
					a, err := startCiliumAgent(startCtx, client, name, map[string]string{"default": "8"}, ciliumAgentUpdateRate)
					if err != nil {
						t.Error(err)
						return
					}
					t.Cleanup(a.stop)
					agents[i] = a
				})
			}
			wg.Wait()
			return agents
		},
		gives: func(cn *ciliumv2.CiliumNode, addr netip.Addr) bool {
			return slices.ContainsFunc(allocatedCIDRs(cn, "default"), func(c string) bool {
				return netip.MustParsePrefix(c).Contains(addr)
			})
		},
		describe: func(cn *ciliumv2.CiliumNode) string { return fmt.Sprint(allocatedCIDRs(cn, "default")) },
		onTwoNodes: func(nodes []ciliumv2.CiliumNode) []string {
			return onTwoNodes(nodes, func(cn *ciliumv2.CiliumNode) []string { return allocatedCIDRs(cn, "default") })
		},
		agrees: func(e *crdEnv, node string) (bool, string) {
			got, want := e.storeBlocks(node), allocatedCIDRs(e.get(node), "default")
			return slices.Equal(got, want), fmt.Sprintf("store %v, allocated %v", got, want)
		},
		churned: func(e *crdEnv, kinds, afterFaults map[alloc.EventKind]int, _ int) {
			if kinds[alloc.EventBlockRelease] == 0 || afterFaults[alloc.EventBlockCarve] == 0 || afterFaults[alloc.EventBlockRelease] == 0 {
				e.t.Errorf("block events %v, after the faults %v: the churn did not make blocks come and go", kinds, afterFaults)
			}
		},
	})
}

// The acceptance scenario of crd mode with Cilium's own agent IPAM
// (crdAgent: Cilium v1.20.2's ipam.NewIPAM and ConfigureAllocator in crd
// mode, one process per node): see ciliumAgentThroughFaults. On each node
// Pods come and go in waves of up to 12 (pre-allocate 4, max above
// watermark 2), so the operator tops the pool up and, past the release
// delay, takes the excess back through Cilium's release handshake, which
// the agents answer with Cilium's code.
func TestCRDWithCiliumAgentThroughFaults(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(27, "10.71.0.0/16")}, apiServerEndsWatches)
	ciliumAgentThroughFaults(t, e, agentMode{
		replica: operatorProcess{Cooldown: time.Second},
		peak:    12,
		startAgents: func(e *crdEnv, names []string) []agentIPAM {
			kubeconfig := e.kc.Kubeconfig(t, e.kc.Config())
			procs := make([]*crdAgent, len(names))
			for i, name := range names {
				e.createNode(name, func(cn *ciliumv2.CiliumNode) {
					cn.Spec.IPAM = ipamtypes.IPAMSpec{PreAllocate: 4, MaxAboveWatermark: 2}
				})
				p, err := e.startCRDAgent(name, ciliumAgentUpdateRate, kubeconfig)
				if err != nil {
					t.Fatal(err)
				}
				procs[i] = p
			}
			agents := make([]agentIPAM, len(names))
			var wg sync.WaitGroup
			for i, p := range procs {
				wg.Go(func() {
					// Fifty processes starting on a loaded machine, each
					// polling for its pre-allocation every 5 s.
					if err := p.ready(90 * time.Second); err != nil {
						t.Error(err)
						return
					}
					agents[i] = p
				})
			}
			wg.Wait()
			return agents
		},
		gives: func(cn *ciliumv2.CiliumNode, addr netip.Addr) bool {
			_, ok := cn.Spec.IPAM.Pool[addr.String()]
			return ok
		},
		describe:   func(cn *ciliumv2.CiliumNode) string { return fmt.Sprint(specPool(cn)) },
		onTwoNodes: func(nodes []ciliumv2.CiliumNode) []string { return onTwoNodes(nodes, specPool) },
		agrees: func(e *crdEnv, node string) (bool, string) {
			got, want := specPool(e.get(node)), e.heldByStore(node)
			return slices.Equal(got, want), fmt.Sprintf("spec %v, store %v", got, want)
		},
		churned: func(e *crdEnv, kinds, afterFaults map[alloc.EventKind]int, handshakeAnswers int) {
			if handshakeAnswers == 0 || kinds[alloc.EventRelease] == 0 || afterFaults[alloc.EventLease] == 0 || afterFaults[alloc.EventRelease] == 0 {
				e.t.Errorf("events %v, after the faults %v, %d ready-for-release answers seen: the churn did not make addresses come and go through the handshake",
					kinds, afterFaults, handshakeAnswers)
			}
		},
	})
}

// ciliumAgentUpdateRate is the agents' --ipam-cilium-node-update-rate:
// Cilium's default is 15 s; 1 s lets a 60 s churn make the pools come and
// go several times, and keeps 50 agents' writes to about 50 a second.
const ciliumAgentUpdateRate = time.Second

// apiServerEndsWatches lets the API server's graceful stop end open
// watches after 2 s. With kube-apiserver's default (0) the watches of 50
// agents and two operators hold the process past SIGTERM until kubetest's
// 30 s grace ends in a SIGKILL: a restart took 32 s with 100 watches
// open, against 4 s with none or with this flag.
var apiServerEndsWatches = kubetest.WithAPIServerFlags("--shutdown-watch-termination-grace-period=2s")

// onTwoNodes is every item of what (a CIDR, an address) listed on two
// nodes.
func onTwoNodes(nodes []ciliumv2.CiliumNode, what func(*ciliumv2.CiliumNode) []string) []string {
	seen := map[string]string{}
	var out []string
	for _, cn := range nodes {
		for _, x := range what(&cn) {
			if other, dup := seen[x]; dup {
				out = append(out, fmt.Sprintf("%s on %s and %s", x, other, cn.Name))
			}
			seen[x] = cn.Name
		}
	}
	return out
}

// ciliumAgentThroughFaults is issue 34's acceptance scenario for one
// mode: two operator replicas, each a process of its own, and 50 nodes
// whose agents are Cilium's own agent IPAM. On each node Pods come and go
// in waves (growing for 6 s to mode.peak, then as long shrinking) for
// 60 s, and on until every node has grown to the top in a wave begun
// after the faults (a minute at most). At 8 s the leading replica is SIGKILLed, its Lease left to
// expire, and the other takes over; at 26 s the API server restarts
// (apiServerEndsWatches). Throughout, checked four times a second: no address is
// handed to two Pods at once across the nodes, no used address leaves
// what its node's CiliumNode gives it, nothing is given to two nodes at
// once. After the faults every node still grows to the wave top, and the
// churn went on (mode.churned). Once settled every node's CiliumNode is
// what the store holds for it, every agent's own record (Dump) is its
// Pods' addresses, and the store's consistency check is clean.
func ciliumAgentThroughFaults(t *testing.T, e *crdEnv, mode agentMode) {
	const (
		nodes    = 50
		wave     = 6 * time.Second // growing, then as long shrinking
		churnFor = 60 * time.Second
		// afterFaultsBound is how long past the faults the churn waits
		// for every node to grow to the top: two reflector backoff caps.
		afterFaultsBound = 60 * time.Second
		killAt           = 8 * time.Second
		restartAt        = 26 * time.Second
		step             = 100 * time.Millisecond // between a node's Pod starts or stops
	)
	replica := func(identity string) *exec.Cmd {
		p := mode.replica
		p.Database, p.Identity = e.dbURL, identity
		return e.startOperatorProcessOf(p)
	}
	first := replica("replica-a")
	e.eventually(30*time.Second, "replica-a leads", func() (bool, string) { l := e.leader(); return l == "replica-a", "leader " + l })
	replica("replica-b")

	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("cilium-agent-%02d", i)
	}
	started := time.Now()
	agents := mode.startAgents(e, names)
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d agents started in %v", nodes, time.Since(started).Round(100*time.Millisecond))

	ledger := &addressLedger{held: map[netip.Addr]string{}}
	began := time.Now()
	// The churn lasts churnFor, and past the faults until every node has
	// grown to the wave top (at most afterFaultsBound). After an API
	// server restart client-go's reflectors, the operator's and the
	// agents' (Cilium's as ours), come back on their own backoff (0.8 s
	// doubling with up to 100% jitter, capped at 30 s), so after a 20 s
	// outage a watch may resume 25 s later: a fixed 60 s left one 6 s wave
	// after the restart of CI stop 42, and 5 of 50 nodes missed it.
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var (
		faultsOver     atomic.Pointer[time.Time]
		topAfterFaults = make([]atomic.Bool, nodes)
		waits          atomic.Int64
		wg             sync.WaitGroup
	)
	churnOver := func() bool {
		over := faultsOver.Load()
		if time.Since(began) < churnFor || over == nil || time.Since(*over) < 2*wave {
			return false
		}
		for i := range topAfterFaults {
			if !topAfterFaults[i].Load() {
				return time.Since(*over) >= afterFaultsBound
			}
		}
		return true
	}
	for i, a := range agents {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 34))
			var pods []netip.Addr
			for n := 0; ctx.Err() == nil; n++ {
				inChurn := time.Since(began)
				growing := (inChurn/wave)%2 == 0
				switch {
				case growing && len(pods) < mode.peak:
					ledger.quiet.RLock()
					addr, err := a.allocate(fmt.Sprintf("churn/%s-%d", a.nodeName(), n))
					if err == nil {
						ledger.took(a.nodeName(), addr)
						pods = append(pods, addr)
					}
					ledger.quiet.RUnlock()
					if err != nil && !a.outOfAddresses(err) {
						t.Errorf("%s: allocate: %v", a.nodeName(), err)
						return
					}
					if err != nil {
						// Out of addresses: the agent has asked for more.
						waits.Add(1)
					}
				case growing:
					// At the top in a wave that began growing after the
					// faults.
					waveBegan := began.Add(inChurn / (2 * wave) * (2 * wave))
					if over := faultsOver.Load(); over != nil && waveBegan.After(*over) {
						topAfterFaults[i].Store(true)
					}
				case len(pods) > 0:
					k := rng.IntN(len(pods))
					ledger.quiet.RLock()
					err := a.release(pods[k])
					ledger.gave(pods[k])
					ledger.quiet.RUnlock()
					if err != nil {
						t.Errorf("%s: release %s: %v", a.nodeName(), pods[k], err)
						return
					}
					pods = slices.Delete(pods, k, k+1)
				}
				time.Sleep(step)
			}
		})
	}

	checks := 0
	handshakeAnswers := map[string]bool{}
	check := func() {
		checks++
		lost, cns, err := ledger.outsideNode(e.ctx, e.client, mode)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lost {
			t.Errorf("used address taken from its node: %s", l)
		}
		for _, d := range mode.onTwoNodes(cns) {
			t.Errorf("given to two nodes: %s", d)
		}
		for _, cn := range cns {
			for ip, st := range cn.Status.IPAM.ReleaseIPs {
				if st == releaseReady {
					handshakeAnswers[cn.Name+"/"+ip] = true
				}
			}
		}
	}
	killed, restarted := false, false
	var killedAt time.Time
	takeover := time.Duration(0)
	for ctx.Err() == nil && !churnOver() {
		switch {
		case !killed && time.Since(began) > killAt:
			killed, killedAt = true, time.Now()
			if err := first.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		case !restarted && time.Since(began) > restartAt:
			restarted = true
			e.kc.RestartAPIServer(t)
			over := time.Now()
			faultsOver.Store(&over)
			t.Logf("API server restarted %v into the churn, back %v later", restartAt, time.Since(began)-restartAt)
		}
		if killed && takeover == 0 && e.leader() == "replica-b" {
			takeover = time.Since(killedAt)
		}
		check()
		time.Sleep(250 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	check()
	if len(ledger.dups) > 0 {
		t.Errorf("addresses handed out twice: %v", ledger.dups)
	}
	if takeover == 0 || e.leader() != "replica-b" {
		t.Errorf("leader %q after replica-a's SIGKILL; want replica-b within the churn", e.leader())
	}
	for i := range topAfterFaults {
		if !topAfterFaults[i].Load() {
			t.Errorf("%s did not grow to %d Pods after the faults", names[i], mode.peak)
		}
	}

	held := ledger.byNode()
	for _, a := range agents {
		e.eventually(45*time.Second, a.nodeName()+" agrees with the store", func() (bool, string) { return mode.agrees(e, a.nodeName()) })
		recorded, err := a.recorded()
		if err != nil {
			t.Fatal(err)
		}
		var pods []string
		for _, p := range held[a.nodeName()] {
			pods = append(pods, p.String())
		}
		slices.Sort(pods)
		if !slices.Equal(recorded, pods) {
			t.Errorf("%s: Cilium's record %v, the Pods' addresses %v", a.nodeName(), recorded, pods)
		}
	}
	check()

	kinds, afterFaults := map[alloc.EventKind]int{}, map[alloc.EventKind]int{}
	for _, n := range names {
		page := alloc.Page{Limit: 1000}
		for {
			events, next, err := e.st.History(e.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: n}, page)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range events {
				kinds[ev.Kind]++
				if over := faultsOver.Load(); over != nil && ev.At.After(*over) {
					afterFaults[ev.Kind]++
				}
			}
			if next == "" {
				break
			}
			page.Continue = next
		}
	}
	mode.churned(e, kinds, afterFaults, len(handshakeAnswers))
	t.Logf("%d nodes, %v: %d addresses handed out, %d waits for addresses, %d checks, takeover %v after the SIGKILL; events %v, after the faults %v; %d ready-for-release answers",
		nodes, time.Since(began).Round(time.Second), ledger.total, waits.Load(), checks, takeover.Round(100*time.Millisecond), kinds, afterFaults, len(handshakeAnswers))
	e.consistent()
}
