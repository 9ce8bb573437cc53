// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func intPtr(i int) *int { return &i }

func addrRange(start, end string) AddrRange {
	var r AddrRange
	if start != "" {
		r.Start = netip.MustParseAddr(start)
	}
	if end != "" {
		r.End = netip.MustParseAddr(end)
	}
	return r
}

// specBase is a valid dual-stack spec: two IPv4 CIDRs and one IPv6 CIDR.
func specBase() PoolSpec {
	return PoolSpec{
		IPv4:      &PoolFamily{CIDRs: prefixes("10.0.0.0/16", "10.1.0.0/16"), MaskSize: 24},
		IPv6:      &PoolFamily{CIDRs: prefixes("fd00::/104"), MaskSize: 120},
		NodeLocal: DefaultNodeLocal,
	}
}

func checkSpecError(t *testing.T, err error, kind Kind, field string) {
	t.Helper()
	if kind == "" {
		if err != nil {
			t.Fatalf("got %v, want no error", err)
		}
		return
	}
	var e *Error
	if !asError(err, &e) || e.Kind != kind || e.Field != field {
		t.Fatalf("got %v, want %s at %q", err, kind, field)
	}
}

func TestPoolSpecValidateModePreAllocateSelectors(t *testing.T) {
	badOp := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Foo", Values: []string{"x"}}}}
	badKey := &metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "x"}}
	goodSel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}
	cases := []struct {
		name   string
		modify func(*PoolSpec)
		kind   Kind
		field  string
	}{
		{"base", func(*PoolSpec) {}, "", ""},
		{"mode empty", func(s *PoolSpec) { s.Mode = "" }, "", ""},
		{"mode multi-pool", func(s *PoolSpec) { s.Mode = ModeMultiPool }, "", ""},
		{"mode cluster-pool", func(s *PoolSpec) { s.Mode = ModeClusterPool }, "", ""},
		{"mode Multi-Pool", func(s *PoolSpec) { s.Mode = "Multi-Pool" }, KindInvalid, "spec.mode"},
		{"mode cluster_pool", func(s *PoolSpec) { s.Mode = "cluster_pool" }, KindInvalid, "spec.mode"},
		{"mode kubernetes", func(s *PoolSpec) { s.Mode = "kubernetes" }, KindInvalid, "spec.mode"},
		{"mode with space", func(s *PoolSpec) { s.Mode = " multi-pool" }, KindInvalid, "spec.mode"},
		{"preAllocate unset", func(s *PoolSpec) { s.PreAllocate = nil }, "", ""},
		{"preAllocate -1", func(s *PoolSpec) { s.PreAllocate = intPtr(-1) }, KindInvalid, "spec.preAllocate"},
		{"preAllocate 0", func(s *PoolSpec) { s.PreAllocate = intPtr(0) }, "", ""},
		{"preAllocate 8", func(s *PoolSpec) { s.PreAllocate = intPtr(8) }, "", ""},
		{"preAllocate 65536", func(s *PoolSpec) { s.PreAllocate = intPtr(65536) }, "", ""},
		{"preAllocate 65537", func(s *PoolSpec) { s.PreAllocate = intPtr(65537) }, KindInvalid, "spec.preAllocate"},
		{"preAllocate on cluster-pool", func(s *PoolSpec) { s.Mode, s.PreAllocate = ModeClusterPool, intPtr(4) }, "", ""},
		{"good selectors", func(s *PoolSpec) { s.PodSelector, s.NamespaceSelector = goodSel, goodSel }, "", ""},
		{"empty selectors", func(s *PoolSpec) {
			s.PodSelector, s.NamespaceSelector = &metav1.LabelSelector{}, &metav1.LabelSelector{}
		}, "", ""},
		{"podSelector operator Foo", func(s *PoolSpec) { s.PodSelector = badOp }, KindInvalid, "spec.podSelector"},
		{"podSelector invalid key", func(s *PoolSpec) { s.PodSelector = badKey }, KindInvalid, "spec.podSelector"},
		{"namespaceSelector operator Foo", func(s *PoolSpec) { s.NamespaceSelector = badOp }, KindInvalid, "spec.namespaceSelector"},
		{"good nodeSelector", func(s *PoolSpec) { s.NodeSelector = goodSel }, "", ""},
		{"nodeSelector operator Foo", func(s *PoolSpec) { s.NodeSelector = badOp }, KindInvalid, "spec.nodeSelector"},
		{"nodeSelector invalid key", func(s *PoolSpec) { s.NodeSelector = badKey }, KindInvalid, "spec.nodeSelector"},
		{"namespaceSelector invalid key", func(s *PoolSpec) { s.NamespaceSelector = badKey }, KindInvalid, "spec.namespaceSelector"},
		{"namespaceSelector bad, podSelector good", func(s *PoolSpec) { s.PodSelector, s.NamespaceSelector = goodSel, badKey }, KindInvalid, "spec.namespaceSelector"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := specBase()
			c.modify(&s)
			checkSpecError(t, s.Validate(), c.kind, c.field)
		})
	}
}

