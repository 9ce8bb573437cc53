package api

import (
	"context"
	"errors"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// GetAddressHistory answers the address's events in a time range, or with
// at, the holding that contains that instant.
func (s *Server) GetAddressHistory(ctx context.Context, req ipamv1.GetAddressHistoryRequestObject) (ipamv1.GetAddressHistoryResponseObject, error) {
	p := req.Params
	space, err := parseSpace(p.Space)
	if err != nil {
		return nil, err
	}
	addr, err := parseAddr("address", req.Address)
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
		h, err := s.store.HolderAt(ctx, space, addr, at)
		if alloc.IsKind(err, alloc.KindNotFound) {
			if e := (*alloc.Error)(nil); errors.As(err, &e) && e.Field == "space" {
				return nil, err
			}
			return ipamv1.GetAddressHistory200JSONResponse{Items: []ipamv1.AddressEvent{}}, nil
		} else if err != nil {
			return nil, err
		}
		holder := holdingToAPI(h)
		return ipamv1.GetAddressHistory200JSONResponse{Items: eventsToAPI(h.Events), Holder: &holder}, nil
	}
	f, page, err := historyQueryFromAPI(alloc.HistoryFilter{Space: space, Address: addr}, p.From, p.To, p.Limit, p.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := s.store.History(ctx, f, page)
	if err != nil {
		return nil, err
	}
	l := eventListToAPI(items, next)
	return ipamv1.GetAddressHistory200JSONResponse{Items: l.Items, Continue: l.Continue}, nil
}

// ListHistory answers the events of one owner or one node.
func (s *Server) ListHistory(ctx context.Context, req ipamv1.ListHistoryRequestObject) (ipamv1.ListHistoryResponseObject, error) {
	p := req.Params
	f, err := historyFilterFromAPI(p)
	if err != nil {
		return nil, err
	}
	f, page, err := historyQueryFromAPI(f, p.From, p.To, p.Limit, p.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := s.store.History(ctx, f, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListHistory200JSONResponse(eventListToAPI(items, next)), nil
}

// CheckConsistency runs the check and answers what it found; findings are
// a 200 like a clean report (the check itself succeeded).
func (s *Server) CheckConsistency(ctx context.Context, _ ipamv1.CheckConsistencyRequestObject) (ipamv1.CheckConsistencyResponseObject, error) {
	r, err := s.store.CheckConsistency(ctx)
	if err != nil {
		return nil, err
	}
	return ipamv1.CheckConsistency200JSONResponse(ConsistencyReportToAPI(r)), nil
}
