// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

func parseAddrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// restore runs RestoreNodeAddresses, failing the test on error, and
// answers the refusals as "field kind" strings.
func (f *fixture) restore(node string, as []netip.Addr) ([]netip.Addr, []string, []*alloc.Error) {
	f.t.Helper()
	got, refused, err := f.s.RestoreNodeAddresses(f.ctx, alloc.DefaultSpace, node, nil, as)
	if err != nil {
		f.t.Fatalf("restore for %s: %v", node, err)
	}
	var kinds []string
	for _, e := range refused {
		kinds = append(kinds, e.Field+" "+string(e.Kind))
	}
	return got, kinds, refused
}

// The addresses a CiliumNode lists are occupied for it as reserved
// addresses of its blocks (adopted when no node holds them), each
// recorded in the history with the node and reason cilium-restored; an
// address of no pool, one its block sets aside, one in another node's
// block or held by another node is refused and not occupied; restoring
// again changes nothing; a released address the node still lists is its
// again once its cooldown ended; a reservation after the restore never hands out a restored one.
func TestRestoreNodeAddresses(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 28) // router and health at offsets 1 and 2
	listed := parseAddrs("10.0.0.5", "10.0.0.6", "10.0.1.7", "10.0.0.5", "192.168.0.1", "10.0.0.1", "10.0.0.15")
	if _, refused, err := f.s.RestoreNodeAddresses(f.ctx, alloc.DefaultSpace, "n0", nil, []netip.Addr{{}}); err != nil ||
		len(refused) != 1 || refused[0].Kind != alloc.KindInvalid {
		t.Fatalf("the zero address: refused %+v, %v", refused, err)
	}
	got, kinds, refused := f.restore("n1", listed)
	if want := parseAddrs("10.0.0.5", "10.0.0.6", "10.0.1.7"); !slices.Equal(got, want) {
		t.Fatalf("restored %v, want %v", got, want)
	}
	if want := []string{"addresses[4] invalid-input", "addresses[5] invalid-input", "addresses[6] invalid-input"}; !slices.Equal(kinds, want) {
		t.Fatalf("refused %v, want %v (%+v)", kinds, want, refused)
	}
	if !strings.Contains(refused[0].Detail, "no pool") || !strings.Contains(refused[1].Detail, "sets aside") {
		t.Errorf("refusals say %q and %q", refused[0].Detail, refused[1].Detail)
	}
	held := f.held("n1")
	if !slices.Equal(addrsOf(held), got) {
		t.Fatalf("n1 holds %v", addrsOf(held))
	}
	for _, h := range held {
		if h.State != alloc.StateReserved || h.Pool != "default" {
			t.Errorf("restored %+v; want reserved in default", h)
		}
		if ev := f.events(h.Addr); !slices.Contains(ev, "lease reserved  cilium-restored") {
			t.Errorf("%s's history: %q", h.Addr, ev)
		}
		if ev := f.history(alloc.HistoryFilter{Space: alloc.DefaultSpace, Address: h.Addr}); len(ev) == 0 || ev[0].Node != "n1" {
			t.Errorf("%s's history names no holder: %+v", h.Addr, ev)
		}
	}
	events := len(f.history(alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: "n1"}))

	// Again: the same answer, nothing written.
	if again, _, _ := f.restore("n1", listed); !slices.Equal(again, got) {
		t.Fatalf("restored again %v", again)
	}
	if n := len(f.history(alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: "n1"})); n != events {
		t.Errorf("restoring again wrote %d events", n-events)
	}

	// n1's block and n1's address are refused to n2, naming n1.
	got2, kinds2, refused2 := f.restore("n2", parseAddrs("10.0.0.7", "10.0.0.5"))
	if len(got2) != 0 || !slices.Equal(kinds2, []string{"addresses[0] overlap", "addresses[1] overlap"}) {
		t.Fatalf("n2 restored %v, refused %v", got2, kinds2)
	}
	for _, e := range refused2 {
		if !slices.Equal(e.Nodes, []string{"n1"}) || !strings.Contains(e.Detail, "n1") {
			t.Errorf("refusal %+v names not n1", e)
		}
	}
	if h := f.held("n2"); len(h) != 0 {
		t.Fatalf("n2 holds %v", addrsOf(h))
	}

	// A reservation for n2 after the restore takes none of n1's.
	for _, h := range f.reserve("n2", nil, 20) {
		if slices.Contains(got, h.Addr) {
			t.Fatalf("n2 was given n1's restored %s", h.Addr)
		}
	}

	// Released but listed still (an older database): the node's again.
	if _, err := f.s.ReleaseNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", parseAddrs("10.0.0.6")); err != nil {
		t.Fatal(err)
	}
	if again, kinds, _ := f.restore("n1", parseAddrs("10.0.0.6")); len(again) != 0 || !slices.Equal(kinds, []string{"addresses[0] conflict"}) {
		t.Fatalf("a cooling address restored: %v, refused %v", again, kinds)
	}
	f.clock.Advance(f.opts.Cooldown)
	if again, _, _ := f.restore("n1", parseAddrs("10.0.0.6")); !slices.Equal(again, parseAddrs("10.0.0.6")) {
		t.Fatalf("the released address restored: %v", again)
	}
	if h := addrsOf(f.held("n1")); !slices.Equal(h, got) {
		t.Fatalf("n1 holds %v after taking its released address back", h)
	}
	f.checkClean()
}

// Nodes racing to restore one address (the same new block): exactly one
// holds it, every other is refused, and no second copy exists.
func TestRestoreNodeAddressesConcurrently(t *testing.T) {
	t.Parallel()
	f := crdFixture(t, 28)
	a := netip.MustParseAddr("10.0.9.9")
	const nodes = 8
	var wg sync.WaitGroup
	won := make([]bool, nodes)
	errs := make([]error, nodes)
	for i := range nodes {
		wg.Go(func() {
			got, refused, err := f.s.RestoreNodeAddresses(f.ctx, alloc.DefaultSpace, fmt.Sprintf("r%d", i), nil, []netip.Addr{a})
			switch {
			case err != nil:
				errs[i] = err
			case len(got) == 1:
				won[i] = true
			case len(refused) != 1 || refused[0].Kind != alloc.KindOverlap:
				errs[i] = fmt.Errorf("neither restored nor refused as an overlap: %+v", refused)
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("r%d: %v", i, err)
		}
	}
	holders := 0
	for i := range nodes {
		h := addrsOf(f.held(fmt.Sprintf("r%d", i)))
		if won[i] != slices.Equal(h, []netip.Addr{a}) || (!won[i] && len(h) != 0) {
			t.Errorf("r%d won %v and holds %v", i, won[i], h)
		}
		if won[i] {
			holders++
		}
	}
	if holders != 1 {
		t.Fatalf("%d nodes hold %s", holders, a)
	}
	f.checkClean()
}
