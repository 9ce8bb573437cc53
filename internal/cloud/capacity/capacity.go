// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package capacity is the cloud capacity workers' pass over the cloud
// pools: for each node of a pool, what the cloud gave it is recorded as
// its blocks, one round of cloud.Reconciler adds what its sizing says it
// lacks, and addresses in excess for the pool's release delay go back to
// the cloud, drained first so that none a Pod holds can go; so does an
// interface in surplus (the VPC CNI's WARM_ENI_TARGET), detached whole.
//
// One replica at a time should run passes (the caller's leader
// election); a pass is safe to repeat, and a pass cut short leaves
// nothing the next one does not finish: an address the cloud gave but the
// database does not hold yet is recorded by the next pass, a drained block
// the cloud kept is restored once the readings are settled.
//
// A give-back whose outcome is unknown (an answer lost, a call timed
// out) is never undone blindly: its blocks stay drained until the
// cloud's readings, trusted only after the release guard, say whether
// the interface still holds them. A node whose round fails backs off
// (backoff.go); an instance the cloud confirms gone has its blocks
// dropped (dead.go).
package capacity

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/store"
)

// Store is what a pass needs of the database.
type Store interface {
	CloudPools(ctx context.Context) ([]store.CloudPool, error)
	CloudNodes(ctx context.Context, space, pool string) ([]store.CloudNode, error)
	RecordCloudBlocks(ctx context.Context, space, node, pool, iface string, prefixes []netip.Prefix) error
	DrainCloudBlocks(ctx context.Context, space, node, pool string, prefixes []netip.Prefix) ([]netip.Prefix, error)
	RestoreCloudBlocks(ctx context.Context, space, node, pool string, prefixes []netip.Prefix) error
	DropCloudBlocks(ctx context.Context, space, node, pool string, prefixes []netip.Prefix) error
	SetCloudInterfaces(ctx context.Context, space, node, instance string, limits store.InstanceLimits, ifaces []store.CloudInterface, readAt time.Time) error
	// For instances that ended, and addresses the cloud moved (dead.go).
	DropGoneCloudNode(ctx context.Context, space, node, providerID string) (blocks, leases int64, err error)
	CloudBlockHolder(ctx context.Context, space string, prefix netip.Prefix) (store.CloudHolder, error)
}

var _ Store = (*store.Store)(nil)

// Worker runs passes for the cloud pools of one provider.
type Worker struct {
	Store    Store
	Provider alloc.CloudProvider
	Cloud    cloud.Provider
	// Interfaces creates interfaces (AWS); nil for a cloud that never
	// does.
	Interfaces cloud.InterfaceManager
	// Inventory, when set, describes every instance of a network at once:
	// the networks nodes were seen in are listed (a few pages for a
	// thousand nodes) once every Resync instead of describing each node's
	// instance (two calls a node); between listings the last one is read
	// again, and only a node the workers changed since (or the listing
	// lacks) is described alone (list.go).
	Inventory cloud.Inventory
	// Resync is how often the networks are listed again; DefaultResync
	// when 0.
	Resync time.Duration
	// Tags go on created interfaces (the cluster's at least).
	Tags map[string]string
	Log  *slog.Logger
	// Now is the clock of the release delay; time.Now when nil.
	Now func() time.Time
	// Parallel is how many nodes a pass reads and serves at a time;
	// DefaultParallel when 0. Every call still goes through Cloud's one
	// token bucket (cloud.NewLimited).
	Parallel int

	// ReleaseGuard is how long after a give-back the cloud's readings
	// are not trusted to show what was given back; DefaultReleaseGuard
	// when 0.
	ReleaseGuard time.Duration

	mu          sync.Mutex                            // guards excess, surplus, missing, reconciler, written, vpcs, released, added, detachTried, started
	started     time.Time                             // the first pass's start
	released    map[string]map[netip.Prefix]time.Time // "space/pool/node" -> block -> when it was last given back
	added       map[string][]addedAt                  // "space/pool/node" -> what its rounds added, and when
	detachTried map[string]time.Time                  // interface -> when its detach was last asked
	missing     map[string]map[netip.Prefix]bool      // "space/pool/node" -> blocks the last reading lacked
	vpcs        map[string]bool                       // the networks nodes were seen in
	written     map[string][]store.CloudInterface     // "space/node" -> the reading last recorded
	excess      map[string]map[netip.Prefix]time.Time // "space/pool/node" -> block -> excess since
	surplus     map[string]surplusSince               // "space/pool/node" -> the interface in surplus
	reconciler  map[string]*cloud.Reconciler          // "space/pool" -> its reconciler
	holds       holds                                 // the nodes backing off after a failure (backoff.go)
	goneWatch   goneWatch                             // instances not found, until the cloud confirms they ended (dead.go)
	listings    listings                              // the networks' last listings (list.go)
	// singles are the nodes of a prefix pool already logged as falling
	// back to single addresses ("space/pool/node"): logged once.
	singles sync.Map
}

// surplusSince is the interface a node has held in surplus, and since
// when.
type surplusSince struct {
	id    string
	since time.Time
}

// DefaultParallel is how many nodes a pass serves at a time when
// Worker.Parallel is 0.
const DefaultParallel = 8

