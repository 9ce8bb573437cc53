package alloc

import (
	"net/netip"

	"go4.org/netipx"
)

// FirstFreeBlock returns the lowest aligned prefix of length mask inside
// parent that overlaps none of taken (blocks already carved or adopted, in
// any order, possibly outside parent). ok is false when parent is full.
//
// The free space is parent minus taken as a minimal set of CIDRs; the first of
// those with a length <= mask starts with the answer, because any free
// aligned block lies whole inside one prefix of that minimal cover.
func FirstFreeBlock(parent netip.Prefix, mask int, taken []netip.Prefix) (block netip.Prefix, ok bool) {
	if mask < parent.Bits() || mask > parent.Addr().BitLen() {
		return netip.Prefix{}, false
	}
	var b netipx.IPSetBuilder
	b.AddPrefix(parent)
	for _, t := range taken {
		b.RemovePrefix(t)
	}
	free, err := b.IPSet()
	if err != nil {
		return netip.Prefix{}, false
	}
	for _, p := range free.Prefixes() {
		if p.Bits() <= mask {
			return netip.PrefixFrom(p.Addr(), mask), true
		}
	}
	return netip.Prefix{}, false
}
