// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// PoolStore keeps the pools of Pod CIDRs. Its writes take
// alloc.DryRun(true) to check and answer without writing.
type PoolStore interface {
	// CreatePool refuses overlap with any pool CIDR of the space
	// (KindOverlap naming the CIDR's field). Creating a pool that exists
	// with the same labels and spec answers it again (a retry); with
	// others it is KindConflict.
	CreatePool(ctx context.Context, p alloc.Pool, opts ...alloc.WriteOption) (alloc.Pool, error)
	// GetPool reads a pool with its status, or answers KindNotFound.
	GetPool(ctx context.Context, space, name string) (alloc.Pool, error)
	// ListPools pages through the space's pools by name, with status.
	ListPools(ctx context.Context, space string, page alloc.Page) (items []alloc.Pool, next string, err error)
	// UpdatePool replaces labels and spec; it refuses changes of immutable
	// fields (KindImmutable) and the removal of a CIDR or family that has
	// blocks (KindInUse naming the nodes).
	UpdatePool(ctx context.Context, space, name string, labels map[string]string, spec alloc.PoolSpec, opts ...alloc.WriteOption) (alloc.Pool, error)
	// DeletePool refuses (KindInUse, naming the nodes) a pool that has
	// blocks; it answers the pool as it was.
	DeletePool(ctx context.Context, space, name string, opts ...alloc.WriteOption) (alloc.Pool, error)
	// PoolCapacity reports each family's capacity, fragmentation, nodes at
	// capacity or in deficit, and the forecast over window, from one
	// snapshot.
	PoolCapacity(ctx context.Context, space, name string, window time.Duration) (map[alloc.Family]alloc.FamilyCapacity, error)
}

// poolHandlers serve /v1/pools.
type poolHandlers struct {
	store PoolStore
}

func (h *poolHandlers) ListPools(ctx context.Context, req ipamv1.ListPoolsRequestObject) (ipamv1.ListPoolsResponseObject, error) {
	space, page, err := parseSpacePage(req.Params.Space, req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.ListPools(ctx, space, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListPools200JSONResponse(poolListToAPI(items, next)), nil
}

func (h *poolHandlers) CreatePool(ctx context.Context, req ipamv1.CreatePoolRequestObject) (ipamv1.CreatePoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	p, err := poolFromAPI(space, *req.Body)
	if err != nil {
		return nil, err
	}
	dry := deref(req.Params.DryRun, false)
	p, err = h.store.CreatePool(ctx, p, alloc.DryRun(dry))
	if err != nil {
		return nil, err
	}
	if dry {
		return ipamv1.CreatePool200JSONResponse(poolToAPI(p)), nil
	}
	return ipamv1.CreatePool201JSONResponse(poolToAPI(p)), nil
}

func (h *poolHandlers) GetPool(ctx context.Context, req ipamv1.GetPoolRequestObject) (ipamv1.GetPoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	p, err := h.store.GetPool(ctx, space, req.Pool)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetPool200JSONResponse(poolToAPI(p)), nil
}

// UpdatePool replaces labels and spec; absent labels replace the pool's
// labels with none.
func (h *poolHandlers) UpdatePool(ctx context.Context, req ipamv1.UpdatePoolRequestObject) (ipamv1.UpdatePoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	labels, spec, err := poolUpdateFromAPI(req.Pool, *req.Body)
	if err != nil {
		return nil, err
	}
	p, err := h.store.UpdatePool(ctx, space, req.Pool, labels, spec, alloc.DryRun(deref(req.Params.DryRun, false)))
	if err != nil {
		return nil, err
	}
	return ipamv1.UpdatePool200JSONResponse(poolToAPI(p)), nil
}

func (h *poolHandlers) DeletePool(ctx context.Context, req ipamv1.DeletePoolRequestObject) (ipamv1.DeletePoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	dry := deref(req.Params.DryRun, false)
	p, err := h.store.DeletePool(ctx, space, req.Pool, alloc.DryRun(dry))
	if err != nil {
		return nil, err
	}
	if dry {
		return ipamv1.DeletePool200JSONResponse(poolToAPI(p)), nil
	}
	return ipamv1.DeletePool204Response{}, nil
}

// GetPoolCapacity reports a pool's capacity and forecast.
func (h *poolHandlers) GetPoolCapacity(ctx context.Context, req ipamv1.GetPoolCapacityRequestObject) (ipamv1.GetPoolCapacityResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	window, err := parseWindow(req.Params.Window)
	if err != nil {
		return nil, err
	}
	c, err := h.store.PoolCapacity(ctx, space, req.Pool, window)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetPoolCapacity200JSONResponse(poolCapacityToAPI(req.Pool, window, c)), nil
}
