// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// historyFilterFromAPI parses the subject of a history list: one owner
// (namespace/name) or one node of a space. Whether exactly one is given is
// the filter's Validate, which historyQueryFromAPI runs.
func historyFilterFromAPI(p ipamv1.ListHistoryParams) (alloc.HistoryFilter, error) {
	space, err := parseSpace(p.Space)
	if err != nil {
		return alloc.HistoryFilter{}, err
	}
	f := alloc.HistoryFilter{Space: space}
	if p.Owner != nil {
		if f.OwnerNamespace, f.OwnerName, err = alloc.ParseOwner("owner", *p.Owner); err != nil {
			return alloc.HistoryFilter{}, err
		}
	}
	if p.Node != nil {
		if err := alloc.ValidateNodeName("node", *p.Node); err != nil {
			return alloc.HistoryFilter{}, err
		}
		f.Node = *p.Node
	}
	return f, nil
}

// historyQueryFromAPI completes f with the range [from, to), checks the
// filter as a whole, and answers it with the page to read.
func historyQueryFromAPI(f alloc.HistoryFilter, from, to *string, limit *int, cont *string) (alloc.HistoryFilter, alloc.Page, error) {
	var err error
	if f.From, f.To, err = parseRange(from, to); err != nil {
		return alloc.HistoryFilter{}, alloc.Page{}, err
	}
	if err := f.Validate(); err != nil {
		return alloc.HistoryFilter{}, alloc.Page{}, err
	}
	page, err := parsePage(limit, cont)
	if err != nil {
		return alloc.HistoryFilter{}, alloc.Page{}, err
	}
	return f, page, nil
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

func eventsToAPI(items []alloc.Event) []ipamv1.AddressEvent { return mapAll(items, eventToAPI) }

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

func eventListToAPI(items []alloc.Event, next string) ipamv1.EventList {
	return ipamv1.EventList{Items: eventsToAPI(items), Continue: optString(next)}
}