func TestPoolSpecValidateReservedRanges(t *testing.T) {
	p := netip.MustParsePrefix
	v4a, v4b, v6 := p("10.0.0.0/16"), p("10.1.0.0/16"), p("fd00::/104")
	ranges := func(n int) []AddrRange {
		out := make([]AddrRange, n)
		for i := range out {
			a := AddrAt(v4a, int64(i)*256)
			out[i] = AddrRange{Start: a, End: a}
		}
		return out
	}
	cases := []struct {
		name  string
		v4    []CIDRReservation
		v6    []CIDRReservation
		kind  Kind
		field string
	}{
		{"none", nil, nil, "", ""},
		{"good", []CIDRReservation{
			{CIDR: v4a, Ranges: []AddrRange{addrRange("10.0.0.0", "10.0.0.255"), addrRange("10.0.5.5", "10.0.5.5")}},
			{CIDR: v4b, Ranges: []AddrRange{addrRange("10.1.0.0", "10.1.255.255")}},
		}, []CIDRReservation{{CIDR: v6, Ranges: []AddrRange{addrRange("fd00::", "fd00::ff:ffff")}}}, "", ""},
		{"a CIDR with no ranges", []CIDRReservation{{CIDR: v4a}}, nil, "", ""},
		{"32 ranges", []CIDRReservation{{CIDR: v4a, Ranges: ranges(32)}}, nil, "", ""},
		{"33 ranges", []CIDRReservation{{CIDR: v4b}, {CIDR: v4a, Ranges: ranges(33)}}, nil, KindInvalid, "spec.ipv4.pool[1].reservedRanges"},
		{"cidr not among cidrs", []CIDRReservation{{CIDR: p("10.2.0.0/16")}}, nil, KindInvalid, "spec.ipv4.pool[0].cidr"},
		{"cidr inside a cidr but not one", []CIDRReservation{{CIDR: v4a}, {CIDR: p("10.1.0.0/24")}}, nil, KindInvalid, "spec.ipv4.pool[1].cidr"},
		{"ipv6 cidr under ipv4", []CIDRReservation{{CIDR: v6}}, nil, KindInvalid, "spec.ipv4.pool[0].cidr"},
		{"cidr listed twice", []CIDRReservation{{CIDR: v4a}, {CIDR: v4b}, {CIDR: v4a}}, nil, KindInvalid, "spec.ipv4.pool[2].cidr"},
		{"start after end", []CIDRReservation{{CIDR: v4a, Ranges: []AddrRange{
			addrRange("10.0.0.1", "10.0.0.2"), addrRange("10.0.0.9", "10.0.0.8")}}}, nil, KindInvalid, "spec.ipv4.pool[0].reservedRanges[1].end"},
		{"start equals end", []CIDRReservation{{CIDR: v4a, Ranges: []AddrRange{addrRange("10.0.0.9", "10.0.0.9")}}}, nil, "", ""},
		{"start outside the cidr", []CIDRReservation{{CIDR: v4a, Ranges: []AddrRange{addrRange("10.1.0.1", "10.0.0.2")}}}, nil, KindInvalid, "spec.ipv4.pool[0].reservedRanges[0].start"},
		{"end outside the cidr", []CIDRReservation{{CIDR: v4b, Ranges: []AddrRange{
			addrRange("10.1.0.1", "10.1.0.2"), addrRange("10.1.255.0", "10.2.0.0")}}}, nil, KindInvalid, "spec.ipv4.pool[0].reservedRanges[1].end"},
		{"end in another cidr of the family", []CIDRReservation{{CIDR: v4a, Ranges: []AddrRange{addrRange("10.0.255.0", "10.1.0.5")}}}, nil, KindInvalid, "spec.ipv4.pool[0].reservedRanges[0].end"},
		{"start of the wrong family", []CIDRReservation{{CIDR: v4a, Ranges: []AddrRange{addrRange("fd00::1", "10.0.0.2")}}}, nil, KindInvalid, "spec.ipv4.pool[0].reservedRanges[0].start"},
		{"end of the wrong family", []CIDRReservation{{CIDR: v4a, Ranges: []AddrRange{addrRange("10.0.0.1", "fd00::2")}}}, nil, KindInvalid, "spec.ipv4.pool[0].reservedRanges[0].end"},
		{"ipv4-mapped start", []CIDRReservation{{CIDR: v4a, Ranges: []AddrRange{addrRange("::ffff:10.0.0.1", "10.0.0.2")}}}, nil, KindInvalid, "spec.ipv4.pool[0].reservedRanges[0].start"},
		{"missing start", []CIDRReservation{{CIDR: v4a, Ranges: []AddrRange{addrRange("", "10.0.0.2")}}}, nil, KindInvalid, "spec.ipv4.pool[0].reservedRanges[0].start"},
		{"missing end", []CIDRReservation{{CIDR: v4a, Ranges: []AddrRange{addrRange("10.0.0.1", "")}}}, nil, KindInvalid, "spec.ipv4.pool[0].reservedRanges[0].end"},
		{"ipv6 start after end", nil, []CIDRReservation{{CIDR: v6, Ranges: []AddrRange{addrRange("fd00::ff", "fd00::fe")}}}, KindInvalid, "spec.ipv6.pool[0].reservedRanges[0].end"},
		{"ipv6 end outside", nil, []CIDRReservation{{CIDR: v6, Ranges: []AddrRange{addrRange("fd00::1", "fd00::100:0")}}}, KindInvalid, "spec.ipv6.pool[0].reservedRanges[0].end"},
		{"ipv6 start of the wrong family", nil, []CIDRReservation{{CIDR: v6, Ranges: []AddrRange{addrRange("10.0.0.1", "fd00::2")}}}, KindInvalid, "spec.ipv6.pool[0].reservedRanges[0].start"},
		{"ipv6 cidr not among cidrs", nil, []CIDRReservation{{CIDR: p("fd01::/104")}}, KindInvalid, "spec.ipv6.pool[0].cidr"},
		{"ipv6 zoned end", nil, []CIDRReservation{{CIDR: v6, Ranges: []AddrRange{{Start: netip.MustParseAddr("fd00::1"), End: netip.MustParseAddr("fd00::2%eth0")}}}}, KindInvalid, "spec.ipv6.pool[0].reservedRanges[0].end"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := specBase()
			s.IPv4.Reserved, s.IPv6.Reserved = c.v4, c.v6
			checkSpecError(t, s.Validate(), c.kind, c.field)
		})
	}
}

