// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cilium/cilium/pkg/annotation"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"go.opentelemetry.io/otel/metric"

	"github.com/ipam-dev/ipam/internal/leader"
)

// Mode is the Cilium IPAM mode whose operator role the service plays.
type Mode string

const (
	// ModeCRD: single addresses in spec.ipam.pool / ipv6-pool (Cilium's
	// ipam.mode=crd with an external allocator).
	ModeCRD Mode = "crd"
	// ModeMultiPool: CIDRs per requested pool in spec.ipam.pools.allocated.
	ModeMultiPool Mode = "multi-pool"
	// ModeClusterPool: one CIDR per family in spec.ipam.podCIDRs.
	ModeClusterPool Mode = "cluster-pool"
)

// Modes lists the modes the operator can play.
var Modes = []Mode{ModeCRD, ModeMultiPool, ModeClusterPool}

// ParseMode checks a mode named on the command line.
func ParseMode(s string) (Mode, error) {
	for _, m := range Modes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown Cilium IPAM mode %q: want crd, multi-pool or cluster-pool", s)
}

// AnnotationIgnore is the annotation with which Cilium's operator leaves a
// CiliumNode to someone else; this operator honours it too.
const AnnotationIgnore = annotation.IPAMIgnore

// Defaults of Cilium's operator that this one keeps.
const (
	DefaultExcessIPReleaseDelay = 180 * time.Second
	DefaultResync               = time.Minute
	DefaultWorkers              = 50
	// Leader election (package leader): takeover within 12.4 s, inside
	// the 15 s the failover tests allow.
	DefaultLeaseDuration = leader.DefaultLeaseDuration
	DefaultRenewDeadline = leader.DefaultRenewDeadline
	DefaultRetryPeriod   = leader.DefaultRetryPeriod
)

