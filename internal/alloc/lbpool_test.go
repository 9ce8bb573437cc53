// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"testing"

	"go4.org/netipx"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseLBBlock(t *testing.T) {
	for _, c := range []struct {
		cidr, start, stop string
		want              string // the block, or the field of the refusal
		ok                bool
	}{
		{"10.0.10.0/24", "", "", "10.0.10.0/24", true},
		{"", "10.0.10.5", "10.0.10.9", "10.0.10.5-10.0.10.9", true},
		{"", "10.0.10.5", "", "10.0.10.5-10.0.10.5", true},
		{"", "fd00::1", "fd00::ff", "fd00::1-fd00::ff", true},
		{"10.0.10.0/24", "10.0.10.1", "", "b", false},
		{"10.0.10.1/24", "", "", "b.cidr", false},
		{"", "", "10.0.10.9", "b", false},
		{"", "", "", "b", false},
		{"", "10.0.10.300", "", "b.start", false},
		{"", "10.0.10.1", "fe80::1%eth0", "b.stop", false},
		{"", "::ffff:10.0.0.1", "", "b.start", false},
	} {
		got, err := ParseLBBlock("b", c.cidr, c.start, c.stop)
		var ae *Error
		switch {
		case c.ok && (err != nil || got.String() != c.want):
			t.Errorf("%q %q %q: %v, %v; want %s", c.cidr, c.start, c.stop, got, err, c.want)
		case !c.ok && (!errors.As(err, &ae) || ae.Field != c.want || ae.Kind != KindInvalid):
			t.Errorf("%q %q %q: %v, want invalid %s", c.cidr, c.start, c.stop, err, c.want)
		}
	}
}

