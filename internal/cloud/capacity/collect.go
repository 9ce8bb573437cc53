// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import "time"

// DefaultCollectEvery is how often the leader collects leaked interfaces
// (the VPC CNI's and Cilium's five minutes).
const DefaultCollectEvery = 5 * time.Minute

// CollectSchedule says when the replica running the passes collects
// leaked interfaces: every Every (DefaultCollectEvery when 0), the first
// time Every after it took the lead. Waiting after taking the lead leaves
// the interfaces a former leader was creating the time to be attached,
// and a lead that moves back and forth cannot make the collector run at
// every move.
type CollectSchedule struct {
	Every time.Duration

	leadSince, last time.Time
}

// Due records whether this replica held the lead for a pass at now, and
// answers whether it should collect now. A pass the replica did not run
// (another holds the lock) ends its lead.
func (c *CollectSchedule) Due(ran bool, now time.Time) bool {
	every := c.Every
	if every <= 0 {
		every = DefaultCollectEvery
	}
	if !ran {
		c.leadSince, c.last = time.Time{}, time.Time{}
		return false
	}
	if c.leadSince.IsZero() {
		c.leadSince, c.last = now, now
	}
	if now.Sub(c.last) < every {
		return false
	}
	c.last = now
	return true
}