// Config is how the operator runs.
type Config struct {
	Mode Mode
	// Space is the address space the cluster's addresses live in.
	Space string
	// DefaultPool serves nodes no pool's node selector picks.
	DefaultPool string
	// Kube reaches the API server. Its QPS and Burst bound every request
	// the operator makes.
	Kube *rest.Config
	// LeaseNamespace and LeaseName name the coordination.k8s.io Lease of
	// the leader election; Identity is this replica's name in it (the
	// host name when empty).
	LeaseNamespace, LeaseName, Identity       string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// ExcessIPReleaseDelay is how long an address stays excess before it
	// is marked for release (crd mode).
	ExcessIPReleaseDelay time.Duration
	// AWSReleaseExcessIPs lets the operator give back the excess
	// addresses of nodes whose pool is an AWS cloud pool, as Cilium's
	// --aws-release-excess-ips (false by default there and here). Nodes of
	// an Azure cloud pool never give excess back (Cilium v1.20.2's Azure
	// IPAM prepares no release); nodes of other pools always do.
	AWSReleaseExcessIPs bool
	// NodesGCInterval is Cilium's nodes-gc-interval: how often the
	// CiliumNodes of deleted Nodes are looked for, a CiliumNode being
	// deleted on the first pass at least this long after it was first
	// found without its Node (gc.go). 0 turns the collector off, as in
	// Cilium.
	NodesGCInterval time.Duration
	// ClusterPoolToMultiPoolMigration is Cilium's
	// enable-cluster-pool-to-multi-pool-migration (multi-pool mode): every
	// CiliumNode listing spec.ipam.podCIDRs has them moved, in the store
	// and in the object, to spec.ipam.pools.allocated under DefaultPool
	// before the first allocation (migrate.go).
	ClusterPoolToMultiPoolMigration bool
	// Resync re-examines every node this often (excess timers, drift).
	Resync time.Duration
	// Workers reconcile nodes in parallel; one node is never reconciled
	// by two workers at once.
	Workers int
	Logger  *slog.Logger
	// Meter receives the operator's metrics; nil records none.
	Meter metric.Meter
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// election is the Lease of the config.
func (c *Config) election(log *slog.Logger) leader.Election {
	return leader.Election{LeaseNamespace: c.LeaseNamespace, LeaseName: c.LeaseName, Identity: c.Identity,
		LeaseDuration: c.LeaseDuration, RenewDeadline: c.RenewDeadline, RetryPeriod: c.RetryPeriod, Logger: log}
}

func (c *Config) setDefaults() error {
	if c.Kube == nil {
		return errors.New("cilium operator: no Kubernetes configuration")
	}
	if _, err := ParseMode(string(c.Mode)); err != nil {
		return err
	}
	if c.ClusterPoolToMultiPoolMigration && c.Mode != ModeMultiPool {
		return fmt.Errorf("cilium operator: the cluster-pool to multi-pool migration runs in mode %s, not %s", ModeMultiPool, c.Mode)
	}
	if c.Space == "" {
		c.Space = "default"
	}
	if c.LeaseName == "" {
		c.LeaseName = "ipam-cilium-operator"
	}
	e := c.election(nil)
	if err := e.SetDefaults(); err != nil {
		return err
	}
	c.LeaseNamespace, c.Identity = e.LeaseNamespace, e.Identity
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = e.LeaseDuration, e.RenewDeadline, e.RetryPeriod
	if c.ExcessIPReleaseDelay == 0 {
		c.ExcessIPReleaseDelay = DefaultExcessIPReleaseDelay
	}
	if c.Resync == 0 {
		c.Resync = DefaultResync
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// reconciler is one mode's part: it brings the CiliumNode called name in
// line with the store, cn being the cached object (nil once deleted). It
// answers how soon the node needs another look (0: at the next resync).
type reconciler interface {
	reconcile(ctx context.Context, name string, cn *ciliumv2.CiliumNode) (time.Duration, error)
}

// Operator is the leader-elected controller of CiliumNodes.
type Operator struct {
	cfg    Config
	log    *slog.Logger
	cilium ciliumclient.Interface
	kube   kubernetes.Interface
	// leaseKube renews the leader Lease, on its own request budget.
	leaseKube kubernetes.Interface
	store     Store
	m         *metrics
	// needs is each crd-mode node's need after its last round (node
	// name -> int64), for the per-node ipam_needed_ips metric.
	needs sync.Map

	// Set while leading (nil otherwise), guarded by mu.
	mu    sync.Mutex
	nodes cache.Indexer // CiliumNodes
	kNode cache.Indexer // Kubernetes Nodes (labels for pool selection)
	// pending holds the Pods in phase Pending (crd mode), indexed by
	// node: the surge of an allocation round (pendingPods). Nil when
	// not leading or in another mode.
	pending cache.SharedIndexInformer
	state   *nodeStates
}

// New builds an operator; Run starts it.
func New(cfg Config, st Store) (*Operator, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Meter)
	if err != nil {
		return nil, err
	}
	work, lease := leader.SplitBudget(cfg.Kube, cfg.RetryPeriod)
	work, lease = m.countRequests(work), m.countRequests(lease)
	cc, err := ciliumclient.NewForConfig(work)
	if err != nil {
		return nil, fmt.Errorf("cilium client: %w", err)
	}
	kc, err := kubernetes.NewForConfig(work)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	lc, err := kubernetes.NewForConfig(lease)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	log := cfg.Logger.With("component", "cilium-operator", "mode", string(cfg.Mode))
	return &Operator{cfg: cfg, log: log, cilium: cc, kube: kc, leaseKube: lc, store: st, m: m}, nil
}

// MinKubeQPS and MinKubeBurst are the least limits that leave node
// writes a budget beside the Lease renewals (leader.SplitBudget).
const (
	MinKubeQPS   = 2
	MinKubeBurst = leader.LeaseBurst + 1
)

// Run campaigns for leadership until ctx ends, and while leading runs the
// controller. Losing the lease stops the controller (its writes stop with
// it) and campaigns again.
func (o *Operator) Run(ctx context.Context) error {
	return o.cfg.election(o.log).Run(ctx, o.leaseKube, func(ctx context.Context) {
		defer o.m.leading.Store(false)
		o.log.Info("leading: reconciling CiliumNodes", "identity", o.cfg.Identity)
		if err := o.lead(ctx); err != nil && ctx.Err() == nil {
			o.log.Error("controller stopped", "err", err)
		}
	})
}

// lead runs the controller until ctx ends (leadership lost or shutdown).
func (o *Operator) lead(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "ciliumnodes"})
	defer queue.ShutDown()

	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	cnInformer := cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(o.cilium.CiliumV2().RESTClient(), "ciliumnodes", metav1.NamespaceAll, fields.Everything()),
		&ciliumv2.CiliumNode{}, o.cfg.Resync, cache.Indexers{})
	if _, err := cnInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	nodeInformer := cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(o.kube.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll, fields.Everything()),
		&corev1.Node{}, 0, cache.Indexers{})
	if _, err := nodeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		// A node's labels pick its pool: a change is a reason to look.
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		// A CiliumNode deleted while its Node lived holds its addresses
		// for the agent; the Node's deletion lets them go (liveAgent).
		// The CiliumNode of a deleted Node is the garbage collector's.
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	o.mu.Lock()
	o.nodes, o.kNode = cnInformer.GetIndexer(), nodeInformer.GetIndexer()
	if o.cfg.Mode == ModeCRD {
		o.pending = o.pendingPodInformer()
		go o.pending.Run(ctx.Done())
	}
	o.state = newNodeStates()
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		o.nodes, o.kNode, o.state, o.pending = nil, nil, nil, nil
		o.mu.Unlock()
	}()

	go cnInformer.Run(ctx.Done())
	go nodeInformer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), cnInformer.HasSynced, nodeInformer.HasSynced) {
		return ctx.Err()
	}
	if o.pending != nil {
		// The first rounds count pending Pods too; but a replica that may
		// not list Pods serves without the surge rather than not at all.
		wait, cancelWait := context.WithTimeout(ctx, pendingSyncTimeout)
		if !cache.WaitForCacheSync(wait.Done(), o.pending.HasSynced) && ctx.Err() == nil {
			o.log.Warn("pending Pods not listed: allocation rounds ask for no surge until they are", "waited", pendingSyncTimeout)
		}
		cancelWait()
	}
	rec, err := o.reconcilerFor(o.cfg.Mode)
	if err != nil {
		return err
	}
	if r, ok := rec.(restorer); ok {
		var nodes []*ciliumv2.CiliumNode
		for _, obj := range cnInformer.GetStore().List() {
			if cn, ok := obj.(*ciliumv2.CiliumNode); ok {
				nodes = append(nodes, cn)
			}
		}
		if err := o.restoreAll(ctx, r, nodes); err != nil {
			return err
		}
		if mp, ok := rec.(*multiPoolReconciler); ok && o.cfg.ClusterPoolToMultiPoolMigration {
			o.log.Info("migrated the CiliumNodes listing podCIDRs from cluster-pool to multi-pool", "pool", o.cfg.DefaultPool,
				"migrated", mp.migrated.Load(), "refused", mp.refused.Load())
		}
	}
	o.m.leading.Store(true)
	o.log.Info("caches synced: serving CiliumNodes")
	// Nodes the store serves whose CiliumNode is gone (deleted while no
	// replica led) are reconciled as deleted.
	listStoreNodes := func(ctx context.Context) ([]string, error) { return o.store.CiliumNodes(ctx, o.cfg.Space) }
	if l, ok := rec.(storeNodeLister); ok {
		listStoreNodes = l.storeNodes
	}
	if orphans, err := listStoreNodes(ctx); err != nil {
		o.log.Warn("listing the store's Cilium nodes", "err", err)
	} else {
		for _, name := range orphans {
			queue.Add(name)
		}
	}
	var background sync.WaitGroup
	defer background.Wait()
	if o.cfg.NodesGCInterval > 0 {
		gc := &nodeGC{o: o, interval: o.cfg.NodesGCInterval, candidates: map[string]time.Time{}}
		background.Go(func() { gc.run(ctx) })
	}
	if b, ok := rec.(backgroundRunner); ok {
		background.Go(func() {
			b.run(ctx, func() {
				for _, key := range cnInformer.GetIndexer().ListKeys() {
					queue.Add(key)
				}
			})
		})
	}
	leader.Work(ctx, queue, o.cfg.Workers, func() bool { return o.processNext(ctx, queue, rec) })
	return nil
}

