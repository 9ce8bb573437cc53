package alloc

import (
	"net/netip"
	"testing"
)

func prefixes(ss ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range ss {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}

func TestFirstFreeBlock(t *testing.T) {
	cases := []struct {
		name   string
		parent string
		mask   int
		taken  []netip.Prefix
		want   string // "" = full
	}{
		{"empty pool", "10.244.0.0/16", 24, nil, "10.244.0.0/24"},
		{"after first", "10.244.0.0/16", 24, prefixes("10.244.0.0/24"), "10.244.1.0/24"},
		{"fills a hole first", "10.244.0.0/16", 24, prefixes("10.244.0.0/24", "10.244.2.0/24"), "10.244.1.0/24"},
		{"unordered taken", "10.244.0.0/16", 24, prefixes("10.244.1.0/24", "10.244.0.0/24"), "10.244.2.0/24"},
		{"adopted smaller block blocks its aligned parent", "10.0.0.0/22", 24, prefixes("10.0.0.16/28"), "10.0.1.0/24"},
		{"blocks outside parent ignored", "10.0.0.0/24", 26, prefixes("10.1.0.0/16"), "10.0.0.0/26"},
		{"full", "10.0.0.0/25", 26, prefixes("10.0.0.0/26", "10.0.0.64/26"), ""},
		{"single block pool", "10.0.0.0/28", 28, nil, "10.0.0.0/28"},
		{"ipv6", "fd00::/104", 120, prefixes("fd00::/120"), "fd00::100/120"},
		{"mask shorter than parent", "10.0.0.0/24", 16, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := FirstFreeBlock(netip.MustParsePrefix(c.parent), c.mask, c.taken)
			if c.want == "" {
				if ok {
					t.Fatalf("got %s, want full", got)
				}
				return
			}
			if !ok || got.String() != c.want {
				t.Fatalf("got %s %v, want %s", got, ok, c.want)
			}
		})
	}
}

// Carving every block of a pool one by one yields each aligned block once,
// in order, and then reports the pool full.
func TestFirstFreeBlockExhaustsInOrder(t *testing.T) {
	parent := netip.MustParsePrefix("10.244.0.0/20")
	var taken []netip.Prefix
	for i := range 64 {
		b, ok := FirstFreeBlock(parent, 26, taken)
		if !ok {
			t.Fatalf("full after %d blocks", i)
		}
		if want := netip.PrefixFrom(AddrAt(parent, int64(i)*64), 26); b != want {
			t.Fatalf("block %d = %s, want %s", i, b, want)
		}
		taken = append(taken, b)
	}
	if b, ok := FirstFreeBlock(parent, 26, taken); ok {
		t.Fatalf("got %s from a full pool", b)
	}
}

// BenchmarkFirstFreeBlock: the cost of choosing a block grows with the
// blocks already carved in the pool CIDR (carving happens once per node and
// pool, never per lease).
func BenchmarkFirstFreeBlock(b *testing.B) {
	parent := netip.MustParsePrefix("10.0.0.0/8")
	for _, n := range []int{5000, 65000} {
		taken := make([]netip.Prefix, n)
		for i := range taken {
			taken[i] = netip.PrefixFrom(AddrAt(parent, int64(i)<<8), 24)
		}
		b.Run(itoa(n), func(b *testing.B) {
			for b.Loop() {
				if _, ok := FirstFreeBlock(parent, 24, taken); !ok {
					b.Fatal("full")
				}
			}
		})
	}
}
