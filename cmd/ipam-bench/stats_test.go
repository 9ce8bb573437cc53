// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100) // 1ms..100ms
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one value", []time.Duration{7}, 99, 7},
		{"p50 of 1..100", hundred, 50, 50 * time.Millisecond},
		{"p99 of 1..100", hundred, 99, 99 * time.Millisecond},
		{"p100 is the max", hundred, 100, 100 * time.Millisecond},
		{"p0 is the min", hundred, 0, 1 * time.Millisecond},
		{"p50 of 4 is the 2nd (nearest rank)", []time.Duration{1, 2, 3, 4}, 50, 2},
		{"p99 of 4 is the max", []time.Duration{1, 2, 3, 4}, 99, 4},
		{"p51 of 4 rounds the rank up", []time.Duration{1, 2, 3, 4}, 51, 3},
	}
	for _, tt := range tests {
		if got := percentile(tt.sorted, tt.p); got != tt.want {
			t.Errorf("%s: percentile(p=%v) = %v; want %v", tt.name, tt.p, got, tt.want)
		}
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{0.5, 0.25}, 0.375},
	}
	for _, tt := range tests {
		in := append([]float64(nil), tt.xs...)
		if got := median(in); got != tt.want {
			t.Errorf("median(%v) = %v; want %v", tt.xs, got, tt.want)
		}
		for i := range in {
			if in[i] != tt.xs[i] {
				t.Errorf("median(%v) reordered its input to %v", tt.xs, in)
				break
			}
		}
	}
}

func TestSummarize(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3}
	got := summarize(ds)
	if want := (latency{P50: 3, P90: 5, P99: 5, Max: 5}); got != want {
		t.Errorf("summarize = %+v; want %+v", got, want)
	}
	if ds[0] != 1 || ds[4] != 5 {
		t.Errorf("summarize did not sort in place: %v", ds)
	}
}

func TestErrorRate(t *testing.T) {
	tests := []struct {
		ok, errs int64
		want     float64
	}{
		{0, 0, 0},
		{999, 1, 0.001},
		{0, 5, 1},
	}
	for _, tt := range tests {
		if got := errorRate(tt.ok, tt.errs); got != tt.want {
			t.Errorf("errorRate(%d, %d) = %v; want %v", tt.ok, tt.errs, got, tt.want)
		}
	}
}