func TestLBPoolSpecValidate(t *testing.T) {
	cidr := func(s string) LBBlock { return LBBlock{CIDR: netip.MustParsePrefix(s)} }
	rng := func(a, b string) LBBlock { return LBBlock{Start: netip.MustParseAddr(a), Stop: netip.MustParseAddr(b)} }
	many := make([]LBBlock, MaxLBBlocks+1)
	for i := range many {
		many[i] = LBBlock{Start: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Stop: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})}
	}
	for _, c := range []struct {
		name  string
		spec  LBPoolSpec
		kind  Kind
		field string
	}{
		{"a CIDR and a range, both families", LBPoolSpec{Blocks: []LBBlock{cidr("10.0.10.0/24"), rng("fd00::1", "fd00::ff")}}, "", ""},
		{"no block", LBPoolSpec{}, KindInvalid, "spec.blocks"},
		{"too many blocks", LBPoolSpec{Blocks: many}, KindInvalid, "spec.blocks"},
		{"both cidr and range", LBPoolSpec{Blocks: []LBBlock{{CIDR: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.0.1")}}}, KindInvalid, "spec.blocks[0]"},
		{"host bits", LBPoolSpec{Blocks: []LBBlock{cidr("10.0.10.0/24"), {CIDR: netip.MustParsePrefix("10.0.11.1/24")}}}, KindInvalid, "spec.blocks[1].cidr"},
		{"a start alone", LBPoolSpec{Blocks: []LBBlock{{Start: netip.MustParseAddr("10.0.0.1")}}}, KindInvalid, "spec.blocks[0]"},
		{"mixed families", LBPoolSpec{Blocks: []LBBlock{rng("10.0.0.1", "fd00::1")}}, KindInvalid, "spec.blocks[0].stop"},
		{"stop before start", LBPoolSpec{Blocks: []LBBlock{rng("10.0.0.9", "10.0.0.1")}}, KindInvalid, "spec.blocks[0].stop"},
		{"blocks overlap", LBPoolSpec{Blocks: []LBBlock{cidr("10.0.10.0/24"), rng("10.0.9.250", "10.0.10.1")}}, KindOverlap, "spec.blocks[1]"},
		{"a bad selector", LBPoolSpec{Blocks: []LBBlock{cidr("10.0.10.0/24")}, ServiceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "x"}}}, KindInvalid, "spec.serviceSelector"},
	} {
		err := c.spec.Validate()
		var ae *Error
		switch {
		case c.field == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.field != "" && (!errors.As(err, &ae) || ae.Field != c.field || ae.Kind != c.kind):
			t.Errorf("%s: %v, want %s on %s", c.name, err, c.kind, c.field)
		}
		// An applied pool's blocks may overlap one another (the pool is
		// marked conflicting); every other refusal stands.
		applied := c.spec.ValidateApplied()
		if wantApplied := c.kind != KindOverlap && c.field != ""; (applied != nil) != wantApplied {
			t.Errorf("%s: applied: %v, want refused %v", c.name, applied, wantApplied)
		}
	}
}

// TestLBPoolRanges: allowFirstLastIPs No keeps the first and last address
// of CIDR blocks out, except of blocks of one or two addresses, and never
// touches a start/stop range.
func TestLBPoolRanges(t *testing.T) {
	s := LBPoolSpec{ReserveFirstLast: true, Blocks: []LBBlock{
		{CIDR: netip.MustParsePrefix("10.0.10.0/30")},
		{CIDR: netip.MustParsePrefix("10.0.11.0/31")},
		{CIDR: netip.MustParsePrefix("10.0.12.7/32")},
		{CIDR: netip.MustParsePrefix("fd00::/126")},
		{Start: netip.MustParseAddr("10.0.13.0"), Stop: netip.MustParseAddr("10.0.13.255")},
	}}
	want := []string{"10.0.10.1-10.0.10.2", "10.0.11.0-10.0.11.1", "10.0.12.7-10.0.12.7", "fd00::1-fd00::2", "10.0.13.0-10.0.13.255"}
	got := s.Ranges()
	for i, r := range got {
		if r.String() != want[i] {
			t.Errorf("block %d: %s, want %s", i, r, want[i])
		}
	}
	for a, offered := range map[string]bool{"10.0.10.0": false, "10.0.10.3": false, "10.0.10.1": true, "10.0.11.1": true, "10.0.13.0": true, "10.0.14.0": false} {
		if s.Offers(netip.MustParseAddr(a)) != offered {
			t.Errorf("%s offered: %v, want %v", a, !offered, offered)
		}
	}
	s.ReserveFirstLast = false
	if r := s.Ranges()[0].String(); r != "10.0.10.0-10.0.10.3" {
		t.Errorf("allowFirstLastIPs Yes: %s", r)
	}
}

// TestLBPoolSelects: the selector sees the Service's labels and the
// synthetic namespace and name labels, which win over labels of the same
// key; no selector selects every Service.
func TestLBPoolSelects(t *testing.T) {
	for _, c := range []struct {
		sel       *metav1.LabelSelector
		ns, name  string
		svcLabels map[string]string
		want      bool
	}{
		{nil, "a", "web", nil, true},
		{&metav1.LabelSelector{MatchLabels: map[string]string{"color": "blue"}}, "a", "web", map[string]string{"color": "blue"}, true},
		{&metav1.LabelSelector{MatchLabels: map[string]string{"color": "blue"}}, "a", "web", map[string]string{"color": "red"}, false},
		{&metav1.LabelSelector{MatchLabels: map[string]string{LabelServiceNamespace: "tenant-a"}}, "tenant-a", "web", nil, true},
		{&metav1.LabelSelector{MatchLabels: map[string]string{LabelServiceNamespace: "tenant-a"}}, "tenant-b", "web",
			map[string]string{LabelServiceNamespace: "tenant-a"}, false},
		{&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: LabelServiceName, Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "api"}}}},
			"a", "api", nil, true},
		{&metav1.LabelSelector{}, "a", "web", nil, true},
	} {
		got, err := LBPoolSpec{ServiceSelector: c.sel}.Selects(c.ns, c.name, c.svcLabels)
		if err != nil || got != c.want {
			t.Errorf("%v on %s/%s %v: %v, %v; want %v", c.sel, c.ns, c.name, c.svcLabels, got, err, c.want)
		}
	}
}

