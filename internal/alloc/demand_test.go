// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"slices"
	"testing"
)

// The seed's cases ("How the agent asks for capacity"): with preAlloc P a
// demand of 0 asks P, 1 to P ask 2P, P+1 asks 3P; and on, 2P asks 3P and
// 2P+1 asks 4P. Without pre-allocation the need is the demand.
func TestNeededIPCeilSeedCases(t *testing.T) {
	type tc struct{ demand, preAlloc, want int64 }
	var cases []tc
	for _, p := range []int64{1, 2, 8, 16} {
		cases = append(cases,
			tc{0, p, p},
			tc{1, p, 2 * p},
			tc{p, p, 2 * p},
			tc{p + 1, p, 3 * p},
			tc{2 * p, p, 3 * p},
			tc{2*p + 1, p, 4 * p},
		)
		if p > 2 {
			cases = append(cases, tc{p / 2, p, 2 * p}, tc{p - 1, p, 2 * p}, tc{2*p - 1, p, 3 * p})
		}
	}
	cases = append(cases,
		tc{0, 0, 0}, tc{1, 0, 1}, tc{7, 0, 7}, tc{100, 0, 100},
		tc{0, -1, 0}, tc{5, -8, 5}, // a negative pre-allocation counts as none
		tc{17, 8, 32}, tc{24, 8, 32}, tc{25, 8, 40}, tc{1000, 8, 1008},
	)
	for _, c := range cases {
		t.Run(fmt.Sprintf("demand=%d,P=%d", c.demand, c.preAlloc), func(t *testing.T) {
			if got := NeededIPCeil(c.demand, c.preAlloc); got != c.want {
				t.Fatalf("NeededIPCeil(%d, %d) = %d, want %d", c.demand, c.preAlloc, got, c.want)
			}
		})
	}
}

// NeededIPCeil is the documented roundUp(demand + P, P): at least one unit
// of pre-allocation free, and a multiple of P.
func TestNeededIPCeilIsDocumentedFormula(t *testing.T) {
	roundUp := func(x, m int64) int64 { return (x + m - 1) / m * m }
	for p := int64(1); p <= 20; p++ {
		for d := int64(0); d <= 200; d++ {
			got := NeededIPCeil(d, p)
			if w := roundUp(d+p, p); got != w {
				t.Fatalf("NeededIPCeil(%d, %d) = %d, want roundUp(%d, %d) = %d", d, p, got, d+p, p, w)
			}
			if got%p != 0 || got < d+p || got >= d+2*p {
				t.Fatalf("NeededIPCeil(%d, %d) = %d: not a multiple of P in [d+P, d+2P)", d, p, got)
			}
		}
	}
}

func TestNodePoolDemand(t *testing.T) {
	caps := []int64{11, 29, 61}
	cases := []struct {
		name    string
		d       NodePoolDemand
		demand  int64
		needed  int64
		deficit int64
		blocks  []int64 // BlocksToCarve for caps
	}{
		{"empty node", NodePoolDemand{PreAlloc: 8}, 0, 8, 8, []int64{1, 1, 1}},
		{"in use, pending and cooling all count", NodePoolDemand{InUse: 10, Pending: 2, Cooling: 3, Capacity: 11, PreAlloc: 8}, 15, 24, 13, []int64{2, 1, 1}},
		{"pending only", NodePoolDemand{Pending: 8, PreAlloc: 8}, 8, 16, 16, []int64{2, 1, 1}},
		{"cooling only", NodePoolDemand{Cooling: 9, PreAlloc: 8}, 9, 24, 24, []int64{3, 1, 1}},
		{"large demand", NodePoolDemand{InUse: 50, PreAlloc: 8}, 50, 64, 64, []int64{6, 3, 2}},
		{"capacity exactly at need", NodePoolDemand{InUse: 15, Capacity: 24, PreAlloc: 8}, 15, 24, 0, []int64{0, 0, 0}},
		{"capacity one short", NodePoolDemand{InUse: 15, Capacity: 23, PreAlloc: 8}, 15, 24, 1, []int64{1, 1, 1}},
		{"capacity above need", NodePoolDemand{InUse: 15, Capacity: 101, PreAlloc: 8}, 15, 24, 0, []int64{0, 0, 0}},
		{"no pre-allocation, nothing used", NodePoolDemand{}, 0, 0, 0, []int64{0, 0, 0}},
		{"no pre-allocation", NodePoolDemand{InUse: 30, Capacity: 11}, 30, 30, 19, []int64{2, 1, 1}},
		{"deficit an exact multiple", NodePoolDemand{InUse: 33}, 33, 33, 33, []int64{3, 2, 1}},
		{"deficit of exactly two blocks of 29", NodePoolDemand{InUse: 58}, 58, 58, 58, []int64{6, 2, 1}},
		{"deficit of exactly one block of 61", NodePoolDemand{InUse: 50, Capacity: 3, PreAlloc: 8}, 50, 64, 61, []int64{6, 3, 1}},
		// The per-node limit clamps the need, as max-allocate does Cilium's.
		{"need clamped to the limit", NodePoolDemand{InUse: 50, Capacity: 29, PreAlloc: 8, MaxCapacity: 58}, 50, 58, 29, []int64{3, 1, 1}},
		{"at the limit: no deficit", NodePoolDemand{InUse: 58, Capacity: 58, PreAlloc: 8, MaxCapacity: 58}, 58, 58, 0, []int64{0, 0, 0}},
		{"limit above the need", NodePoolDemand{InUse: 15, Capacity: 11, PreAlloc: 8, MaxCapacity: 1000}, 15, 24, 13, []int64{2, 1, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := c.d.Demand(); got != c.demand {
				t.Errorf("Demand = %d, want %d", got, c.demand)
			}
			if got := c.d.Needed(); got != c.needed {
				t.Errorf("Needed = %d, want %d", got, c.needed)
			}
			if got := c.d.Deficit(); got != c.deficit {
				t.Errorf("Deficit = %d, want %d", got, c.deficit)
			}
			for i, bc := range caps {
				n := c.d.BlocksToCarve(bc)
				if n != c.blocks[i] {
					t.Errorf("BlocksToCarve(%d) = %d, want %d", bc, n, c.blocks[i])
				}
				// The fewest blocks that cover the deficit.
				if c.d.Capacity+n*bc < c.d.Needed() || (n > 0 && c.d.Capacity+(n-1)*bc >= c.d.Needed()) {
					t.Errorf("BlocksToCarve(%d) = %d does not just cover need %d from capacity %d", bc, n, c.d.Needed(), c.d.Capacity)
				}
			}
			for _, bc := range []int64{0, -11} {
				if n := c.d.BlocksToCarve(bc); n != 0 {
					t.Errorf("BlocksToCarve(%d) = %d, want 0", bc, n)
				}
			}
		})
	}
}