// storeNodeLister is a reconciler that names the store's nodes its mode
// serves (the crd mode's are the store's CiliumNodes).
type storeNodeLister interface {
	storeNodes(ctx context.Context) ([]string, error)
}

// backgroundRunner is a reconciler with work of its own while leading; it
// returns when ctx ends. requeueAll queues every CiliumNode.
type backgroundRunner interface {
	run(ctx context.Context, requeueAll func())
}

func (o *Operator) reconcilerFor(m Mode) (reconciler, error) {
	switch m {
	case ModeCRD:
		return &crdReconciler{o: o}, nil
	case ModeClusterPool:
		return &clusterPoolReconciler{o: o}, nil
	case ModeMultiPool:
		return &multiPoolReconciler{o: o}, nil
	}
	return nil, fmt.Errorf("cilium operator: mode %s is not implemented yet", m)
}

// processNext reconciles one queued node; false once the queue shuts down.
func (o *Operator) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], rec reconciler) bool {
	name, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(name)
	cn, err := o.cachedCiliumNode(name)
	// A conflict means the agent wrote in between: the round starts over
	// at once from a fresh read (the cache may lag the write it lost to).
	for attempt := 0; err == nil; attempt++ {
		var after time.Duration
		after, err = rec.reconcile(ctx, name, cn)
		if err == nil {
			o.m.round(ctx, "ok")
			q.Forget(name)
			if after > 0 {
				q.AddAfter(name, after)
			}
			return true
		}
		if !apierrors.IsConflict(err) || attempt == maxConflictRetries {
			break
		}
		o.m.round(ctx, "conflict")
		cn, err = o.cilium.CiliumV2().CiliumNodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cn, err = nil, nil
		}
	}
	if ctx.Err() != nil {
		return true
	}
	o.m.round(ctx, "error")
	o.log.Warn("reconciling CiliumNode", "node", name, "err", err)
	q.AddRateLimited(name)
	return true
}

