// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// VIPStore gives LoadBalancer VIPs to owners.
type VIPStore interface {
	// AssignVIPs answers what the owner holds after the request; an
	// unsatisfied request is an answer (Satisfied false, Reason), not an
	// error.
	AssignVIPs(ctx context.Context, r alloc.VIPRequest) (alloc.VIPAssignment, error)
	// GetVIPs answers KindNotFound (field "owner") for an unknown owner.
	GetVIPs(ctx context.Context, space string, o alloc.VIPOwner) (alloc.VIPAssignment, error)
	// ReleaseVIPs is no error when the owner holds nothing; a generation
	// other than 0 that is not the owner's is KindStaleGeneration.
	ReleaseVIPs(ctx context.Context, space string, o alloc.VIPOwner, generation int64) error
	ListVIPOwners(ctx context.Context, space string, page alloc.Page) (items []alloc.VIPAssignment, next string, err error)
}

// vipHandlers serve /v1/vip-owners.
type vipHandlers struct {
	store VIPStore
}

func (h *vipHandlers) ListVIPOwners(ctx context.Context, req ipamv1.ListVIPOwnersRequestObject) (ipamv1.ListVIPOwnersResponseObject, error) {
	space, page, err := parseSpacePage(req.Params.Space, req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.ListVIPOwners(ctx, space, page)
	if err != nil {
		return nil, err
	}
	l := ipamv1.VIPOwnerList{Items: make([]ipamv1.VIPAssignment, len(items)), Continue: optString(next)}
	for i, a := range items {
		l.Items[i] = vipAssignmentToAPI(space, a)
	}
	return ipamv1.ListVIPOwners200JSONResponse(l), nil
}

func (h *vipHandlers) AssignVIPs(ctx context.Context, req ipamv1.AssignVIPsRequestObject) (ipamv1.AssignVIPsResponseObject, error) {
	space, o, err := parseVIPOwner(req.Params.Space, req.Namespace, req.Name)
	if err != nil {
		return nil, err
	}
	r, err := vipRequestFromAPI(space, o, *req.Body)
	if err != nil {
		return nil, err
	}
	a, err := h.store.AssignVIPs(ctx, r)
	if err != nil {
		return nil, err
	}
	return ipamv1.AssignVIPs200JSONResponse(vipAssignmentToAPI(space, a)), nil
}

func (h *vipHandlers) GetVIPs(ctx context.Context, req ipamv1.GetVIPsRequestObject) (ipamv1.GetVIPsResponseObject, error) {
	space, o, err := parseVIPOwner(req.Params.Space, req.Namespace, req.Name)
	if err != nil {
		return nil, err
	}
	a, err := h.store.GetVIPs(ctx, space, o)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetVIPs200JSONResponse(vipAssignmentToAPI(space, a)), nil
}

func (h *vipHandlers) ReleaseVIPs(ctx context.Context, req ipamv1.ReleaseVIPsRequestObject) (ipamv1.ReleaseVIPsResponseObject, error) {
	space, o, err := parseVIPOwner(req.Params.Space, req.Namespace, req.Name)
	if err != nil {
		return nil, err
	}
	gen := deref(req.Params.Generation, 0)
	if req.Params.Generation != nil && gen < 1 {
		return nil, alloc.Invalid("generation", "%d: a generation is at least 1", gen)
	}
	if err := h.store.ReleaseVIPs(ctx, space, o, gen); err != nil {
		return nil, err
	}
	return ipamv1.ReleaseVIPs204Response{}, nil
}
