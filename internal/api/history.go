package api

import (
	"context"
	"errors"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// ---- address history and the consistency check ----

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
	l, err := s.history(ctx, alloc.HistoryFilter{Space: space, Address: addr}, p.From, p.To, p.Limit, p.Continue)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetAddressHistory200JSONResponse{Items: l.Items, Continue: l.Continue}, nil
}

// ListHistory answers the events of one owner or one node.
func (s *Server) ListHistory(ctx context.Context, req ipamv1.ListHistoryRequestObject) (ipamv1.ListHistoryResponseObject, error) {
	p := req.Params
	space, err := parseSpace(p.Space)
	if err != nil {
		return nil, err
	}
	f := alloc.HistoryFilter{Space: space}
	if p.Owner != nil {
		if f.OwnerNamespace, f.OwnerName, err = alloc.ParseOwner("owner", *p.Owner); err != nil {
			return nil, err
		}
	}
	if p.Node != nil {
		if err := alloc.ValidateNodeName("node", *p.Node); err != nil {
			return nil, err
		}
		f.Node = *p.Node
	}
	l, err := s.history(ctx, f, p.From, p.To, p.Limit, p.Continue)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListHistory200JSONResponse(l), nil
}

// history pages through the events f selects in [from, to).
func (s *Server) history(ctx context.Context, f alloc.HistoryFilter, from, to *string, limit *int, cont *string) (ipamv1.EventList, error) {
	var err error
	if f.From, f.To, err = parseRange(from, to); err != nil {
		return ipamv1.EventList{}, err
	}
	if err := f.Validate(); err != nil {
		return ipamv1.EventList{}, err
	}
	page, err := parsePage(limit, cont)
	if err != nil {
		return ipamv1.EventList{}, err
	}
	items, next, err := s.store.History(ctx, f, page)
	if err != nil {
		return ipamv1.EventList{}, err
	}
	return ipamv1.EventList{Items: eventsToAPI(items), Continue: optString(next)}, nil
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

// parseInstant reads an RFC 3339 time parameter; absent is the zero time.
func parseInstant(field string, s *string) (time.Time, error) {
	if s == nil {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, *s)
	if err != nil {
		return time.Time{}, alloc.Invalid(field, "%q is not an RFC 3339 time such as 2026-11-30T14:02:00Z", *s)
	}
	return t.UTC(), nil
}

// parseRange reads from and to; from must come before to.
func parseRange(from, to *string) (time.Time, time.Time, error) {
	f, err := parseInstant("from", from)
	if err != nil {
		return f, time.Time{}, err
	}
	t, err := parseInstant("to", to)
	if err != nil {
		return f, t, err
	}
	if !f.IsZero() && !t.IsZero() && !f.Before(t) {
		return f, t, alloc.Invalid("to", "must be after from")
	}
	return f, t, nil
}

func eventToAPI(e alloc.Event) ipamv1.AddressEvent {
	out := ipamv1.AddressEvent{
		At:          e.At.UTC(),
		Kind:        ipamv1.AddressEventKind(e.Kind),
		Space:       e.Space,
		Actor:       e.Actor,
		Reason:      e.Reason,
		Address:     optAddr(e.Address),
		Pool:        optString(e.Pool),
		Node:        optString(e.Node),
		Network:     optString(e.Attachment.Network),
		ContainerID: optString(e.Attachment.ContainerID),
		Interface:   optString(e.Attachment.Interface),
	}
	if e.Family != 0 {
		out.Family = ptr(familyToAPI(e.Family))
	}
	if e.Block.IsValid() {
		out.Block = ptr(e.Block.String())
	}
	if e.State != "" {
		out.State = ptr(ipamv1.AddressEventState(e.State))
	}
	if e.Owner != (alloc.Owner{}) {
		out.Owner = ptr(ownerToAPI(e.Owner))
	}
	if e.Generation != 0 {
		out.Generation = &e.Generation
	}
	return out
}

func eventsToAPI(items []alloc.Event) []ipamv1.AddressEvent {
	out := make([]ipamv1.AddressEvent, len(items))
	for i, e := range items {
		out[i] = eventToAPI(e)
	}
	return out
}

func holdingToAPI(h alloc.Holding) ipamv1.Holding {
	return ipamv1.Holding{
		Address:     h.Address.String(),
		Node:        h.Node,
		Pool:        h.Pool,
		Owner:       ownerToAPI(h.Owner),
		ContainerID: h.Attachment.ContainerID,
		Interface:   h.Attachment.Interface,
		From:        h.From.UTC(),
		To:          optTime(h.To),
	}
}

// ConsistencyReportToAPI is the report as the API and `ipam-server check`
// show it.
func ConsistencyReportToAPI(r alloc.ConsistencyReport) ipamv1.ConsistencyReport {
	out := ipamv1.ConsistencyReport{
		Consistent:      len(r.Findings) == 0,
		CheckedAt:       r.CheckedAt.UTC(),
		DurationSeconds: r.Took.Seconds(),
		Findings:        make([]ipamv1.ConsistencyFinding, len(r.Findings)),
		Truncated:       r.Truncated,
	}
	c := r.Counts
	out.Counts.Spaces, out.Counts.Pools, out.Counts.PoolCIDRs = c.Spaces, c.Pools, c.PoolCIDRs
	out.Counts.Nodes, out.Counts.Blocks, out.Counts.Leases = c.Nodes, c.Blocks, c.Leases
	for i, f := range r.Findings {
		out.Findings[i] = ipamv1.ConsistencyFinding{Kind: ipamv1.ConsistencyFindingKind(f.Kind), Space: f.Space,
			Detail: f.Detail, Objects: f.Objects}
	}
	return out
}
