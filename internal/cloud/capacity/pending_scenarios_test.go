// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"strconv"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// TestScenarioPendingPodsSurge (Cilium's surge allocation): Pods a
// Cilium-watermark node refused for want of an address are what the
// node's pending Pods are to Cilium's operator. The next pass asks for
// all of them in one AssignPrivateIpAddresses call (the need, the
// pre-allocation, raised to the Pods waiting), not the pre-allocation
// alone with the rest waiting for more passes; the one after restores the
// pre-allocation. A Pod the refusals count once, however often it
// retries.
func TestScenarioPendingPodsSurge(t *testing.T) {
	x := newScen(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 2}})
	x.pass(t)
	for _, c := range []string{"p0", "p1"} {
		if _, err := x.lease(t, c); err != nil {
			t.Fatalf("%s: %v", c, err)
		}
	}
	// Five Pods arrive: the node's two addresses are in use, so each is
	// refused, and the kubelet retries each.
	const waiting = 5
	for range 2 {
		for i := range waiting {
			if _, err := x.lease(t, "w"+strconv.Itoa(i)); err == nil {
				t.Fatalf("w%d leased with the node's addresses in use", i)
			}
		}
	}
	before := x.fake.Calls("AssignPrivateIpAddresses")
	x.pass(t)
	if n := x.fake.Calls("AssignPrivateIpAddresses") - before; n != 1 {
		t.Fatalf("%d AssignPrivateIpAddresses calls in the pass, want 1", n)
	}
	if addrs, _ := x.held(); addrs != 2+waiting {
		t.Fatalf("the node holds %d addresses after the pass, want the 2 in use and the %d Pods waiting", addrs, waiting)
	}
	for i := range waiting {
		if _, err := x.lease(t, "w"+strconv.Itoa(i)); err != nil {
			t.Fatalf("w%d still waits after the pass: %v", i, err)
		}
	}
	// Served, they wait no more: the next pass asks the pre-allocation.
	x.pass(t)
	if addrs, _ := x.held(); addrs != 2+waiting+2 {
		t.Fatalf("the node holds %d addresses, want %d in use and the pre-allocation of 2", addrs, 2+waiting)
	}
}
