// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"net/netip"
)

// maxIPv6MaskDiff is Cilium's clusterSubnetMaxDiff: an IPv6 pool CIDR may be
// split into at most 2^16 node blocks (ErrCIDRSetSubNetTooBig).
const maxIPv6MaskDiff = 16

// Sizing is the capacity math of the seeds' "Sizing math":
//
//	nodes per pool CIDR = 2^(M - P)
//	addresses per node  = 2^(32 - M) or 2^(128 - M)
//	usable per node     = addresses - network - broadcast - node-local
type Sizing struct {
	CIDR             netip.Prefix
	MaskSize         int
	Nodes            int64
	AddressesPerNode int64
	ReservedPerNode  int64
	UsablePerNode    int64
}

// SizingOptions are the per-block choices that change usable addresses.
type SizingOptions struct {
	AllowFirstIP, AllowLastIP bool
	NodeLocal                 NodeLocal
}

// ComputeSizing validates cidr and mask like a pool family and returns the
// sizing. Errors are *Error of KindInvalid naming cidrField or maskField.
func ComputeSizing(cidr netip.Prefix, mask int, o SizingOptions, cidrField, maskField string) (Sizing, error) {
	if err := checkMask(cidr, mask, cidrField, maskField); err != nil {
		return Sizing{}, err
	}
	l := BlockLayout(netip.PrefixFrom(cidr.Addr(), mask), o.AllowFirstIP, o.AllowLastIP, o.NodeLocal)
	addrs := int64(1) << (cidr.Addr().BitLen() - mask)
	s := Sizing{
		CIDR:             cidr,
		MaskSize:         mask,
		Nodes:            int64(1) << (mask - cidr.Bits()),
		AddressesPerNode: addrs,
		UsablePerNode:    l.Capacity,
		ReservedPerNode:  addrs - l.Capacity,
	}
	if s.UsablePerNode < 1 {
		return Sizing{}, Invalid(maskField, "a /%d block has no leasable address left after network, broadcast and %d node-local addresses", mask, o.NodeLocal.Count())
	}
	return s, nil
}

// checkMask holds the mask rules shared by pools and sizing.
// checkMaskBounds is what any pool's mask must be: within the family,
// no shorter than the CIDR, and a block of at most 2^32 addresses. A
// cloud pool, which carves nothing, is held to this only; checkMask adds
// the bounds of carving.
func checkMaskBounds(cidr netip.Prefix, mask int, maskField string) error {
	bits := cidr.Addr().BitLen()
	switch {
	case mask < 0 || mask > bits:
		return Invalid(maskField, "must be between 0 and %d for %s", bits, FamilyOf(cidr.Addr()))
	case mask < cidr.Bits():
		return Invalid(maskField, "/%d is shorter than the CIDR %s", mask, cidr)
	case bits-mask > maxBlockHostBits:
		return Invalid(maskField, "/%d blocks are too large: a block holds at most 2^%d addresses (mask >= %d)", mask, maxBlockHostBits, bits-maxBlockHostBits)
	}
	return nil
}

func checkMask(cidr netip.Prefix, mask int, cidrField, maskField string) error {
	if err := checkMaskBounds(cidr, mask, maskField); err != nil {
		return err
	}
	bits := cidr.Addr().BitLen()
	switch {
	case bits == 128 && mask-cidr.Bits() > maxIPv6MaskDiff:
		return Invalid(maskField, "mask /%d minus the CIDR length /%d exceeds %d (Cilium's clusterSubnetMaxDiff); use a longer CIDR or a shorter mask", mask, cidr.Bits(), maxIPv6MaskDiff)
	case mask-cidr.Bits() > 62:
		return Invalid(cidrField, "%s holds too many /%d blocks", cidr, mask)
	}
	return nil
}