func TestValidateUpdateMode(t *testing.T) {
	modes := []PoolMode{"", ModeMultiPool, ModeClusterPool}
	for _, from := range modes {
		for _, to := range modes {
			name := fmt.Sprintf("%q to %q", from, to)
			t.Run(name, func(t *testing.T) {
				prev, next := specBase(), specBase()
				prev.Mode, next.Mode = from, to
				err := ValidateUpdate(prev, next)
				if from != ModeClusterPool && to == ModeClusterPool {
					checkSpecError(t, err, KindImmutable, "spec.mode")
					return
				}
				checkSpecError(t, err, "", "")
			})
		}
	}
}

// Mode, preAllocate, selectors and reserved ranges may change; the shape of
// blocks may not.
func TestValidateUpdateOtherFields(t *testing.T) {
	cases := []struct {
		name   string
		modify func(*PoolSpec)
		kind   Kind
		field  string
	}{
		{"preAllocate", func(s *PoolSpec) { s.PreAllocate = intPtr(16) }, "", ""},
		{"selectors", func(s *PoolSpec) { s.PodSelector = &metav1.LabelSelector{} }, "", ""},
		{"reserved ranges", func(s *PoolSpec) {
			s.IPv4.Reserved = []CIDRReservation{{CIDR: s.IPv4.CIDRs[0], Ranges: []AddrRange{addrRange("10.0.0.0", "10.0.0.255")}}}
		}, "", ""},
		{"disabled", func(s *PoolSpec) { s.Disabled = true }, "", ""},
		{"cidr appended", func(s *PoolSpec) { s.IPv4.CIDRs = append(s.IPv4.CIDRs, netip.MustParsePrefix("10.2.0.0/16")) }, "", ""},
		{"ipv4 maskSize", func(s *PoolSpec) { s.IPv4.MaskSize = 26 }, KindImmutable, "spec.ipv4.maskSize"},
		{"ipv6 maskSize", func(s *PoolSpec) { s.IPv6.MaskSize = 112 }, KindImmutable, "spec.ipv6.maskSize"},
		{"allowFirstIP", func(s *PoolSpec) { s.AllowFirstIP = true }, KindImmutable, "spec.allowFirstIP"},
		{"allowLastIP", func(s *PoolSpec) { s.AllowLastIP = true }, KindImmutable, "spec.allowLastIP"},
		{"nodeLocal", func(s *PoolSpec) { s.NodeLocal.Ingress = true }, KindImmutable, "spec.nodeLocal"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			next := specBase()
			c.modify(&next)
			checkSpecError(t, ValidateUpdate(specBase(), next), c.kind, c.field)
		})
	}
}

