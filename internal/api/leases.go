// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// LeaseStore is what the attachment handlers need: the leases of one
// container interface on a node (an attachment), from allocation to
// release. The CNI plugin calls these on every Pod start and stop.
//
// The methods ending in At act only on leases of generation gen: a lease
// of another generation is a KindStaleGeneration error and nothing
// changes. Nothing held (or already released at gen) is success, as
// without a generation.
type LeaseStore interface {
	// Allocate leases one address per family in one transaction. A retry
	// of the same attachment answers the existing leases with
	// Created=false, or KindLeaseConflict when it asks for something else.
	// KindPoolExhausted carries a RetryAfter when addresses of the node are
	// still cooling.
	Allocate(ctx context.Context, r alloc.LeaseRequest) (alloc.Allocation, error)
	// GetAttachment answers the attachment's pending and active leases, or
	// KindNotFound when it holds none.
	GetAttachment(ctx context.Context, space, node string, a alloc.Attachment) (alloc.Allocation, error)
	// Confirm makes the attachment's pending leases active, which stops
	// their expiry, and answers the attachment; confirming again is a
	// no-op, and an attachment holding nothing is KindNotFound.
	Confirm(ctx context.Context, space, node string, a alloc.Attachment) (alloc.Allocation, error)
	ConfirmAt(ctx context.Context, space, node string, a alloc.Attachment, gen int64) (alloc.Allocation, error)
	// ReleaseAttachment releases the attachment's leases and answers them;
	// nothing held is success with nothing released.
	ReleaseAttachment(ctx context.Context, space, node string, a alloc.Attachment) ([]alloc.Lease, error)
	ReleaseAttachmentAt(ctx context.Context, space, node string, a alloc.Attachment, gen int64) ([]alloc.Lease, error)
}

// leaseHandlers serve the attachments of /v1/nodes/{node}: allocate, get,
// confirm and release. AllocateLease is the hot path.
type leaseHandlers struct {
	store       LeaseStore
	bindings    bindingReader     // a node's sticky takeovers (placement.go)
	metrics     *metrics          // never nil
	podMetadata PodMetadataSource // nil: requests carry their metadata or have none
	kubeSpace   string            // the space of podMetadata's cluster (Options.KubeSpace)
}

// podsOf is the Pod metadata of space's cluster: podMetadata for the
// space of the cluster it reads, nil for any other (another cluster's
// Pods are not in it, and a lookup there would answer "not on this node"
// for every Pod).
func (h *leaseHandlers) podsOf(space string) PodMetadataSource {
	if space != h.kubeSpace {
		return nil
	}
	return h.podMetadata
}

// AllocateLease is the hot path (one call per Pod interface): parse,
// validate, one store transaction, format. It answers 201 for a new
// allocation and 200 for a retry of the same attachment, and counts every
// call by its outcome.
func (h *leaseHandlers) AllocateLease(ctx context.Context, req ipamv1.AllocateLeaseRequestObject) (ipamv1.AllocateLeaseResponseObject, error) {
	a, err := h.allocate(ctx, req)
	h.metrics.countAllocation(ctx, a, err)
	if err != nil {
		return nil, err
	}
	if mayReadEveryNode(ctx) {
		showOperatorReasons(a)
	}
	if a.Created {
		return ipamv1.AllocateLease201JSONResponse(allocationToAPI(a)), nil
	}
	return ipamv1.AllocateLease200JSONResponse(allocationToAPI(a)), nil
}

// allocate parses the request, completes the Pod's metadata from
// Kubernetes when the request carries none, holds a node certificate to
// the Pods on its node (placement.go), and makes the one store call. A
// slot of a node's reserve names no Pod: Kubernetes is not asked.
func (h *leaseHandlers) allocate(ctx context.Context, req ipamv1.AllocateLeaseRequestObject) (alloc.Allocation, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return alloc.Allocation{}, err
	}
	r, err := leaseRequestFromAPI(space, req.Node, *req.Body)
	if err != nil {
		return alloc.Allocation{}, err
	}
	_, restricted := nodeCaller(ctx)
	carried := req.Body.Pod != nil || req.Body.Namespace != nil
	if pods := h.podsOf(r.Space); pods != nil && !r.Owner.IsReserve() && (restricted || !carried) {
		pod, err := h.owner(ctx, pods, r.Owner, r.Node, restricted)
		if err != nil {
			return alloc.Allocation{}, err
		}
		if !carried {
			r.Pod, r.Namespace = pod.Pod, pod.Namespace
		}
	}
	if restricted && r.Sticky != nil {
		if r.Sticky.Moves, err = h.stickyMoves(ctx, r); err != nil {
			return alloc.Allocation{}, err
		}
	}
	return h.store.Allocate(ctx, r)
}

func (h *leaseHandlers) GetAttachment(ctx context.Context, req ipamv1.GetAttachmentRequestObject) (ipamv1.GetAttachmentResponseObject, error) {
	space, node, a, err := parseAttachmentPath(req.Params.Space, req.Params.Network, req.Node, req.ContainerID, req.Interface)
	if err != nil {
		return nil, err
	}
	got, err := h.store.GetAttachment(ctx, space, node, a)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetAttachment200JSONResponse(allocationToAPI(got)), nil
}

func (h *leaseHandlers) ConfirmAttachment(ctx context.Context, req ipamv1.ConfirmAttachmentRequestObject) (ipamv1.ConfirmAttachmentResponseObject, error) {
	space, node, a, err := parseAttachmentPath(req.Params.Space, req.Params.Network, req.Node, req.ContainerID, req.Interface)
	if err != nil {
		return nil, err
	}
	var got alloc.Allocation
	if g := req.Params.Generation; g != nil {
		got, err = h.store.ConfirmAt(ctx, space, node, a, *g)
	} else {
		got, err = h.store.Confirm(ctx, space, node, a)
	}
	if err != nil {
		return nil, err
	}
	return ipamv1.ConfirmAttachment200JSONResponse(allocationToAPI(got)), nil
}

// ReleaseAttachment answers 204 whether or not anything was held, and counts
// the leases it released.
func (h *leaseHandlers) ReleaseAttachment(ctx context.Context, req ipamv1.ReleaseAttachmentRequestObject) (ipamv1.ReleaseAttachmentResponseObject, error) {
	space, node, a, err := parseAttachmentPath(req.Params.Space, req.Params.Network, req.Node, req.ContainerID, req.Interface)
	if err != nil {
		return nil, err
	}
	var released []alloc.Lease
	if g := req.Params.Generation; g != nil {
		released, err = h.store.ReleaseAttachmentAt(ctx, space, node, a, *g)
	} else {
		released, err = h.store.ReleaseAttachment(ctx, space, node, a)
	}
	if err != nil {
		return nil, err
	}
	h.metrics.countReleases(ctx, released)
	return ipamv1.ReleaseAttachment204Response{}, nil
}
