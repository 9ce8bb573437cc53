// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"net/netip"
)

// ParseCanonicalPrefix parses a CIDR and insists on its canonical form: no
// host bits set, no zone, no IPv4-mapped IPv6, and written the way
// netip.Prefix.String writes it (so "fd00:0::/104" and "10.0.0.1/8" are
// refused). Stored prefixes then compare equal to what users wrote.
func ParseCanonicalPrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is an IPv4-mapped IPv6 prefix; write the IPv4 form", s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set; the network is %s", s, m)
	}
	if p.String() != s {
		return netip.Prefix{}, fmt.Errorf("%q is not canonical; write %s", s, p)
	}
	return p, nil
}

// ParseAddr parses a single address without zone, refusing IPv4-mapped IPv6.
func ParseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	if a.Is4In6() {
		return netip.Addr{}, fmt.Errorf("%q is an IPv4-mapped IPv6 address; write the IPv4 form", s)
	}
	return a, nil
}
