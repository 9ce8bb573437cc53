// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"go4.org/netipx"
)

// specialPurposeOracle is the list of special-purpose ranges written out
// again, apart from the code's, so that a range dropped from specialPurpose
// fails these tests.
var specialPurposeOracle = []string{
	"0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
	"::/128", "::1/128", "::ffff:0:0/96", "fe80::/10", "ff00::/8",
}

// oracleOverlap is the first range of the oracle r overlaps, in the
// list's order (which is the order the refusal names them in).
func oracleOverlap(r netipx.IPRange) (netip.Prefix, bool) {
	for _, s := range specialPurposeOracle {
		p := netip.MustParsePrefix(s)
		if netipx.RangeOfPrefix(p).Overlaps(r) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// specialShape is one block drawn around a special-purpose range.
type specialShape struct {
	name  string
	block LBBlock
}

// shapesAround draws blocks around the special-purpose range p: p itself
// and a CIDR inside it, its first and last address alone, ranges over
// either edge, a range and a CIDR containing it, and the ranges just
// outside it (which overlap it only when they reach another
// special-purpose range: 239.255.255.255 below 240.0.0.0/4 is multicast).
func shapesAround(p netip.Prefix) []specialShape {
	first, last := p.Addr(), netipx.PrefixLastIP(p)
	before, after := first.Prev(), last.Next()
	rng := func(a, b netip.Addr) LBBlock { return LBBlock{Start: a, Stop: b} }
	out := []specialShape{
		{"the range as a CIDR", LBBlock{CIDR: p}},
		{"its first address alone", rng(first, first)},
		{"its last address alone", rng(last, last)},
		{"a CIDR inside", LBBlock{CIDR: netip.PrefixFrom(first, min(p.Bits()+4, first.BitLen()))}},
	}
	if p.Bits() > 0 {
		out = append(out, specialShape{"a CIDR containing it", LBBlock{CIDR: netip.PrefixFrom(first, p.Bits()-1).Masked()}})
	}
	if before.IsValid() {
		out = append(out,
			specialShape{"a range over its first edge", rng(before, first)},
			specialShape{"the address just below", rng(before, before)})
	}
	if after.IsValid() {
		out = append(out,
			specialShape{"a range over its last edge", rng(last, after)},
			specialShape{"the address just above", rng(after, after)})
	}
	if before.IsValid() && after.IsValid() {
		out = append(out, specialShape{"a range containing it", rng(before, after)})
	}
	return out
}

// wantSpecial is the field a refusal of b names and the range it names,
// or false when b overlaps none: a CIDR block's cidr and the first range
// it overlaps; a range's start, else its stop, with the range it lies in;
// else the block and the first range it passes over.
func wantSpecial(field string, b LBBlock) (string, netip.Prefix, bool) {
	if b.CIDR.IsValid() {
		r, ok := oracleOverlap(netipx.RangeOfPrefix(b.CIDR))
		return field + ".cidr", r, ok
	}
	if r, ok := oracleOverlap(netipx.IPRangeFrom(b.Start, b.Start)); ok {
		return field + ".start", r, true
	}
	if r, ok := oracleOverlap(netipx.IPRangeFrom(b.Stop, b.Stop)); ok {
		return field + ".stop", r, true
	}
	r, ok := oracleOverlap(b.Range())
	return field, r, ok
}

// Every special-purpose range, IPv4, IPv6 and IPv4-mapped, refused in a
// VIP pool's block of any shape that overlaps it (inside, over an edge,
// containing it, as a CIDR or a start/stop range), naming the block's
// field and the range; the addresses next to it pass unless they are
// special-purpose themselves; spec.allowSpecialPurpose admits them all.
func TestLBPoolSpecialPurpose(t *testing.T) {
	ordinary := []LBBlock{{CIDR: netip.MustParsePrefix("192.0.2.0/24")}, {CIDR: netip.MustParsePrefix("2001:db8::/32")}}
	refused, passed := 0, 0
	named := map[string]bool{}
	for _, s := range specialPurposeOracle {
		for _, c := range shapesAround(netip.MustParsePrefix(s)) {
			t.Run(s+" "+c.name+" "+c.block.String(), func(t *testing.T) {
				spec := LBPoolSpec{Blocks: append(append([]LBBlock(nil), ordinary...), c.block)}
				field, rng, overlaps := wantSpecial("spec.blocks[2]", c.block)
				err := spec.Validate()
				var ae *Error
				switch {
				case overlaps:
					refused++
					named[rng.String()] = true
					if !errors.As(err, &ae) || ae.Kind != KindInvalid || ae.Field != field {
						t.Fatalf("Validate: %v, want invalid-input on %s", err, field)
					}
					for _, want := range []string{c.block.String(), "special-purpose range " + rng.String(), "spec.allowSpecialPurpose"} {
						if !strings.Contains(ae.Detail, want) {
							t.Errorf("detail %q lacks %q", ae.Detail, want)
						}
					}
				case err != nil:
					t.Fatalf("Validate of a block overlapping no special-purpose range: %v", err)
				default:
					passed++
				}
				spec.AllowSpecialPurpose = true
				if err := spec.Validate(); err != nil {
					t.Fatalf("Validate with allowSpecialPurpose: %v", err)
				}
			})
		}
	}
	// The table must keep exercising both outcomes and every range.
	if refused < 70 || passed < 5 || len(named) != len(specialPurposeOracle) {
		t.Fatalf("%d refused, %d passed, ranges named %v", refused, passed, named)
	}
}

// The reproducers of issue 33 and the fields a refusal names, written
// out: owners were given 127.0.0.1 and 224.0.0.0-224.0.0.3.
func TestLBPoolSpecialPurposeFields(t *testing.T) {
	cidr := func(s string) LBBlock { return LBBlock{CIDR: netip.MustParsePrefix(s)} }
	rng := func(a, b string) LBBlock { return LBBlock{Start: netip.MustParseAddr(a), Stop: netip.MustParseAddr(b)} }
	for _, c := range []struct {
		block        LBBlock
		field, rng   string
		wantsInvalid bool
	}{
		{cidr("127.0.0.0/30"), "spec.blocks[0].cidr", "127.0.0.0/8", true},
		{rng("224.0.0.0", "224.0.0.3"), "spec.blocks[0].start", "224.0.0.0/4", true},
		{rng("127.0.0.1", "127.0.0.1"), "spec.blocks[0].start", "127.0.0.0/8", true},
		{rng("126.255.255.250", "127.0.0.5"), "spec.blocks[0].stop", "127.0.0.0/8", true},
		{rng("126.255.255.0", "128.0.0.0"), "spec.blocks[0]", "127.0.0.0/8", true},
		// The first range of the list wins: 0.0.0.0/8 before 127.0.0.0/8.
		{rng("0.0.0.5", "127.0.0.1"), "spec.blocks[0].start", "0.0.0.0/8", true},
		{rng("1.0.0.0", "127.0.0.1"), "spec.blocks[0].stop", "127.0.0.0/8", true},
		// The stop lies in 240.0.0.0/4: named, though 224.0.0.0/4 comes
		// first in the list and the range passes over it.
		{rng("223.255.255.255", "255.255.255.255"), "spec.blocks[0].stop", "240.0.0.0/4", true},
		{rng("223.255.255.255", "239.0.0.0"), "spec.blocks[0].stop", "224.0.0.0/4", true},
		{cidr("::/64"), "spec.blocks[0].cidr", "::/128", true},
		{rng("::2", "::fffe:ffff:ffff"), "", "", false},
		{rng("::fffe:ffff:ffff", "::1:0:0:0"), "spec.blocks[0]", "::ffff:0.0.0.0/96", true},
		{rng("::ffff:10.0.0.1", "::ffff:10.0.0.9"), "spec.blocks[0].start", "::ffff:0.0.0.0/96", true},
		{rng("fe7f:ffff:ffff:ffff:ffff:ffff:ffff:fff0", "fe80::1"), "spec.blocks[0].stop", "fe80::/10", true},
		{rng("fd00::1", "fd00::ff"), "", "", false},
		{cidr("100.64.0.0/10"), "", "", false},
	} {
		spec := LBPoolSpec{Blocks: []LBBlock{c.block}}
		err := spec.Validate()
		var ae *Error
		switch {
		case !c.wantsInvalid && err != nil:
			t.Errorf("%s: %v", c.block, err)
		case c.wantsInvalid && (!errors.As(err, &ae) || ae.Kind != KindInvalid || ae.Field != c.field ||
			!strings.Contains(ae.Detail, "special-purpose range "+c.rng+";")):
			t.Errorf("%s: %v, want invalid-input on %s naming %s", c.block, err, c.field, c.rng)
		}
		first, _ := oracleOverlap(c.block.Range())
		if r, ok := SpecialPurposeOverlapRange(c.block.Range()); ok != c.wantsInvalid || r != first {
			t.Errorf("%s: SpecialPurposeOverlapRange %v %v", c.block, r, ok)
		}
	}
	// Nothing overlaps an invalid range, nor across families.
	if _, ok := SpecialPurposeOverlapRange(netipx.IPRange{}); ok {
		t.Error("the zero range overlaps")
	}
	if _, ok := SpecialPurposeOverlapRange(netipx.IPRangeFrom(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1"))); ok {
		t.Error("a range of two families overlaps")
	}
}

// A CIDR group's CIDR overlapping a special-purpose range in any way is
// refused naming its field and the range, unless the group allows it;
// the prefixes next to it pass unless special-purpose themselves.
func TestCIDRGroupSpecialPurpose(t *testing.T) {
	refused, passed := 0, 0
	for _, s := range specialPurposeOracle {
		for _, c := range shapesAround(netip.MustParsePrefix(s)) {
			p := c.block.CIDR
			if !p.IsValid() {
				if c.block.Start != c.block.Stop {
					continue // a range is no CIDR
				}
				p = netip.PrefixFrom(c.block.Start, c.block.Start.BitLen())
			}
			g := CIDRGroup{Name: "g", CIDRs: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), p}}
			rng, overlaps := oracleOverlap(netipx.RangeOfPrefix(p))
			err := g.Validate()
			var ae *Error
			switch {
			case overlaps:
				refused++
				if !errors.As(err, &ae) || ae.Kind != KindInvalid || ae.Field != "externalCIDRs[1]" ||
					!strings.Contains(ae.Detail, fmt.Sprintf("%s overlaps the special-purpose range %s;", p, rng)) ||
					!strings.Contains(ae.Detail, "allowSpecialPurpose") {
					t.Errorf("%s (%s): %v, want invalid-input on externalCIDRs[1] naming %s", p, c.name, err, rng)
				}
			case err != nil:
				t.Errorf("%s (%s): %v", p, c.name, err)
			default:
				passed++
			}
			g.AllowSpecialPurpose = true
			if err := g.Validate(); err != nil {
				t.Errorf("%s (%s) allowed: %v", p, c.name, err)
			}
		}
	}
	if refused < 50 || passed < 5 {
		t.Fatalf("%d refused, %d passed", refused, passed)
	}
	// The groups network policies most often hold: the whole Internet
	// reaches special-purpose ranges, the metadata service is one.
	for _, c := range []string{"0.0.0.0/0", "::/0", "169.254.169.254/32"} {
		g := CIDRGroup{Name: "g", CIDRs: []netip.Prefix{netip.MustParsePrefix(c)}}
		if err := g.Validate(); !IsKind(err, KindInvalid) {
			t.Errorf("%s: %v", c, err)
		}
	}
}
