// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"net/netip"
	"testing"
)

func TestBlockAtAndIndex(t *testing.T) {
	cases := []struct {
		parent string
		mask   int
		i      int64
		want   string
	}{
		{"10.244.0.0/16", 24, 0, "10.244.0.0/24"},
		{"10.244.0.0/16", 24, 255, "10.244.255.0/24"},
		{"10.244.0.0/16", 28, 4095, "10.244.255.240/28"},
		{"10.0.0.0/8", 24, 65535, "10.255.255.0/24"},
		{"10.0.0.0/8", 32, 1<<24 - 1, "10.255.255.255/32"},
		{"fd00::/104", 120, 1, "fd00::100/120"},
		{"fd00::/104", 120, 65535, "fd00::ff:ff00/120"},
		{"fd00:10:244::/96", 112, 65535, "fd00:10:244::ffff:0/112"},
		{"fd00:10::/80", 96, 65535, "fd00:10::ffff:0:0/96"},
	}
	for _, c := range cases {
		parent := netip.MustParsePrefix(c.parent)
		got := BlockAt(parent, c.mask, c.i)
		if got.String() != c.want {
			t.Errorf("BlockAt(%s, %d, %d) = %s, want %s", c.parent, c.mask, c.i, got, c.want)
		}
		if back := BlockIndex(parent, got); back != c.i {
			t.Errorf("BlockIndex(%s, %s) = %d, want %d", c.parent, got, back, c.i)
		}
	}
	if n := BlockCount(netip.MustParsePrefix("10.244.0.0/16"), 26); n != 1024 {
		t.Errorf("BlockCount = %d", n)
	}
}

// Every block of a pool CIDR, numbered in order, tiles it exactly.
func FuzzBlockAtTiles(f *testing.F) {
	f.Add("10.244.0.0/20", 26, int64(5))
	f.Add("fd00::/104", 120, int64(300))
	f.Fuzz(func(t *testing.T, s string, mask int, i int64) {
		parent, err := ParseCanonicalPrefix(s)
		if err != nil || mask < parent.Bits() || mask > parent.Addr().BitLen() ||
			parent.Addr().BitLen()-mask > 32 || mask-parent.Bits() > 20 {
			return
		}
		n := BlockCount(parent, mask)
		if i < 0 || i >= n {
			return
		}
		b := BlockAt(parent, mask, i)
		if !parent.Contains(b.Addr()) || b.Masked() != b || BlockIndex(parent, b) != i {
			t.Fatalf("block %d of %s at /%d = %s", i, parent, mask, b)
		}
		if i+1 < n && BlockAt(parent, mask, i+1).Overlaps(b) {
			t.Fatalf("blocks %d and %d overlap", i, i+1)
		}
	})
}
