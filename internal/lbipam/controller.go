// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package lbipam plays Cilium's LB IPAM (operator/pkg/lbipam) for
// Kubernetes Services of type LoadBalancer: each Service the controller
// serves is a VIP owner of the store (namespace and name), its request
// read from the Service's spec and annotations, and the addresses the
// store gave it written to status.loadBalancer.ingress with the condition
// cilium.io/IPAMRequestSatisfied. PostgreSQL stays the system of record:
// every status write follows a committed assignment, and a pool edit never
// moves a Service's address (the store keeps it, reported stranded).
//
// The controller is leader-elected (package leader) on a Lease of its
// own, beside the Cilium operator role's.
package lbipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/leader"
)

// Values of Config.DefaultIPAM, as Cilium's defaultLBServiceIPAM.
const (
	DefaultLBIPAM   = "lbipam"
	DefaultNodeIPAM = "nodeipam"
	DefaultNone     = "none"
)

// Store is what the controller needs of the store.
type Store interface {
	// AssignVIPs answers what the owner holds after the request; an
	// unsatisfied request is an answer, not an error.
	AssignVIPs(ctx context.Context, r alloc.VIPRequest) (alloc.VIPAssignment, error)
	// GetVIPs answers KindNotFound for an unknown owner.
	GetVIPs(ctx context.Context, space string, o alloc.VIPOwner) (alloc.VIPAssignment, error)
	// ReleaseVIPs is no error when the owner holds nothing; a generation
	// other than 0 that is not the owner's is KindStaleGeneration.
	ReleaseVIPs(ctx context.Context, space string, o alloc.VIPOwner, generation int64) error
	ListVIPOwners(ctx context.Context, space string, page alloc.Page) ([]alloc.VIPAssignment, string, error)
}

// ChangeListener is a Store that announces the changes that can serve a
// waiting Service, and the owners whose pool was deleted
// (store.ListenLBChanges): with one, the controller re-evaluates its
// waiting Services and those owners' Services at once, as Cilium does on
// every pool and Service event; without, at its resync.
type ChangeListener interface {
	ListenLBChanges(ctx context.Context, changed func(alloc.LBChange)) error
}

// Config is how the controller runs.
type Config struct {
	// Space is the address space of the cluster's VIP pools.
	Space string
	// Kube reaches the API server; its QPS and Burst bound every request.
	Kube *rest.Config
	// Election names the Lease (default name ipam-lbipam).
	Election leader.Election
	// DefaultIPAM serves Services without a loadBalancerClass (Cilium's
	// defaultLBServiceIPAM): DefaultLBIPAM (the default), DefaultNodeIPAM
	// (needs NodeIPAM) or DefaultNone. Classes are the classes LB IPAM
	// serves besides (default Cilium's: l2-announcer and
	// bgp-control-plane); with NodeIPAM, io.cilium/node is Node IPAM's.
	// Any other class is left alone.
	DefaultIPAM string
	Classes     []string
	// NodeIPAM publishes node addresses for the Services of class
	// io.cilium/node (Cilium's nodeIPAM.enabled); it watches Nodes and
	// EndpointSlices.
	NodeIPAM bool
	// Mirror keeps the space's VIP pools and CiliumLoadBalancerIPPool
	// objects, and its CIDR groups and CiliumCIDRGroup objects, in line
	// (mirror.go): the database's are written out read-only, with
	// Cilium's status conditions, and the cluster's imported, as their
	// informers see them and at every Resync; the store must then be a
	// MirrorStore too.
	Mirror bool
	// IPv4 and IPv6 are the cluster's families (at least one).
	IPv4, IPv6 bool
	// Resync looks at every Service again this often (default 1 minute):
	// a pool edit or a new pool reaches unsatisfied Services by it.
	Resync  time.Duration
	Workers int
	Logger  *slog.Logger
	Now     func() time.Time
}

