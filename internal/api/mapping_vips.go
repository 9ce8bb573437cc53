// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"fmt"
	"slices"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

func parseVIPOwner(space *string, namespace, name string) (string, alloc.VIPOwner, error) {
	sp, err := parseSpace(space)
	if err != nil {
		return "", alloc.VIPOwner{}, err
	}
	o := alloc.VIPOwner{Namespace: namespace, Name: name}
	return sp, o, o.Validate()
}

// Bounds of a VIP request beyond the domain's (alloc.MaxVIPAddresses,
// alloc.MaxVIPPorts), as api/openapi.yaml declares them.
const maxCrossNamespaces = 64

// vipRequestFromAPI parses and validates a request; families default to
// IPv4 alone when no address is named, as Cilium's single stack does.
func vipRequestFromAPI(space string, o alloc.VIPOwner, b ipamv1.VIPRequest) (alloc.VIPRequest, error) {
	r := alloc.VIPRequest{Space: space, Owner: o, RequireAll: deref(b.RequireAllFamilies, true), Reassign: deref(b.Reassign, false)}
	var err error
	if r.Labels, err = labelsFromAPI("labels", b.Labels); err != nil {
		return r, err
	}
	fams := deref(b.Families, nil)
	if err := checkCount("families", len(fams), len(alloc.Families)); err != nil {
		return r, err
	}
	for i, f := range fams {
		fam, err := parseFamily(fmt.Sprintf("families[%d]", i), f)
		if err != nil {
			return r, err
		}
		r.Families = append(r.Families, fam)
	}
	addrs := deref(b.Addresses, nil)
	if err := checkCount("addresses", len(addrs), alloc.MaxVIPAddresses); err != nil {
		return r, err
	}
	for i, a := range addrs {
		addr, err := parseAddr(fmt.Sprintf("addresses[%d]", i), a)
		if err != nil {
			return r, err
		}
		r.Addresses = append(r.Addresses, addr)
	}
	if len(r.Families) == 0 && len(r.Addresses) == 0 {
		r.Families = []alloc.Family{alloc.IPv4}
	}
	if b.Sharing != nil {
		if r.Sharing, err = vipSharingFromAPI(*b.Sharing); err != nil {
			return r, err
		}
	}
	return r, r.Validate()
}

func vipSharingFromAPI(s ipamv1.VIPSharing) (alloc.VIPSharing, error) {
	out := alloc.VIPSharing{Key: deref(s.Key, ""), CrossNamespace: deref(s.CrossNamespace, nil),
		PermitDifferentPods: deref(s.PermitDifferentPods, false)}
	if err := checkCount("sharing.crossNamespace", len(out.CrossNamespace), maxCrossNamespaces); err != nil {
		return out, err
	}
	ports := deref(s.Ports, nil)
	if err := checkCount("sharing.ports", len(ports), alloc.MaxVIPPorts); err != nil {
		return out, err
	}
	for _, p := range ports {
		out.Ports = append(out.Ports, alloc.VIPPort{Port: p.Port, Protocol: string(deref(p.Protocol, ipamv1.ProtocolTCP))})
	}
	out.ExternalTrafficPolicy = string(deref(s.ExternalTrafficPolicy, ipamv1.TrafficPolicyCluster))
	var err error
	if out.PodSelector, err = labelsFromAPI("sharing.podSelector", s.PodSelector); err != nil {
		return out, err
	}
	return out, nil
}

func vipAssignmentToAPI(space string, a alloc.VIPAssignment) ipamv1.VIPAssignment {
	out := ipamv1.VIPAssignment{Space: space, Namespace: a.Owner.Namespace, Name: a.Owner.Name, Generation: a.Generation, Addresses: []ipamv1.VIPAddress{},
		Satisfied: a.Satisfied, Reason: a.Reason, Message: optString(a.Message), Request: vipRequestToAPI(a.Request)}
	for _, v := range a.Addresses {
		out.Addresses = append(out.Addresses, ipamv1.VIPAddress{Address: v.Addr.String(), Family: familyToAPI(v.Family), Pool: v.Pool,
			Generation: v.Generation, Holders: v.Holders, Stranded: v.Stranded})
	}
	return out
}

func vipRequestToAPI(r alloc.VIPRequest) ipamv1.VIPRequest {
	out := ipamv1.VIPRequest{RequireAllFamilies: ptr(r.RequireAll)}
	if len(r.Labels) > 0 {
		out.Labels = ptr(labelsToAPI(r.Labels))
	}
	if len(r.Families) > 0 {
		fams := make([]ipamv1.Family, len(r.Families))
		for i, f := range r.Families {
			fams[i] = familyToAPI(f)
		}
		out.Families = &fams
	}
	if len(r.Addresses) > 0 {
		addrs := make([]string, len(r.Addresses))
		for i, a := range r.Addresses {
			addrs[i] = a.String()
		}
		out.Addresses = &addrs
	}
	s := r.Sharing
	if s.Key != "" || len(s.Ports) > 0 || s.ExternalTrafficPolicy != "" {
		sh := ipamv1.VIPSharing{Key: optString(s.Key), PermitDifferentPods: ptr(s.PermitDifferentPods)}
		if len(s.CrossNamespace) > 0 {
			sh.CrossNamespace = ptr(slices.Clone(s.CrossNamespace))
		}
		if len(s.Ports) > 0 {
			ports := make([]ipamv1.VIPPort, len(s.Ports))
			for i, p := range s.Ports {
				ports[i] = ipamv1.VIPPort{Port: p.Port, Protocol: ptr(ipamv1.VIPPortProtocol(p.Protocol))}
			}
			sh.Ports = &ports
		}
		if s.ExternalTrafficPolicy != "" {
			sh.ExternalTrafficPolicy = ptr(ipamv1.VIPSharingExternalTrafficPolicy(s.ExternalTrafficPolicy))
		}
		if len(s.PodSelector) > 0 {
			sh.PodSelector = ptr(labelsToAPI(s.PodSelector))
		}
		out.Sharing = &sh
	}
	return out
}
