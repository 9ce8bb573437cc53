// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
)

// An instance that ended takes its interfaces, their addresses and its
// Pods with it, and the cloud hands the addresses to other instances
// (EC2 frees an interface deleted on termination at once). Its node's
// blocks must then go, or the instance that got one of the addresses can
// never record it. They go only once the cloud confirms the end: EC2
// answers NotFound for a while about an instance it just started, too,
// and a node's blocks dropped on such an answer would be recorded again
// at the next reading while its Pods' leases were gone. Confirmed means
// the instance described as ended (EC2's terminated or shutting-down,
// shown for about an hour), or NotFound on every reading for GoneAfter
// (the instance ended long ago: while the workers did not run, or on a
// cloud that shows no ended state). Cilium's operator marks such a node
// not running and stops serving it; its addresses leave with the
// CiliumNode. Here the node's record is Kubernetes' to delete, so its
// blocks leave first, with the leases in them (store.DropGoneCloudNode).

// GoneAfter is how long an instance must answer NotFound, from the first
// reading that did, before its node's blocks are dropped.
const GoneAfter = 5 * time.Minute

// goneWatch is when each node's instance first answered NotFound, since
// its last reading that found it, and the instances the cloud confirmed
// ended.
type goneWatch struct {
	mu    sync.Mutex
	since map[string]notFoundSince // "space/node" -> the first NotFound
	// ended are the providerIDs of the nodes whose instance the cloud
	// confirmed ended, by "space/node": such a node, its blocks gone, is
	// not described again while the listings lack its instance. The
	// Kubernetes node of a terminated instance stays for a while (its
	// lifecycle controller's grace); described each pass, the cluster's
	// dead nodes cost a describe each every pass for nothing (the
	// 1,000-node scale-out's 10 spent 360), where Cilium's operator,
	// reading its instance cache, spends none. A node registered again
	// under that name has another providerID; an Azure VM made again
	// under the same ID shows in the next listing.
	ended map[string]string
}

type notFoundSince struct {
	providerID string
	at         time.Time
}

// gone records a reading of instance providerID of node that answered
// err (KindNotFound), and answers whether the cloud confirms that it
// ended.
func (w *Worker) gone(space, node, providerID string, err error) bool {
	key := space + "/" + node
	now := w.now()
	w.goneWatch.mu.Lock()
	defer w.goneWatch.mu.Unlock()
	if w.goneWatch.since == nil {
		w.goneWatch.since = map[string]notFoundSince{}
	}
	was, ok := w.goneWatch.since[key]
	if !ok || was.providerID != providerID {
		was = notFoundSince{providerID: providerID, at: now}
		w.goneWatch.since[key] = was
	}
	return cloud.Ended(err) || now.Sub(was.at) >= GoneAfter
}

// found records that node's instance was found: a NotFound before was
// the cloud not showing it yet.
func (w *Worker) found(space, node string) {
	w.goneWatch.mu.Lock()
	delete(w.goneWatch.since, space+"/"+node)
	delete(w.goneWatch.ended, space+"/"+node)
	w.goneWatch.mu.Unlock()
}

// confirmEnded records that the cloud confirmed the end of node's
// instance providerID and that its blocks are gone.
func (w *Worker) confirmEnded(space, node, providerID string) {
	w.goneWatch.mu.Lock()
	defer w.goneWatch.mu.Unlock()
	if w.goneWatch.ended == nil {
		w.goneWatch.ended = map[string]string{}
	}
	w.goneWatch.ended[space+"/"+node] = providerID
}

// knownEnded reports whether the cloud confirmed the end of x's instance
// and x's node holds no block: nothing left to read it for.
func (w *Worker) knownEnded(x *nodeWork) bool {
	if len(x.node.Blocks) > 0 {
		return false
	}
	w.goneWatch.mu.Lock()
	defer w.goneWatch.mu.Unlock()
	id, ok := w.goneWatch.ended[x.pool.Space+"/"+x.node.Name]
	return ok && id == x.node.ProviderID
}

// notFound handles a reading of x's instance id that answered err
// (KindNotFound): nothing is created or given back for it, and once the
// cloud confirms it ended its node's blocks and their leases go.
func (w *Worker) notFound(ctx context.Context, x *nodeWork, id string, err error) error {
	p, n := x.pool, x.node
	if !w.gone(p.Space, n.Name, n.ProviderID, err) {
		w.logger().Info("cloud capacity: instance not found; its blocks stay until the cloud confirms it ended",
			"node", n.Name, "instance", id, "err", err)
		return nil
	}
	if len(n.Blocks) == 0 {
		w.logger().Debug("cloud capacity: instance gone", "node", n.Name, "instance", id)
		w.confirmEnded(p.Space, n.Name, n.ProviderID)
		return nil
	}
	if err := w.dropGone(ctx, p.Space, n.Name, n.ProviderID, id); err != nil {
		return err
	}
	w.confirmEnded(p.Space, n.Name, n.ProviderID)
	return nil
}

