// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// ReconcileStore is what a runtime's garbage collection (CNI GC) needs:
// releasing the leases of a node that no valid attachment holds.
type ReconcileStore interface {
	// Reconcile releases every pending or active lease of the node's
	// network whose attachment is not in valid (all of that network), and
	// answers them; other networks' leases are kept.
	Reconcile(ctx context.Context, space, node, network string, valid []alloc.Attachment) ([]alloc.Lease, error)
	// ReconcileUpTo is Reconcile keeping the leases above generation upTo
	// (0 or more; 0 keeps every lease), which the list could not know of.
	ReconcileUpTo(ctx context.Context, space, node, network string, valid []alloc.Attachment, upTo int64) ([]alloc.Lease, error)
	// ReconcileKept counts the node's pending and active leases of network
	// that no attachment of valid holds: after Reconcile, the ones it kept.
	ReconcileKept(ctx context.Context, space, node, network string, valid []alloc.Attachment) (int64, error)
	// GenerationHighWater answers the highest lease generation issued so
	// far: what a runtime reads before listing its attachments, to name
	// it in ReconcileUpTo.
	GenerationHighWater(ctx context.Context) (int64, error)
}

// reconcileHandlers serve /v1/nodes/{node}/reconcile.
type reconcileHandlers struct {
	store   ReconcileStore
	metrics *metrics // never nil
}

// ReconcileNode releases the node's leases that no valid attachment holds,
// and counts them and those it kept.
func (h *reconcileHandlers) ReconcileNode(ctx context.Context, req ipamv1.ReconcileNodeRequestObject) (ipamv1.ReconcileNodeResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	valid, err := attachmentsFromAPI(*req.Body)
	if err != nil {
		return nil, err
	}
	var released []alloc.Lease
	if g := req.Body.Generation; g != nil {
		if err := alloc.ValidateWatermark("generation", *g); err != nil {
			return nil, err
		}
		released, err = h.store.ReconcileUpTo(ctx, space, req.Node, deref(req.Body.Network, ""), valid, *g)
	} else {
		released, err = h.store.Reconcile(ctx, space, req.Node, deref(req.Body.Network, ""), valid)
	}
	if err != nil {
		return nil, err
	}
	h.metrics.countReleases(ctx, released)
	// What the list left out but the call kept, so a runtime can say why a
	// GC released nothing.
	kept, err := h.store.ReconcileKept(ctx, space, req.Node, deref(req.Body.Network, ""), valid)
	if err != nil {
		return nil, err
	}
	return ipamv1.ReconcileNode200JSONResponse{Released: leasesToAPI(released), Kept: kept}, nil
}

// GetReconcileWatermark answers the generation a runtime reads before
// listing its attachments, to name it in the reconcile that follows.
func (h *reconcileHandlers) GetReconcileWatermark(ctx context.Context, req ipamv1.GetReconcileWatermarkRequestObject) (ipamv1.GetReconcileWatermarkResponseObject, error) {
	if _, err := parseSpace(req.Params.Space); err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	g, err := h.store.GenerationHighWater(ctx)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetReconcileWatermark200JSONResponse{Generation: g}, nil
}