func TestNodePoolDemandReleasable(t *testing.T) {
	cases := []struct {
		name string
		d    NodePoolDemand
		free []int64
		want []int
	}{
		// Capacity 11+29+61 = 101 in every case below unless said.
		{"idle node keeps one unit", NodePoolDemand{Capacity: 101, PreAlloc: 8}, []int64{11, 29, 61}, []int{0, 1}},
		{"idle node, release order decides", NodePoolDemand{Capacity: 101, PreAlloc: 8}, []int64{61, 29, 11}, []int{0, 1}},
		{"idle node without pre-allocation releases all", NodePoolDemand{Capacity: 101}, []int64{11, 29, 61}, []int{0, 1, 2}},
		{"partial: the first can go, the second not", NodePoolDemand{InUse: 15, Capacity: 101, PreAlloc: 8}, []int64{61, 29}, []int{0}},
		{"partial: order changes which", NodePoolDemand{InUse: 15, Capacity: 101, PreAlloc: 8}, []int64{29, 61}, []int{0}},
		{"release down to exactly the need", NodePoolDemand{InUse: 25, Capacity: 101, PreAlloc: 8}, []int64{61, 11}, []int{0}},
		{"skip a block too big, release a later one", NodePoolDemand{InUse: 33, Capacity: 101, PreAlloc: 8}, []int64{61, 11}, []int{1}},
		{"none at need", NodePoolDemand{InUse: 15, Capacity: 24, PreAlloc: 8}, []int64{11}, nil},
		{"none below need", NodePoolDemand{InUse: 15, Capacity: 20, PreAlloc: 8}, []int64{11}, nil},
		{"none when no block is free", NodePoolDemand{Capacity: 101, PreAlloc: 8}, nil, nil},
		{"cooling addresses hold capacity", NodePoolDemand{InUse: 5, Cooling: 80, Capacity: 101, PreAlloc: 8}, []int64{11, 29}, nil},
		{"pending addresses hold capacity", NodePoolDemand{Pending: 60, Capacity: 101, PreAlloc: 8}, []int64{11, 29}, []int{0}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.d.Releasable(c.free)
			if !slices.Equal(got, c.want) {
				t.Fatalf("Releasable(%v) = %v, want %v (need %d, capacity %d)", c.free, got, c.want, c.d.Needed(), c.d.Capacity)
			}
			left := c.d.Capacity
			for k, i := range got {
				if k > 0 && i <= got[k-1] {
					t.Fatalf("indexes %v not in release order", got)
				}
				left -= c.free[i]
			}
			if len(got) > 0 && left < c.d.Needed() {
				t.Fatalf("releasing %v leaves %d, below need %d", got, left, c.d.Needed())
			}
		})
	}
}
