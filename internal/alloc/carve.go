// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"net/netip"
)

// Blocks of a pool CIDR are numbered by their position: block i of parent
// at mask m starts 2^(bits-m) * i addresses after parent's first address.
// Carving takes the lowest-numbered block that overlaps no existing block.

// BlockCount is how many blocks of length mask parent holds. mask must lie
// in [parent.Bits(), parent.Addr().BitLen()] with mask - parent.Bits() <= 62
// (pool validation ensures both).
func BlockCount(parent netip.Prefix, mask int) int64 {
	return int64(1) << (mask - parent.Bits())
}

// BlockSize is the number of addresses of a block of length mask; at most
// 2^32 (pool validation ensures it).
func BlockSize(f Family, mask int) int64 {
	return int64(1) << (f.Bits() - mask)
}

// BlockAt returns block i of parent at mask; i must lie in
// [0, BlockCount(parent, mask)).
func BlockAt(parent netip.Prefix, mask int, i int64) netip.Prefix {
	size := BlockSize(FamilyOf(parent.Addr()), mask)
	return netip.PrefixFrom(AddrAt(parent, i*size), mask) // i*size < 2^48
}

// BlockIndex is the inverse of BlockAt: the number of block inside parent.
// block must be an aligned block of parent.
func BlockIndex(parent, block netip.Prefix) int64 {
	size := BlockSize(FamilyOf(parent.Addr()), block.Bits())
	return offsetOf(parent, block.Addr()) / size
}

// offsetOf is the distance of a from the start of p, for a inside p and
// blocks of at most 2^62 addresses from its start.
func offsetOf(p netip.Prefix, a netip.Addr) int64 {
	x, y := p.Masked().Addr().As16(), a.As16()
	var off, borrow int64
	for i := 15; i >= 0; i-- {
		d := int64(y[i]) - int64(x[i]) - borrow
		borrow = 0
		if d < 0 {
			d += 256
			borrow = 1
		}
		if 15-i < 8 {
			off |= d << (8 * (15 - i))
		}
	}
	return off
}
