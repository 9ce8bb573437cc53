// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"math"
	"testing"
	"time"
)

var forecastT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// steadySamples samples used = base + rate*hours every step over window,
// rounded to whole addresses, plus noise(i).
func steadySamples(base, ratePerHour float64, step, window time.Duration, noise func(i int) float64) []UsageSample {
	var out []UsageSample
	for i := 0; time.Duration(i)*step <= window; i++ {
		at := time.Duration(i) * step
		v := base + ratePerHour*at.Hours()
		if noise != nil {
			v += noise(i)
		}
		out = append(out, UsageSample{At: forecastT0.Add(at), Used: int64(math.Round(v))})
	}
	return out
}

// lcgNoise is a deterministic, roughly uniform noise in [-amp, amp].
func lcgNoise(seed uint64, amp float64) func(int) float64 {
	state := seed
	return func(int) float64 {
		state = state*6364136223846793005 + 1442695040888963407
		u := float64(state>>11) / float64(1<<53) // [0, 1)
		return (2*u - 1) * amp
	}
}

func within(got, want, rel float64) bool {
	if want == 0 {
		return math.Abs(got) <= rel
	}
	return math.Abs(got-want) <= rel*math.Abs(want)
}

func TestForecastTooLittleData(t *testing.T) {
	cases := []struct {
		name    string
		samples []UsageSample
		window  time.Duration
	}{
		{"no samples", nil, 0},
		{"one sample", []UsageSample{{At: forecastT0, Used: 10}}, 0},
		{"two samples 30s apart", []UsageSample{{At: forecastT0, Used: 10}, {At: forecastT0.Add(30 * time.Second), Used: 500}}, 30 * time.Second},
		{"window just under a minute", steadySamples(0, 6000, 5*time.Second, 55*time.Second, nil), 55 * time.Second},
		{"two samples at the same time", []UsageSample{{At: forecastT0, Used: 10}, {At: forecastT0, Used: 20}}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := ForecastExhaustion(c.samples, 100, 1000)
			if f.RatePerHour != 0 || f.HoursToFull != nil {
				t.Fatalf("forecast %+v from %d samples; want none", f, len(c.samples))
			}
			if f.Samples != len(c.samples) || f.Window != c.window {
				t.Fatalf("Samples=%d Window=%s, want %d %s", f.Samples, f.Window, len(c.samples), c.window)
			}
		})
	}
}

func TestForecastSteadyRate(t *testing.T) {
	const capacity = 10000
	cases := []struct {
		name   string
		base   float64
		rate   float64
		step   time.Duration
		window time.Duration
		noise  func(int) float64
	}{
		{"+100/h every minute for 2h", 1000, 100, time.Minute, 2 * time.Hour, nil},
		{"+100/h every minute for 2h, noise ±3", 1000, 100, time.Minute, 2 * time.Hour, lcgNoise(1, 3)},
		{"+100/h every minute for 2h, other noise ±3", 1000, 100, time.Minute, 2 * time.Hour, lcgNoise(42, 3)},
		{"+2400/h every 10s for 1h", 0, 2400, 10 * time.Second, time.Hour, nil},
		{"+600/h over exactly one minute", 500, 600, time.Minute, time.Minute, nil},
		{"+3/h every minute for a day", 9000, 3, time.Minute, 24 * time.Hour, lcgNoise(7, 1)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			samples := steadySamples(c.base, c.rate, c.step, c.window, c.noise)
			used := samples[len(samples)-1].Used
			f := ForecastExhaustion(samples, used, capacity)
			if f.Samples != len(samples) || f.Window != c.window {
				t.Errorf("Samples=%d Window=%s, want %d %s", f.Samples, f.Window, len(samples), c.window)
			}
			if !within(f.RatePerHour, c.rate, 0.01) {
				t.Fatalf("RatePerHour = %.3f, want %.3f within 1%%", f.RatePerHour, c.rate)
			}
			if f.HoursToFull == nil {
				t.Fatalf("HoursToFull = nil at rate %.3f", f.RatePerHour)
			}
			wantHours := float64(capacity-used) / c.rate
			if !within(*f.HoursToFull, wantHours, 0.01) {
				t.Fatalf("HoursToFull = %.3f, want %.3f within 1%%", *f.HoursToFull, wantHours)
			}
			// Exactly (capacity-used)/RatePerHour.
			if exact := float64(capacity-used) / f.RatePerHour; math.Abs(*f.HoursToFull-exact) > 1e-9*exact {
				t.Fatalf("HoursToFull = %v, want (capacity-used)/rate = %v", *f.HoursToFull, exact)
			}
		})
	}
}

