// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package leader

import (
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// The work and the Lease renewals share the configured limit: their
// budgets add up to it, each is one token bucket for all its clientsets,
// and the renewals get one request per retry period.
func TestSplitBudget(t *testing.T) {
	for _, c := range []struct {
		qps, leaseQPS float32
		burst         int
		retry         time.Duration
	}{
		{20, 1, 40, time.Second},
		{2, 1, 3, time.Second},
		{50, 0.5, 100, 2 * time.Second},
		{2, 1, 3, 100 * time.Millisecond}, // renewals never take more than half
	} {
		work, lease := SplitBudget(&rest.Config{QPS: c.qps, Burst: c.burst}, c.retry)
		if lease.QPS != c.leaseQPS || work.QPS+lease.QPS != c.qps || work.Burst+lease.Burst != c.burst {
			t.Errorf("qps %v burst %d retry %v: work %v/%d, lease %v/%d", c.qps, c.burst, c.retry, work.QPS, work.Burst, lease.QPS, lease.Burst)
		}
		if work.RateLimiter == nil || lease.RateLimiter == nil || work.RateLimiter == lease.RateLimiter {
			t.Errorf("qps %v: want one limiter per budget", c.qps)
		}
		if got := rest.CopyConfig(work).RateLimiter; got != work.RateLimiter {
			t.Error("a copy of the work config has a limiter of its own")
		}
	}
}
