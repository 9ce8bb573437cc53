// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// The map of a pool CIDR, drawn from blocks and reserved ranges: one
// character per slot while the CIDR fits, then a power of two of slots per
// character; rows start on prefix boundaries and are labelled by them.
func TestPoolMap(t *testing.T) {
	type rng struct{ start, end string }
	for _, c := range []struct {
		name     string
		cidr     string
		mask     int
		width    int
		blocks   []string
		reserved []rng
		want     string
	}{{
		name: "one character per slot", cidr: "10.0.0.0/24", mask: 28, width: 80,
		blocks:   []string{"10.0.0.0/28", "10.0.0.32/28", "10.0.1.0/28" /* another CIDR */},
		reserved: []rng{{"10.0.0.200", "10.0.0.210"}},
		want: `  10.0.0.0/24: 16 blocks of /28, one character each
    10.0.0.0    #.#.........xx..
`,
	}, {
		name: "rows of a narrow terminal", cidr: "10.0.0.0/24", mask: 28, width: 28,
		blocks: []string{"10.0.0.240/28"},
		want: `  10.0.0.0/24: 16 blocks of /28, one character each
    10.0.0.0    ........
    10.0.0.128  .......#
`,
	}, {
		// 2^12 slots in 8 rows of 64: eight per character. A full
		// character, a partly carved one, a reserved one.
		name: "aggregated", cidr: "10.0.0.0/8", mask: 20, width: 100,
		blocks: []string{"10.0.0.0/20", "10.0.16.0/20", "10.0.32.0/20", "10.0.48.0/20", "10.0.64.0/20", "10.0.80.0/20",
			"10.0.96.0/20", "10.0.112.0/20", "10.0.128.0/20"},
		reserved: []rng{{"10.255.255.0", "10.255.255.255"}},
		want: "  10.0.0.0/8: 4,096 blocks of /20, 8 per character\n" +
			"    10.0.0.0        #+.............. ................ ................ ................\n" +
			rows("10.", 32, 6, "................ ................ ................ ................") +
			"    10.224.0.0      ................ ................ ................ ...............x\n",
	}, {
		name: "IPv6, blocks smaller than a slot mark it partly", cidr: "fd00::/112", mask: 116, width: 80,
		blocks: []string{"fd00::1000/116", "fd00::2005/128"},
		want: `  fd00::/112: 16 blocks of /116, one character each
    fd00::      .#+.............
`,
	}, {
		name: "a block the size of the CIDR", cidr: "10.9.0.0/30", mask: 32, width: 80,
		blocks: []string{"10.9.0.0/30"},
		want: `  10.9.0.0/30: 4 blocks of /32, one character each
    10.9.0.0  ####
`,
	}} {
		t.Run(c.name, func(t *testing.T) {
			m, err := newPoolMap(netip.MustParsePrefix(c.cidr), c.mask, c.width, 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range c.blocks {
				m.carve(netip.MustParsePrefix(b))
			}
			for _, r := range c.reserved {
				m.reserve(netip.MustParseAddr(r.start), netip.MustParseAddr(r.end))
			}
			var b strings.Builder
			if err := m.write(&b, "  "); err != nil {
				t.Fatal(err)
			}
			if b.String() != c.want {
				t.Errorf("map:\n%s\nwant:\n%s", b.String(), c.want)
			}
		})
	}

	for _, c := range []struct {
		cidr string
		mask int
	}{{"10.0.0.0/16", 8}, {"10.0.0.0/8", 33}, {"fd00::/8", 120}} {
		if _, err := newPoolMap(netip.MustParsePrefix(c.cidr), c.mask, 80, 2); err == nil {
			t.Errorf("%s in /%d: drawn", c.cidr, c.mask)
		}
	}
}

// rows are the middle rows of the aggregated /8: n rows of 64 characters,
// 8 slots (/20s) each, so 512 /20s, a /11, per row, labelled from
// 10.32.0.0 on.
func rows(prefix string, step, n int, cells string) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		label := prefix + strconv.Itoa(i*step) + ".0.0"
		b.WriteString("    " + label + strings.Repeat(" ", 16-len(label)) + cells + "\n")
	}
	return b.String()
}

// bitsOf and withBits are inverses over a CIDR's slot bits; lastAddr is
// the CIDR's last address.
func TestSlotBits(t *testing.T) {
	a := netip.MustParseAddr("10.244.37.9")
	if got := bitsOf(a, 16, 24); got != 37 {
		t.Errorf("bitsOf = %d, want 37", got)
	}
	if got := withBits(a, 16, 24, 200); got != netip.MustParseAddr("10.244.200.9") {
		t.Errorf("withBits = %s", got)
	}
	v6 := netip.MustParseAddr("fd00:10:244::ab00")
	if got := bitsOf(v6, 104, 120); got != 0xab {
		t.Errorf("bitsOf v6 = %#x", got)
	}
	if got := withBits(v6, 104, 120, 0x1234); got != netip.MustParseAddr("fd00:10:244::12:3400") {
		t.Errorf("withBits v6 = %s", got)
	}
	for p, want := range map[string]string{"10.244.0.0/16": "10.244.255.255", "fd00:10:244::/104": "fd00:10:244::ff:ffff", "10.0.0.7/32": "10.0.0.7"} {
		if got := lastAddr(netip.MustParsePrefix(p)); got.String() != want {
			t.Errorf("lastAddr(%s) = %s, want %s", p, got, want)
		}
	}
}
