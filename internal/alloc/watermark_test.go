// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import "testing"

// The cases follow Cilium's operator/pkg/ipam/nodemanager node_test.go
// tables for calculateNeededIPs and calculateExcessIPs (the numbers are
// recomputed here from the formulas, not copied).
func TestWatermarksNeeded(t *testing.T) {
	for _, c := range []struct {
		name            string
		w               Watermarks
		available, used int
		want            int
	}{
		{"empty node takes pre-allocate", Watermarks{PreAllocate: 16}, 0, 0, 16},
		{"pre-allocate 0 means Cilium's 8", Watermarks{}, 0, 0, 8},
		{"used eats the headroom", Watermarks{PreAllocate: 16}, 16, 8, 8},
		{"enough held", Watermarks{PreAllocate: 16}, 32, 16, 0},
		{"more than enough is never negative", Watermarks{PreAllocate: 4}, 32, 1, 0},
		{"min-allocate wins over pre-allocate", Watermarks{PreAllocate: 4, MinAllocate: 20}, 0, 0, 20},
		{"min-allocate already met", Watermarks{PreAllocate: 4, MinAllocate: 10}, 10, 2, 0},
		{"pre-allocate wins over min-allocate", Watermarks{PreAllocate: 16, MinAllocate: 10}, 10, 8, 14},
		{"max-allocate caps", Watermarks{PreAllocate: 16, MaxAllocate: 20}, 10, 8, 10},
		{"at max-allocate", Watermarks{PreAllocate: 16, MaxAllocate: 20}, 20, 20, 0},
		{"above max-allocate is no negative need", Watermarks{PreAllocate: 16, MaxAllocate: 20}, 30, 30, 0},
	} {
		if got := c.w.Needed(c.available, c.used); got != c.want {
			t.Errorf("%s: %+v.Needed(%d, %d) = %d; want %d", c.name, c.w, c.available, c.used, got, c.want)
		}
	}
}

func TestWatermarksToAllocate(t *testing.T) {
	for _, c := range []struct {
		name                     string
		w                        Watermarks
		available, used, pending int
		want                     int
	}{
		{"need only", Watermarks{PreAllocate: 8}, 0, 0, 0, 8},
		{"need plus max-above-watermark", Watermarks{PreAllocate: 8, MaxAboveWatermark: 4}, 0, 0, 0, 12},
		{"no need, no round, whatever the watermark", Watermarks{PreAllocate: 8, MaxAboveWatermark: 4}, 8, 0, 0, 0},
		{"surge: pending Pods beyond the need", Watermarks{PreAllocate: 8}, 8, 4, 10, 10},
		{"pending within the need adds nothing", Watermarks{PreAllocate: 8}, 8, 4, 3, 4},
		{"max-allocate caps the round", Watermarks{PreAllocate: 8, MaxAboveWatermark: 10, MaxAllocate: 12}, 0, 0, 0, 12},
	} {
		if got := c.w.ToAllocate(c.available, c.used, c.pending); got != c.want {
			t.Errorf("%s: %+v.ToAllocate(%d, %d, %d) = %d; want %d", c.name, c.w, c.available, c.used, c.pending, got, c.want)
		}
	}
}

func TestWatermarksExcess(t *testing.T) {
	for _, c := range []struct {
		name            string
		w               Watermarks
		available, used int
		want            int
	}{
		{"nothing held", Watermarks{PreAllocate: 8}, 0, 0, 0},
		{"exactly pre-allocate free", Watermarks{PreAllocate: 8}, 8, 0, 0},
		{"beyond pre-allocate", Watermarks{PreAllocate: 8}, 20, 2, 10},
		{"max-above-watermark is never excess", Watermarks{PreAllocate: 8, MaxAboveWatermark: 5}, 20, 2, 5},
		{"initial allocation kept while unused", Watermarks{PreAllocate: 2, MinAllocate: 10, MaxAboveWatermark: 2}, 12, 3, 0},
		{"beyond the initial allocation, before it is used up", Watermarks{PreAllocate: 2, MinAllocate: 10, MaxAboveWatermark: 2}, 20, 3, 8},
		{"initial allocation used up: watermark rule", Watermarks{PreAllocate: 2, MinAllocate: 10, MaxAboveWatermark: 2}, 30, 13, 13},
		{"used within floor but pre-allocate reaches past it", Watermarks{PreAllocate: 8, MinAllocate: 4}, 20, 2, 10},
	} {
		if got := c.w.Excess(c.available, c.used); got != c.want {
			t.Errorf("%s: %+v.Excess(%d, %d) = %d; want %d", c.name, c.w, c.available, c.used, got, c.want)
		}
	}
}

// The eni worked example (pre-allocate 4, 2 Pods): the agent asks for 6,
// which is 2 in use; the default pre-allocation applies when unset; a
// demand under the pre-allocation is no use, never a negative one.
func TestWatermarksUsedFromRequested(t *testing.T) {
	for _, c := range []struct {
		w               Watermarks
		requested, want int
	}{
		{Watermarks{PreAllocate: 4}, 6, 2},
		{Watermarks{PreAllocate: 4}, 4, 0},
		{Watermarks{PreAllocate: 4}, 1, 0},
		{Watermarks{}, 10, 2},
		{Watermarks{PreAllocate: 16}, 116, 100},
	} {
		if got := c.w.UsedFromRequested(c.requested); got != c.want {
			t.Errorf("%+v requested %d: used %d, want %d", c.w, c.requested, got, c.want)
		}
	}
}