func TestPoolSpecPreAllocation(t *testing.T) {
	cases := []struct {
		name        string
		mode        PoolMode
		preAllocate *int
		pool        string
		defaultPool string
		want        int
	}{
		{"default pool, unset", "", nil, "default", "default", DefaultPreAllocate},
		{"default pool, unset, multi-pool", ModeMultiPool, nil, "default", "default", 8},
		{"other pool, unset", "", nil, "mars", "default", 0},
		{"default pool, explicit 3", "", intPtr(3), "default", "default", 3},
		{"default pool, explicit 0", "", intPtr(0), "default", "default", 0},
		{"other pool, explicit 16", ModeMultiPool, intPtr(16), "mars", "default", 16},
		{"default pool, cluster-pool", ModeClusterPool, nil, "default", "default", 0},
		{"cluster-pool ignores an explicit value", ModeClusterPool, intPtr(8), "mars", "default", 0},
		{"server default pool named otherwise", "", nil, "site-a", "site-a", 8},
		{"pool named default is not the server default", "", nil, "default", "site-a", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := PoolSpec{Mode: c.mode, PreAllocate: c.preAllocate}
			if got := s.PreAllocation(c.pool, c.defaultPool); got != c.want {
				t.Fatalf("PreAllocation(%q, %q) = %d, want %d", c.pool, c.defaultPool, got, c.want)
			}
		})
	}
}

