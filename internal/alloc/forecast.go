// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"math"
	"time"
)

// UsageSample is a pool family's use at one time: addresses leased or
// cooling.
type UsageSample struct {
	At   time.Time
	Used int64
}

// Forecast is the exhaustion forecast of one pool family.
type Forecast struct {
	// RatePerHour is the net growth of used addresses (allocations minus
	// releases) per hour over the window, by least squares.
	RatePerHour float64
	// HoursToFull is when, at that rate, the free addresses run out; nil
	// when use is not growing or there are too few samples to tell.
	HoursToFull *float64
	Samples     int
	Window      time.Duration
}

// ForecastExhaustion fits a line through the samples (at least two, spread
// over at least a minute) and answers when used reaches capacity. A net
// rate is the honest measure: a pool that allocates and releases equally
// fast never fills, however busy.
func ForecastExhaustion(samples []UsageSample, used, capacity int64) Forecast {
	f := Forecast{Samples: len(samples)}
	if len(samples) < 2 {
		return f
	}
	t0 := samples[0].At
	f.Window = samples[len(samples)-1].At.Sub(t0)
	if f.Window < time.Minute {
		return f
	}
	var sx, sy, sxx, sxy float64
	n := float64(len(samples))
	for _, s := range samples {
		x := s.At.Sub(t0).Hours()
		y := float64(s.Used)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	den := n*sxx - sx*sx
	if den == 0 {
		return f
	}
	f.RatePerHour = (n*sxy - sx*sy) / den
	if f.RatePerHour > 0 {
		h := math.Max(float64(capacity-used), 0) / f.RatePerHour
		f.HoursToFull = &h
	}
	return f
}
