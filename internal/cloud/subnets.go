// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import (
	"cmp"
	"slices"
)

// SubnetSelector is a cloud pool's choice of subnets for the interfaces
// it creates. With IDs only those subnets; else, with Tags, the subnets
// carrying every tag; else the node's own subnet first, then any other.
// Whatever the selector, a subnet must be in the instance's network and
// zone (an interface cannot attach across zones).
type SubnetSelector struct {
	IDs  []string
	Tags map[string]string
}

// ChooseSubnets answers, in the order to try them, the subnets of
// candidates a new interface of inst holding need Pod addresses may be
// created in: those the selector names, in inst's network and zone, with
// room for need addresses and the interface's own, and not cooling
// (a subnet that answered subnet full is skipped for a while; cooling
// may be nil). The most free first; without IDs or Tags the node's own
// subnet comes first when it has room, as Cilium's operator does.
func ChooseSubnets(candidates []Subnet, inst Instance, sel SubnetSelector, need int, cooling func(id string) bool) []Subnet {
	var out []Subnet
	for _, s := range candidates {
		switch {
		case s.VPC != inst.VPC || s.Zone != inst.Zone:
		case s.Free < need+1:
		case cooling != nil && cooling(s.ID):
		case len(sel.IDs) > 0 && !slices.Contains(sel.IDs, s.ID):
		case len(sel.IDs) == 0 && !hasTags(s.Tags, sel.Tags):
		default:
			out = append(out, s)
		}
	}
	own := len(sel.IDs) == 0 && len(sel.Tags) == 0
	slices.SortStableFunc(out, func(a, b Subnet) int {
		if own && (a.ID == inst.SubnetID) != (b.ID == inst.SubnetID) {
			if a.ID == inst.SubnetID {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.Free, a.Free), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// hasTags reports whether tags holds every tag of want.
func hasTags(tags, want map[string]string) bool {
	for k, v := range want {
		if got, ok := tags[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// SecurityGroupsFor answers the security groups of a new interface of
// inst: explicit when the pool names them, else a copy of the primary
// interface's (device 0). None when neither exists: the caller must not
// create an interface without groups, which EC2 would give the VPC's
// default group.
func SecurityGroupsFor(inst Instance, explicit []string) []string {
	if len(explicit) > 0 {
		return slices.Clone(explicit)
	}
	for _, f := range inst.Interfaces {
		if f.DeviceIndex == 0 {
			return slices.Clone(f.SecurityGroups)
		}
	}
	return nil
}