func TestAddrRangeOverlapsCovers(t *testing.T) {
	cases := []struct {
		start, end string
		prefix     string
		overlaps   bool
		covers     bool
	}{
		// IPv4, range 10.0.0.10-10.0.0.20.
		{"10.0.0.10", "10.0.0.20", "10.0.0.0/28", true, false},  // .0-.15 holds the start
		{"10.0.0.10", "10.0.0.20", "10.0.0.16/30", true, true},  // .16-.19 inside
		{"10.0.0.10", "10.0.0.20", "10.0.0.16/29", true, false}, // .16-.23 holds the end
		{"10.0.0.10", "10.0.0.20", "10.0.0.8/30", true, false},  // .8-.11 holds the start
		{"10.0.0.10", "10.0.0.20", "10.0.0.8/31", false, false}, // .8-.9 just before
		{"10.0.0.10", "10.0.0.20", "10.0.0.9/32", false, false}, // one before the start
		{"10.0.0.10", "10.0.0.20", "10.0.0.10/32", true, true},  // the start
		{"10.0.0.10", "10.0.0.20", "10.0.0.20/32", true, true},  // the end
		{"10.0.0.10", "10.0.0.20", "10.0.0.21/32", false, false},
		{"10.0.0.10", "10.0.0.20", "10.0.0.24/29", false, false},
		{"10.0.0.10", "10.0.0.20", "10.0.0.0/24", true, false},
		{"10.0.0.10", "10.0.0.20", "10.0.0.17/30", true, true}, // host bits ignored: .16-.19
		{"10.0.0.10", "10.0.0.20", "10.0.1.0/24", false, false},
		{"10.0.0.0", "10.0.0.255", "10.0.0.0/24", true, true}, // exactly
		{"10.0.0.1", "10.0.0.255", "10.0.0.0/24", true, false},
		{"10.0.0.0", "10.0.0.254", "10.0.0.0/24", true, false},
		{"10.0.0.255", "10.0.1.0", "10.0.0.0/24", true, false},
		{"10.0.0.255", "10.0.1.0", "10.0.1.0/24", true, false},
		{"0.0.0.0", "255.255.255.255", "255.255.255.255/32", true, true},
		{"0.0.0.0", "255.255.255.255", "0.0.0.0/1", true, true},
		{"0.0.0.0", "0.0.0.0", "0.0.0.0/31", true, false},
		{"255.255.255.255", "255.255.255.255", "255.255.255.254/31", true, false},
		// IPv6.
		{"fd00::ff00", "fd00::ffff", "fd00::ff00/120", true, true},
		{"fd00::ff00", "fd00::ffff", "fd00::ff80/121", true, true},
		{"fd00::ff00", "fd00::ffff", "fd00::fe00/120", false, false},
		{"fd00::ff00", "fd00::ffff", "fd00::1:0/120", false, false},
		{"fd00::ff00", "fd00::ffff", "fd00::/112", true, false},
		{"fd00::ff", "fd00::100", "fd00::/120", true, false},    // the start is the last address
		{"fd00::ff", "fd00::100", "fd00::100/120", true, false}, // the end is the first address
		{"fd00::ff", "fd00::100", "fd00::200/120", false, false},
		{"fd00::", "fd00::ffff:ffff", "fd00::/96", true, true},
		{"fd00::1", "fd00::ffff:ffff", "fd00::/96", true, false},
		{"fd00::", "fd00::ffff:fffe", "fd00::/96", true, false},
		{"fd00::ffff:ffff", "fd00::1:0:0", "fd00::1:0:0/96", true, false},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120", true, true},
		{"fd00::5", "fd00::5", "fd00::5/128", true, true},
		{"fd00::5", "fd00::5", "fd00::4/127", true, false},
		{"fd00::5", "fd00::5", "fd00::6/127", false, false},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s-%s in %s", c.start, c.end, c.prefix), func(t *testing.T) {
			r := addrRange(c.start, c.end)
			p := netip.MustParsePrefix(c.prefix)
			if got := r.Overlaps(p); got != c.overlaps {
				t.Errorf("Overlaps = %v, want %v", got, c.overlaps)
			}
			if got := r.Covers(p); got != c.covers {
				t.Errorf("Covers = %v, want %v", got, c.covers)
			}
		})
	}
}