// Unevenly spaced samples still give the rate: least squares over time, not
// over sample index.
func TestForecastUnevenSamples(t *testing.T) {
	offsets := []time.Duration{0, 2 * time.Minute, 3 * time.Minute, 30 * time.Minute, 31 * time.Minute, 90 * time.Minute, 120 * time.Minute}
	var samples []UsageSample
	for _, o := range offsets {
		samples = append(samples, UsageSample{At: forecastT0.Add(o), Used: 200 + int64(math.Round(60*o.Hours()))})
	}
	f := ForecastExhaustion(samples, 320, 1000)
	if !within(f.RatePerHour, 60, 0.01) {
		t.Fatalf("RatePerHour = %.3f, want 60", f.RatePerHour)
	}
	if f.HoursToFull == nil || !within(*f.HoursToFull, 680.0/60, 0.01) {
		t.Fatalf("HoursToFull = %v, want %.3f", f.HoursToFull, 680.0/60)
	}
}

func TestForecastNotGrowing(t *testing.T) {
	cases := []struct {
		name     string
		samples  []UsageSample
		wantRate float64 // sign only: 0 or -1
	}{
		{"flat", steadySamples(500, 0, time.Minute, 2*time.Hour, nil), 0},
		{"shrinking", steadySamples(900, -100, time.Minute, 2*time.Hour, nil), -1},
		{"shrinking with noise", steadySamples(900, -100, time.Minute, 2*time.Hour, lcgNoise(3, 5)), -1},
		{"busy but balanced: up and down", func() []UsageSample {
			var s []UsageSample
			for i := range 121 {
				used := int64(500)
				if i%2 == 1 {
					used = 600
				}
				s = append(s, UsageSample{At: forecastT0.Add(time.Duration(i) * time.Minute), Used: used})
			}
			return s // symmetric around the middle: the fitted slope is zero
		}(), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := ForecastExhaustion(c.samples, c.samples[len(c.samples)-1].Used, 1000)
			if f.HoursToFull != nil {
				t.Fatalf("HoursToFull = %v at rate %.3f; want nil", *f.HoursToFull, f.RatePerHour)
			}
			switch {
			case c.wantRate == 0 && math.Abs(f.RatePerHour) > 1e-9:
				t.Fatalf("RatePerHour = %v, want 0", f.RatePerHour)
			case c.wantRate < 0 && !within(f.RatePerHour, -100, 0.01):
				t.Fatalf("RatePerHour = %v, want -100", f.RatePerHour)
			}
		})
	}
}

func TestForecastAlreadyFull(t *testing.T) {
	samples := steadySamples(900, 100, time.Minute, time.Hour, nil)
	for _, used := range []int64{1000, 1001, 5000} {
		f := ForecastExhaustion(samples, used, 1000)
		if f.HoursToFull == nil || *f.HoursToFull != 0 {
			t.Errorf("used %d of 1000: HoursToFull = %v, want 0", used, f.HoursToFull)
		}
		if !within(f.RatePerHour, 100, 0.01) {
			t.Errorf("used %d: RatePerHour = %v, want 100", used, f.RatePerHour)
		}
	}
}
