// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// CIDRGroupStore keeps the CIDR groups. Its writes take alloc.DryRun(true).
type CIDRGroupStore interface {
	// CreateCIDRGroup answers an existing group of the same labels and
	// CIDRs again (a retry); another is KindConflict.
	CreateCIDRGroup(ctx context.Context, g alloc.CIDRGroup, opts ...alloc.WriteOption) (alloc.CIDRGroup, error)
	GetCIDRGroup(ctx context.Context, space, name string) (alloc.CIDRGroup, error)
	ListCIDRGroups(ctx context.Context, space string, page alloc.Page) (items []alloc.CIDRGroup, next string, err error)
	UpdateCIDRGroup(ctx context.Context, g alloc.CIDRGroup, opts ...alloc.WriteOption) (alloc.CIDRGroup, error)
	DeleteCIDRGroup(ctx context.Context, space, name string, opts ...alloc.WriteOption) (alloc.CIDRGroup, error)
	// CIDRGroupsContaining answers the groups holding an address.
	CIDRGroupsContaining(ctx context.Context, space string, a netip.Addr) ([]alloc.CIDRGroupMatch, error)
}

// cidrGroupHandlers serve /v1/cidr-groups.
type cidrGroupHandlers struct {
	store CIDRGroupStore
}

func (h *cidrGroupHandlers) ListCIDRGroups(ctx context.Context, req ipamv1.ListCIDRGroupsRequestObject) (ipamv1.ListCIDRGroupsResponseObject, error) {
	space, page, err := parseSpacePage(req.Params.Space, req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.ListCIDRGroups(ctx, space, page)
	if err != nil {
		return nil, err
	}
	l := ipamv1.CIDRGroupList{Items: make([]ipamv1.CIDRGroup, len(items)), Continue: optString(next)}
	for i, g := range items {
		l.Items[i] = cidrGroupToAPI(g)
	}
	return ipamv1.ListCIDRGroups200JSONResponse(l), nil
}

func (h *cidrGroupHandlers) CreateCIDRGroup(ctx context.Context, req ipamv1.CreateCIDRGroupRequestObject) (ipamv1.CreateCIDRGroupResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	g, err := cidrGroupFromAPI(space, req.Body.Name, req.Body.Labels, req.Body.ExternalCIDRs, req.Body.AllowSpecialPurpose)
	if err != nil {
		return nil, err
	}
	dry := deref(req.Params.DryRun, false)
	if g, err = h.store.CreateCIDRGroup(ctx, g, alloc.DryRun(dry)); err != nil {
		return nil, err
	}
	if dry {
		return ipamv1.CreateCIDRGroup200JSONResponse(cidrGroupToAPI(g)), nil
	}
	return ipamv1.CreateCIDRGroup201JSONResponse(cidrGroupToAPI(g)), nil
}

func (h *cidrGroupHandlers) GetCIDRGroup(ctx context.Context, req ipamv1.GetCIDRGroupRequestObject) (ipamv1.GetCIDRGroupResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("group", req.Group); err != nil {
		return nil, err
	}
	g, err := h.store.GetCIDRGroup(ctx, space, req.Group)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetCIDRGroup200JSONResponse(cidrGroupToAPI(g)), nil
}

func (h *cidrGroupHandlers) UpdateCIDRGroup(ctx context.Context, req ipamv1.UpdateCIDRGroupRequestObject) (ipamv1.UpdateCIDRGroupResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("group", req.Group); err != nil {
		return nil, err
	}
	if n := req.Body.Name; n != nil && *n != req.Group {
		return nil, alloc.Invalid("name", "must be the group's name %q as in the path, or absent: a group cannot be renamed", req.Group)
	}
	g, err := cidrGroupFromAPI(space, req.Group, req.Body.Labels, req.Body.ExternalCIDRs, req.Body.AllowSpecialPurpose)
	if err != nil {
		return nil, err
	}
	if g, err = h.store.UpdateCIDRGroup(ctx, g, alloc.DryRun(deref(req.Params.DryRun, false))); err != nil {
		return nil, err
	}
	return ipamv1.UpdateCIDRGroup200JSONResponse(cidrGroupToAPI(g)), nil
}

func (h *cidrGroupHandlers) DeleteCIDRGroup(ctx context.Context, req ipamv1.DeleteCIDRGroupRequestObject) (ipamv1.DeleteCIDRGroupResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("group", req.Group); err != nil {
		return nil, err
	}
	dry := deref(req.Params.DryRun, false)
	g, err := h.store.DeleteCIDRGroup(ctx, space, req.Group, alloc.DryRun(dry))
	if err != nil {
		return nil, err
	}
	if dry {
		return ipamv1.DeleteCIDRGroup200JSONResponse(cidrGroupToAPI(g)), nil
	}
	return ipamv1.DeleteCIDRGroup204Response{}, nil
}

func (h *cidrGroupHandlers) GetAddressCIDRGroups(ctx context.Context, req ipamv1.GetAddressCIDRGroupsRequestObject) (ipamv1.GetAddressCIDRGroupsResponseObject, error) {
	space, a, err := parseSpaceAddr(req.Params.Space, req.Address)
	if err != nil {
		return nil, err
	}
	ms, err := h.store.CIDRGroupsContaining(ctx, space, a)
	if err != nil {
		return nil, err
	}
	out := ipamv1.CIDRGroupMatchList{Items: make([]ipamv1.CIDRGroupMatch, len(ms))}
	for i, m := range ms {
		out.Items[i] = ipamv1.CIDRGroupMatch{Group: m.Group, Cidr: m.CIDR.String()}
	}
	return ipamv1.GetAddressCIDRGroups200JSONResponse(out), nil
}

// cidrGroupFromAPI parses and validates a group; allowSpecialPurpose
// absent is false, on an update too, as for pools.
func cidrGroupFromAPI(space, name string, l *ipamv1.Labels, cidrs *[]string, allowSpecialPurpose *bool) (alloc.CIDRGroup, error) {
	g := alloc.CIDRGroup{Space: space, Name: name, AllowSpecialPurpose: deref(allowSpecialPurpose, false)}
	var err error
	if g.Labels, err = labelsFromAPI("labels", l); err != nil {
		return g, err
	}
	cs := deref(cidrs, nil)
	if err := checkCount("externalCIDRs", len(cs), alloc.MaxCIDRGroupCIDRs); err != nil {
		return g, err
	}
	for i, c := range cs {
		p, err := parsePrefix(fmt.Sprintf("externalCIDRs[%d]", i), c)
		if err != nil {
			return g, err
		}
		g.CIDRs = append(g.CIDRs, p)
	}
	return g, g.Validate()
}

func cidrGroupToAPI(g alloc.CIDRGroup) ipamv1.CIDRGroup {
	out := ipamv1.CIDRGroup{Name: g.Name, Space: g.Space, Labels: labelsToAPI(g.Labels), ExternalCIDRs: make([]string, len(g.CIDRs)),
		AllowSpecialPurpose: g.AllowSpecialPurpose, CreatedAt: g.CreatedAt.UTC(), UpdatedAt: g.UpdatedAt.UTC()}
	for i, c := range g.CIDRs {
		out.ExternalCIDRs[i] = c.String()
	}
	return out
}