// Every special-purpose range is refused as a pool CIDR, and so is any
// CIDR overlapping one (inside, around, or a whole family), unless the
// pool allows it; ordinary private ranges pass.
func TestSpecialPurposeOverlap(t *testing.T) {
	for _, c := range []struct {
		cidr, rng string // rng "" when none overlaps
	}{
		{"0.0.0.0/8", "0.0.0.0/8"},
		{"0.0.0.0/4", "0.0.0.0/8"},
		{"0.0.0.0/0", "0.0.0.0/8"},
		{"127.0.0.1/32", "127.0.0.0/8"},
		{"169.254.10.0/24", "169.254.0.0/16"},
		{"224.0.0.0/4", "224.0.0.0/4"},
		{"255.255.255.255/32", "240.0.0.0/4"},
		{"::/128", "::/128"},
		{"::1/128", "::1/128"},
		{"::/0", "::/128"},
		{"::ffff:10.0.0.0/104", "::ffff:0.0.0.0/96"},
		{"fe80::/64", "fe80::/10"},
		{"ff02::/16", "ff00::/8"},
		{"10.0.0.0/8", ""},
		{"100.64.0.0/10", ""},
		{"192.168.0.0/16", ""},
		{"1.0.0.0/8", ""},
		{"223.255.255.0/24", ""},
		{"fd00::/8", ""},
		{"2001:db8::/32", ""},
		{"::2/127", ""},
	} {
		p := netip.MustParsePrefix(c.cidr)
		r, ok := SpecialPurposeOverlap(p)
		if ok != (c.rng != "") || (ok && r.String() != c.rng) {
			t.Errorf("%s: overlaps %v %v, want %q", c.cidr, r, ok, c.rng)
		}
		f, mask := FamilyOf(p.Addr()), p.Bits()
		pf := &PoolFamily{CIDRs: []netip.Prefix{p}, MaskSize: mask}
		spec := PoolSpec{IPv4: pf}
		if f == IPv6 {
			spec = PoolSpec{IPv6: pf}
		}
		if mask < 16 && f == IPv4 || mask < 112 && f == IPv6 {
			pf.MaskSize = min(mask+16, 32)
			if f == IPv6 {
				pf.MaskSize = mask + 16
			}
		}
		spec.AllowFirstIP, spec.AllowLastIP = true, true
		err := spec.Validate()
		switch {
		case c.rng != "" && (!IsKind(err, KindInvalid) || err.(*Error).Field != "spec."+f.String()+".cidrs[0]"):
			t.Errorf("%s: Validate %v, want invalid-input of the CIDR", c.cidr, err)
		case c.rng == "" && err != nil && strings.Contains(err.Error(), "special-purpose"):
			t.Errorf("%s: %v", c.cidr, err)
		}
		spec.AllowSpecialPurpose = true
		if err := spec.Validate(); err != nil && strings.Contains(err.Error(), "special-purpose") {
			t.Errorf("%s allowed: %v", c.cidr, err)
		}
	}
}

// TestBlocksPossibleSaturates: a pool's count of blocks, and of blocks
// times addresses, saturate at math.MaxInt64 rather than wrap: a cloud
// pool's IPv6 CIDRs (nothing carved of them) hold more than an int64.
func TestBlocksPossibleSaturates(t *testing.T) {
	fam := func(mask int, cidrs ...string) PoolFamily {
		pf := PoolFamily{MaskSize: mask}
		for _, c := range cidrs {
			pf.CIDRs = append(pf.CIDRs, netip.MustParsePrefix(c))
		}
		return pf
	}
	for _, c := range []struct {
		pf   PoolFamily
		want int64
	}{
		{fam(28, "10.0.0.0/16"), 4096},
		{fam(28, "10.0.0.0/16", "10.1.0.0/24"), 4096 + 16},
		{fam(96, "2600:1f18:aaaa:bb00::/56"), 1 << 40},
		{fam(96, "2600:1f18::/32"), math.MaxInt64},
		{fam(126, "2600:1f18::/64", "2600:1f19::/64"), math.MaxInt64},
	} {
		if got := c.pf.BlocksPossible(); got != c.want {
			t.Errorf("%v /%d: %d blocks, want %d", c.pf.CIDRs, c.pf.MaskSize, got, c.want)
		}
	}
	for _, c := range []struct{ a, b, want int64 }{
		{3, 4, 12}, {0, math.MaxInt64, 0}, {1 << 40, 1 << 32, math.MaxInt64}, {1 << 31, 1 << 31, 1 << 62},
	} {
		if got := SaturatingMul(c.a, c.b); got != c.want {
			t.Errorf("SaturatingMul(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
