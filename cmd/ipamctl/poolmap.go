// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"io"
	"math/bits"
	"net/netip"
	"strings"
)

// A pool map draws one pool CIDR as a grid of characters, one per
// block-sized slot (a prefix of the pool's maskSize), so that carved
// blocks, free ones and fragmentation show at a glance. A CIDR with more
// slots than fit (a /8 in /24 blocks is 65,536) is drawn with several slots
// per character, a power of two so that every row still starts on a
// prefix boundary and its label is a prefix's first address.
//
// The characters:
const (
	mapCarved   = '#' // every slot of the character is a carved block
	mapPartly   = '+' // some are (aggregated), or a block smaller than a slot is
	mapReserved = 'x' // free, but in a reserved range: no new block goes there
	mapFree     = '.' // free
)

// mapLegend explains the characters under every map.
const mapLegend = "legend: # carved  + partly carved  x reserved (no new blocks)  . free"

const (
	// mapMaxRows bounds a CIDR's drawing, so that a big pool does not
	// scroll its other CIDRs and families off the screen: a /16 in /24
	// blocks still gets one character per block at 80 columns.
	mapMaxRows = 8
	// mapMaxCols is the widest row: 64 characters (in groups of 16) read
	// well and keep rows aligned on prefixes.
	mapMaxCols = 64
	mapMinCols = 8
	// mapGroup characters are followed by a space.
	mapGroup = 16
	// mapMaxSlotBits bounds what a map can count: the API keeps IPv6 pools
	// to 16 bits (Cilium's rule) and IPv4 to 32.
	mapMaxSlotBits = 40
)

// poolMap counts, per character, the slots carved and reserved.
type poolMap struct {
	cidr      netip.Prefix
	maskSize  int
	slotBits  int // log2 of the number of slots
	cellBits  int // log2 of the slots per character
	cols      int // characters per row
	carved    []uint64
	partly    []bool
	reserved  []uint64
	labelSize int
}

// newPoolMap prepares the map of cidr in blocks of maskSize for a terminal
// width characters wide, with indent spaces before each row.
func newPoolMap(cidr netip.Prefix, maskSize, width, indent int) (*poolMap, error) {
	cidr = cidr.Masked()
	slotBits := maskSize - cidr.Bits()
	if slotBits < 0 || maskSize > cidr.Addr().BitLen() {
		return nil, fmt.Errorf("mask /%d does not fit %s", maskSize, cidr)
	}
	if slotBits > mapMaxSlotBits {
		return nil, fmt.Errorf("%s holds 2^%d blocks of /%d: too many to draw", cidr, slotBits, maskSize)
	}
	m := &poolMap{cidr: cidr, maskSize: maskSize, slotBits: slotBits}
	m.labelSize = len(lastAddr(cidr).String())
	// The widest power of two that fits beside the labels.
	room := width - indent - m.labelSize - 2
	cols := mapMaxCols
	for cols > mapMinCols && cols+cols/mapGroup-1 > room {
		cols /= 2
	}
	cellsBits := min(slotBits, bits.Len(uint(cols*mapMaxRows))-1)
	m.cellBits = slotBits - cellsBits
	cells := 1 << cellsBits
	m.cols = min(cols, cells)
	m.carved = make([]uint64, cells)
	m.partly = make([]bool, cells)
	m.reserved = make([]uint64, cells)
	return m, nil
}

// slotsPerCell is how many slots one character stands for.
func (m *poolMap) slotsPerCell() uint64 { return 1 << m.cellBits }

// addSlots adds the slots first..last (inclusive) to counts, per cell.
func (m *poolMap) addSlots(counts []uint64, first, last uint64) {
	for c := first >> m.cellBits; c <= last>>m.cellBits && c < uint64(len(counts)); c++ {
		lo, hi := c<<m.cellBits, (c+1)<<m.cellBits-1
		counts[c] += min(hi, last) - max(lo, first) + 1
	}
}

// slot is the index of the slot holding addr, which must be in the CIDR.
func (m *poolMap) slot(addr netip.Addr) uint64 {
	return bitsOf(addr, m.cidr.Bits(), m.maskSize)
}