func TestRangeSize(t *testing.T) {
	for r, want := range map[string]int64{
		"10.0.0.0/24":             256,
		"10.0.0.7/32":             1,
		"0.0.0.0/0":               1 << 32,
		"fd00::/64":               math.MaxInt64, // 2^64 saturates
		"fd00::/65":               math.MaxInt64, // 2^63 does too
		"fd00::/66":               1 << 62,
		"fd00::/120":              256,
		"10.0.0.250-10.0.1.4":     11,
		"fd00::ffff-fd00::1:0001": 3,
	} {
		rng, err := netipx.ParseIPRange(r)
		if err != nil {
			p := netip.MustParsePrefix(r)
			rng = netipx.RangeOfPrefix(p)
		}
		if got := RangeSize(rng); got != want {
			t.Errorf("%s: %d, want %d", r, got, want)
		}
	}
	s := LBPoolSpec{ReserveFirstLast: true, Blocks: []LBBlock{
		{CIDR: netip.MustParsePrefix("10.0.10.0/24")},
		{Start: netip.MustParseAddr("10.0.20.100"), Stop: netip.MustParseAddr("10.0.20.200")},
		{CIDR: netip.MustParsePrefix("fd00::/64")},
	}}
	if got := s.Totals(); got[IPv4] != 254+101 || got[IPv6] != math.MaxInt64 {
		t.Errorf("totals %v", got)
	}
}

// TestSettleLBConflicts: the newer of two overlapping pools is marked and
// names the older; marks stay until the pool overlaps no unmarked pool.
func TestSettleLBConflicts(t *testing.T) {
	pool := func(name, conflict string, blocks ...string) LBPoolBlocks {
		p := LBPoolBlocks{Name: name, Conflict: conflict}
		for _, b := range blocks {
			if r, err := netipx.ParseIPRange(b); err == nil {
				p.Blocks = append(p.Blocks, LBBlock{Start: r.From(), Stop: r.To()})
			} else {
				p.Blocks = append(p.Blocks, LBBlock{CIDR: netip.MustParsePrefix(b)})
			}
		}
		return p
	}
	const marked = "marked before"
	for _, c := range []struct {
		name  string
		pools []LBPoolBlocks
		want  []string // "" not marked, else the mark
	}{
		{"disjoint", []LBPoolBlocks{pool("a", "", "10.0.10.0/24"), pool("b", "", "10.0.11.0/24")}, []string{"", ""}},
		{"the newer is marked", []LBPoolBlocks{pool("a", "", "10.0.10.0/24"), pool("b", "", "10.0.11.0/24", "10.0.10.100-10.0.10.200")},
			[]string{"", `block 10.0.10.100-10.0.10.200 overlaps block 10.0.10.0/24 of pool "a"`}},
		{"an older pool edited onto a newer one marks the newer", []LBPoolBlocks{pool("a", "", "10.0.10.0/24", "10.0.11.5-10.0.11.5"), pool("b", "", "10.0.11.0/24")},
			[]string{"", `block 10.0.11.0/24 overlaps block 10.0.11.5-10.0.11.5 of pool "a"`}},
		{"a mark sticks while the overlap stays", []LBPoolBlocks{pool("a", marked, "10.0.10.0/24"), pool("b", "", "10.0.10.0/25")},
			[]string{`block 10.0.10.0/24 overlaps block 10.0.10.0/25 of pool "b"`, ""}},
		{"a mark goes when the overlap goes", []LBPoolBlocks{pool("a", "", "10.0.10.0/24"), pool("b", marked, "10.0.11.0/25")},
			[]string{"", ""}},
		{"a pool overlapping only a marked one is not marked", []LBPoolBlocks{pool("a", "", "10.0.10.0/24"), pool("b", marked, "10.0.10.0/23"),
			pool("c", "", "10.0.11.0/24")}, []string{"", `block 10.0.10.0/23 overlaps block 10.0.10.0/24 of pool "a"`, ""}},
		{"two marked pools overlapping only each other: the older comes back", []LBPoolBlocks{pool("b", marked, "10.0.10.0/24"),
			pool("c", marked, "10.0.10.128/25")}, []string{"", `block 10.0.10.128/25 overlaps block 10.0.10.0/24 of pool "b"`}},
		{"families never overlap", []LBPoolBlocks{pool("a", "", "10.0.0.0/8"), pool("b", "", "::a00:0/104")}, []string{"", ""}},
		{"a pool whose own blocks overlap is marked, and marks nobody", []LBPoolBlocks{pool("a", "", "10.0.10.0/24", "10.0.10.64/28"),
			pool("b", "", "10.0.10.0/25")}, []string{`block 10.0.10.64/28 overlaps block 10.0.10.0/24 of pool "a"`, ""}},
		{"a pool's own overlap keeps its mark with nothing else near", []LBPoolBlocks{pool("a", marked, "10.0.10.0/24", "10.0.10.64/28")},
			[]string{`block 10.0.10.64/28 overlaps block 10.0.10.0/24 of pool "a"`}},
		{"a mark goes when the pool's own overlap goes", []LBPoolBlocks{pool("a", marked, "10.0.10.0/24")}, []string{""}},
	} {
		got := SettleLBConflicts(c.pools)
		for i, w := range c.want {
			if got[i] != w {
				t.Errorf("%s: pool %s: %q, want %q", c.name, c.pools[i].Name, got[i], w)
			}
		}
	}
	// Whatever the marks before, the unmarked pools never overlap.
	all := []LBPoolBlocks{pool("a", "", "10.0.0.0/24"), pool("b", marked, "10.0.0.0/25"), pool("c", "", "10.0.0.128/25"),
		pool("d", marked, "10.0.1.0/24"), pool("e", "", "10.0.0.0/16")}
	marks := SettleLBConflicts(all)
	for i := range all {
		for j := range i {
			if marks[i] == "" && marks[j] == "" {
				if _, ok := overlapping(all[i], all[j]); ok {
					t.Errorf("unmarked %s and %s overlap: %q", all[i].Name, all[j].Name, marks)
				}
			}
		}
	}
}

