// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"fmt"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// leaseRequestFromAPI parses and validates an allocation request. Expire
// defaults to true; an absent pool is alloc.DefaultPool, an explicit empty
// one an error; absent or empty families mean every family of the pool.
func leaseRequestFromAPI(space, node string, b ipamv1.LeaseRequest) (alloc.LeaseRequest, error) {
	r := alloc.LeaseRequest{
		Space:      space,
		Node:       node,
		Owner:      ownerFromAPI(b.Owner),
		Attachment: alloc.Attachment{Network: deref(b.Network, ""), ContainerID: b.ContainerID, Interface: b.Interface},
		Expire:     deref(b.Expire, true),
	}
	if h := b.FromReserve; h != nil {
		r.FromReserve = &alloc.ReserveHandover{ContainerID: h.ContainerID, Interface: h.Interface, Generation: h.Generation}
	}
	if b.Pool != nil {
		if *b.Pool == "" {
			return alloc.LeaseRequest{}, alloc.Invalid("pool", "must not be empty; leave it out to let the selection rules choose")
		}
		r.Pool = *b.Pool
	}
	if ps := b.Pools; ps != nil {
		for f, name := range map[alloc.Family]*string{alloc.IPv4: ps.Ipv4, alloc.IPv6: ps.Ipv6} {
			if name == nil {
				continue
			}
			if *name == "" {
				return alloc.LeaseRequest{}, alloc.Invalid("pools."+f.String(), "must not be empty; leave it out to let the selection rules choose")
			}
			if r.Pools == nil {
				r.Pools = map[alloc.Family]string{}
			}
			r.Pools[f] = *name
		}
	}
	var err error
	if r.Pod, err = metadataFromAPI("pod", b.Pod); err != nil {
		return alloc.LeaseRequest{}, err
	}
	if r.Namespace, err = metadataFromAPI("namespace", b.Namespace); err != nil {
		return alloc.LeaseRequest{}, err
	}
	if b.Families != nil {
		if err := checkCount("families", len(*b.Families), maxFamilies); err != nil {
			return alloc.LeaseRequest{}, err
		}
		r.Families = make([]alloc.Family, len(*b.Families))
		for i, f := range *b.Families {
			fam, err := parseFamily(fmt.Sprintf("families[%d]", i), f)
			if err != nil {
				return alloc.LeaseRequest{}, err
			}
			r.Families[i] = fam
		}
	}
	if r.Sticky, err = stickyFromAPI(b.Sticky); err != nil {
		return alloc.LeaseRequest{}, err
	}
	if err := r.Validate(); err != nil {
		return alloc.LeaseRequest{}, err
	}
	return r, nil
}

// metadataFromAPI checks labels as Kubernetes does and bounds annotations.
func metadataFromAPI(field string, m *ipamv1.ObjectMetadata) (alloc.Metadata, error) {
	if m == nil {
		return alloc.Metadata{}, nil
	}
	labels, err := labelsFromAPI(field+".labels", m.Labels)
	if err != nil {
		return alloc.Metadata{}, err
	}
	ann := map[string]string(deref(m.Annotations, nil))
	if err := alloc.ValidateAnnotations(field+".annotations", ann); err != nil {
		return alloc.Metadata{}, err
	}
	return alloc.Metadata{Labels: labels, Annotations: ann}, nil
}

func ownerFromAPI(o ipamv1.Owner) alloc.Owner {
	return alloc.Owner{Namespace: o.Namespace, Name: o.Name, UID: deref(o.Uid, "")}
}

func ownerToAPI(o alloc.Owner) ipamv1.Owner {
	return ipamv1.Owner{Namespace: o.Namespace, Name: o.Name, Uid: optString(o.UID)}
}

// parseAttachment checks an attachment key taken from the path.
func parseAttachment(network, containerID, iface string) (alloc.Attachment, error) {
	if err := checkLen("network", network, maxNetworkLen); err != nil {
		return alloc.Attachment{}, err
	}
	a := alloc.Attachment{Network: network, ContainerID: containerID, Interface: iface}
	return a, alloc.ValidateAttachment("", a)
}

