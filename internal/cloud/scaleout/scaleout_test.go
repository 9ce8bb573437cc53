// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package scaleout

import (
	"context"
	"testing"
)

// TestScaleOut is a short scale-out: 50 nodes to 30 Pods each, then
// churn, with 10% of the calls throttled. No Pod is left without an
// address, no Pod started after the ramp waited for the cloud, and the
// calls stay within 1.2 times their floor. The counts are deterministic
// (one seed, one goroutine), so this is no timing test.
func TestScaleOut(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Nodes, cfg.RampSteps, cfg.ChurnSteps, cfg.ChurnPerStep = 50, 30, 60, 5
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Failed != 0 || res.SteadyWaited != 0 || res.SteadyStarts == 0 {
		t.Fatalf("failed %d, steady waits %d of %d", res.Failed, res.SteadyWaited, res.SteadyStarts)
	}
	if res.Floor == 0 || float64(res.AllCalls) > 1.2*float64(res.Floor) {
		t.Fatalf("%d calls against a floor of %d", res.AllCalls, res.Floor)
	}
	if res.Calls["RequestLimitExceeded"] != 0 {
		t.Fatal("counted a refusal as an action")
	}
}