// maxConflictRetries bounds the fresh-read retries of one round.
const maxConflictRetries = 4

// cachedCiliumNode is the informer's copy of the named CiliumNode, nil
// when it does not exist. Callers must not modify it.
func (o *Operator) cachedCiliumNode(name string) (*ciliumv2.CiliumNode, error) {
	o.mu.Lock()
	idx := o.nodes
	o.mu.Unlock()
	return leader.Lookup[ciliumv2.CiliumNode](idx, name)
}

// nodeLabels are the labels of the Kubernetes Node of that name, or, when
// there is none, those of the CiliumNode (the agent copies them there).
func (o *Operator) nodeLabels(name string, cn *ciliumv2.CiliumNode) map[string]string {
	if n := o.kubeNode(name); n != nil {
		return n.Labels
	}
	if cn != nil {
		return cn.Labels
	}
	return nil
}

// liveAgent says whether the node called name, whose CiliumNode cn is
// deleted or being deleted, still has its Kubernetes Node: its agent is
// then taken to be running and to recreate the CiliumNode, so the
// addresses and blocks it holds stay its own rather than going back to
// the pools while Pods may still use them. They go once the Node is gone
// (its deletion queues the name) or the CiliumNode comes back and is
// reconciled as usual. Cilium's operator releases a deleted CiliumNode's
// allocations at once; this is a deliberate difference (docs/cilium.md):
// another node must never be handed an address a running Pod holds.
func (o *Operator) liveAgent(name string) bool { return o.kubeNode(name) != nil }

// kubeNode is the cached Kubernetes Node of that name; nil when there is
// none, or when this replica does not lead.
func (o *Operator) kubeNode(name string) *corev1.Node {
	o.mu.Lock()
	idx := o.kNode
	o.mu.Unlock()
	n, err := leader.Lookup[corev1.Node](idx, name)
	if err != nil {
		return nil
	}
	return n
}

// pendingSyncTimeout bounds the wait for the pending Pods' first list.
const pendingSyncTimeout = 10 * time.Second

// podsByNode indexes Pods by spec.nodeName.
const podsByNode = "node"

