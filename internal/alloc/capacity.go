// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"net/netip"

	"go4.org/netipx"
)

// FamilyCapacity is the capacity report of one family of a pool.
type FamilyCapacity struct {
	BlocksPossible int64 // blocks of maskSize the CIDRs hold
	BlocksCarved   int64
	// AddressesPossible is what the pool could lease if every block were
	// carved: BlocksPossible x the leasable addresses of one block.
	AddressesPossible int64
	AddressesInBlocks int64 // leasable addresses in carved blocks
	Leased            int64 // pending + active + reserved (crd mode)
	Cooling           int64 // released, cooldown not over
	NodesWithBlocks   int64
	// NodesAtCapacity hold blocks of the pool with no free address left.
	NodesAtCapacity int64
	// NodesInDeficit have less capacity than their need (multi-pool).
	NodesInDeficit int64
	// LargestFreeBlock is the largest prefix of the pool's CIDRs that no
	// block and no reserved range touches; invalid when none is left. Its
	// size next to maskSize tells fragmentation from exhaustion.
	LargestFreeBlock netip.Prefix
	// FreeBlocks is how many blocks of maskSize can still be carved.
	FreeBlocks int64
	Forecast   Forecast
}

// Free is the addresses leasable now without carving.
func (c FamilyCapacity) Free() int64 { return max(c.AddressesInBlocks-c.Leased-c.Cooling, 0) }

// FreeSpace reports, for one family of a pool, the largest free prefix and
// the number of free aligned blocks of mask, given the carved blocks: the
// CIDRs minus the blocks and the reserved ranges, as an IP set.
func FreeSpace(pf PoolFamily, blocks []netip.Prefix) (largest netip.Prefix, freeBlocks int64) {
	var b netipx.IPSetBuilder
	for _, c := range pf.CIDRs {
		b.AddPrefix(c)
	}
	for _, r := range pf.Reserved {
		for _, rg := range r.Ranges {
			b.RemoveRange(netipx.IPRangeFrom(rg.Start, rg.End))
		}
	}
	for _, blk := range blocks {
		b.RemovePrefix(blk)
	}
	set, err := b.IPSet()
	if err != nil {
		return netip.Prefix{}, 0
	}
	for _, p := range set.Prefixes() {
		if !largest.IsValid() || p.Bits() < largest.Bits() {
			largest = p
		}
		if p.Bits() <= pf.MaskSize {
			freeBlocks += int64(1) << min(pf.MaskSize-p.Bits(), 62)
		}
	}
	return largest, freeBlocks
}
