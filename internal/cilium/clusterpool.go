// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"errors"
	"net/netip"
	"time"

	iputil "github.com/cilium/cilium/pkg/ip"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// retryUnserved is how soon a node the pools could not serve is looked at
// again (Cilium's operator retries such nodes in a controller of its own).
const retryUnserved = 5 * time.Second

// clusterPoolReconciler plays Cilium's operator for ipam.mode=cluster-pool:
// each CiliumNode's spec.ipam.podCIDRs holds its one block per family of
// the cluster pool (the operator's default pool, of mode cluster-pool),
// and the agent allocates Pod addresses inside them itself.
type clusterPoolReconciler struct{ o *Operator }

func (r *clusterPoolReconciler) reconcile(ctx context.Context, name string, cn *ciliumv2.CiliumNode) (time.Duration, error) {
	o := r.o
	if cn == nil || !cn.DeletionTimestamp.IsZero() {
		return 0, o.releaseAgentNode(ctx, name)
	}
	if ignored(cn) {
		return 0, nil
	}
	var listed []netip.Prefix
	for _, c := range cn.Spec.IPAM.PodCIDRs {
		if c.IsValid() {
			listed = append(listed, c.Masked())
		}
	}
	blocks, err := o.store.ClusterPoolBlocks(ctx, o.cfg.Space, name, o.cfg.DefaultPool, listed)
	desired := cn.DeepCopy()
	var requeue time.Duration
	var ae *alloc.Error
	switch {
	case err == nil:
		desired.Spec.IPAM.PodCIDRs = podCIDRs(blocks)
		desired.Status.IPAM.OperatorStatus.Error = ""
	case errors.As(err, &ae) && (ae.Kind == alloc.KindPoolExhausted || ae.Kind == alloc.KindNodeBlockLimit):
		// Cilium's words, as its cluster-pool operator writes them. The
		// families the node did get are listed: the agent waits for
		// every family it runs.
		desired.Spec.IPAM.PodCIDRs = podCIDRs(blocks)
		desired.Status.IPAM.OperatorStatus.Error = ErrAllocatorFull
		requeue = retryUnserved
	case errors.As(err, &ae):
		// The node's podCIDRs are not the cluster pool's, or the pool is
		// not a cluster-pool pool: say so, and pull nothing from under
		// the agent.
		desired.Status.IPAM.OperatorStatus.Error = ae.Detail
		requeue = retryUnserved
	default:
		return 0, err
	}
	return requeue, o.write(ctx, cn, desired)
}

// storeNodes names the store's nodes the mode serves.
func (r *clusterPoolReconciler) storeNodes(ctx context.Context) ([]string, error) {
	return r.o.store.AgentNodes(ctx, r.o.cfg.Space, alloc.ModeClusterPool)
}

func podCIDRs(blocks []netip.Prefix) []iputil.Prefix {
	if len(blocks) == 0 {
		return nil
	}
	out := make([]iputil.Prefix, len(blocks))
	for i, b := range blocks {
		out[i] = iputil.PrefixFrom(b)
	}
	return out
}

// releaseAgentNode gives the blocks of a node whose CiliumNode is gone back
// to their pools at once, as Cilium's operator does, by deleting the node
// from the store (its history records the release), unless the node's
// Kubernetes Node still exists (liveAgent). A node that also holds
// leases made through the API is left, with a warning: those are not the
// agent's to end.
func (o *Operator) releaseAgentNode(ctx context.Context, name string) error {
	if o.liveAgent(name) {
		return nil
	}
	err := o.store.DeleteNode(ctx, o.cfg.Space, name, false)
	var ae *alloc.Error
	switch {
	case err == nil:
		o.log.Info("CiliumNode deleted: its blocks went back to their pools", "node", name)
		return nil
	case errors.As(err, &ae) && ae.Kind == alloc.KindNotFound:
		return nil
	case errors.As(err, &ae) && ae.Kind == alloc.KindInUse:
		o.log.Warn("CiliumNode deleted, but its node holds leases made through the API: its blocks stay", "node", name, "err", err)
		return nil
	}
	return err
}
