// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"net/netip"
	"testing"
	"time"
)

func TestFindOverlaps(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.4")
	h := func(addr netip.Addr, cid string, from, to time.Duration) hold {
		return hold{addr: addr, node: "n", containerID: cid, from: from, to: to}
	}
	tests := []struct {
		name  string
		holds []hold
		want  []overlap
	}{
		{name: "none", holds: nil},
		{name: "one address reused after its release", holds: []hold{
			h(a, "c1", 1, 5), h(a, "c2", 5, 9), h(a, "c3", 12, stillHeld), h(b, "c4", 2, stillHeld),
		}},
		{name: "planted: a second holder while the first still holds it", holds: []hold{
			h(b, "c4", 2, stillHeld), h(a, "c1", 1, stillHeld), h(a, "c2", 6, 9),
		}, want: []overlap{{Addr: "10.0.0.3", First: "n/c1", Second: "n/c2"}}},
		{name: "planted: overlap with an earlier, longer hold, not the latest", holds: []hold{
			h(a, "c1", 1, 20), h(a, "c2", 2, 3), h(a, "c3", 10, 12),
		}, want: []overlap{{Addr: "10.0.0.3", First: "n/c1", Second: "n/c2"}, {Addr: "10.0.0.3", First: "n/c1", Second: "n/c3"}}},
	}
	for _, tt := range tests {
		got := findOverlaps(tt.holds)
		if len(got) != len(tt.want) {
			t.Errorf("%s: %+v; want %+v", tt.name, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s: %+v; want %+v", tt.name, got, tt.want)
			}
		}
	}
}

// TestLedgerOverlaps plants a duplicate in the clients' bookkeeping: an
// attachment still held by a worker, and a released hold of the same
// address that began while it was held.
func TestLedgerOverlaps(t *testing.T) {
	l := newLedger()
	addr := netip.MustParseAddr("10.0.0.9")
	w := &worker{ledger: l, closed: []hold{{addr: addr, node: "n1", containerID: "old", from: 3 * time.Second, to: 4 * time.Second}}}
	l.collect([]*worker{w})
	open := []attachment{{node: "n2", containerID: "holder", addr: addr, from: 2 * time.Second}}
	got := l.overlaps(open)
	if len(got) != 1 || got[0].First != "n2/holder" || got[0].Second != "n1/old" {
		t.Fatalf("overlaps %+v", got)
	}
	if l.count() != 1 || len(w.closed) != 0 {
		t.Fatalf("collect: ledger %d, worker kept %d", l.count(), len(w.closed))
	}
	if got := l.overlaps([]attachment{{node: "n2", containerID: "later", addr: addr, from: 5 * time.Second}}); len(got) != 0 {
		t.Fatalf("a later holder is no duplicate: %+v", got)
	}
}