// DefaultReleaseGuard is how long the workers distrust a reading about
// what they gave back: the VPC CNI's reconcile cooldown for recently
// freed addresses (ipamd's ipReconcileCooldown, 60 s). EC2's describes
// are eventually consistent and may show an address for seconds after it
// was unassigned, and a give-back whose answer was lost may or may not
// have happened: within the guard such a block is neither recorded nor
// restored, so no Pod can lease an address its interface may not hold.
const DefaultReleaseGuard = time.Minute

// Pass runs one pass over every cloud pool of the worker's provider and
// answers the failures joined (a node that failed is left out until its
// backoff ends, backoff.go; the others go on). It reads every node
// first, then serves them by largest deficit, Parallel at a time, so
// that under a token bucket the nodes short of the most addresses get
// the cloud's calls first (Cilium's operator queues the same way).
func (w *Worker) Pass(ctx context.Context) error {
	w.mu.Lock()
	if w.started.IsZero() {
		w.started = w.now()
	}
	w.mu.Unlock()
	pools, err := w.Store.CloudPools(ctx)
	if err != nil {
		return err
	}
	var errs []error
	var work []*nodeWork
	for _, p := range pools {
		if p.Cloud.Provider != w.Provider {
			continue
		}
		// Every pool's settings are written here, before any round runs:
		// the rounds below only read them.
		rec := w.reconcilerOf(p)
		nodes, err := w.Store.CloudNodes(ctx, p.Space, p.Name)
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s/%s: %w", p.Space, p.Name, err))
			continue
		}
		opts := poolOptions(p)
		for _, n := range nodes {
			if w.holds.holding(p.Space+"/"+p.Name+"/"+n.Name, w.now()) {
				continue
			}
			work = append(work, &nodeWork{pool: p, node: n, rec: rec, opts: nodeOptions(opts, n.PodInterfaces)})
		}
	}
	w.learnNetwork(ctx, work)
	listed, lerrs := w.list(ctx)
	errs = append(errs, lerrs...)
	for _, x := range work {
		x.listed = listed
	}
	errs = append(errs, w.each(ctx, work, w.read)...)
	all := slices.Clone(work)
	work = slices.DeleteFunc(work, func(x *nodeWork) bool { return !x.ready })
	// Largest deficit first; the order of the store among equals, so that
	// a pass is predictable.
	slices.SortStableFunc(work, func(a, b *nodeWork) int { return cmp.Compare(b.deficit, a.deficit) })
	errs = append(errs, w.each(ctx, work, w.serve)...)
	for _, x := range all {
		if !x.failed && !x.skipped {
			w.holds.succeeded(holdKey(x))
		}
	}
	return errors.Join(errs...)
}

// optionsOn are x's options for its instance inst: a prefix pool's node on
// a type that takes no prefixes (Xen) gets single addresses, as the VPC
// CNI and Cilium's operator fall back; logged once a node.
func (w *Worker) optionsOn(x *nodeWork, inst cloud.Instance) cloud.PlanOptions {
	o, fellBack := x.opts.On(inst.Limits)
	if fellBack {
		key := x.pool.Space + "/" + x.pool.Name + "/" + x.node.Name
		if _, logged := w.singles.LoadOrStore(key, true); !logged {
			w.logger().Warn("cloud capacity: instance type takes no prefixes; the node gets single addresses",
				"pool", x.pool.Space+"/"+x.pool.Name, "node", x.node.Name, "instance", inst.ID, "type", inst.Type)
		}
	}
	return o
}

// nodeWork is one node of a pass: what its reading found, then its round.
type nodeWork struct {
	pool store.CloudPool
	node store.CloudNode
	rec  *cloud.Reconciler
	// opts are the pool's plan options with what the node says of its
	// own interfaces (nodeOptions): the reconciler is the pool's, shared
	// by its nodes, so they go with each round.
	opts     cloud.PlanOptions
	inst     cloud.Instance
	used     map[netip.Addr]bool
	reserved map[netip.Addr]bool
	listed   *inventory // this pass's listings (list.go)
	reused   bool       // inst is a listing an earlier pass read already
	skipped  bool       // left out of this pass: its network's listing failed and none is young enough, or its instance ended
	deficit  int        // addresses the plan says the node lacks
	ready    bool       // read, and to be served
	failed   bool       // its reading or round failed: it backs off
}

// nodeKey names node n of pool p in the worker's memory: "space/pool/node".
func nodeKey(p store.CloudPool, n store.CloudNode) string {
	return p.Space + "/" + p.Name + "/" + n.Name
}

// state is what the plan knows of x's node.
func (x *nodeWork) state() cloud.NodeState {
	return cloud.NodeState{Instance: x.inst, Used: x.used, Reserved: x.reserved, Pending: x.node.Pending}
}