// pendingPodInformer caches the Pods in phase Pending: a field selector
// keeps the cache to the Pods waiting (a Pod that starts running leaves
// it), where Cilium's operator caches every Pod for the same count.
func (o *Operator) pendingPodInformer() cache.SharedIndexInformer {
	lw := cache.NewListWatchFromClient(o.kube.CoreV1().RESTClient(), "pods", metav1.NamespaceAll,
		fields.OneTermEqualSelector("status.phase", string(corev1.PodPending)))
	return cache.NewSharedIndexInformer(lw, &corev1.Pod{}, 0, cache.Indexers{
		podsByNode: func(obj any) ([]string, error) {
			if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
				return []string{p.Spec.NodeName}, nil
			}
			return nil, nil
		},
	})
}

// pendingPods is how many Pods wait in phase Pending on the node, for
// the surge of an allocation round (Cilium's getPendingPodCount). Until
// the Pod cache has synced (or without the right to list Pods) it answers
// 0, and the round asks for no surge, as Cilium's does when it cannot
// count.
func (o *Operator) pendingPods(node string) int {
	o.mu.Lock()
	inf := o.pending
	o.mu.Unlock()
	if inf == nil || !inf.HasSynced() {
		return 0
	}
	pods, err := inf.GetIndexer().ByIndex(podsByNode, node)
	if err != nil {
		return 0
	}
	return len(pods)
}

// ignored says whether another party manages the node's IPAM.
func ignored(cn *ciliumv2.CiliumNode) bool {
	// Cilium's operator compares the value in lower case (nodewatcher.go):
	// "True" and "TRUE" leave the node alone too.
	return cn != nil && strings.ToLower(cn.Annotations[AnnotationIgnore]) == "true"
}

// NeededIPs is the addresses the node lacked after its last crd-mode round
// (Cilium's calculateNeededIPs over both families), as Cilium's operator
// reports it in ipam_needed_ips; ok is false when this replica has not
// reconciled the node since it took the lead.
func (o *Operator) NeededIPs(space, node string) (n int64, ok bool) {
	if space != o.cfg.Space {
		return 0, false
	}
	v, ok := o.needs.Load(node)
	if !ok {
		return 0, false
	}
	return v.(int64), true
}

// Serving reports whether this replica leads and has its caches synced:
// from then on a new CiliumNode is served as soon as its event arrives.
func (o *Operator) Serving() bool { return o.m.leading.Load() }

// stateOf is the memory of the current leadership.
func (o *Operator) stateOf() *nodeStates {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.state == nil {
		return newNodeStates() // not leading: a throwaway
	}
	return o.state
}

// write makes the CiliumNode cur into desired: its spec first (new
// addresses must be in the pool before anything refers to them), then its
// status, each with the resourceVersion read, so a write over a change
// the operator has not seen fails with a conflict and the node is
// reconciled again from a fresh read. It compares with Cilium's generated
// DeepEqual: apimachinery's semantic equality panics on the netip values
// of podCIDRs and pools.allocated.
func (o *Operator) write(ctx context.Context, cur, desired *ciliumv2.CiliumNode) error {
	nodes := o.cilium.CiliumV2().CiliumNodes()
	// Status first, as Cilium's operator writes it (syncToAPIServer): what
	// the agent needs to use an address (its interface, the release
	// handshake, why the pool is short) is there before the address is in
	// spec. The status subresource leaves spec as it was; the spec update
	// then carries the new resourceVersion.
	if !cur.Status.DeepEqual(&desired.Status) {
		spec := desired.Spec
		updated, err := nodes.UpdateStatus(ctx, desired, metav1.UpdateOptions{FieldManager: fieldManager})
		if err != nil {
			return fmt.Errorf("updating CiliumNode %s status: %w", cur.Name, err)
		}
		cur, desired = updated, updated.DeepCopy()
		desired.Spec = spec
	}
	if !cur.Spec.DeepEqual(&desired.Spec) {
		if _, err := nodes.Update(ctx, desired, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
			return fmt.Errorf("updating CiliumNode %s: %w", cur.Name, err)
		}
	}
	return nil
}

// fieldManager names this operator in the objects' managed fields.
const fieldManager = "ipam-cilium-operator"
