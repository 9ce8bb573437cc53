// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package testclock is a time source that tests move by hand, for code that
// takes its clock as a func() time.Time (store.Options.Now and the like):
//
//	clk := testclock.New(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
//	opts.Now = clk.Now
//	clk.Advance(time.Minute)
package testclock

import (
	"sync"
	"time"
)

// Clock is a time that moves only when a test moves it. It is safe for
// concurrent use; the zero Clock reads the zero time.
type Clock struct {
	mu  sync.Mutex // protects now
	now time.Time
}

// New returns a Clock that reads t until it is moved.
func New(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (backward when d is negative).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}