func overlapping(a, b LBPoolBlocks) (string, bool) {
	for _, x := range a.Blocks {
		for _, y := range b.Blocks {
			if x.Range().Overlaps(y.Range()) {
				return x.String(), true
			}
		}
	}
	return "", false
}

// TestLBPoolReserved: the CIDRs of named groups leave the pool's ranges,
// totals and offers; a pool names a group once, at most 16.
func TestLBPoolReserved(t *testing.T) {
	s := LBPoolSpec{ReserveFirstLast: true, Blocks: []LBBlock{{CIDR: netip.MustParsePrefix("10.0.10.0/24")},
		{Start: netip.MustParseAddr("10.0.20.1"), Stop: netip.MustParseAddr("10.0.20.9")}},
		ReservedGroups: []string{"corp"}, Reserved: []netip.Prefix{netip.MustParsePrefix("10.0.10.64/26"), netip.MustParsePrefix("10.0.20.4/32")}}
	var got []string
	for _, r := range s.Ranges() {
		got = append(got, r.String())
	}
	if want := "10.0.10.1-10.0.10.63 10.0.10.128-10.0.10.254 10.0.20.1-10.0.20.3 10.0.20.5-10.0.20.9"; fmt.Sprint(got) != "["+want+"]" {
		t.Fatalf("ranges %v, want %s", got, want)
	}
	if n := s.Totals()[IPv4]; n != 63+127+3+5 {
		t.Fatalf("total %d", n)
	}
	if s.Offers(netip.MustParseAddr("10.0.10.70")) || !s.Offers(netip.MustParseAddr("10.0.10.130")) {
		t.Fatal("offers")
	}
	for _, c := range []struct {
		groups []string
		field  string
	}{{[]string{"a", "a"}, "spec.reservedCIDRGroups[1]"}, {[]string{"A"}, "spec.reservedCIDRGroups[0]"},
		{make([]string, 17), "spec.reservedCIDRGroups"}} {
		s := LBPoolSpec{Blocks: s.Blocks, ReservedGroups: c.groups}
		var ae *Error
		if err := s.Validate(); !errors.As(err, &ae) || ae.Field != c.field {
			t.Errorf("%v: %v, want %s", c.groups, err, c.field)
		}
	}
}
