// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimit is a token bucket: PerSecond requests on average, Burst at
// once. The zero value (PerSecond 0) does not limit.
type RateLimit struct {
	PerSecond float64
	Burst     int
}

// ParseRateLimit reads "RATE,BURST" (requests per second, bucket size),
// e.g. "50,300"; "0" means no limit.
func ParseRateLimit(s string) (RateLimit, error) {
	if s == "0" {
		return RateLimit{}, nil
	}
	r, b, ok := strings.Cut(s, ",")
	perSecond, err1 := strconv.ParseFloat(r, 64)
	burst, err2 := strconv.Atoi(b)
	l := RateLimit{PerSecond: perSecond, Burst: burst}
	if !ok || err1 != nil || err2 != nil {
		return l, fmt.Errorf("rate limit %q is not RATE,BURST (e.g. 50,300) or 0", s)
	}
	return l, l.Validate()
}

func (l RateLimit) String() string {
	if l.PerSecond == 0 {
		return "0"
	}
	return strconv.FormatFloat(l.PerSecond, 'g', -1, 64) + "," + strconv.Itoa(l.Burst)
}

// Validate reports a negative or infinite rate, or a limit whose bucket
// holds less than one request.
func (l RateLimit) Validate() error {
	switch {
	case l.PerSecond == 0 && l.Burst == 0:
		return nil
	case l.PerSecond <= 0 || math.IsInf(l.PerSecond, 0) || math.IsNaN(l.PerSecond):
		return fmt.Errorf("rate limit: %v requests per second must be positive", l.PerSecond)
	case l.Burst < 1:
		return fmt.Errorf("rate limit: burst %d must be at least 1", l.Burst)
	}
	return nil
}

// RateLimits are the per-identity limits of each kind of caller. The zero
// value limits nobody (tests, the benchmark).
type RateLimits struct {
	// Node limits each node certificate. The CNI plugin sends two
	// requests per Pod start (lease, confirm) and one per stop: the burst
	// covers a node restarting all its Pods at once.
	Node RateLimit
	// Client limits each token and each operator certificate.
	Client RateLimit
	// Anonymous limits the failed authentications of each remote address
	// (the probes /healthz and /readyz are not limited).
	Anonymous RateLimit
}

// DefaultRateLimits leave room for the benchmark's load many times over,
// and for a node starting 110 Pods at once (a lease and a confirmation
// each); TestDefaultRateLimitsDoNotThrottleTheBenchmark checks both.
var DefaultRateLimits = RateLimits{
	Node:      RateLimit{PerSecond: 50, Burst: 300},
	Client:    RateLimit{PerSecond: 100, Burst: 200},
	Anonymous: RateLimit{PerSecond: 20, Burst: 40},
}

// Validate reports every invalid limit.
func (ls RateLimits) Validate() error {
	var errs []error
	for name, l := range map[string]RateLimit{"node": ls.Node, "client": ls.Client, "anonymous": ls.Anonymous} {
		if err := l.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// maxLimiterKeys bounds the identities tracked at once. Beyond it (a spray
// of addresses that outruns the sweep), new identities of a class share one
// overflow bucket instead of growing memory.
const maxLimiterKeys = 1 << 16

// limiters keeps one token bucket per identity. An identity's bucket is
// dropped once it has been idle long enough to be full again, which changes
// nothing (a new bucket starts full), so memory follows the identities
// active within a few seconds, not all ever seen.
type limiters struct {
	mu        sync.Mutex // guards buckets and lastSweep
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	lim      *rate.Limiter
	lastSeen time.Time
	refill   time.Duration // from empty to full: Burst / PerSecond
}

func newLimiters() *limiters { return &limiters{buckets: map[string]*bucket{}} }

// allow takes one request from key's bucket (limit l) at now. When the
// bucket is empty it answers false and how long until it holds one again.
func (ls *limiters) allow(key string, l RateLimit, now time.Time) (bool, time.Duration) {
	if l.PerSecond == 0 {
		return true, 0
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.sweepLocked(now)
	b := ls.bucketLocked(key, l, now)
	b.lastSeen = now
	if b.lim.AllowN(now, 1) {
		return true, 0
	}
	r := b.lim.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	r.CancelAt(now)
	return false, wait
}

func (ls *limiters) bucketLocked(key string, l RateLimit, now time.Time) *bucket {
	if b, ok := ls.buckets[key]; ok {
		return b
	}
	if len(ls.buckets) >= maxLimiterKeys {
		key = "overflow:" + l.String()
		if b, ok := ls.buckets[key]; ok {
			return b
		}
	}
	b := &bucket{lim: rate.NewLimiter(rate.Limit(l.PerSecond), l.Burst),
		refill: time.Duration(float64(l.Burst) / l.PerSecond * float64(time.Second))}
	ls.buckets[key] = b
	return b
}

// sweepEvery spaces the sweeps: each walks every bucket.
const sweepEvery = 10 * time.Second

func (ls *limiters) sweepLocked(now time.Time) {
	since := now.Sub(ls.lastSweep)
	// When full, sweep sooner, but not on every request: a sweep is O(n).
	if since < sweepEvery && (len(ls.buckets) < maxLimiterKeys || since < time.Second) {
		return
	}
	ls.lastSweep = now
	for k, b := range ls.buckets {
		if now.Sub(b.lastSeen) >= b.refill {
			delete(ls.buckets, k)
		}
	}
}

// size is the number of tracked identities, for tests.
func (ls *limiters) size() int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return len(ls.buckets)
}
