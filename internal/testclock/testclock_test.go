// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package testclock

import (
	"sync"
	"testing"
	"time"
)

func TestClock(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	c := New(t0)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("New(%v).Now() = %v", t0, got)
	}
	c.Advance(90 * time.Second)
	if got, want := c.Now(), t0.Add(90*time.Second); !got.Equal(want) {
		t.Fatalf("after Advance(90s): %v; want %v", got, want)
	}
	c.Advance(-30 * time.Second)
	if got, want := c.Now(), t0.Add(time.Minute); !got.Equal(want) {
		t.Fatalf("after Advance(-30s): %v; want %v", got, want)
	}
	c.Set(t0)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("after Set(%v): %v", t0, got)
	}
	if got := new(Clock).Now(); !got.IsZero() {
		t.Fatalf("zero Clock reads %v", got)
	}
}

// TestClockConcurrent moves the clock from many goroutines at once (run
// with -race): no step is lost.
func TestClockConcurrent(t *testing.T) {
	c := New(time.Time{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				c.Advance(time.Second)
				_ = c.Now()
			}
		}()
	}
	wg.Wait()
	if got := c.Now().Sub(time.Time{}); got != 800*time.Second {
		t.Fatalf("800 steps of 1s moved the clock %v", got)
	}
}
