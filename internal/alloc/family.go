// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"net/netip"
)

// Family is an IP address family. The zero value is invalid.
type Family uint8

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// Families lists every family in the order allocations lock them (IPv4 first),
// which keeps dual-stack transactions free of lock-order deadlocks.
var Families = []Family{IPv4, IPv6}

// ParseFamily accepts "ipv4" and "ipv6".
func ParseFamily(s string) (Family, error) {
	switch s {
	case "ipv4":
		return IPv4, nil
	case "ipv6":
		return IPv6, nil
	}
	return 0, fmt.Errorf("unknown family %q (want ipv4 or ipv6)", s)
}

// FamilyOf returns the family of a valid address.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// Bits is the address length: 32 or 128.
func (f Family) Bits() int {
	if f == IPv4 {
		return 32
	}
	return 128
}

func (f Family) String() string {
	switch f {
	case IPv4:
		return "ipv4"
	case IPv6:
		return "ipv6"
	}
	return fmt.Sprintf("Family(%d)", uint8(f))
}
