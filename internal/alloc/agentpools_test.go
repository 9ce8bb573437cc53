// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"math"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// Cilium's addrsInPrefix: first and last reserved unless allowed, none
// for prefixes of one or two addresses, saturating where int64 ends.
func TestCiliumBlockAddrs(t *testing.T) {
	for _, c := range []struct {
		prefix            string
		allowFirst, allow bool
		want              int64
	}{
		{"10.0.0.0/27", false, false, 30},
		{"10.0.0.0/27", true, false, 31},
		{"10.0.0.0/27", false, true, 31},
		{"10.0.0.0/27", true, true, 32},
		{"10.0.0.0/24", false, false, 254},
		{"10.0.0.0/30", false, false, 2},
		{"10.0.0.0/31", false, false, 2},
		{"10.0.0.1/32", false, false, 1},
		{"fd00::/120", false, false, 254},
		{"fd00::/127", false, false, 2},
		{"fd00::/128", false, false, 1},
		{"fd00::/66", false, false, 1<<62 - 2},
		{"fd00::/65", false, false, math.MaxInt64},
		{"fd00::/64", false, false, math.MaxInt64},
	} {
		if got := CiliumBlockAddrs(netip.MustParsePrefix(c.prefix), c.allowFirst, c.allow); got != c.want {
			t.Errorf("CiliumBlockAddrs(%s, %v, %v) = %d, want %d", c.prefix, c.allowFirst, c.allow, got, c.want)
		}
	}
}

func TestDiffAgentBlocks(t *testing.T) {
	p := netip.MustParsePrefix
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	node := []AgentBlock{
		{Pool: "a", CIDR: p("10.0.0.0/27")},                  // held, listed: kept
		{Pool: "a", CIDR: p("10.0.0.32/27")},                 // held, not listed: returned
		{Pool: "a", CIDR: p("10.0.0.64/27"), ReturnedAt: at}, // returned, listed again: retaken
		{Pool: "a", CIDR: p("10.0.0.96/27"), ReturnedAt: at}, // returned, not listed: stays returned
		{Pool: "b", CIDR: p("10.1.0.0/27")},                  // listed under another pool: held
	}
	d := DiffAgentBlocks(node, map[string][]netip.Prefix{
		"a": {p("10.0.0.0/27"), p("10.0.0.64/27"), p("10.0.0.128/27"), p("10.0.0.129/27")},
		"c": {p("10.1.0.0/27"), p("10.2.0.0/27")},
		"d": {p("10.0.0.128/27")}, // listed twice: adopted once
	})
	if want := []AgentBlock{node[1]}; !slices.Equal(d.Return, want) {
		t.Errorf("Return %v, want %v", d.Return, want)
	}
	if want := []AgentBlock{node[2]}; !slices.Equal(d.Retake, want) {
		t.Errorf("Retake %v, want %v", d.Retake, want)
	}
	// 10.0.0.129/27 is the same block as .128/27 once masked.
	adopt := d.Adopt
	if len(adopt) != 2 || adopt[1] != (PoolCIDR{"c", p("10.2.0.0/27")}) ||
		adopt[0] != (PoolCIDR{"a", p("10.0.0.128/27")}) {
		t.Errorf("Adopt %v, want a/10.0.0.128/27 (the first pool listing it) and c/10.2.0.0/27", adopt)
	}
	if d := DiffAgentBlocks(nil, nil); d.Return != nil || d.Retake != nil || d.Adopt != nil {
		t.Errorf("empty diff %+v", d)
	}
}

// The operator covers the need with the returned blocks first, then with
// new blocks, a block at a time: never short, never a block more than it
// takes.
func TestBlocksToCover(t *testing.T) {
	for _, c := range []struct {
		name       string
		need, held int64
		returned   []int64
		newBlock   int64
		wantRetake int
		wantCarve  int64
	}{
		{"covered", 8, 30, []int64{30}, 30, 0, 0},
		{"exactly covered", 30, 30, nil, 30, 0, 0},
		{"nothing held", 8, 0, nil, 30, 0, 1},
		{"one short", 31, 30, nil, 30, 0, 1},
		{"several blocks", 100, 0, nil, 30, 0, 4},
		{"returned first", 40, 30, []int64{30, 30}, 30, 1, 0},
		{"returned then carved", 100, 0, []int64{30}, 30, 1, 3},
		{"every returned block", 90, 0, []int64{30, 30, 30}, 30, 3, 0},
		{"no need", 0, 0, []int64{30}, 30, 0, 0},
		{"block of nothing", 5, 0, nil, 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			retake, carve := BlocksToCover(c.need, c.held, c.returned, c.newBlock)
			if retake != c.wantRetake || carve != c.wantCarve {
				t.Fatalf("BlocksToCover(%d, %d, %v, %d) = %d, %d; want %d, %d",
					c.need, c.held, c.returned, c.newBlock, retake, carve, c.wantRetake, c.wantCarve)
			}
		})
	}
}

func TestAgentBlockReleaseDue(t *testing.T) {
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	b := AgentBlock{CIDR: netip.MustParsePrefix("10.0.0.0/27"), ReturnedAt: at}
	if due, when := b.ReleaseDue(at.Add(time.Minute), 3*time.Minute); due || !when.Equal(at.Add(3*time.Minute)) {
		t.Errorf("a minute after the return: due %v at %v; want not yet, at +3m", due, when)
	}
	if due, _ := b.ReleaseDue(at.Add(3*time.Minute), 3*time.Minute); !due {
		t.Error("at the end of the hold-off: not due")
	}
	if due, _ := b.ReleaseDue(at, 0); !due {
		t.Error("without a hold-off: not due at once")
	}
	held := AgentBlock{CIDR: b.CIDR}
	if due, _ := held.ReleaseDue(at.Add(time.Hour), 0); due {
		t.Error("a block the agent holds is due for release")
	}
}

func TestPoolRequestNeed(t *testing.T) {
	r := PoolRequest{Pool: "a", IPv4: 8, IPv6: 16}
	if r.Need(IPv4) != 8 || r.Need(IPv6) != 16 {
		t.Fatalf("Need: %d, %d", r.Need(IPv4), r.Need(IPv6))
	}
}
