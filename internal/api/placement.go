// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"errors"
	"fmt"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// A node acts only for the Pods on it, as Kubernetes' Node authorizer lets
// a kubelet act only for the Pods bound to its node. A node certificate is
// confined to its own node's routes by the gate (authz.go), but a lease
// request names an owner, a Pod anywhere, and may carry a sticky identity
// that another node's workload holds. So, for a node certificate's lease
// request:
//
//   - with Kubernetes (Options.PodMetadata), the owner's Pod must be bound
//     to the node (owner), and a sticky identity bound on another node is
//     taken over only when the Pod that held it there has left that node
//     (stickyMoves, alloc.TakeoverRefusal);
//   - without, nothing says where Pods are: a sticky identity leaves
//     another node only when its retention ends, or by an operator.
//
// Operators (tokens, operator certificates) are not restricted: they act
// for the cluster. The Kubernetes lookups happen here, before the store's
// transaction; the store compares the takeovers allowed with the bound
// rows under their locks (alloc.StickyMoves), so a binding that changed in
// between is refused, not taken.

// bindingReader reads the bindings of an identity, for the takeover check.
type bindingReader interface {
	// Bindings answers the addresses bound to identity: held by a lease,
	// or released and within their retention.
	Bindings(ctx context.Context, space, identity string) ([]alloc.Lease, error)
}

// noKubernetes is the refusal's reason on a server without Kubernetes.
const noKubernetes = "this server has no Kubernetes access to see that the workload has left that node"

// owner looks the request's owner up in Kubernetes. For a node
// certificate (restricted) the Pod must be bound to node: a cached Pod
// that is not is read again from the API server before the refusal, and
// any Pod not bound there (elsewhere, not scheduled, absent) is a 403 on
// owner, the same for each so that a node learns nothing of other nodes'
// Pods. For other callers an absent Pod is a 404 on owner.
func (h *leaseHandlers) owner(ctx context.Context, pods PodMetadataSource, owner alloc.Owner, node string, restricted bool) (PodInfo, error) {
	var recheck func(alloc.PodPlacement) bool
	if restricted {
		recheck = func(p alloc.PodPlacement) bool { return !p.BoundTo(owner, node) }
	}
	pod, err := pods.Pod(ctx, owner.Namespace, owner.Name, recheck)
	switch {
	case errors.Is(err, ErrPodNotFound) && restricted:
		return PodInfo{}, alloc.CheckOwnerPlacement(owner, node, alloc.PodPlacement{})
	case errors.Is(err, ErrPodNotFound):
		return PodInfo{}, alloc.NotFound("owner", "pod", owner.Namespace+"/"+owner.Name+" in Kubernetes")
	case err != nil:
		return PodInfo{}, &unavailableError{err: fmt.Errorf("kubernetes lookup: %w", err), dependency: "Kubernetes"}
	}
	if restricted {
		if err := alloc.CheckOwnerPlacement(owner, node, pod.Placement); err != nil {
			return PodInfo{}, err
		}
	}
	return pod, nil
}

// stickyMoves is the restriction of a node certificate's sticky request:
// which bindings of its identity on other nodes it may take over. Without
// Kubernetes, none. With it, those whose last Pod has left their node
// (alloc.TakeoverRefusal), as the API server says now: a takeover strips
// another node's workload of its address, so it is never decided on a
// cache that may lag a Pod recreated there. Bindings held by a lease, or
// on the request's node, need no decision (the store answers a conflict,
// or no move).
func (h *leaseHandlers) stickyMoves(ctx context.Context, r alloc.LeaseRequest) (*alloc.StickyMoves, error) {
	pods := h.podsOf(r.Space)
	if pods == nil {
		return &alloc.StickyMoves{Why: noKubernetes}, nil
	}
	bound, err := h.bindings.Bindings(ctx, r.Space, r.Sticky.Identity)
	if err != nil {
		return nil, err
	}
	m := &alloc.StickyMoves{}
	type holder struct {
		owner alloc.Owner
		node  string
	}
	decided := map[holder]string{} // the families of one binding share a Pod
	for _, l := range bound {
		if l.Node == r.Node || l.State != alloc.StateCooling {
			continue
		}
		k := holder{owner: alloc.Owner{Namespace: l.Owner.Namespace, Name: l.Owner.Name}, node: l.Node}
		why, ok := decided[k]
		if !ok {
			now, err := placementNow(ctx, pods, l.Owner)
			if err != nil {
				return nil, err
			}
			why = alloc.TakeoverRefusal(r.Node, r.Owner, l.Owner, l.Node, now)
			decided[k] = why
		}
		switch {
		case why == "":
			m.From = append(m.From, alloc.BoundLease{Family: l.Family, Node: l.Node, Generation: l.Generation})
		case m.Why == "":
			m.Why = why
		}
	}
	return m, nil
}

// placementNow is where the API server, not the cache, has owner's Pod.
func placementNow(ctx context.Context, pods PodMetadataSource, owner alloc.Owner) (alloc.PodPlacement, error) {
	if owner.Namespace == "" || owner.Name == "" {
		return alloc.PodPlacement{}, nil
	}
	pod, err := pods.Pod(ctx, owner.Namespace, owner.Name, func(alloc.PodPlacement) bool { return true })
	switch {
	case errors.Is(err, ErrPodNotFound):
		return alloc.PodPlacement{}, nil
	case err != nil:
		return alloc.PodPlacement{}, &unavailableError{err: fmt.Errorf("kubernetes lookup: %w", err), dependency: "Kubernetes"}
	}
	return pod.Placement, nil
}