// attachmentsFromAPI parses a reconcile list. The list is required: a body
// without it must not read as "nothing is valid" and release every lease of
// the node; an explicit [] does that.
func attachmentsFromAPI(b ipamv1.ReconcileRequest) ([]alloc.Attachment, error) {
	if b.Attachments == nil {
		return nil, alloc.Invalid("attachments", "is required; send [] to release every lease of the node")
	}
	if err := checkCount("attachments", len(b.Attachments), maxAttachments); err != nil {
		return nil, err
	}
	network := deref(b.Network, "")
	if err := checkLen("network", network, maxNetworkLen); err != nil {
		return nil, err
	}
	out := make([]alloc.Attachment, len(b.Attachments))
	for i, a := range b.Attachments {
		out[i] = alloc.Attachment{Network: network, ContainerID: a.ContainerID, Interface: a.Interface}
		if err := alloc.ValidateAttachment(fmt.Sprintf("attachments[%d].", i), out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// leaseFilterFromAPI parses the filters of a lease list; absent filters
// match everything, present ones must be well-formed names or a state.
func leaseFilterFromAPI(p ipamv1.ListLeasesParams) (alloc.LeaseFilter, error) {
	space, err := parseSpace(p.Space)
	if err != nil {
		return alloc.LeaseFilter{}, err
	}
	f := alloc.LeaseFilter{Space: space}
	checks := []struct {
		v     *string
		dst   *string
		check func(field, s string) error
		field string
	}{
		{p.Node, &f.Node, alloc.ValidateNodeName, "node"},
		{p.Pool, &f.Pool, alloc.ValidateLabelName, "pool"},
		{p.OwnerNamespace, &f.OwnerNamespace, alloc.ValidateLabelName, "ownerNamespace"},
		{p.OwnerName, &f.OwnerName, alloc.ValidateNodeName, "ownerName"},
	}
	for _, c := range checks {
		if c.v == nil {
			continue
		}
		if err := c.check(c.field, *c.v); err != nil {
			return alloc.LeaseFilter{}, err
		}
		*c.dst = *c.v
	}
	if p.State != nil {
		st, err := alloc.ParseLeaseState(string(*p.State))
		if err != nil {
			return alloc.LeaseFilter{}, alloc.Invalid("state", "%s (want pending, active or cooling)", err)
		}
		f.State = st
	}
	return f, nil
}

func allocationToAPI(a alloc.Allocation) ipamv1.Allocation {
	out := ipamv1.Allocation{
		Node:        a.Node,
		Network:     optString(a.Attachment.Network),
		ContainerID: a.Attachment.ContainerID,
		Interface:   a.Attachment.Interface,
		Owner:       ownerToAPI(a.Owner),
		State:       ipamv1.LeaseState(a.State),
		ExpiresAt:   optTime(a.ExpiresAt),
		Addresses:   make([]ipamv1.LeaseAddress, len(a.Leases)),
		Generation:  a.Generation,
	}
	for i, l := range a.Leases {
		out.Addresses[i] = ipamv1.LeaseAddress{
			Family:  familyToAPI(l.Family),
			Address: l.Prefix().String(),
			Gateway: optAddr(l.Gateway),
			Pool:    l.Pool,
			Block:   l.Block.String(),

			SkipMasquerade: l.SkipMasquerade,
			Generation:     &l.Generation,
			Sticky:         stickyToAPI(l.Sticky),
		}
		if l.SelectedBy != "" {
			out.Addresses[i].SelectedBy = ptr(ipamv1.LeaseAddressSelectedBy(l.SelectedBy))
		}
	}
	return out
}

// showOperatorReasons puts each sticky binding's OperatorReason in the
// place of its Reason, for a caller that may read every node.
func showOperatorReasons(a alloc.Allocation) {
	for _, l := range a.Leases {
		if l.Sticky != nil && l.Sticky.OperatorReason != "" {
			l.Sticky.Reason = l.Sticky.OperatorReason
		}
	}
}

func leaseToAPI(l alloc.Lease) ipamv1.Lease {
	out := ipamv1.Lease{
		Address:        l.Prefix().String(),
		Family:         familyToAPI(l.Family),
		Node:           l.Node,
		Pool:           l.Pool,
		Block:          l.Block.String(),
		Gateway:        optAddr(l.Gateway),
		Network:        optString(l.Attachment.Network),
		ContainerID:    l.Attachment.ContainerID,
		Interface:      l.Attachment.Interface,
		State:          ipamv1.LeaseState(l.State),
		CreatedAt:      l.CreatedAt.UTC(),
		ExpiresAt:      optTime(l.ExpiresAt),
		ConfirmedAt:    optTime(l.ConfirmedAt),
		ReleasedAt:     optTime(l.ReleasedAt),
		CooldownUntil:  optTime(l.CooldownUntil),
		SkipMasquerade: &l.SkipMasquerade,
		Generation:     l.Generation,
		Sticky:         stickyToAPI(l.Sticky),
	}
	if l.SelectedBy != "" {
		out.SelectedBy = ptr(ipamv1.LeaseSelectedBy(l.SelectedBy))
	}
	// A node's reserved address (crd mode) has no owner.
	if l.Owner != (alloc.Owner{}) {
		out.Owner = ptr(ownerToAPI(l.Owner))
	}
	return out
}

func leasesToAPI(items []alloc.Lease) []ipamv1.Lease { return mapAll(items, leaseToAPI) }

// stickyFromAPI parses a lease request's sticky section; the identity is
// checked by LeaseRequest.Validate.
func stickyFromAPI(s *ipamv1.StickyRequest) (*alloc.StickyRequest, error) {
	if s == nil {
		return nil, nil
	}
	out := &alloc.StickyRequest{Identity: s.Identity, Require: deref(s.Require, false)}
	if s.Retention != nil {
		d, err := time.ParseDuration(*s.Retention)
		if err != nil || d < time.Second || d > alloc.MaxStickyRetention {
			return nil, alloc.Invalid("sticky.retention", "%q is not a duration from 1s to %s", *s.Retention, alloc.MaxStickyRetention)
		}
		out.Retention = d
	}
	return out, nil
}

func stickyToAPI(b *alloc.Binding) *ipamv1.StickyStatus {
	if b == nil {
		return nil
	}
	out := &ipamv1.StickyStatus{Identity: b.Identity, Retention: b.Retention.String(), Reason: optString(b.Reason)}
	if b.Decided {
		out.Reused = ptr(b.Reused)
	}
	return out
}

// parseAttachmentPath checks the space, node and attachment of the
// /v1/nodes/{node}/attachments/{containerID}/{interface} routes.
// The network comes from the query (absent: the unnamed network).
func parseAttachmentPath(spaceParam, network *string, node, containerID, iface string) (space string, _ string, a alloc.Attachment, err error) {
	if space, err = parseSpace(spaceParam); err != nil {
		return "", "", alloc.Attachment{}, err
	}
	if err = alloc.ValidateNodeName("node", node); err != nil {
		return "", "", alloc.Attachment{}, err
	}
	if a, err = parseAttachment(deref(network, ""), containerID, iface); err != nil {
		return "", "", alloc.Attachment{}, err
	}
	return space, node, a, nil
}
