// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"math"
	"slices"
	"time"
)

// percentile answers the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. It answers 0 for no values; p <= 0 answers the minimum.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// median answers the middle value of xs, or the mean of the two middle
// values when their count is even; 0 for no values. xs is not modified.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// latency summarizes the durations of one kind of call.
type latency struct {
	P50 time.Duration
	P90 time.Duration
	P99 time.Duration
	Max time.Duration
}

// summarize sorts ds in place and answers its percentiles.
func summarize(ds []time.Duration) latency {
	slices.Sort(ds)
	l := latency{P50: percentile(ds, 50), P90: percentile(ds, 90), P99: percentile(ds, 99)}
	if len(ds) > 0 {
		l.Max = ds[len(ds)-1]
	}
	return l
}

// ms is d in milliseconds, for printing.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// errorRate answers errors / (ok + errors), 0 when nothing was attempted.
func errorRate(ok, errors int64) float64 {
	if ok+errors == 0 {
		return 0
	}
	return float64(errors) / float64(ok+errors)
}
