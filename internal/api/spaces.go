// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// SpaceStore keeps the address spaces.
type SpaceStore interface {
	// CreateSpace adds a space; creating one that exists answers it again
	// (a retry).
	CreateSpace(ctx context.Context, name string) (alloc.Space, error)
	// GetSpace reads one space, or answers KindNotFound.
	GetSpace(ctx context.Context, name string) (alloc.Space, error)
	// ListSpaces pages through the spaces by name.
	ListSpaces(ctx context.Context, page alloc.Page) (items []alloc.Space, next string, err error)
	// DeleteSpace removes an empty space; it refuses (KindInUse) the
	// default space and a space that still has pools or nodes.
	DeleteSpace(ctx context.Context, name string) error
}

// spaceHandlers serve /v1/spaces.
type spaceHandlers struct {
	store SpaceStore
}

func (h *spaceHandlers) ListSpaces(ctx context.Context, req ipamv1.ListSpacesRequestObject) (ipamv1.ListSpacesResponseObject, error) {
	page, err := parsePage(req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.ListSpaces(ctx, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListSpaces200JSONResponse(spaceListToAPI(items, next)), nil
}

func (h *spaceHandlers) CreateSpace(ctx context.Context, req ipamv1.CreateSpaceRequestObject) (ipamv1.CreateSpaceResponseObject, error) {
	if err := alloc.ValidateLabelName("name", req.Body.Name); err != nil {
		return nil, err
	}
	sp, err := h.store.CreateSpace(ctx, req.Body.Name)
	if err != nil {
		return nil, err
	}
	return ipamv1.CreateSpace201JSONResponse(spaceToAPI(sp)), nil
}

func (h *spaceHandlers) GetSpace(ctx context.Context, req ipamv1.GetSpaceRequestObject) (ipamv1.GetSpaceResponseObject, error) {
	if err := alloc.ValidateLabelName("space", req.Space); err != nil {
		return nil, err
	}
	sp, err := h.store.GetSpace(ctx, req.Space)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetSpace200JSONResponse(spaceToAPI(sp)), nil
}

func (h *spaceHandlers) DeleteSpace(ctx context.Context, req ipamv1.DeleteSpaceRequestObject) (ipamv1.DeleteSpaceResponseObject, error) {
	if err := alloc.ValidateLabelName("space", req.Space); err != nil {
		return nil, err
	}
	if err := h.store.DeleteSpace(ctx, req.Space); err != nil {
		return nil, err
	}
	return ipamv1.DeleteSpace204Response{}, nil
}
