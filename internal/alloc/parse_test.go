// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"errors"
	"net/netip"
	"strconv"
	"testing"
)

func itoa(i int) string { return strconv.Itoa(i) }

func prefixes(ss ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range ss {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}

func asError(err error, target **Error) bool { return errors.As(err, target) }

func TestParseCanonicalPrefix(t *testing.T) {
	good := []string{"10.0.0.0/8", "10.244.0.0/16", "fd00::/104", "fd00:10:244::/96", "0.0.0.0/0", "192.168.1.7/32"}
	for _, s := range good {
		if p, err := ParseCanonicalPrefix(s); err != nil || p.String() != s {
			t.Errorf("%q: %v %v", s, p, err)
		}
	}
	bad := []string{"", "10.0.0.0", "10.0.0.1/8", "fd00:0::/104", "FD00::/104", "10.0.0.0/33", "010.0.0.0/8",
		"::ffff:10.0.0.0/104", "fe80::%eth0/64", "10.0.0.0/8 ", "10.0.0.0/-1", "abc"}
	for _, s := range bad {
		if p, err := ParseCanonicalPrefix(s); err == nil {
			t.Errorf("%q accepted as %s", s, p)
		}
	}
}

func TestParseAddr(t *testing.T) {
	for _, s := range []string{"10.0.0.1", "fd00::1"} {
		if _, err := ParseAddr(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, s := range []string{"", "10.0.0.1/32", "::ffff:10.0.0.1", "fe80::1%eth0", "10.0.0.256"} {
		if _, err := ParseAddr(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}

// FuzzParseCanonicalPrefix: whatever is accepted round-trips exactly and is
// a masked, unmapped prefix.
func FuzzParseCanonicalPrefix(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "fd00::/104", "10.0.0.1/8", "::ffff:1.2.3.0/120", "1.2.3.4/32",
		"fd00:0::/104", "fe80::%eth0/64", "10.0.0.0/08", "0.0.0.0/0", "::/0", "10.0.0.0/33", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseCanonicalPrefix(s)
		if err != nil {
			// Refusals are exactly the non-canonical: what netip parses,
			// prints back unchanged, masked and unmapped must be accepted.
			if n, perr := netip.ParsePrefix(s); perr == nil && n.String() == s && n.Masked() == n && !n.Addr().Is4In6() {
				t.Fatalf("%q is canonical but refused: %v", s, err)
			}
			return
		}
		if p.String() != s || p.Masked() != p || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			t.Fatalf("%q accepted as %s", s, p)
		}
		if _, err := netip.ParsePrefix(p.String()); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzPoolSpecValidate: a spec that validates never makes BlockLayout panic
// and every block it allows has at least one leasable address.
func FuzzPoolSpecValidate(f *testing.F) {
	f.Add("10.244.0.0/16", 24, false, false, true, true, false)
	f.Add("fd00::/104", 120, true, true, false, false, true)
	f.Fuzz(func(t *testing.T, cidr string, mask int, first, last, router, health, ingress bool) {
		p, err := ParseCanonicalPrefix(cidr)
		if err != nil {
			return
		}
		spec := PoolSpec{AllowFirstIP: first, AllowLastIP: last, NodeLocal: NodeLocal{router, health, ingress}}
		pf := &PoolFamily{CIDRs: []netip.Prefix{p}, MaskSize: mask}
		if p.Addr().Is4() {
			spec.IPv4 = pf
		} else {
			spec.IPv6 = pf
		}
		if spec.Validate() != nil {
			return
		}
		l := BlockLayout(netip.PrefixFrom(p.Addr(), mask), first, last, spec.NodeLocal)
		if l.Capacity < 1 {
			t.Fatalf("validated spec with empty blocks: %+v", l)
		}
	})
}

func TestPoolSpecValidate(t *testing.T) {
	v4 := func(mask int, cidrs ...string) *PoolFamily {
		return &PoolFamily{CIDRs: prefixes(cidrs...), MaskSize: mask}
	}
	many := make([]string, 33)
	for i := range many {
		many[i] = netip.PrefixFrom(AddrAt(netip.MustParsePrefix("10.0.0.0/8"), int64(i)<<16), 16).String()
	}
	cases := []struct {
		name  string
		spec  PoolSpec
		kind  Kind
		field string
	}{
		{"ok", PoolSpec{IPv4: v4(24, "10.0.0.0/16"), NodeLocal: DefaultNodeLocal}, "", ""},
		{"no family", PoolSpec{}, KindInvalid, "spec"},
		{"no cidrs", PoolSpec{IPv4: v4(24)}, KindInvalid, "spec.ipv4.cidrs"},
		{"33 cidrs", PoolSpec{IPv4: v4(24, many...)}, KindInvalid, "spec.ipv4.cidrs"},
		{"family mismatch", PoolSpec{IPv4: v4(120, "fd00::/104")}, KindInvalid, "spec.ipv4.cidrs[0]"},
		{"overlap in list", PoolSpec{IPv4: v4(24, "10.0.0.0/16", "10.0.1.0/24")}, KindOverlap, "spec.ipv4.cidrs[1]"},
		{"mask shorter", PoolSpec{IPv4: v4(8, "10.0.0.0/16")}, KindInvalid, "spec.ipv4.maskSize"},
		{"mask over 32", PoolSpec{IPv4: v4(33, "10.0.0.0/16")}, KindInvalid, "spec.ipv4.maskSize"},
		{"v6 diff over 16", PoolSpec{IPv6: v4(120, "fd00::/96")}, KindInvalid, "spec.ipv6.maskSize"},
		{"no room after reservations", PoolSpec{IPv4: v4(30, "10.0.0.0/16"), NodeLocal: NodeLocal{true, true, true}}, KindInvalid, "spec.ipv4.maskSize"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.spec.Validate()
			if c.kind == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var e *Error
			if !asError(err, &e) || e.Kind != c.kind || e.Field != c.field {
				t.Fatalf("got %v, want %s at %s", err, c.kind, c.field)
			}
		})
	}
}

// FuzzParseAddr: whatever is accepted is a zoneless, unmapped address that
// round-trips through its string form.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "fd00::1", "::ffff:10.0.0.1", "fe80::1%eth0", "1.2.3.4/32"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAddr(s)
		if err != nil {
			return
		}
		if a.Zone() != "" || a.Is4In6() {
			t.Fatalf("%q accepted as %s", s, a)
		}
		if b, err := ParseAddr(a.String()); err != nil || b != a {
			t.Fatalf("%s does not round-trip: %v %v", a, b, err)
		}
	})
}
