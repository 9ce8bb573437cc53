// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Cilium v1.20.2's LB IPAM tests (operator/pkg/lbipam/lbipam_test.go)
// whose behaviour is the store's, written afresh; docs/lbipam-cilium-tests.md
// maps every one of Cilium's tests to the test that covers it.

// TestVIPFamilySwitchAsCilium is Cilium's TestAllocHappyPath: an owner
// asking IPv4, then IPv6 instead, then IPv4 again holds one address of
// the family it asks each time, the other family's going back. (The API
// server refuses to change a Service's primary family, so this is the
// store's part of it.)
func TestVIPFamilySwitchAsCilium(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.lbPool("pool-a", lbSpec("10.0.10.0/24", "fd00:10::/48"))
	r := svc("default", "service-a")
	for _, step := range []struct {
		family alloc.Family
		want   string
	}{{alloc.IPv4, "10.0.10.0"}, {alloc.IPv6, "fd00:10::"}, {alloc.IPv4, "10.0.10.0"}} {
		r.Families = []alloc.Family{step.family}
		if a := f.assign(r); !a.Satisfied || a.Reason != alloc.ReasonSatisfied || addrs(a) != step.want {
			t.Fatalf("asking %v: %s %s, want %s satisfied", step.family, addrs(a), a.Reason, step.want)
		}
	}
	p, err := f.s.GetLBPool(f.ctx, alloc.DefaultSpace, "pool-a")
	if err != nil {
		t.Fatal(err)
	}
	if v4, v6 := p.Status.Families[alloc.IPv4].Used, p.Status.Families[alloc.IPv6].Used; v4 != 1 || v6 != 0 {
		t.Fatalf("used: IPv4 %d, IPv6 %d; want 1, 0", v4, v6)
	}
}

// TestVIPPoolShrinkCountsAsCilium is Cilium's TestPoolShrink: a pool of
// two /24s counts 512 addresses; one given, 511 available; the pool
// shrunk to the block holding it counts 256, 255 available, 1 used.
func TestVIPPoolShrinkCountsAsCilium(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	counts := func() alloc.LBFamilyStatus {
		t.Helper()
		p, err := f.s.GetLBPool(f.ctx, alloc.DefaultSpace, "pool-a")
		if err != nil {
			t.Fatal(err)
		}
		return p.Status.Families[alloc.IPv4]
	}
	f.lbPool("pool-a", lbSpec("10.0.10.0/24", "10.0.11.0/24"))
	if c := counts(); c.Total != 512 || c.Available() != 512 || c.Used != 0 {
		t.Fatalf("new pool: %+v", c)
	}
	a := f.assign(svc("default", "service-a"))
	if addrs(a) != "10.0.10.0" {
		t.Fatalf("service-a: %s", addrs(a))
	}
	if c := counts(); c.Total != 512 || c.Available() != 511 || c.Used != 1 {
		t.Fatalf("one given: %+v", c)
	}
	if _, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "pool-a", nil, lbSpec("10.0.10.0/24")); err != nil {
		t.Fatal(err)
	}
	if c := counts(); c.Total != 256 || c.Available() != 255 || c.Used != 1 {
		t.Fatalf("shrunk: %+v", c)
	}
}

// TestVIPConflictResolutionAsCilium is Cilium's TestConflictResolution: a
// newer pool with a block overlapping an older pool's is marked
// conflicting and gives nothing from any of its blocks; edited to drop
// the overlapping block, it is no longer marked and gives again.
func TestVIPConflictResolutionAsCilium(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.lbPool("pool-a", lbSpec("10.0.10.0/24"))
	f.clock.Advance(1e9)
	if b := f.lbPool("pool-b", lbSpec("10.0.10.0/24", "fd00:ff::/48")); !b.Status.Conflicting() {
		t.Fatalf("pool-b not conflicting: %+v", b.Status)
	}
	v6 := svc("default", "service-a")
	v6.Families = []alloc.Family{alloc.IPv6}
	if a := f.assign(v6); a.Satisfied || a.Reason != alloc.ReasonNoPool {
		t.Fatalf("a conflicting pool gave: %s %s", addrs(a), a.Reason)
	}
	b, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "pool-b", nil, lbSpec("fd00:ff::/48"))
	if err != nil {
		t.Fatal(err)
	}
	if b.Status.Conflicting() || f.lbConflict("pool-b") != "" {
		t.Fatalf("pool-b still conflicting: %+v", b.Status)
	}
	if a := f.assign(v6); !a.Satisfied || addrs(a) != "fd00:ff::" {
		t.Fatalf("pool-b resolved gives nothing: %s %s", addrs(a), a.Reason)
	}
}