func (c *Config) setDefaults() error {
	if c.Kube == nil {
		return errors.New("lbipam: no Kubernetes configuration")
	}
	if c.Space == "" {
		c.Space = alloc.DefaultSpace
	}
	if c.Election.LeaseName == "" {
		c.Election.LeaseName = "ipam-lbipam"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = c.Logger.With("component", "lbipam")
	c.Election.Logger = c.Logger
	if err := c.Election.SetDefaults(); err != nil {
		return err
	}
	if c.Classes == nil {
		c.Classes = []string{ClassL2, ClassBGP}
	}
	switch c.DefaultIPAM {
	case "":
		c.DefaultIPAM = DefaultLBIPAM
	case DefaultLBIPAM, DefaultNone:
	case DefaultNodeIPAM:
		if !c.NodeIPAM {
			return errors.New("lbipam: the default IPAM nodeipam needs Node IPAM on")
		}
	default:
		return fmt.Errorf("lbipam: default IPAM %q: want lbipam, nodeipam or none", c.DefaultIPAM)
	}
	if !c.IPv4 && !c.IPv6 {
		return errors.New("lbipam: no family enabled")
	}
	if c.Resync == 0 {
		c.Resync = time.Minute
	}
	if c.Workers <= 0 {
		c.Workers = 8
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Controller is the leader-elected controller of LoadBalancer Services.
type Controller struct {
	cfg       Config
	log       *slog.Logger
	kube      kubernetes.Interface
	leaseKube kubernetes.Interface
	store     Store
	leading   atomic.Bool
	// cilium, mirrorStore and events serve the mirror (Config.Mirror).
	cilium      ciliumclient.Interface
	mirrorStore MirrorStore
	events      record.EventRecorder

	mu       sync.Mutex
	services cache.Indexer // set while leading
	// waiting are the Services whose last request was not satisfied (by
	// key), while leading: what a change in the store may serve.
	waiting map[string]bool
	// Node IPAM's Nodes and EndpointSlices (by namespace), set while
	// leading with NodeIPAM.
	nodes, slices cache.Indexer
	// The cluster's CiliumLoadBalancerIPPool and CiliumCIDRGroup objects
	// (by name), and the refusal last said on each group's object (its
	// UID and message), set while leading with Mirror.
	poolObjects, groupObjects cache.Indexer
	groupRefusals             map[string]string
}

// New builds a controller; Run starts it.
func New(cfg Config, st Store) (*Controller, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	work, lease := leader.SplitBudget(cfg.Kube, cfg.Election.RetryPeriod)
	kc, err := kubernetes.NewForConfig(work)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	lc, err := kubernetes.NewForConfig(lease)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	c := &Controller{cfg: cfg, log: cfg.Logger, kube: kc, leaseKube: lc, store: st}
	if cfg.Mirror {
		ms, ok := st.(MirrorStore)
		if !ok {
			return nil, errors.New("lbipam: the mirror needs a store that lists VIP pools and CIDR groups")
		}
		if c.cilium, err = ciliumclient.NewForConfig(work); err != nil {
			return nil, fmt.Errorf("cilium client: %w", err)
		}
		c.mirrorStore = ms
	}
	return c, nil
}

// Serving reports whether this replica leads with its cache synced.
func (c *Controller) Serving() bool { return c.leading.Load() }

// Run campaigns for leadership until ctx ends, serving Services while it
// leads.
func (c *Controller) Run(ctx context.Context) error {
	return c.cfg.Election.Run(ctx, c.leaseKube, func(ctx context.Context) {
		defer c.leading.Store(false)
		c.log.Info("leading: serving LoadBalancer Services", "identity", c.cfg.Election.Identity)
		if err := c.lead(ctx); err != nil && ctx.Err() == nil {
			c.log.Error("controller stopped", "err", err)
		}
	})
}

func (c *Controller) lead(ctx context.Context) error {
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "lbipam-services"})
	defer queue.ShutDown()
	// Only Services that are or were LoadBalancers concern the
	// controller: every other Service of the cluster (most of them) would
	// cost a look at the store at each resync.
	enqueue := func(obj any) {
		if !concerns(obj) {
			return
		}
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			queue.Add(key)
		}
	}
	informer := cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(c.kube.CoreV1().RESTClient(), "services", metav1.NamespaceAll, fields.Everything()),
		&corev1.Service{}, c.cfg.Resync, cache.Indexers{})
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		// A Service that stops being a LoadBalancer (its status cleared
		// with the type) concerns the controller by its old self.
		UpdateFunc: func(old, obj any) {
			if concerns(old) && !concerns(obj) {
				enqueue(old)
				return
			}
			enqueue(obj)
		},
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	synced := []cache.InformerSynced{informer.HasSynced}
	mirrorQueue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "lbipam-mirror"})
	defer mirrorQueue.ShutDown()
	var poolIdx, groupIdx cache.Indexer
	if c.cfg.Mirror {
		pi, gi, err := c.mirrorInformers(mirrorQueue)
		if err != nil {
			return err
		}
		go pi.Run(ctx.Done())
		go gi.Run(ctx.Done())
		synced = append(synced, pi.HasSynced, gi.HasSynced)
		poolIdx, groupIdx = pi.GetIndexer(), gi.GetIndexer()
		broadcaster := record.NewBroadcaster(record.WithContext(ctx))
		defer broadcaster.Shutdown()
		broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.kube.CoreV1().Events("")})
		c.events = broadcaster.NewRecorder(eventScheme, corev1.EventSource{Component: "ipam-lbipam"})
	}
	var nodeIdx, sliceIdx cache.Indexer
	if c.cfg.NodeIPAM {
		ni, si, err := c.nodeIPAMInformers(queue, informer.GetIndexer())
		if err != nil {
			return err
		}
		go ni.Run(ctx.Done())
		go si.Run(ctx.Done())
		synced = append(synced, ni.HasSynced, si.HasSynced)
		nodeIdx, sliceIdx = ni.GetIndexer(), si.GetIndexer()
	}
	c.mu.Lock()
	c.services, c.nodes, c.slices, c.waiting = informer.GetIndexer(), nodeIdx, sliceIdx, map[string]bool{}
	c.poolObjects, c.groupObjects, c.groupRefusals = poolIdx, groupIdx, map[string]string{}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.services, c.nodes, c.slices, c.waiting = nil, nil, nil, nil
		c.poolObjects, c.groupObjects, c.groupRefusals = nil, nil, nil
		c.mu.Unlock()
	}()
	go informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}
	c.leading.Store(true)
	c.log.Info("cache synced: serving Services")
	var sweeps sync.WaitGroup
	defer sweeps.Wait()
	// The store's Kubernetes owners whose Service is gone (deleted while
	// no replica led, or released by hand) are reconciled as deleted: at
	// once, then at every resync.
	sweeps.Go(func() {
		t := time.NewTicker(c.cfg.Resync)
		defer t.Stop()
		for {
			if err := c.queueStoreOwners(ctx, queue); err != nil && ctx.Err() == nil {
				c.log.Warn("listing the store's VIP owners", "err", err)
			}
			if c.cfg.Mirror {
				if err := c.queueMirror(ctx, mirrorQueue); err != nil && ctx.Err() == nil {
					c.log.Warn("listing VIP pools and CIDR groups to mirror", "err", err)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	if l, ok := c.store.(ChangeListener); ok {
		sweeps.Go(func() { c.listen(ctx, l, queue, mirrorQueue) })
	}
	if c.cfg.Mirror {
		sweeps.Go(func() { leader.Work(ctx, mirrorQueue, 2, func() bool { return c.processMirror(ctx, mirrorQueue) }) })
	}
	leader.Work(ctx, queue, c.cfg.Workers, func() bool { return c.processNext(ctx, queue) })
	return nil
}

// eventScheme resolves the kinds of the objects the mirror's events are
// about.
var eventScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := ciliumv2.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

// listen queues the waiting Services at every change of the store that
// may serve them, and the Service of an owner that lost its addresses
// with its pool (to be re-homed or stripped); with Mirror, a look at
// every pool and group (mirrorQ's keyAll, which a burst of changes
// queues once), so that an edit through the REST API reaches its
// mirrored object at once. It listens again a second after the connection is lost
// (a database failover), until ctx ends.
func (c *Controller) listen(ctx context.Context, l ChangeListener, q, mirrorQ workqueue.TypedRateLimitingInterface[string]) {
	changed := func(ch alloc.LBChange) {
		if ch.Space != "" && ch.Space != c.cfg.Space {
			return
		}
		if c.cfg.Mirror {
			mirrorQ.Add(keyAll)
		}
		if ch.Owner != (alloc.VIPOwner{}) {
			q.Add(ch.Owner.String())
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for key := range c.waiting {
			q.Add(key)
		}
	}
	for {
		err := l.ListenLBChanges(ctx, changed)
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("listening for the store's LB IPAM changes; listening again in 1s", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// setWaiting records whether the Service of key waits for an address.
func (c *Controller) setWaiting(key string, waits bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.waiting == nil {
		return // not leading
	}
	if waits {
		c.waiting[key] = true
	} else {
		delete(c.waiting, key)
	}
}

func (c *Controller) queueStoreOwners(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) error {
	page := alloc.Page{Limit: 1000}
	for {
		owners, next, err := c.store.ListVIPOwners(ctx, c.cfg.Space, page)
		if err != nil {
			return err
		}
		for _, o := range owners {
			if o.Request.Source != alloc.VIPSourceKubernetes {
				continue // the API's owner: not the controller's to release
			}
			if svc, err := c.cached(o.Owner.String()); err == nil && svc == nil {
				q.Add(o.Owner.String())
			}
		}
		if next == "" {
			return nil
		}
		page.Continue = next
	}
}

func (c *Controller) processNext(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	err := c.reconcile(ctx, key, false)
	for attempt := 0; apierrors.IsConflict(err) && attempt < 4; attempt++ {
		err = c.reconcile(ctx, key, true) // the cache lagged a write: read the Service anew
	}
	if err == nil {
		q.Forget(key)
		return true
	}
	if ctx.Err() == nil {
		c.log.Warn("reconciling Service", "service", key, "err", err)
		q.AddRateLimited(key)
	}
	return true
}

// concerns reports whether obj (a Service, or the tombstone of one) is a
// LoadBalancer or carries the condition the controller writes (it was
// one).
func concerns(obj any) bool {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return true // unknown: look
	}
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer || meta.FindStatusCondition(svc.Status.Conditions, ConditionSatisfied) != nil
}

// handler answers who serves svc: DefaultLBIPAM, DefaultNodeIPAM, or
// DefaultNone (nobody here).
func (c *Controller) handler(svc *corev1.Service) string {
	// A Service being deleted is still served until it is gone: a
	// finalizer may hold it while the load balancer in front drains, and
	// Cilium too lets its address go only on the deletion itself.
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return DefaultNone
	}
	switch {
	case svc.Spec.LoadBalancerClass == nil:
		return c.cfg.DefaultIPAM
	case c.cfg.NodeIPAM && *svc.Spec.LoadBalancerClass == ClassNode:
		return DefaultNodeIPAM
	case slices.Contains(c.cfg.Classes, *svc.Spec.LoadBalancerClass):
		return DefaultLBIPAM
	}
	return DefaultNone
}

// reconcile brings the Service of key (namespace/name) in line: a served
// Service's request goes to the store and its answer to the status; a
// Service gone or no longer served lets its addresses go. fresh reads the
// Service from the API server instead of the cache.
func (c *Controller) reconcile(ctx context.Context, key string, fresh bool) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil // not a key of ours
	}
	owner := alloc.VIPOwner{Namespace: ns, Name: name}
	var svc *corev1.Service
	if fresh {
		svc, err = c.kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			svc, err = nil, nil
		}
	} else {
		svc, err = c.cached(key)
	}
	if err != nil {
		return err
	}
	by := DefaultNone
	if svc != nil {
		by = c.handler(svc)
	}
	if by != DefaultLBIPAM {
		c.setWaiting(key, false)
		if err := c.releaseOwned(ctx, owner); err != nil {
			return err
		}
		if svc == nil {
			return nil
		}
		if by == DefaultNodeIPAM {
			return c.reconcileNodeIPAM(ctx, svc)
		}
		if st, changed := clearedStatus(svc); changed {
			return c.writeStatus(ctx, svc, st)
		}
		return nil
	}
	r, dropped := requestOf(c.cfg.Space, svc, families{v4: c.cfg.IPv4, v6: c.cfg.IPv6})
	if len(dropped) > 0 {
		c.log.Warn("Service names entries that are no address: left out, as Cilium leaves them out", "service", key, "entries", dropped)
	}
	if len(r.Families) == 0 && len(r.Addresses) == 0 {
		// Nothing asked (PreferDualStack listing only families not
		// enabled): Cilium's ServiceView.isSatisfied holds at once, so
		// handleUpsertService gives nothing and writes no condition. The
		// store would refuse the empty request as invalid.
		c.setWaiting(key, false)
		if err := c.releaseOwned(ctx, owner); err != nil {
			return err
		}
		if st, changed := clearedStatus(svc); changed {
			return c.writeStatus(ctx, svc, st)
		}
		return nil
	}
	// Waiting from before the request until it is known satisfied: a
	// change committed while it runs queues the Service again (the
	// workqueue runs it once more after this pass) rather than going
	// unseen.
	c.setWaiting(key, true)
	a, err := c.store.AssignVIPs(ctx, r)
	var ae *alloc.Error
	if errors.As(err, &ae) && ae.Kind == alloc.KindInvalid {
		// The Service's own fields are at fault: said on its condition,
		// as Cilium logs them; what it held stays until it is fixed.
		a = alloc.VIPAssignment{Owner: owner, Reason: ReasonInvalid, Message: fmt.Sprintf("%s: %s", ae.Field, ae.Detail)}
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if addr, perr := parseIngress(in); perr == nil {
				a.Addresses = append(a.Addresses, alloc.VIP{Addr: addr})
			}
		}
	} else if err != nil {
		return err
	}
	// An invalid request waits for its Service's edit, not the store's.
	c.setWaiting(key, err == nil && !a.Satisfied)
	if st, changed := desiredStatus(svc, a, metav1.NewTime(c.cfg.Now())); changed {
		return c.writeStatus(ctx, svc, st)
	}
	return nil
}

// releaseOwned releases what the owner holds when the controller speaks
// for it; an owner of the API of the same name is left alone.
func (c *Controller) releaseOwned(ctx context.Context, owner alloc.VIPOwner) error {
	a, err := c.store.GetVIPs(ctx, c.cfg.Space, owner)
	var ae *alloc.Error
	if errors.As(err, &ae) && ae.Kind == alloc.KindNotFound {
		return nil
	} else if err != nil {
		return err
	}
	if a.Request.Source != alloc.VIPSourceKubernetes {
		return nil
	}
	// The generation read: an owner asked for anew since (the Service
	// re-created) is not released by this stale look.
	err = c.store.ReleaseVIPs(ctx, c.cfg.Space, owner, a.Generation)
	if alloc.IsKind(err, alloc.KindStaleGeneration) {
		return nil
	}
	return err
}

func (c *Controller) cached(key string) (*corev1.Service, error) {
	c.mu.Lock()
	idx := c.services
	c.mu.Unlock()
	return leader.Lookup[corev1.Service](idx, key)
}

// writeStatus writes st as svc's status (the status subresource). A
// conflict (the Service changed since it was read) goes back to the
// caller, which starts the round over from a fresh read.
func (c *Controller) writeStatus(ctx context.Context, svc *corev1.Service, st corev1.ServiceStatus) error {
	next := svc.DeepCopy()
	next.Status = st
	_, err := c.kube.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func parseIngress(in corev1.LoadBalancerIngress) (netip.Addr, error) { return netip.ParseAddr(in.IP) }