// dropGone drops the blocks of node, whose instance id (named by
// providerID) the cloud confirmed gone, and the leases in them.
func (w *Worker) dropGone(ctx context.Context, space, node, providerID, id string) error {
	blocks, leases, err := w.Store.DropGoneCloudNode(ctx, space, node, providerID)
	if err != nil {
		return fmt.Errorf("dropping the blocks of instance %s, gone: %w", id, err)
	}
	w.mu.Lock()
	delete(w.written, space+"/"+node)
	w.mu.Unlock()
	w.logger().Info("cloud capacity: instance gone, its node's blocks dropped", "node", node, "instance", id,
		"blocks", blocks, "leases", leases)
	return nil
}

// recordContested records what x's interfaces hold that its node lacks,
// one block at a time, when recording them together overlapped a block
// another node or pool holds: the cloud says which instance truly holds
// the address now (resolveOverlap). A block still contested is left out
// of this pass and logged; the node is served with the others.
func (w *Worker) recordContested(ctx context.Context, x *nodeWork, inst cloud.Instance) error {
	p, n := x.pool, x.node
	have := map[netip.Prefix]bool{}
	for _, b := range n.Blocks {
		have[b.Prefix] = true
	}
	for _, f := range inst.Interfaces {
		for _, b := range podBlocks(f, x.opts) {
			if have[b] {
				continue
			}
			err := w.Store.RecordCloudBlocks(ctx, p.Space, n.Name, p.Name, f.ID, []netip.Prefix{b})
			if alloc.IsKind(err, alloc.KindOverlap) {
				var again bool
				if again, err = w.resolveOverlap(ctx, x, b); err == nil && again {
					err = w.Store.RecordCloudBlocks(ctx, p.Space, n.Name, p.Name, f.ID, []netip.Prefix{b})
				}
			}
			if alloc.IsKind(err, alloc.KindOverlap) {
				w.logger().Warn("cloud capacity: an address the cloud gave the node overlaps a block another holds; left out",
					"node", n.Name, "interface", f.ID, "block", b)
				continue
			}
			if err != nil {
				return fmt.Errorf("recording what %s holds: %w", f.ID, err)
			}
		}
	}
	return nil
}

// resolveOverlap reads the cloud about the holder of the block that b,
// which x's instance holds, overlaps, and answers whether that block is
// gone now: dropped with its node when the holder's instance is
// confirmed gone, or alone when the holder's instance is there without
// it and no lease row is in it (the cloud moved the address: each
// instance's reading says so). An address both instances show (a stale
// reading of one) stays contested.
func (w *Worker) resolveOverlap(ctx context.Context, x *nodeWork, b netip.Prefix) (bool, error) {
	space, n := x.pool.Space, x.node
	h, err := w.Store.CloudBlockHolder(ctx, space, b)
	if alloc.IsKind(err, alloc.KindNotFound) {
		return true, nil // gone meanwhile
	} else if err != nil {
		return false, err
	}
	log := w.logger().With("node", n.Name, "block", b, "holder", h.Node, "pool", h.Pool)
	id := InstanceID(w.Provider, h.ProviderID)
	if h.Node == n.Name || !h.Cloud || id == "" {
		// The node's own block in another pool (its labels moved it), or
		// no cloud's block: nothing the cloud can settle.
		log.Warn("cloud capacity: an address the cloud gave the node is held by a block the workers cannot settle")
		return false, nil
	}
	// Only a listing of this pass: an older one may show the holder as it
	// was before the cloud moved the address.
	r, reused, ok := x.listed.lookup(id)
	inst := r.inst
	if !ok || reused {
		inst, err = w.Cloud.Instance(ctx, id)
	}
	switch {
	case cloud.KindOf(err) == cloud.KindNotFound:
		if !w.gone(space, h.Node, h.ProviderID, err) {
			log.Info("cloud capacity: the holder's instance is not found; waiting for the cloud to confirm it ended", "instance", id)
			return false, nil
		}
		if err := w.dropGone(ctx, space, h.Node, h.ProviderID, id); err != nil {
			return false, err
		}
		return true, nil
	case err != nil:
		log.Warn("cloud capacity: reading the holder of an overlapping block failed", "instance", id, "err", err)
		return false, nil
	}
	w.found(space, h.Node)
	if holdsAny(inst, h.Block) {
		log.Warn("cloud capacity: two instances show the same address (a stale reading); left to the next pass", "instance", id)
		return false, nil
	}
	drained, err := w.Store.DrainCloudBlocks(ctx, space, h.Node, h.Pool, []netip.Prefix{h.Block})
	if err != nil || len(drained) == 0 {
		if err == nil {
			log.Warn("cloud capacity: the cloud moved an address a Pod of its former node still holds", "instance", id)
		}
		return false, err
	}
	if err := w.Store.DropCloudBlocks(ctx, space, h.Node, h.Pool, drained); err != nil {
		return false, err
	}
	log.Info("cloud capacity: a block the cloud moved to another instance dropped from its former node", "instance", id)
	return true, nil
}

// holdsAny reports whether any interface of inst holds an address of b.
func holdsAny(inst cloud.Instance, b netip.Prefix) bool {
	for _, f := range inst.Interfaces {
		if b.Contains(f.Primary) || slices.ContainsFunc(f.Addresses, b.Contains) {
			return true
		}
		for _, p := range slices.Concat(f.Prefixes, f.IPv6Prefixes) {
			if p.Overlaps(b) {
				return true
			}
		}
	}
	return false
}
