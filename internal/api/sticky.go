// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// StickyStore keeps the bindings of workload identities to addresses.
type StickyStore interface {
	// Bindings answers the addresses bound to identity: held by a lease,
	// or released and within their retention.
	Bindings(ctx context.Context, space, identity string) ([]alloc.Lease, error)
	// Unbind ends the bindings of identity before their retention and
	// answers them; none is not an error.
	Unbind(ctx context.Context, space, identity string) ([]alloc.Lease, error)
}

// stickyHandlers serve /v1/sticky-bindings.
type stickyHandlers struct {
	store StickyStore
}

func (h *stickyHandlers) GetStickyBindings(ctx context.Context, req ipamv1.GetStickyBindingsRequestObject) (ipamv1.GetStickyBindingsResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	items, err := h.store.Bindings(ctx, space, req.Params.Identity)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetStickyBindings200JSONResponse{Items: leasesToAPI(items)}, nil
}

func (h *stickyHandlers) DeleteStickyBindings(ctx context.Context, req ipamv1.DeleteStickyBindingsRequestObject) (ipamv1.DeleteStickyBindingsResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	items, err := h.store.Unbind(ctx, space, req.Params.Identity)
	if err != nil {
		return nil, err
	}
	return ipamv1.DeleteStickyBindings200JSONResponse{Items: leasesToAPI(items)}, nil
}
