// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// TestScenarioFallbackAddressesGoBack: a prefix pool's node on a
// fragmented subnet got single addresses instead of /28s (cilium#29634);
// once its Pods are gone, those in excess go back to the subnet after the
// release delay, as prefixes would, instead of staying for good (issue
// 35: only whole prefixes were ever given back in prefix mode).
func TestScenarioFallbackAddressesGoBack(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Prefixes: true, Watermarks: &alloc.Watermarks{PreAllocate: 4}, ReleaseDelay: time.Minute})
	subnet := netip.MustParsePrefix("10.90.0.0/24")
	for a := subnet.Addr(); subnet.Contains(a); a = a.Next() {
		if a.As4()[3]%16 == 9 {
			x.fake.Take("subnet-0123456789abcdef0", a)
		}
	}
	var pods []string
	for range 4 {
		x.pass(t)
		for len(pods) < 10 {
			c := "c" + strconv.Itoa(len(pods))
			if _, err := x.lease(t, c); err != nil {
				break
			}
			pods = append(pods, c)
		}
	}
	held, ifaces := x.held()
	if _, prefixes := x.fake.Held(x.eni0); len(prefixes) != 0 || len(pods) != 10 || held < 13 {
		t.Fatalf("%d Pods on %d single addresses of %d interfaces, prefixes %v; want 10 Pods on at least 13 single addresses", len(pods), held, ifaces, prefixes)
	}
	free := x.fake.FreeAddresses("subnet-0123456789abcdef0")
	for _, c := range pods {
		x.release(t, c)
	}
	x.cooledAndPurged(t)
	// One interface's excess a round, each after the release delay.
	for range 24 {
		x.clock.Advance(10 * time.Second)
		x.pass(t)
	}
	// Pre-allocate 4 with no Pod: the watermark keeps 4 (Cilium's
	// max-above-watermark 0), the rest goes.
	if after, _ := x.held(); after != 4 {
		t.Fatalf("%d single addresses held after the Pods left and the release delay, want 4", after)
	}
	if got := x.fake.FreeAddresses("subnet-0123456789abcdef0"); got != free+held-4 {
		t.Fatalf("the subnet has %d free addresses, want %d back", got, free+held-4)
	}
	if bad := x.leasableNotHeld(t); len(bad) > 0 {
		t.Fatalf("leasable blocks the interface does not hold: %v", bad)
	}
}
