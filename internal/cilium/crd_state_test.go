// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"net/netip"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The excess timers of one family survive the other family's round, a
// do-not-release restarts one address's timer, and a deleted node leaves
// nothing behind.
func TestNodeStatesKeepEachFamilysTimers(t *testing.T) {
	s := newNodeStates()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	a4, b4 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	a6 := netip.MustParseAddr("fd00::1")
	s.excessSince("n", alloc.IPv4, []netip.Addr{a4, b4}, t0)
	s.excessSince("n", alloc.IPv6, []netip.Addr{a6}, t0.Add(time.Second))
	got := s.excessSince("n", alloc.IPv4, []netip.Addr{a4, b4}, t0.Add(time.Minute))
	if !got[a4].Equal(t0) || !got[b4].Equal(t0) {
		t.Fatalf("IPv4 timers after an IPv6 round: %v; want both from %v", got, t0)
	}
	s.restart("n", a4)
	got = s.excessSince("n", alloc.IPv4, []netip.Addr{a4, b4}, t0.Add(2*time.Minute))
	if !got[a4].Equal(t0.Add(2*time.Minute)) || !got[b4].Equal(t0) {
		t.Errorf("after restart(a4): %v", got)
	}
	if got := s.excessSince("n", alloc.IPv4, []netip.Addr{b4}, t0.Add(3*time.Minute)); len(got) != 1 {
		t.Errorf("an address no longer excess keeps its timer: %v", got)
	}
	s.forget("n")
	if len(s.nodes) != 0 {
		t.Errorf("forget left %v", s.nodes)
	}
}

// A family the node's pool lacks is asked for again only once a period,
// and a deleted node's memory of it goes.
func TestNodeStatesRememberALackingFamily(t *testing.T) {
	s := newNodeStates()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if s.lacksFamily("n", alloc.IPv6, t0, time.Minute) {
		t.Fatal("lacking before anything was recorded")
	}
	s.setLacksFamily("n", alloc.IPv6, t0)
	if !s.lacksFamily("n", alloc.IPv6, t0.Add(59*time.Second), time.Minute) {
		t.Error("not lacking within the period")
	}
	if s.lacksFamily("n", alloc.IPv4, t0.Add(time.Second), time.Minute) {
		t.Error("the other family lacking too")
	}
	if s.lacksFamily("n", alloc.IPv6, t0.Add(time.Minute), time.Minute) {
		t.Error("still lacking after the period: the pool is never asked again")
	}
	s.forget("n")
	if len(s.noFamily) != 0 {
		t.Errorf("forget left %v", s.noFamily)
	}
}