// each runs f over work, at most Parallel at a time, and answers the
// failures, each named by its pool and node.
func (w *Worker) each(ctx context.Context, work []*nodeWork, f func(context.Context, *nodeWork) error) []error {
	par := w.Parallel
	if par <= 0 {
		par = DefaultParallel
	}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, par)
	for _, x := range work {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := f(ctx, x); err != nil {
				x.failed = true
				hold := w.holds.failed(ctx, holdKey(x), w.now(), err)
				mu.Lock()
				errs = append(errs, fmt.Errorf("pool %s/%s node %s (left out for %s): %w", x.pool.Space, x.pool.Name, x.node.Name, hold.Round(time.Millisecond), err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errs
}

// read describes x's instance, records what the cloud holds that the
// database lacks, and sizes the node's deficit.
func (w *Worker) read(ctx context.Context, x *nodeWork) error {
	p, n := x.pool, x.node
	if len(n.Conflict) > 0 {
		return fmt.Errorf("the node selectors of cloud pools %s all take the node: none serves it", strings.Join(n.Conflict, ", "))
	}
	id := InstanceID(w.Provider, n.ProviderID)
	if id == "" {
		return fmt.Errorf("providerID %q names no %s instance", n.ProviderID, w.Provider)
	}
	// Azure's resource IDs are case-insensitive (a providerID may spell
	// the group otherwise than ARM lists it); EC2's are lower case.
	r, reused, ok := x.listed.lookup(id)
	inst, readAt := r.inst, r.at
	var err error
	switch {
	case x.listed.left(id):
		// Its network's listing failed: no describe herd (list.go).
		x.skipped = true
		return nil
	case !ok && w.Inventory != nil && w.knownEnded(x):
		// Ended, confirmed, blocks gone: nothing to read it for (dead.go).
		x.skipped = true
		return nil
	case !ok:
		readAt = w.now()
		inst, err = w.Cloud.Instance(ctx, id)
		if err == nil {
			w.describedAlone(inst, readAt)
		}
	}
	x.reused = reused
	if cloud.KindOf(err) == cloud.KindNotFound {
		// Gone, or not visible yet: nothing to create or give back for
		// it; its blocks go once the cloud confirms it ended.
		return w.notFound(ctx, x, id, err)
	} else if err != nil {
		return err
	}
	w.found(p.Space, n.Name)
	w.mu.Lock()
	if w.vpcs == nil {
		w.vpcs = map[string]bool{}
	}
	w.vpcs[inst.VPC] = true
	w.mu.Unlock()
	inst = w.asSettled(p, n, inst, readAt)
	x.opts = w.optionsOn(x, inst)
	err = w.recordHeld(ctx, p, n, inst, x.opts)
	if alloc.IsKind(err, alloc.KindOverlap) {
		// Another node's block holds an address the cloud gave this one:
		// the cloud says which of the two holds it now.
		err = w.recordContested(ctx, x, inst)
	}
	if err != nil {
		return err
	}
	if err := w.settle(ctx, p, n, inst, x.opts, !x.reused); err != nil {
		return err
	}
	if err := w.recordInterfaces(ctx, p, n, inst); err != nil {
		return err
	}
	x.inst, x.used, x.reserved = inst, map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for _, a := range n.Used {
		x.used[a] = true
	}
	for _, a := range n.Reserved {
		x.reserved[a] = true
	}
	// The reconciler's plan, subnets' room counted: a node no subnet can
	// serve has no deficit to come first with.
	plan, err := x.rec.Plan(ctx, x.state(), x.opts)
	if err != nil {
		return err
	}
	units := 0
	switch {
	case plan.Assign != nil:
		units = plan.Assign.Count
	case plan.Create != nil:
		units = plan.Create.Count
	}
	if x.opts.Prefixes {
		units *= cloud.IPv4PrefixSize
	}
	x.deficit, x.ready = units, true
	return nil
}

// serve runs x's round: what its plan lacks is added and recorded, what
// has been excess for the release delay goes back.
func (w *Worker) serve(ctx context.Context, x *nodeWork) error {
	p, n := x.pool, x.node
	plan, added, err := x.rec.Round(ctx, n.Name, x.state(), x.opts)
	if err != nil {
		if plan.Assign != nil || plan.Create != nil {
			// Asked of the cloud, and the answer unknown or refused (a
			// lost one may have been applied): the next pass describes
			// the node.
			w.changed(x.inst.ID)
		}
		return err
	}
	if plan.Assign != nil || plan.Create != nil {
		// The cloud's answer says what the interface holds now.
		w.answered(withAdded(x.inst, added), w.now())
	}
	if got := blocksOf(added.Addresses, added.Prefixes); len(got) > 0 {
		w.markAdded(nodeKey(p, n), added, w.now())
		if err := w.Store.RecordCloudBlocks(ctx, p.Space, n.Name, p.Name, added.Interface, got); err != nil {
			return fmt.Errorf("recording what %s got: %w", added.Interface, err)
		}
		// The reading with what the round added: the crd-mode controller
		// routes a CiliumNode's new addresses by it, now rather than at
		// the next pass.
		if err := w.recordInterfaces(ctx, p, n, withAdded(x.inst, added)); err != nil {
			return err
		}
	}
	if err := w.release(ctx, p, n, plan.Release); err != nil {
		return err
	}
	if err := w.detach(ctx, x, plan.Detach); err != nil {
		return err
	}
	return w.delegateIPv6(ctx, x)
}

// detach gives back id, the interface x's node holds beyond its need (the
// VPC CNI's WARM_ENI_TARGET: otherwise a node that once scaled up keeps
// its interfaces' addresses from the subnet for good, amazon-vpc-cni-k8s
// #2294), once it has been in surplus for the pool's release delay: all
// its blocks drained, so that no Pod can take one meanwhile (a Pod that
// took one keeps the interface), then the interface detached and its
// blocks dropped. The collector deletes it once the cloud shows it
// detached.
func (w *Worker) detach(ctx context.Context, x *nodeWork, id string) error {
	p, n := x.pool, x.node
	key := nodeKey(p, n)
	now := w.now()
	w.mu.Lock()
	if w.surplus == nil {
		w.surplus = map[string]surplusSince{}
	}
	was := w.surplus[key]
	if id == "" || w.Interfaces == nil {
		delete(w.surplus, key)
		w.mu.Unlock()
		return nil
	}
	if was.id != id {
		// A new surplus, or another interface: the delay starts now.
		was = surplusSince{id: id, since: now}
		w.surplus[key] = was
	}
	w.mu.Unlock()
	if now.Sub(was.since) < releaseDelay(p) {
		return nil
	}
	var f cloud.Interface
	for _, g := range x.inst.Interfaces {
		if g.ID == id {
			f = g
		}
	}
	addrs := f.Addresses
	if x.opts.UsePrimary {
		addrs = append([]netip.Addr{f.Primary}, addrs...)
	}
	blocks := blocksOf(addrs, f.Prefixes)
	drained, err := w.Store.DrainCloudBlocks(ctx, p.Space, n.Name, p.Name, blocks)
	if err != nil {
		return err
	}
	if len(drained) != len(blocks) {
		// A Pod holds (or just held) one of its addresses: the interface
		// stays, whole.
		return w.Store.RestoreCloudBlocks(ctx, p.Space, n.Name, p.Name, drained)
	}
	// From here the blocks stay drained whatever the answer: a detach
	// whose answer was lost may have happened. The readings decide
	// (settle): dropped once they lack the blocks, restored only if the
	// interface still holds them after the release guard.
	w.changed(x.inst.ID)
	err = w.Interfaces.DetachInterface(ctx, id)
	w.mu.Lock()
	w.markReleased(key, drained, now)
	if w.detachTried == nil {
		w.detachTried = map[string]time.Time{}
	}
	w.detachTried[id] = now
	delete(w.surplus, key)
	w.mu.Unlock()
	if err != nil {
		return fmt.Errorf("detaching %s, in surplus: %w", id, err)
	}
	w.logger().Info("cloud capacity: interface in surplus detached", "node", n.Name, "interface", id, "addresses", len(blocks))
	return nil
}

// markReleased notes that blocks of key were given back (or asked to be)
// at t. w.mu held.
func (w *Worker) markReleased(key string, blocks []netip.Prefix, t time.Time) {
	if w.released == nil {
		w.released = map[string]map[netip.Prefix]time.Time{}
	}
	if w.released[key] == nil {
		w.released[key] = map[netip.Prefix]time.Time{}
	}
	for _, b := range blocks {
		w.released[key][b] = t
	}
}

// releaseGuard is the worker's release guard, or the default.
func (w *Worker) releaseGuard() time.Duration {
	if w.ReleaseGuard > 0 {
		return w.ReleaseGuard
	}
	return DefaultReleaseGuard
}

// guardWindows are the release guard, and how long an entry of the
// worker's memory of its own changes is kept: no reading read is older.
func (w *Worker) guardWindows() (guard, keep time.Duration) {
	guard = w.releaseGuard()
	return guard, guard + ListingMaxAge*w.resync()
}

// guarded says whether a reading at now may still be wrong about block b
// of key: the worker gave it back (or asked to) within the release
// guard, or started within it (an earlier leader may have, and a drained
// block is then not restored before the guard says the cloud's reading
// is settled). w.mu held.
func (w *Worker) guarded(key string, b netip.Prefix, now time.Time) bool {
	since := w.started
	if t := w.released[key][b]; t.After(since) {
		since = t
	}
	return now.Sub(since) < w.releaseGuard()
}

// addedAt is what a round added, and when its answer came.
type addedAt struct {
	at    time.Time
	added cloud.Added
}

// markAdded notes that a round of key added a at t.
func (w *Worker) markAdded(key string, a cloud.Added, t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.added == nil {
		w.added = map[string][]addedAt{}
	}
	w.added[key] = append(w.added[key], addedAt{at: t, added: a})
}

// asSettled is inst as the cloud will show it once its describes have
// caught up with the worker's own changes of the release guard: with
// what the rounds added within it, and without what was given back
// (withoutReleased). EC2's describes are eventually consistent: a
// listing made seconds after a round's answer may lack what the round
// added. Read as it came, such a listing made the node look short (a
// second /28 asked, given back minutes later) and its recorded block
// look taken back (the node described alone to confirm): under load,
// hundreds of describes and unassigns in the 1,000-node scale-out. The
// answer is the cloud's word on what the interface holds, as Cilium's
// operator updates its instance cache from it; an addition older than
// the guard that a reading lacks is a lack (settle).
func (w *Worker) asSettled(p store.CloudPool, n store.CloudNode, inst cloud.Instance, at time.Time) cloud.Instance {
	return w.withoutReleased(p, n, w.withRecentlyAdded(p, n, inst, at), at)
}

// withRecentlyAdded is inst with what the rounds of its node added within
// the release guard of the reading's time at, where the reading lacks it:
// onto the interface it went to, or the new interface whole when the
// reading lacks it. Entries no reading can be that old for are forgotten.
func (w *Worker) withRecentlyAdded(p store.CloudPool, n store.CloudNode, inst cloud.Instance, at time.Time) cloud.Instance {
	key, now := nodeKey(p, n), w.now()
	guard, keep := w.guardWindows()
	w.mu.Lock()
	defer w.mu.Unlock()
	adds := slices.DeleteFunc(w.added[key], func(a addedAt) bool { return now.Sub(a.at) >= keep })
	if len(adds) == 0 {
		delete(w.added, key)
		return inst
	}
	w.added[key] = adds
	ifaces := slices.Clone(inst.Interfaces)
	for _, a := range adds {
		if at.Sub(a.at) >= guard {
			continue
		}
		i := slices.IndexFunc(ifaces, func(f cloud.Interface) bool { return f.ID == a.added.Interface })
		if i < 0 {
			if a.added.Created {
				ifaces = append(ifaces, a.added.NewInterface)
			}
			continue
		}
		f := ifaces[i]
		for _, x := range a.added.Addresses {
			if !slices.Contains(f.Addresses, x) {
				f.Addresses = append(slices.Clip(f.Addresses), x)
			}
		}
		for _, x := range a.added.Prefixes {
			if !slices.Contains(f.Prefixes, x) {
				f.Prefixes = append(slices.Clip(f.Prefixes), x)
			}
		}
		ifaces[i] = f
	}
	slices.SortFunc(ifaces, func(a, b cloud.Interface) int { return cmp.Compare(a.DeviceIndex, b.DeviceIndex) })
	inst.Interfaces = ifaces
	return inst
}

// withoutReleased is inst without the blocks the worker gave back (or
// asked to) within the release guard, which an eventually consistent
// reading may still show, and with an interface whose detach was asked
// within it shown detaching: so a stale reading neither records them
// again nor plans on them. The guard counts to the reading's time at:
// a listing read again is as old as it was made (list.go). Entries no
// reading can be that old for are forgotten.
func (w *Worker) withoutReleased(p store.CloudPool, n store.CloudNode, inst cloud.Instance, at time.Time) cloud.Instance {
	key, now := nodeKey(p, n), w.now()
	guard, keep := w.guardWindows()
	w.mu.Lock()
	defer w.mu.Unlock()
	recent := map[netip.Prefix]bool{}
	for b, t := range w.released[key] {
		if at.Sub(t) < guard {
			recent[b] = true
		}
		if now.Sub(t) >= keep {
			delete(w.released[key], b)
		}
	}
	ifaces := slices.Clone(inst.Interfaces)
	for i, f := range ifaces {
		if t, ok := w.detachTried[f.ID]; ok {
			if at.Sub(t) < guard {
				f.Detaching = true
			}
			if now.Sub(t) >= keep {
				delete(w.detachTried, f.ID)
			}
		}
		if len(recent) > 0 {
			f.Addresses = slices.DeleteFunc(slices.Clone(f.Addresses), func(a netip.Addr) bool { return recent[netip.PrefixFrom(a, a.BitLen())] })
			f.Prefixes = slices.DeleteFunc(slices.Clone(f.Prefixes), func(q netip.Prefix) bool { return recent[q] })
		}
		ifaces[i] = f
	}
	inst.Interfaces = ifaces
	return inst
}

// releaseDelay is the pool's release delay, or the default.
func releaseDelay(p store.CloudPool) time.Duration {
	if p.Cloud.ReleaseDelay == 0 {
		return alloc.DefaultCloudReleaseDelay
	}
	return p.Cloud.ReleaseDelay
}

// withAdded is inst as it is after a round added a.
func withAdded(inst cloud.Instance, a cloud.Added) cloud.Instance {
	ifaces := slices.Clone(inst.Interfaces)
	if a.Created {
		ifaces = append(ifaces, a.NewInterface)
	}
	for i, f := range ifaces {
		if f.ID == a.Interface && !a.Created {
			f.Addresses = append(slices.Clip(f.Addresses), a.Addresses...)
			f.Prefixes = append(slices.Clip(f.Prefixes), a.Prefixes...)
			ifaces[i] = f
		}
	}
	inst.Interfaces = ifaces
	return inst
}

// podBlocks is what f holds for Pods, as blocks; nothing on an interface
// not for Pods (below the first interface index, excluded by its tags, or
// being detached).
func podBlocks(f cloud.Interface, opts cloud.PlanOptions) []netip.Prefix {
	if !opts.ForPods(f) {
		return nil
	}
	addrs := f.Addresses
	if opts.UsePrimary {
		addrs = append([]netip.Addr{f.Primary}, addrs...)
	}
	out := blocksOf(addrs, f.Prefixes)
	if opts.IPv6 {
		for _, p := range f.IPv6Prefixes {
			out = append(out, ipv6Block(p))
		}
	}
	return out
}

// ipv6Block is the block a node leases from of an IPv6 prefix the cloud
// delegated (EC2's /80): its first /96, as a block holds at most 2^32
// addresses (store.MinIPv6CloudBits). 2^32 addresses are more than any
// node leases.
func ipv6Block(p netip.Prefix) netip.Prefix {
	if p.Bits() >= store.MinIPv6CloudBits {
		return p.Masked()
	}
	return netip.PrefixFrom(p.Addr(), store.MinIPv6CloudBits).Masked()
}

// delegateIPv6 gives x's node an IPv6 prefix when its pool takes IPv6 and
// none of its interfaces for Pods has one: one call on the first of them,
// the prefix recorded as its block. A subnet without an IPv6 range, or a
// type that takes no prefix, is asked again only after the subnet
// cooldown.
func (w *Worker) delegateIPv6(ctx context.Context, x *nodeWork) error {
	opts := x.opts
	if !opts.IPv6 || w.Interfaces == nil {
		return nil
	}
	var first *cloud.Interface
	for i := range x.inst.Interfaces {
		f := &x.inst.Interfaces[i]
		if !opts.ForPods(*f) {
			continue
		}
		if len(f.IPv6Prefixes) > 0 {
			return nil
		}
		if first == nil || f.DeviceIndex < first.DeviceIndex {
			first = f
		}
	}
	if first == nil || x.rec.Cooling(ipv6Key(first.SubnetID)) {
		return nil
	}
	w.changed(x.inst.ID)
	p, err := w.Interfaces.AssignIPv6Prefix(ctx, first.ID)
	if err != nil {
		if k := cloud.KindOf(err); k == cloud.KindInvalid || k == cloud.KindInterfaceFull || k == cloud.KindNoContiguousPrefix {
			x.rec.Cool(ipv6Key(first.SubnetID))
		}
		return fmt.Errorf("delegating an IPv6 prefix to %s: %w", first.ID, err)
	}
	if err := w.Store.RecordCloudBlocks(ctx, x.pool.Space, x.node.Name, x.pool.Name, first.ID, []netip.Prefix{ipv6Block(p)}); err != nil {
		return fmt.Errorf("recording the IPv6 prefix %s of %s: %w", p, first.ID, err)
	}
	first.IPv6Prefixes = append(first.IPv6Prefixes, p)
	return w.recordInterfaces(ctx, x.pool, x.node, x.inst)
}

// ipv6Key is the cooling key of a subnet that delegated no IPv6 prefix.
func ipv6Key(subnet string) string { return "ipv6 " + subnet }

// recordHeld records what the node's interfaces (from the first
// interface index) hold in the cloud that the database lacks: what a pass
// cut short between the cloud's answer and its record left.
func (w *Worker) recordHeld(ctx context.Context, p store.CloudPool, n store.CloudNode, inst cloud.Instance, opts cloud.PlanOptions) error {
	have := map[netip.Prefix]bool{}
	for _, b := range n.Blocks {
		have[b.Prefix] = true
	}
	for _, f := range inst.Interfaces {
		var missing []netip.Prefix
		for _, b := range podBlocks(f, opts) {
			if !have[b] {
				missing = append(missing, b)
			}
		}
		if len(missing) > 0 {
			if err := w.Store.RecordCloudBlocks(ctx, p.Space, n.Name, p.Name, f.ID, missing); err != nil {
				return fmt.Errorf("recording what %s holds: %w", f.ID, err)
			}
		}
	}
	return nil
}

// settle squares the node's recorded blocks with the reading. A drained
// block the cloud still holds (a pass stopped between the drain and the
// cloud's call, or the restore after a refusal failed) is restored. A
// block the cloud no longer holds (taken back outside the workers, or a
// pass stopped between the cloud's call and the drop) is dropped once two
// readings in a row lack it, so that an address EC2 lists late after its
// assignment is not lost; one a Pod holds stays, and is logged: the
// Pod's address no longer reaches the node.
//
// A reading reused from an earlier pass's listing (fresh false) is no new
// reading: it restores, but neither counts a lack again nor drops.
func (w *Worker) settle(ctx context.Context, p store.CloudPool, n store.CloudNode, inst cloud.Instance, opts cloud.PlanOptions, fresh bool) error {
	inCloud := map[netip.Prefix]bool{}
	for _, f := range inst.Interfaces {
		for _, b := range podBlocks(f, opts) {
			inCloud[b] = true
		}
	}
	key := nodeKey(p, n)
	var kept, gone []netip.Prefix
	missing := map[netip.Prefix]bool{}
	now := w.now()
	w.mu.Lock()
	was := w.missing[key]
	for _, b := range n.Blocks {
		switch {
		case inCloud[b.Prefix] && b.Drained && w.guarded(key, b.Prefix, now):
			// Maybe given back, and the reading not settled yet.
		case inCloud[b.Prefix] && b.Drained:
			kept = append(kept, b.Prefix)
		case !inCloud[b.Prefix] && !fresh:
			// The lack this reading showed when it was new is counted.
			if was[b.Prefix] {
				missing[b.Prefix] = true
			}
		case !inCloud[b.Prefix] && (was[b.Prefix] || b.Drained):
			// Lacked twice; or once, fresh, by a drained block (given
			// back): a stale reading shows an older state, which held
			// it, and no Pod can lease it meanwhile. A give-back then
			// costs no describe to confirm it.
			gone = append(gone, b.Prefix)
		case !inCloud[b.Prefix]:
			missing[b.Prefix] = true
			// Described alone at the next pass, to confirm the lack
			// (list.go).
			w.changed(InstanceID(w.Provider, n.ProviderID))
		}
	}
	if w.missing == nil {
		w.missing = map[string]map[netip.Prefix]bool{}
	}
	w.missing[key] = missing
	w.mu.Unlock()
	if len(kept) > 0 {
		if err := w.Store.RestoreCloudBlocks(ctx, p.Space, n.Name, p.Name, kept); err != nil {
			return fmt.Errorf("restoring the blocks the cloud kept: %w", err)
		}
		w.logger().Info("cloud capacity: drained blocks the cloud kept restored", "node", n.Name, "blocks", kept)
	}
	if len(gone) == 0 {
		return nil
	}
	drained, err := w.Store.DrainCloudBlocks(ctx, p.Space, n.Name, p.Name, gone)
	if err != nil {
		return err
	}
	isDrained := map[netip.Prefix]bool{}
	for _, b := range n.Blocks {
		isDrained[b.Prefix] = b.Drained
	}
	var drop, leased []netip.Prefix
	for _, b := range gone {
		if isDrained[b] || slices.Contains(drained, b) {
			drop = append(drop, b)
		} else {
			leased = append(leased, b)
		}
	}
	if len(leased) > 0 {
		// Kept so that the lease stays true to the store; the next
		// readings log it again until the Pod goes.
		w.mu.Lock()
		for _, b := range leased {
			w.missing[key][b] = true
		}
		w.mu.Unlock()
		w.logger().Warn("cloud capacity: the cloud took back addresses Pods hold", "node", n.Name, "blocks", leased)
	}
	if len(drop) == 0 {
		return nil
	}
	if err := w.Store.DropCloudBlocks(ctx, p.Space, n.Name, p.Name, drop); err != nil {
		return fmt.Errorf("dropping the blocks the cloud took back: %w", err)
	}
	w.logger().Info("cloud capacity: blocks the cloud took back dropped", "node", n.Name, "blocks", drop)
	return nil
}

// recordInterfaces records the node's interfaces as this reading shows
// them (for the crd-mode controller's CiliumNode status), when they
// differ from the reading this worker recorded last: a pass over an
// unchanged node writes nothing. What the round then adds shows at the
// next pass's reading.
func (w *Worker) recordInterfaces(ctx context.Context, p store.CloudPool, n store.CloudNode, inst cloud.Instance) error {
	// An interface being detached holds nothing for Pods any more.
	ifaces := make([]store.CloudInterface, 0, len(inst.Interfaces))
	for _, f := range inst.Interfaces {
		if f.Detaching {
			continue
		}
		ifaces = append(ifaces, store.CloudInterface{ID: f.ID, Name: f.Name, MAC: f.MAC, DeviceIndex: f.DeviceIndex,
			SubnetID: f.SubnetID, SubnetCIDR: f.SubnetCIDR, Gateway: f.Gateway, VPC: inst.VPC, VPCCIDRs: f.VPCCIDRs,
			Zone: inst.Zone, Primary: f.Primary, Addresses: f.Addresses, Prefixes: f.Prefixes,
			IPv6Prefixes: f.IPv6Prefixes, SecurityGroups: f.SecurityGroups, Tags: f.Tags})
	}
	key := p.Space + "/" + n.Name
	w.mu.Lock()
	same := w.written != nil && reflect.DeepEqual(w.written[key], ifaces)
	w.mu.Unlock()
	if same {
		return nil
	}
	limits := store.InstanceLimits{Type: inst.Type, Interfaces: inst.Limits.Interfaces, IPv4PerInterface: inst.Limits.IPv4PerInterface}
	if err := w.Store.SetCloudInterfaces(ctx, p.Space, n.Name, inst.ID, limits, ifaces, w.now()); err != nil {
		return fmt.Errorf("recording the interfaces of %s: %w", inst.ID, err)
	}
	w.mu.Lock()
	if w.written == nil {
		w.written = map[string][]store.CloudInterface{}
	}
	w.written[key] = ifaces
	w.mu.Unlock()
	return nil
}

// release gives back, for the part of r excess for the pool's release
// delay, what drains: drained, taken back by the cloud, then dropped (or
// restored when the cloud refused).
func (w *Worker) release(ctx context.Context, p store.CloudPool, n store.CloudNode, r *cloud.Release) error {
	now := w.now()
	delay := releaseDelay(p)
	key := nodeKey(p, n)
	w.mu.Lock()
	if w.excess == nil {
		w.excess = map[string]map[netip.Prefix]time.Time{}
	}
	// Only what is excess now keeps its time: an address needed in between
	// starts the delay over.
	was, current := w.excess[key], map[netip.Prefix]time.Time{}
	var due []netip.Prefix
	if r != nil {
		for _, b := range blocksOf(r.Addresses, r.Prefixes) {
			since, ok := was[b]
			if !ok {
				since = now
			}
			current[b] = since
			if now.Sub(since) >= delay {
				due = append(due, b)
			}
		}
	}
	w.excess[key] = current
	w.mu.Unlock()
	if len(due) == 0 {
		return nil
	}
	drained, err := w.Store.DrainCloudBlocks(ctx, p.Space, n.Name, p.Name, due)
	if err != nil || len(drained) == 0 {
		return err
	}
	var addrs []netip.Addr
	var prefixes []netip.Prefix
	for _, b := range drained {
		if b.Bits() == 32 {
			addrs = append(addrs, b.Addr())
		} else {
			prefixes = append(prefixes, b)
		}
	}
	// The blocks stay drained whatever the answer: an unassign whose
	// answer was lost may have happened (the SDK's retry then hears "not
	// assigned"), and restoring them would let a Pod lease an address the
	// interface no longer holds. The readings decide (settle): dropped
	// once a fresh one lacks the blocks, restored only if the interface
	// still holds them after the release guard. A failed answer has the
	// node described alone at the next pass; a successful one waits for
	// the next listing, which drops them (no Pod can lease them
	// meanwhile): a describe per give-back was 2 calls for nothing.
	err = w.Cloud.Unassign(ctx, r.Interface, addrs, prefixes)
	if err != nil {
		w.changed(InstanceID(w.Provider, n.ProviderID))
	}
	w.mu.Lock()
	w.markReleased(key, drained, now)
	for _, b := range drained {
		delete(w.excess[key], b)
	}
	w.mu.Unlock()
	return err
}

func (w *Worker) reconcilerOf(p store.CloudPool) *cloud.Reconciler {
	w.mu.Lock()
	defer w.mu.Unlock()
	key := p.Space + "/" + p.Name
	if w.reconciler == nil {
		w.reconciler = map[string]*cloud.Reconciler{}
	}
	r := w.reconciler[key]
	if r == nil {
		r = &cloud.Reconciler{Provider: w.Cloud, Interfaces: w.Interfaces, Tags: w.Tags, Now: w.Now}
		w.reconciler[key] = r
	}
	// The pool's spec may have changed since: read it every pass.
	r.Subnets = cloud.SubnetSelector{IDs: p.Cloud.SubnetIDs, Tags: p.Cloud.SubnetTags}
	r.SecurityGroups = p.Cloud.SecurityGroups
	r.SecurityGroupTags = p.Cloud.SecurityGroupTags
	return r
}

// poolOptions are the plan options of pool p: its spec.cloud's, and IPv6
// when it lists IPv6 CIDRs.
func poolOptions(p store.CloudPool) cloud.PlanOptions {
	o := Options(p.Cloud)
	o.IPv6 = p.IPv6
	return o
}

// nodeOptions are the pool's plan options o for a node that says which of
// its interfaces hold Pod addresses (a CiliumNode's spec.eni): its first
// interface index wins over the pool's, its excluded tags are its own.
// Cilium's AWS operator reads both of the node alone
// (pkg/aws/ipam/node.go, ENI.IsExcludedBySpec). The Node's max Pods
// bounds it when the pool sets none, as the VPC CNI's ipamd reads it.
func nodeOptions(o cloud.PlanOptions, pi store.PodInterfaces) cloud.PlanOptions {
	if pi.FirstIndex != nil {
		o.FirstDevice = *pi.FirstIndex
	}
	o.ExcludeTags = pi.ExcludeTags
	if o.MaxPods == 0 && pi.MaxPods > 0 {
		o.MaxPods = pi.MaxPods
	}
	return o
}

// Options are the plan options of a pool's spec.cloud: Cilium's
// watermarks (their defaults when unset) or the VPC CNI's warm targets
// (PlanNode counts them in /28s with prefixes).
func Options(c alloc.CloudSpec) cloud.PlanOptions {
	o := cloud.PlanOptions{Prefixes: c.Prefixes, UsePrimary: c.UsePrimaryAddress, FirstDevice: c.FirstInterfaceIndex}
	switch {
	case c.WarmTargets != nil:
		o.Sizing.WarmTargets = c.WarmTargets
		o.MaxPods = c.WarmTargets.MaxPods
	case c.Watermarks != nil:
		o.Sizing.Watermarks = *c.Watermarks
	}
	return o
}

// InstanceID is the cloud's id of the instance a Kubernetes providerID
// names: aws:///ZONE/i-... gives i-...; azure://RESOURCE-ID gives the
// resource ID. "" when providerID is not of provider.
func InstanceID(provider alloc.CloudProvider, providerID string) string {
	rest, ok := strings.CutPrefix(providerID, string(provider)+"://")
	if !ok || rest == "" {
		return ""
	}
	if provider == alloc.CloudAzure {
		return rest
	}
	id := rest[strings.LastIndexByte(rest, '/')+1:]
	if !strings.HasPrefix(id, "i-") {
		return ""
	}
	return id
}

// blocksOf is addresses as /32s, then prefixes, in order.
func blocksOf(addrs []netip.Addr, prefixes []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(addrs)+len(prefixes))
	for _, a := range addrs {
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	out = append(out, prefixes...)
	return slices.Clip(out)
}

func (w *Worker) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

func (w *Worker) logger() *slog.Logger {
	if w.Log != nil {
		return w.Log
	}
	return slog.Default()
}
