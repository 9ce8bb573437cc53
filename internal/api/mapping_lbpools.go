// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"fmt"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// lbPoolContentFromAPI parses a VIP pool's labels and spec and validates
// the spec as a whole.
func lbPoolContentFromAPI(l *ipamv1.Labels, s ipamv1.LBPoolSpec) (map[string]string, alloc.LBPoolSpec, error) {
	labels, err := labelsFromAPI("labels", l)
	if err != nil {
		return nil, alloc.LBPoolSpec{}, err
	}
	var spec alloc.LBPoolSpec
	if err := checkCount("spec.blocks", len(s.Blocks), alloc.MaxLBBlocks); err != nil {
		return nil, alloc.LBPoolSpec{}, err
	}
	for i, b := range s.Blocks {
		field := fmt.Sprintf("spec.blocks[%d]", i)
		cidr, start, stop := deref(b.Cidr, ""), deref(b.Start, ""), deref(b.Stop, "")
		for _, v := range []struct{ name, text string }{{"cidr", cidr}, {"start", start}, {"stop", stop}} {
			if err := checkLen(field+"."+v.name, v.text, maxAddressTextLen); err != nil {
				return nil, alloc.LBPoolSpec{}, err
			}
		}
		blk, err := alloc.ParseLBBlock(field, cidr, start, stop)
		if err != nil {
			return nil, alloc.LBPoolSpec{}, err
		}
		spec.Blocks = append(spec.Blocks, blk)
	}
	if spec.ServiceSelector, err = selectorFromAPI("spec.serviceSelector", s.ServiceSelector); err != nil {
		return nil, alloc.LBPoolSpec{}, err
	}
	switch v := deref(s.AllowFirstLastIPs, ipamv1.AllowFirstLastYes); v {
	case ipamv1.AllowFirstLastYes:
	case ipamv1.AllowFirstLastNo:
		spec.ReserveFirstLast = true
	default:
		return nil, alloc.LBPoolSpec{}, alloc.Invalid("spec.allowFirstLastIPs", "%q: must be \"Yes\" or \"No\"", string(v))
	}
	spec.Disabled = deref(s.Disabled, false)
	spec.AllowSpecialPurpose = deref(s.AllowSpecialPurpose, false)
	groups := deref(s.ReservedCIDRGroups, nil)
	if err := checkCount("spec.reservedCIDRGroups", len(groups), alloc.MaxLBReservedGroups); err != nil {
		return nil, alloc.LBPoolSpec{}, err
	}
	if len(groups) > 0 {
		spec.ReservedGroups = groups
	}
	if err := spec.Validate(); err != nil {
		return nil, alloc.LBPoolSpec{}, err
	}
	return labels, spec, nil
}

func lbPoolToAPI(p alloc.LBPool) ipamv1.LBPool {
	sp := ipamv1.LBPoolSpec{Blocks: make([]ipamv1.LBBlock, len(p.Spec.Blocks)), ServiceSelector: selectorToAPI(p.Spec.ServiceSelector)}
	for i, b := range p.Spec.Blocks {
		if b.CIDR.IsValid() {
			sp.Blocks[i].Cidr = optString(b.CIDR.String())
		} else {
			sp.Blocks[i].Start, sp.Blocks[i].Stop = optString(b.Start.String()), optString(b.Stop.String())
		}
	}
	first := ipamv1.AllowFirstLastYes
	if p.Spec.ReserveFirstLast {
		first = ipamv1.AllowFirstLastNo
	}
	sp.AllowFirstLastIPs = &first
	sp.Disabled = &p.Spec.Disabled
	sp.AllowSpecialPurpose = &p.Spec.AllowSpecialPurpose
	if len(p.Spec.ReservedGroups) > 0 {
		sp.ReservedCIDRGroups = &p.Spec.ReservedGroups
	}
	out := ipamv1.LBPool{
		Name:      p.Name,
		Space:     p.Space,
		Labels:    labelsToAPI(p.Labels),
		Spec:      sp,
		Status:    ipamv1.LBPoolStatus{Conflicting: p.Status.Conflicting(), Conflict: optString(p.Status.Conflict)},
		CreatedAt: p.CreatedAt.UTC(),
		UpdatedAt: p.UpdatedAt.UTC(),
	}
	for f, st := range p.Status.Families {
		fs := &ipamv1.LBFamilyStatus{Total: st.Total, Used: st.Used, Available: st.Available()}
		if f == alloc.IPv4 {
			out.Status.Ipv4 = fs
		} else {
			out.Status.Ipv6 = fs
		}
	}
	return out
}
