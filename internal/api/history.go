// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// HistoryStore reads the address history.
type HistoryStore interface {
	// History pages through the events of one address, owner or node of a
	// space in [f.From, f.To), oldest first. An unknown space is
	// KindNotFound; a subject without events is an empty list.
	History(ctx context.Context, f alloc.HistoryFilter, page alloc.Page) (items []alloc.Event, next string, err error)
	// HolderAt answers the holding of addr that contains instant at, or
	// KindNotFound when nobody held it then (field "space" when the space
	// is unknown).
	HolderAt(ctx context.Context, space string, addr netip.Addr, at time.Time) (alloc.Holding, error)
}

// historyHandlers serve the address history: /v1/addresses/{address}/history
// and /v1/history.
type historyHandlers struct {
	store HistoryStore
}

// GetAddressHistory answers the address's events in a time range, or with
// at, the holding that contains that instant.
func (h *historyHandlers) GetAddressHistory(ctx context.Context, req ipamv1.GetAddressHistoryRequestObject) (ipamv1.GetAddressHistoryResponseObject, error) {
	p := req.Params
	space, addr, err := parseSpaceAddr(p.Space, req.Address)
	if err != nil {
		return nil, err
	}
	if p.At != nil {
		if p.From != nil || p.To != nil || p.Limit != nil || p.Continue != nil {
			return nil, alloc.Invalid("at", "asks for one instant; it cannot go with from, to, limit or continue")
		}
		at, err := parseInstant("at", p.At)
		if err != nil {
			return nil, err
		}
		holding, err := h.store.HolderAt(ctx, space, addr, at)
		if alloc.IsKind(err, alloc.KindNotFound) {
			if e := (*alloc.Error)(nil); errors.As(err, &e) && e.Field == "space" {
				return nil, err
			}
			return ipamv1.GetAddressHistory200JSONResponse{Items: []ipamv1.AddressEvent{}}, nil
		} else if err != nil {
			return nil, err
		}
		holder := holdingToAPI(holding)
		return ipamv1.GetAddressHistory200JSONResponse{Items: eventsToAPI(holding.Events), Holder: &holder}, nil
	}
	f, page, err := historyQueryFromAPI(alloc.HistoryFilter{Space: space, Address: addr}, p.From, p.To, p.Limit, p.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.History(ctx, f, page)
	if err != nil {
		return nil, err
	}
	l := eventListToAPI(items, next)
	return ipamv1.GetAddressHistory200JSONResponse{Items: l.Items, Continue: l.Continue}, nil
}

// ListHistory answers the events of one owner or one node.
func (h *historyHandlers) ListHistory(ctx context.Context, req ipamv1.ListHistoryRequestObject) (ipamv1.ListHistoryResponseObject, error) {
	p := req.Params
	f, err := historyFilterFromAPI(p)
	if err != nil {
		return nil, err
	}
	f, page, err := historyQueryFromAPI(f, p.From, p.To, p.Limit, p.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.History(ctx, f, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListHistory200JSONResponse(eventListToAPI(items, next)), nil
}
