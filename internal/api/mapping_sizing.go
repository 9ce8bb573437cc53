// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

func sizingFromAPI(p ipamv1.GetSizingParams) (alloc.Sizing, error) {
	cidr, err := parsePrefix("cidr", p.Cidr)
	if err != nil {
		return alloc.Sizing{}, err
	}
	o := alloc.SizingOptions{
		AllowFirstIP: deref(p.AllowFirstIP, false),
		AllowLastIP:  deref(p.AllowLastIP, false),
		NodeLocal: alloc.NodeLocal{
			Router:  deref(p.Router, alloc.DefaultNodeLocal.Router),
			Health:  deref(p.Health, alloc.DefaultNodeLocal.Health),
			Ingress: deref(p.Ingress, alloc.DefaultNodeLocal.Ingress),
		},
	}
	return alloc.ComputeSizing(cidr, p.MaskSize, o, "cidr", "maskSize")
}

func sizingToAPI(s alloc.Sizing) ipamv1.Sizing {
	return ipamv1.Sizing{
		Cidr:             s.CIDR.String(),
		Family:           familyToAPI(alloc.FamilyOf(s.CIDR.Addr())),
		MaskSize:         s.MaskSize,
		Nodes:            s.Nodes,
		AddressesPerNode: s.AddressesPerNode,
		ReservedPerNode:  s.ReservedPerNode,
		UsablePerNode:    s.UsablePerNode,
	}
}
