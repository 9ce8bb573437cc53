// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"testing"
	"time"
)

// TestCollectSchedule: the first collection comes Every after the lead
// was taken, then one per Every; losing the lead starts the wait over.
func TestCollectSchedule(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var c CollectSchedule
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	steps := []struct {
		ran  bool
		at   time.Duration
		want bool
	}{
		{true, 0, false},                            // took the lead
		{true, 4 * time.Minute, false},              // not yet five minutes
		{true, 5 * time.Minute, true},               // five minutes after the lead
		{true, 6 * time.Minute, false},              // one a period
		{true, 10 * time.Minute, true},              // the next period
		{false, 11 * time.Minute, false},            // another replica leads
		{true, 12 * time.Minute, false},             // the lead back: wait again
		{true, 16 * time.Minute, false},             // four minutes into it
		{true, 17 * time.Minute, true},              // five
		{true, 17*time.Minute + time.Second, false}, // not twice in a row
	}
	for i, s := range steps {
		if got := c.Due(s.ran, at(s.at)); got != s.want {
			t.Fatalf("step %d (ran %v at %v): due %v, want %v", i, s.ran, s.at, got, s.want)
		}
	}
	short := CollectSchedule{Every: time.Minute}
	short.Due(true, t0)
	if !short.Due(true, t0.Add(time.Minute)) {
		t.Fatal("Every was not honoured")
	}
}
