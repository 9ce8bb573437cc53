// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"net/netip"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// BlockStore keeps the blocks each node holds.
type BlockStore interface {
	// ListBlocks lists the node's blocks by pool, family and CIDR.
	ListBlocks(ctx context.Context, space, node string) ([]alloc.Block, error)
	// CarveBlock carves the first free aligned block of the pool's mask
	// for a registered node.
	CarveBlock(ctx context.Context, space, node, pool string, f alloc.Family) (alloc.Block, error)
	// ReleaseBlock returns an empty block to its pool; one with leased or
	// cooling addresses is KindInUse, one the node lacks KindNotFound.
	ReleaseBlock(ctx context.Context, space, node string, cidr netip.Prefix) error
	// ListPoolBlocks pages through the pool's blocks of family f (both
	// when 0), IPv4 before IPv6 and by CIDR; a missing pool is
	// KindNotFound.
	ListPoolBlocks(ctx context.Context, space, pool string, f alloc.Family, page alloc.Page) (items []alloc.Block, next string, err error)
}

// blockHandlers serve /v1/nodes/{node}/blocks and /v1/pools/{pool}/blocks.
type blockHandlers struct {
	store BlockStore
}

func (h *blockHandlers) ListBlocks(ctx context.Context, req ipamv1.ListBlocksRequestObject) (ipamv1.ListBlocksResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	items, err := h.store.ListBlocks(ctx, space, req.Node)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListBlocks200JSONResponse(blockListToAPI(items)), nil
}

func (h *blockHandlers) CarveBlock(ctx context.Context, req ipamv1.CarveBlockRequestObject) (ipamv1.CarveBlockResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Body.Pool); err != nil {
		return nil, err
	}
	f, err := parseFamily("family", req.Body.Family)
	if err != nil {
		return nil, err
	}
	b, err := h.store.CarveBlock(ctx, space, req.Node, req.Body.Pool, f)
	if err != nil {
		return nil, err
	}
	return ipamv1.CarveBlock201JSONResponse(blockToAPI(b)), nil
}

func (h *blockHandlers) ReleaseBlock(ctx context.Context, req ipamv1.ReleaseBlockRequestObject) (ipamv1.ReleaseBlockResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	cidr, err := parsePrefix("cidr", req.Params.Cidr)
	if err != nil {
		return nil, err
	}
	if err := h.store.ReleaseBlock(ctx, space, req.Node, cidr); err != nil {
		return nil, err
	}
	return ipamv1.ReleaseBlock204Response{}, nil
}

// ListPoolBlocks pages through a pool's blocks, each with its node and fill.
func (h *blockHandlers) ListPoolBlocks(ctx context.Context, req ipamv1.ListPoolBlocksRequestObject) (ipamv1.ListPoolBlocksResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	var f alloc.Family
	if req.Params.Family != nil {
		if f, err = parseFamily("family", *req.Params.Family); err != nil {
			return nil, err
		}
	}
	page, err := parsePage(req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.ListPoolBlocks(ctx, space, req.Pool, f, page)
	if err != nil {
		return nil, err
	}
	l := blockListToAPI(items)
	l.Continue = optString(next)
	return ipamv1.ListPoolBlocks200JSONResponse(l), nil
}
