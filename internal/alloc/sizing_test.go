// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"net/netip"
	"testing"
)

// The rows of the seeds' sizing table (000, "Sizing math"): nodes per pool
// CIDR and addresses per node, and "usable" = addresses - network -
// broadcast - router, health and ingress.
func TestComputeSizingSeedTable(t *testing.T) {
	all3 := SizingOptions{NodeLocal: NodeLocal{Router: true, Health: true, Ingress: true}}
	cases := []struct {
		cidr         string
		mask         int
		nodes, addrs int64
		usable       int64
	}{
		{"10.0.0.0/8", 24, 65536, 256, 251},
		{"10.244.0.0/16", 24, 256, 256, 251},
		{"10.244.0.0/16", 26, 1024, 64, 59},
		{"10.244.0.0/16", 28, 4096, 16, 11},
		{"fd00::/104", 120, 65536, 256, 251},
		{"fd00:10:244::/96", 112, 65536, 65536, 65531},
	}
	for _, c := range cases {
		t.Run(c.cidr+"@"+itoa(c.mask), func(t *testing.T) {
			s, err := ComputeSizing(netip.MustParsePrefix(c.cidr), c.mask, all3, "cidr", "maskSize")
			if err != nil {
				t.Fatal(err)
			}
			if s.Nodes != c.nodes || s.AddressesPerNode != c.addrs || s.UsablePerNode != c.usable {
				t.Fatalf("got nodes=%d addrs=%d usable=%d, want %d %d %d", s.Nodes, s.AddressesPerNode, s.UsablePerNode, c.nodes, c.addrs, c.usable)
			}
			if s.ReservedPerNode != 5 {
				t.Fatalf("reserved = %d, want 5", s.ReservedPerNode)
			}
		})
	}
}

func TestComputeSizingOptions(t *testing.T) {
	p := netip.MustParsePrefix("10.244.0.0/16")
	cases := []struct {
		name   string
		mask   int
		o      SizingOptions
		usable int64
	}{
		{"cilium default router+health", 24, SizingOptions{NodeLocal: DefaultNodeLocal}, 252},
		{"nothing reserved", 24, SizingOptions{}, 254},
		{"first and last allowed", 24, SizingOptions{AllowFirstIP: true, AllowLastIP: true}, 256},
		{"/31 has no network or broadcast", 31, SizingOptions{}, 2},
		{"/32 single address", 32, SizingOptions{}, 1},
		{"/30 with router and health", 30, SizingOptions{NodeLocal: DefaultNodeLocal}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := ComputeSizing(p, c.mask, c.o, "cidr", "maskSize")
			if c.usable == 0 {
				if !IsKind(err, KindInvalid) {
					t.Fatalf("want invalid-input, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.UsablePerNode != c.usable {
				t.Fatalf("usable = %d, want %d", s.UsablePerNode, c.usable)
			}
		})
	}
}

func TestComputeSizingRejects(t *testing.T) {
	cases := []struct {
		cidr  string
		mask  int
		field string
	}{
		{"10.0.0.0/16", 8, "maskSize"},        // shorter than the CIDR
		{"10.0.0.0/16", 33, "maskSize"},       // over 32
		{"fd00::/64", 96, "maskSize"},         // v6 diff 32 > 16
		{"fd00::/48", 64, "maskSize"},         // block larger than 2^32
		{"fd00:10:244::/96", 129, "maskSize"}, // over 128
		{"fd00:10:244::/96", -1, "maskSize"},  // negative
		{"10.0.0.0/8", 30, ""},                // fine: 4M nodes
	}
	for _, c := range cases {
		_, err := ComputeSizing(netip.MustParsePrefix(c.cidr), c.mask, SizingOptions{}, "cidr", "maskSize")
		if c.field == "" {
			if err != nil {
				t.Errorf("%s@%d: %v", c.cidr, c.mask, err)
			}
			continue
		}
		var e *Error
		if !asError(err, &e) || e.Kind != KindInvalid || e.Field != c.field {
			t.Errorf("%s@%d: got %v, want invalid %s", c.cidr, c.mask, err, c.field)
		}
	}
}

// Lab 1: a /28 block with router, health and ingress reserved yields
// exactly 11 leasable addresses, none of them reserved or network/broadcast.
func TestBlockLayoutLab1(t *testing.T) {
	l := BlockLayout(netip.MustParsePrefix("10.244.0.16/28"), false, false, NodeLocal{Router: true, Health: true, Ingress: true})
	if l.Capacity != 11 {
		t.Fatalf("capacity = %d, want 11", l.Capacity)
	}
	if l.First != 1 || l.Last != 14 {
		t.Fatalf("leasable range [%d,%d], want [1,14]", l.First, l.Last)
	}
	want := []string{"10.244.0.17", "10.244.0.18", "10.244.0.19"}
	got := []netip.Addr{l.Router, l.Health, l.Ingress}
	for i := range want {
		if got[i].String() != want[i] {
			t.Fatalf("reserved[%d] = %s, want %s", i, got[i], want[i])
		}
	}
	if len(l.Reserved) != 3 || l.Reserved[0] != 1 || l.Reserved[2] != 3 {
		t.Fatalf("reserved offsets %v", l.Reserved)
	}
}

func TestAddrAt(t *testing.T) {
	cases := []struct {
		prefix string
		off    int64
		want   string
	}{
		{"10.0.0.0/8", 0, "10.0.0.0"},
		{"10.0.0.0/8", 256, "10.0.1.0"},
		{"10.0.0.0/8", 1<<24 - 1, "10.255.255.255"},
		{"fd00::/96", 65536 + 5, "fd00::1:5"},
		{"fd00::ff00/120", 255, "fd00::ffff"},
		{"fd00::/96", 1<<32 - 1, "fd00::ffff:ffff"},
	}
	for _, c := range cases {
		if got := AddrAt(netip.MustParsePrefix(c.prefix), c.off); got.String() != c.want {
			t.Errorf("AddrAt(%s, %d) = %s, want %s", c.prefix, c.off, got, c.want)
		}
	}
}
