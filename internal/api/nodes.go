// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"log/slog"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// NodeStore keeps the node registry and reports a node's use of its pools.
type NodeStore interface {
	// PutNode registers n or replaces its labels, addresses and provider ID;
	// created reports a registration. CIDRs Kubernetes assigned the node
	// are adopted as its blocks.
	PutNode(ctx context.Context, n alloc.Node) (node alloc.Node, created bool, err error)
	// GetNode reads one node with its block and lease counts, or answers
	// KindNotFound.
	GetNode(ctx context.Context, space, name string) (alloc.Node, error)
	// ListNodes pages through the space's nodes by name.
	ListNodes(ctx context.Context, space string, page alloc.Page) (items []alloc.Node, next string, err error)
	// DeleteNode refuses (KindInUse) a node with pending or active leases,
	// or with addresses bound to workload identities, unless force; force
	// releases its leases (and bindings) and blocks first.
	DeleteNode(ctx context.Context, space, name string, force bool) error
	// NodeUsage reports the node's use of each pool family it holds blocks
	// of or pre-allocates from, or of exactly the pools the filter names
	// (KindNotFound for one the space lacks; a node not registered yet
	// holds no blocks), in one snapshot.
	NodeUsage(ctx context.Context, space, node string, only alloc.UsageFilter) (alloc.NodeUsage, error)
}

// nodeHandlers serve /v1/nodes and a node's pool usage.
type nodeHandlers struct {
	store       NodeStore
	ciliumNodes CiliumNodeSource // nil: the Cilium operator role is off
	log         *slog.Logger
}

func (h *nodeHandlers) ListNodes(ctx context.Context, req ipamv1.ListNodesRequestObject) (ipamv1.ListNodesResponseObject, error) {
	space, page, err := parseSpacePage(req.Params.Space, req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.ListNodes(ctx, space, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListNodes200JSONResponse(nodeListToAPI(items, next)), nil
}

func (h *nodeHandlers) GetNode(ctx context.Context, req ipamv1.GetNodeRequestObject) (ipamv1.GetNodeResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	n, err := h.store.GetNode(ctx, space, req.Node)
	if err != nil {
		return nil, err
	}
	out := nodeToAPI(n)
	if h.ciliumNodes != nil {
		st, ok, err := h.ciliumNodes.CiliumNodeState(ctx, space, req.Node)
		if err != nil {
			// The API server is the operator's business, not this
			// request's: the node is answered without it.
			h.log.WarnContext(ctx, "reading the node's CiliumNode", "node", req.Node, "err", err)
		} else if ok {
			out.Cilium = ciliumNodeToAPI(st)
		}
	}
	return ipamv1.GetNode200JSONResponse(out), nil
}

func (h *nodeHandlers) GetNodeUsage(ctx context.Context, req ipamv1.GetNodeUsageRequestObject) (ipamv1.GetNodeUsageResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	only, err := usageFilterFromAPI(req.Params)
	if err != nil {
		return nil, err
	}
	u, err := h.store.NodeUsage(ctx, space, req.Node, only)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetNodeUsage200JSONResponse(nodeUsageToAPI(req.Node, u)), nil
}

// PutNode answers 201 when it registered the node, 200 when it replaced it.
func (h *nodeHandlers) PutNode(ctx context.Context, req ipamv1.PutNodeRequestObject) (ipamv1.PutNodeResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	n, err := nodeFromAPI(space, req.Node, *req.Body)
	if err != nil {
		return nil, err
	}
	n, created, err := h.store.PutNode(ctx, n)
	if err != nil {
		return nil, err
	}
	if created {
		return ipamv1.PutNode201JSONResponse(nodeToAPI(n)), nil
	}
	return ipamv1.PutNode200JSONResponse(nodeToAPI(n)), nil
}

func (h *nodeHandlers) DeleteNode(ctx context.Context, req ipamv1.DeleteNodeRequestObject) (ipamv1.DeleteNodeResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	if err := h.store.DeleteNode(ctx, space, req.Node, deref(req.Params.Force, false)); err != nil {
		return nil, err
	}
	return ipamv1.DeleteNode204Response{}, nil
}
