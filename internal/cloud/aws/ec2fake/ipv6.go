// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"encoding/xml"
	"fmt"
	"net/netip"
	"strconv"
)

// IPv6 prefix delegation: a subnet with an IPv6 CIDR (a /64, as EC2's
// subnets have) hands out /80 prefixes to its interfaces, the lowest
// free first. An interface's IPv6 prefixes count against the type's IPv6
// addresses per interface, as in EC2.

// IPv6PrefixBits is the size of an IPv6 prefix EC2 delegates.
const IPv6PrefixBits = 80

// AddSubnetIPv6 gives subnet id the IPv6 CIDR cidr.
func (s *Server) AddSubnetIPv6(id string, cidr netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.recordLocked()
	s.subnets[id].IPv6CIDR = cidr.Masked()
}

func (s *Server) assignIPv6Locked(form map[string][]string) (any, *APIError) {
	type response struct {
		XMLName   xml.Name `xml:"AssignIpv6AddressesResponse"`
		Xmlns     string   `xml:"xmlns,attr"`
		RequestID string   `xml:"requestId"`
		IfaceID   string   `xml:"networkInterfaceId"`
		Prefixes  []string `xml:"assignedIpv6PrefixSet>item"`
	}
	f, e := s.lookupLocked(first(form, "NetworkInterfaceId"))
	if e != nil {
		return nil, e
	}
	s.changedLocked(f)
	if first(form, "Ipv6AddressCount") != "" || len(list(form, "Ipv6Addresses")) > 0 || len(list(form, "Ipv6Prefixes")) > 0 {
		return nil, &APIError{Code: "InvalidParameterCombination", Message: "This fake delegates prefixes of its choosing only; name Ipv6PrefixCount."}
	}
	n, err := strconv.Atoi(first(form, "Ipv6PrefixCount"))
	if err != nil || n < 1 {
		return nil, &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("Invalid value '%s' for Ipv6PrefixCount.", first(form, "Ipv6PrefixCount"))}
	}
	sn := s.subnets[f.subnet]
	if !sn.IPv6CIDR.IsValid() {
		return nil, &APIError{Code: "InvalidParameterValue", Message: fmt.Sprintf("The subnet %s does not have an IPv6 CIDR block.", sn.ID)}
	}
	if f.instance != "" {
		t := Types[s.instances[f.instance].typ]
		if !t.TakesPrefixes() {
			return nil, &APIError{Code: "InvalidParameterValue", Message: "Prefix delegation is supported on Nitro instances only."}
		}
		if len(f.ipv6Prefixes)+n > t.IPv6PerInterface {
			return nil, &APIError{Code: "Ipv6AddressLimitExceeded", Message: "Number of IPv6 addresses will exceed limit."}
		}
	}
	taken := map[netip.Prefix]bool{}
	for _, g := range s.ifaces {
		if g.subnet == f.subnet {
			for _, p := range g.ipv6Prefixes {
				taken[p] = true
			}
		}
	}
	res := response{Xmlns: xmlns, RequestID: requestID, IfaceID: f.id}
	var got []netip.Prefix
	// The /80s of the /64 in order, the first (holding the subnet's own
	// addresses) skipped.
	base := sn.IPv6CIDR.Addr().As16()
	for i := uint16(1); len(got) < n && i != 0; i++ {
		a := base
		a[8], a[9] = byte(i>>8), byte(i)
		p := netip.PrefixFrom(netip.AddrFrom16(a), IPv6PrefixBits)
		if !taken[p] {
			got = append(got, p)
		}
	}
	if len(got) < n {
		return nil, &APIError{Code: "InsufficientCidrBlocks", Message: "There are not enough free IPv6 prefixes in the subnet."}
	}
	f.ipv6Prefixes = append(f.ipv6Prefixes, got...)
	for _, p := range got {
		res.Prefixes = append(res.Prefixes, p.String())
	}
	return res, nil
}