// carve marks a block: the slots it covers, or the slot it is part of
// when it is smaller than a slot (a cloud pool's /32 or /28). Blocks of
// other CIDRs are left out.
func (m *poolMap) carve(block netip.Prefix) {
	block = block.Masked()
	if !block.IsValid() || block.Addr().Is4() != m.cidr.Addr().Is4() || !m.cidr.Overlaps(block) {
		return
	}
	if block.Bits() <= m.cidr.Bits() { // covers the whole CIDR
		m.addSlots(m.carved, 0, 1<<m.slotBits-1)
		return
	}
	first := m.slot(block.Addr())
	if block.Bits() > m.maskSize {
		m.partly[first>>m.cellBits] = true
		return
	}
	m.addSlots(m.carved, first, first+1<<(m.maskSize-block.Bits())-1)
}

// reserve marks the slots that a reserved range (start to end, inclusive)
// touches.
func (m *poolMap) reserve(start, end netip.Addr) {
	first, last := m.cidr.Addr(), lastAddr(m.cidr)
	if !start.IsValid() || !end.IsValid() || start.Is4() != first.Is4() || end.Less(start) ||
		end.Less(first) || last.Less(start) {
		return
	}
	if start.Less(first) {
		start = first
	}
	if last.Less(end) {
		end = last
	}
	m.addSlots(m.reserved, m.slot(start), m.slot(end))
}

// cell is the character of cell c.
func (m *poolMap) cell(c int) byte {
	switch {
	case m.carved[c] >= m.slotsPerCell():
		return mapCarved
	case m.carved[c] > 0 || m.partly[c]:
		return mapPartly
	case m.reserved[c] > 0:
		return mapReserved
	}
	return mapFree
}

// write draws the map: a title line, then rows, each labelled with the
// first address it covers.
func (m *poolMap) write(w io.Writer, indent string) error {
	var b strings.Builder
	slots := uint64(1) << m.slotBits
	unit := "one character each"
	if m.cellBits > 0 {
		unit = fmt.Sprintf("%s per character", num(int64(m.slotsPerCell())))
	}
	fmt.Fprintf(&b, "%s%s: %s blocks of /%d, %s\n", indent, m.cidr, num(int64(slots)), m.maskSize, unit)
	rowSlots := uint64(m.cols) << m.cellBits
	for c := 0; c < len(m.carved); c += m.cols {
		label := withBits(m.cidr.Addr(), m.cidr.Bits(), m.maskSize, uint64(c/m.cols)*rowSlots)
		fmt.Fprintf(&b, "%s  %-*s  ", indent, m.labelSize, label)
		for i := c; i < c+m.cols; i++ {
			if i > c && (i-c)%mapGroup == 0 {
				b.WriteByte(' ')
			}
			b.WriteByte(m.cell(i))
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// bitsOf is the number that bits from..to-1 of addr spell (bit 0 is the
// first of the address), at most 63 of them.
func bitsOf(addr netip.Addr, from, to int) uint64 {
	b, off := addr.As16(), 0
	if addr.Is4() {
		off = 96
	}
	var v uint64
	for i := from + off; i < to+off; i++ {
		v = v<<1 | uint64(b[i/8]>>(7-i%8)&1)
	}
	return v
}

// withBits is addr with bits from..to-1 set to v.
func withBits(addr netip.Addr, from, to int, v uint64) netip.Addr {
	b, off := addr.As16(), 0
	if addr.Is4() {
		off = 96
	}
	for i := to + off - 1; i >= from+off; i-- {
		mask := byte(1) << (7 - i%8)
		if v&1 == 1 {
			b[i/8] |= mask
		} else {
			b[i/8] &^= mask
		}
		v >>= 1
	}
	a := netip.AddrFrom16(b)
	if addr.Is4() {
		return a.Unmap()
	}
	return a
}

// lastAddr is the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b, off := p.Masked().Addr().As16(), 0
	if p.Addr().Is4() {
		off = 96
	}
	for i := p.Bits() + off; i < 128; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		return a.Unmap()
	}
	return a
}
