// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"net/netip"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// AddressStore is what the address handlers need: leases found by their
// address, or listed by node, pool, owner and state.
type AddressStore interface {
	// GetAddress answers the pending, active or cooling lease of addr, or
	// KindNotFound when the address is free.
	GetAddress(ctx context.Context, space string, addr netip.Addr) (alloc.Lease, error)
	// ReleaseAddress releases the lease holding addr and answers it;
	// nothing held is success with nothing released. ReleaseAddressAt
	// does so only for a lease of generation gen (KindStaleGeneration for
	// another, and nothing changes).
	ReleaseAddress(ctx context.Context, space string, addr netip.Addr) ([]alloc.Lease, error)
	ReleaseAddressAt(ctx context.Context, space string, addr netip.Addr, gen int64) ([]alloc.Lease, error)
	// ListLeases pages through the leases f selects, by address; free
	// addresses are not listed.
	ListLeases(ctx context.Context, f alloc.LeaseFilter, page alloc.Page) (items []alloc.Lease, next string, err error)
}

// addressHandlers serve /v1/addresses/{address} and /v1/leases.
type addressHandlers struct {
	store   AddressStore
	metrics *metrics // never nil
}

func (h *addressHandlers) GetAddress(ctx context.Context, req ipamv1.GetAddressRequestObject) (ipamv1.GetAddressResponseObject, error) {
	space, addr, err := parseSpaceAddr(req.Params.Space, req.Address)
	if err != nil {
		return nil, err
	}
	l, err := h.store.GetAddress(ctx, space, addr)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetAddress200JSONResponse(leaseToAPI(l)), nil
}

// ReleaseAddress answers 204 whether or not the address was held, and counts
// the lease it released.
func (h *addressHandlers) ReleaseAddress(ctx context.Context, req ipamv1.ReleaseAddressRequestObject) (ipamv1.ReleaseAddressResponseObject, error) {
	space, addr, err := parseSpaceAddr(req.Params.Space, req.Address)
	if err != nil {
		return nil, err
	}
	var released []alloc.Lease
	if g := req.Params.Generation; g != nil {
		released, err = h.store.ReleaseAddressAt(ctx, space, addr, *g)
	} else {
		released, err = h.store.ReleaseAddress(ctx, space, addr)
	}
	if err != nil {
		return nil, err
	}
	h.metrics.countReleases(ctx, released)
	return ipamv1.ReleaseAddress204Response{}, nil
}

func (h *addressHandlers) ListLeases(ctx context.Context, req ipamv1.ListLeasesRequestObject) (ipamv1.ListLeasesResponseObject, error) {
	f, err := leaseFilterFromAPI(req.Params)
	if err != nil {
		return nil, err
	}
	page, err := parsePage(req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.ListLeases(ctx, f, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListLeases200JSONResponse{Items: leasesToAPI(items), Continue: optString(next)}, nil
}
