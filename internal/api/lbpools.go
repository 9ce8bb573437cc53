// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// LBPoolStore keeps the VIP pools. Its writes take alloc.DryRun(true) to
// check and answer without writing.
type LBPoolStore interface {
	// CreateLBPool refuses a block overlapping a Pod pool CIDR of the
	// space (KindOverlap naming spec.blocks[i]), and one overlapping a
	// special-purpose range unless spec.AllowSpecialPurpose (KindInvalid,
	// as alloc.LBPoolSpec.Validate); overlap with another VIP pool marks
	// the newer one conflicting. Creating a pool that exists
	// with the same labels and spec answers it again; with others it is
	// KindConflict.
	CreateLBPool(ctx context.Context, p alloc.LBPool, opts ...alloc.WriteOption) (alloc.LBPool, error)
	// GetLBPool reads a VIP pool with its status, or answers KindNotFound.
	GetLBPool(ctx context.Context, space, name string) (alloc.LBPool, error)
	// ListLBPools pages through the space's VIP pools by name.
	ListLBPools(ctx context.Context, space string, page alloc.Page) (items []alloc.LBPool, next string, err error)
	// UpdateLBPool replaces labels and spec and settles every pool's
	// conflict mark again.
	UpdateLBPool(ctx context.Context, space, name string, labels map[string]string, spec alloc.LBPoolSpec, opts ...alloc.WriteOption) (alloc.LBPool, error)
	// DeleteLBPool answers the pool as it was.
	DeleteLBPool(ctx context.Context, space, name string, opts ...alloc.WriteOption) (alloc.LBPool, error)
}

// lbPoolHandlers serve /v1/lb-pools.
type lbPoolHandlers struct {
	store LBPoolStore
}

func (h *lbPoolHandlers) ListLBPools(ctx context.Context, req ipamv1.ListLBPoolsRequestObject) (ipamv1.ListLBPoolsResponseObject, error) {
	space, page, err := parseSpacePage(req.Params.Space, req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.ListLBPools(ctx, space, page)
	if err != nil {
		return nil, err
	}
	l := ipamv1.LBPoolList{Items: make([]ipamv1.LBPool, len(items)), Continue: optString(next)}
	for i, p := range items {
		l.Items[i] = lbPoolToAPI(p)
	}
	return ipamv1.ListLBPools200JSONResponse(l), nil
}

func (h *lbPoolHandlers) CreateLBPool(ctx context.Context, req ipamv1.CreateLBPoolRequestObject) (ipamv1.CreateLBPoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("name", req.Body.Name); err != nil {
		return nil, err
	}
	labels, spec, err := lbPoolContentFromAPI(req.Body.Labels, req.Body.Spec)
	if err != nil {
		return nil, err
	}
	dry := deref(req.Params.DryRun, false)
	p, err := h.store.CreateLBPool(ctx, alloc.LBPool{Space: space, Name: req.Body.Name, Labels: labels, Spec: spec}, alloc.DryRun(dry))
	if err != nil {
		return nil, err
	}
	if dry {
		return ipamv1.CreateLBPool200JSONResponse(lbPoolToAPI(p)), nil
	}
	return ipamv1.CreateLBPool201JSONResponse(lbPoolToAPI(p)), nil
}

func (h *lbPoolHandlers) GetLBPool(ctx context.Context, req ipamv1.GetLBPoolRequestObject) (ipamv1.GetLBPoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	p, err := h.store.GetLBPool(ctx, space, req.Pool)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetLBPool200JSONResponse(lbPoolToAPI(p)), nil
}

// UpdateLBPool replaces labels and spec; absent labels replace the pool's
// labels with none.
func (h *lbPoolHandlers) UpdateLBPool(ctx context.Context, req ipamv1.UpdateLBPoolRequestObject) (ipamv1.UpdateLBPoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	if n := req.Body.Name; n != nil && *n != req.Pool {
		return nil, alloc.Invalid("name", "must be the pool's name %q as in the path, or absent: a pool cannot be renamed", req.Pool)
	}
	labels, spec, err := lbPoolContentFromAPI(req.Body.Labels, req.Body.Spec)
	if err != nil {
		return nil, err
	}
	p, err := h.store.UpdateLBPool(ctx, space, req.Pool, labels, spec, alloc.DryRun(deref(req.Params.DryRun, false)))
	if err != nil {
		return nil, err
	}
	return ipamv1.UpdateLBPool200JSONResponse(lbPoolToAPI(p)), nil
}

func (h *lbPoolHandlers) DeleteLBPool(ctx context.Context, req ipamv1.DeleteLBPoolRequestObject) (ipamv1.DeleteLBPoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	dry := deref(req.Params.DryRun, false)
	p, err := h.store.DeleteLBPool(ctx, space, req.Pool, alloc.DryRun(dry))
	if err != nil {
		return nil, err
	}
	if dry {
		return ipamv1.DeleteLBPool200JSONResponse(lbPoolToAPI(p)), nil
	}
	return ipamv1.DeleteLBPool204Response{}, nil
}
