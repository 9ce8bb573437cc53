// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import "fmt"

// A node acts only for the Pods on it. Kubernetes' Node authorizer lets a
// kubelet read and change only the Pods bound to its node; a node
// certificate here is held to the same rule when the server can see
// Kubernetes: it leases for a Pod only while that Pod is bound to the
// node, and takes a sticky identity from another node only when the Pod
// that held it there has gone. The API looks the Pods up; the decisions
// are these pure functions.

// ReserveOwnerNamespace is the owner namespace of a node's address
// reserve: the CNI plugin (cmd/cni-shim) leases a few addresses to its node
// in advance, each slot owned by cni-reserve/NETWORK, serves Pods from them
// while the service is unreachable, and later hands each slot used over to
// its Pod (LeaseRequest.FromReserve, which names the Pod as owner). Such an
// owner is the node's own, not a Pod: Kubernetes is not asked about it,
// and its leases never take a sticky identity from another node.
const ReserveOwnerNamespace = "cni-reserve"

// IsReserve reports whether o owns a slot of a node's address reserve
// rather than naming a Pod.
func (o Owner) IsReserve() bool { return o.Namespace == ReserveOwnerNamespace }

// PodPlacement is what Kubernetes says of the Pod an owner names.
type PodPlacement struct {
	// Exists is false when the API server has no such Pod (or no such
	// namespace); the other fields are then empty.
	Exists bool
	UID    string
	// Node is the node the Pod is bound to (spec.nodeName); empty while
	// it is not scheduled.
	Node string
}

// BoundTo reports whether p is owner's Pod bound to node: it exists, is
// bound there, and, when owner names a UID, is that Pod and not one
// recreated under the same name since.
func (p PodPlacement) BoundTo(owner Owner, node string) bool {
	return p.Exists && node != "" && p.Node == node && (owner.UID == "" || owner.UID == p.UID)
}

// CheckOwnerPlacement is the rule for a node certificate's lease request
// (node is the certificate's node, owner the request's): nil when p, the
// owner's Pod, is bound to node, else a KindForbidden error on field
// owner. The detail is the same whether the Pod is bound elsewhere, not
// yet scheduled, or absent, as Kubernetes' Node authorizer answers alike:
// a node learns nothing of the Pods of other nodes by asking.
func CheckOwnerPlacement(owner Owner, node string, p PodPlacement) error {
	if p.BoundTo(owner, node) {
		return nil
	}
	what := fmt.Sprintf("Pod %s/%s", owner.Namespace, owner.Name)
	if owner.UID != "" {
		what += " (uid " + owner.UID + ")"
	}
	return &Error{Kind: KindForbidden, Field: "owner",
		Detail: fmt.Sprintf("node %q may act only for Pods bound to it, and Kubernetes has %s bound to no such node "+
			"(it is on another node, not scheduled yet, or gone)", node, what)}
}

// TakeoverRefusal decides whether a node certificate's request for node,
// leasing for requester (whose Pod is bound to node: CheckOwnerPlacement
// passed), may take over an identity bound on node from, whose lease there
// was last held by the Pod last, which Kubernetes now places at now (read
// from the API server, not a cache). It answers "" when the request may,
// else why not, for StickyMoves.Why (naming nothing of the other node).
//
// The Pod that held the identity must have left from: while it is bound
// there, its workload may come back to its address. Then, if that Pod
// still exists (bound elsewhere or not yet scheduled), the identity is
// its own: only that Pod, bound to node, takes it (a StatefulSet Pod keeps
// its name when it moves, so this is the move Kubernetes made). Only when
// it is gone may another Pod take the identity (a VM's new launcher Pod,
// which has a name of its own). Without the second rule a compromised
// node could take any StatefulSet's identity in the moment its Pod is
// recreated, which every rolling update offers.
func TakeoverRefusal(node string, requester, last Owner, from string, now PodPlacement) string {
	switch {
	case requester.IsReserve():
		return "a reserve slot's lease is no Pod's"
	case last.Namespace == "" || last.Name == "" || last.IsReserve():
		return "its last lease names no Pod"
	case !now.Exists:
		return ""
	case now.Node == from:
		return "the Pod that held it is still bound to that node"
	case requester.Namespace != last.Namespace || requester.Name != last.Name:
		return "the Pod that held it still exists, and only it may take the identity to another node"
	case !now.BoundTo(requester, node):
		// The same Pod, which the API server now places elsewhere than the
		// cache did when the request's owner was checked (or which is a
		// namesake of the requester's UID).
		return "the Pod that held it is not bound to this node"
	}
	return ""
}
