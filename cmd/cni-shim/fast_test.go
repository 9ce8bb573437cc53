// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/store"
)

// fastConf is a configuration of the fast path: the pool named, a reserve
// of size, a timeout long enough for a test that holds the service.
func fastConf(t *testing.T, s *service, pool string, size int) []byte {
	return netconf(t, "1.1.0", s.ipam(map[string]any{"pool": pool, "reserve": size, "timeout": "60s"}), nil)
}

// slotAddrs are the addresses of the reserve's free slots, sorted per slot.
func slotAddrs(t *testing.T, dir string) [][]string {
	t.Helper()
	st, err := readReserve(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	for _, sl := range st.Slots {
		if sl.isFree() {
			out = append(out, addressesOf(sl.Addresses))
		}
	}
	return out
}

// isSlot reports whether addrs are the addresses of one of slots.
func isSlot(slots [][]string, addrs []string) bool {
	return slices.ContainsFunc(slots, func(sl []string) bool { return slices.Equal(sl, addrs) })
}

// askedFor fails t when the service got a lease request for cid other
// than a handover: ADD asked instead of answering from the reserve.
func askedFor(t *testing.T, s *service, cids ...string) {
	t.Helper()
	for _, l := range s.leaseCalls() {
		if slices.Contains(cids, l.ContainerID) && !l.FromReserve {
			t.Fatalf("ADD of %s asked the service for a lease; want it served from the reserve", l.ContainerID)
		}
	}
}

// history is the address history of addr as kind:reason.
func (s *service) history(t *testing.T, addr string) []string {
	t.Helper()
	r, err := s.client.GetAddressHistoryWithResponse(context.Background(), netip.MustParsePrefix(addr).Addr().String(), nil)
	if err != nil || r.JSON200 == nil {
		t.Fatalf("history: %v %s", err, r.Body)
	}
	var trail []string
	for _, ev := range r.JSON200.Items {
		trail = append(trail, string(ev.Kind)+":"+ev.Reason)
	}
	return trail
}

// noAddressTwice fails t when the service holds an address for two
// attachments.
func noAddressTwice(t *testing.T, s *service) map[string]string {
	t.Helper()
	seen := map[string]string{}
	for k, as := range s.serviceLeases(t) {
		for _, a := range as {
			if other, dup := seen[a]; dup {
				t.Fatalf("%s held by %s and %s", a, other, k)
			}
			seen[a] = k
		}
	}
	return seen
}

// With a free slot, ADD answers from the reserve without a request: it
// answers while the service holds every request. The background sync
// then hands the slot over to the Pod by itself, once the service
// answers: the lease is the Pod's, the history shows the handover, and
// the reserve is full again.
func TestReserveFastAddAsksNothing(t *testing.T) {
	s := dualStack(t, nil)
	conf := fastConf(t, s, "default", 2)
	shim(t, "STATUS", "", "", conf).ok(t) // fills the reserve
	slots := slotAddrs(t, s.dataDir)
	if len(slots) != 2 {
		t.Fatalf("reserve %v, want 2 free slots", slots)
	}
	// A Pod the service would refuse (its name is no DNS name) is not
	// served from the reserve: the service answers, and refuses.
	shim(t, "ADD", "bad", "eth0", conf, "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=Bad_Name").fails(t, ErrRejected)
	if got := slotAddrs(t, s.dataDir); fmt.Sprint(got) != fmt.Sprint(slots) {
		t.Fatalf("reserve %v after a refused ADD, want %v", got, slots)
	}
	s.hold()
	out := shimAsync(t, "ADD", "p1", "eth0", conf, "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0").ok(t)
	got := resultAddrs(t, out)
	if !isSlot(slots, got) {
		t.Fatalf("ADD got %v, not a slot of %v", got, slots)
	}
	askedFor(t, s, "p1")
	s.open()
	waitSync(t, s.dataDir)
	a := s.attachment(t, "worker-1", "p1", "eth0")
	if a == nil || !slices.Equal(addressesOf(a.Addresses), got) || a.Owner.Namespace != "shop" || a.Owner.Name != "web-0" || a.State != ipamclient.Active {
		t.Fatalf("p1 at the service: %+v, want %v owned by shop/web-0", a, got)
	}
	if trail := s.history(t, got[0]); !slices.Contains(trail, "lease:from-reserve") {
		t.Fatalf("history of %s: %v", got[0], trail)
	}
	if st, err := readReserve(s.dataDir); err != nil || st.pending() || st.free() != 2 {
		t.Fatalf("reserve after the sync: %+v %v", st, err)
	}
	noAddressTwice(t, s)
}

// A Pod served from the reserve stops before its handover was sent: its
// DEL is recorded, its slot is never given to the next Pod (the address
// has not cooled down), and the sync releases it at the service, where
// it cools down as any other.
func TestReserveFastDelBeforeHandover(t *testing.T) {
	s := newServiceWith(t, nil, func(o *store.Options) { o.Cooldown = time.Hour; o.ReconcileMinAge = 0 })
	s.createPool(t, "default", "10.244.0.0/16", 24, "fd00:10:244::/104", 120)
	conf := fastConf(t, s, "default", 2)
	shim(t, "STATUS", "", "", conf).ok(t)
	s.hold()
	p1 := resultAddrs(t, shimAsync(t, "ADD", "p1", "eth0", conf).ok(t))
	shimAsync(t, "DEL", "p1", "eth0", conf).ok(t)
	p2 := resultAddrs(t, shimAsync(t, "ADD", "p2", "eth0", conf).ok(t))
	if slices.Equal(p1, p2) {
		t.Fatalf("p2 got p1's addresses %v before their cooldown", p1)
	}
	askedFor(t, s, "p1", "p2")
	s.open()
	waitSync(t, s.dataDir)
	if a := s.attachment(t, "worker-1", "p1", "eth0"); a != nil {
		t.Fatalf("p1 still holds %+v", a)
	}
	if a := s.attachment(t, "worker-1", "p2", "eth0"); a == nil || !slices.Equal(addressesOf(a.Addresses), p2) {
		t.Fatalf("p2 at the service: %+v, want %v", a, p2)
	}
	held := noAddressTwice(t, s)
	for _, x := range p1 {
		if k, ok := held[x]; ok {
			t.Fatalf("%s of the stopped p1 is held by %s within its cooldown", x, k)
		}
	}
	r, err := s.client.ListLeasesWithResponse(context.Background(), &ipamclient.ListLeasesParams{Node: ptr("worker-1"), Limit: ptr(1000)})
	if err != nil || r.JSON200 == nil {
		t.Fatalf("list leases: %v", err)
	}
	cooling := 0
	for _, l := range r.JSON200.Items {
		if slices.Contains(p1, l.Address) && l.State == ipamclient.Cooling {
			cooling++
		}
	}
	if cooling != len(p1) {
		t.Fatalf("%d of p1's addresses %v cooling, want all", cooling, p1)
	}
	// The history sees the Pod, and its release.
	if trail := s.history(t, p1[0]); !slices.Contains(trail, "lease:from-reserve") || !slices.Contains(trail, "release:attachment-released") {
		t.Fatalf("history of %s: %v, want p1's handover and release", p1[0], trail)
	}
	if st, err := readReserve(s.dataDir); err != nil || st.pending() || st.free() != 2 {
		t.Fatalf("reserve after the sync: %+v %v", st, err)
	}

	// The same with the service down, so that no handover was even
	// tried before the DEL: the next call that reaches it sends both.
	s.down()
	p3 := resultAddrs(t, shim(t, "ADD", "p3", "eth0", conf).ok(t))
	shim(t, "DEL", "p3", "eth0", conf).ok(t)
	p4 := resultAddrs(t, shim(t, "ADD", "p4", "eth0", conf).ok(t))
	if slices.Equal(p3, p4) {
		t.Fatalf("p4 got p3's addresses %v before their cooldown", p3)
	}
	askedFor(t, s, "p3", "p4")
	s.open()
	shim(t, "STATUS", "", "", conf).ok(t)
	if a := s.attachment(t, "worker-1", "p3", "eth0"); a != nil {
		t.Fatalf("p3 still holds %+v", a)
	}
	if trail := s.history(t, p3[0]); !slices.Contains(trail, "lease:from-reserve") || !slices.Contains(trail, "release:attachment-released") {
		t.Fatalf("history of %s: %v, want p3's handover and release", p3[0], trail)
	}
	held = noAddressTwice(t, s)
	if held[p4[0]] != "p4/eth0" {
		t.Fatalf("%s of p4 held by %q", p4[0], held[p4[0]])
	}
	for _, x := range p3 {
		if k, ok := held[x]; ok {
			t.Fatalf("%s of the stopped p3 is held by %s within its cooldown", x, k)
		}
	}
}

// Many ADDs at once on one node: each slot goes to one Pod only, all
// without a request while the service holds them; then, with the service
// answering, ADD+DEL pairs race the background syncs. No address is ever
// held twice, and the service holds for every Pod what its ADD answered.
// The background sync lingers between the verbs, so one process tells
// the service about many of them.
func TestReserveFastConcurrentAdds(t *testing.T) {
	s := dualStack(t, nil)
	const size = 8
	// The background sync lingers for more work, as by default.
	conf := netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "default", "reserve": size, "timeout": "60s", "syncLinger": "300ms"}), nil)
	shim(t, "STATUS", "", "", conf).ok(t)
	slots := slotAddrs(t, s.dataDir)
	s.hold()
	got := make([][]string, size)
	var wg sync.WaitGroup
	for i := range size {
		wg.Go(func() {
			r := shimAsync(t, "ADD", fmt.Sprintf("w%d", i), "eth0", conf)
			if r.exit == 0 {
				got[i] = resultAddrs(t, r.stdout)
			}
		})
	}
	wg.Wait()
	owner := map[string]int{}
	for i, as := range got {
		if !isSlot(slots, as) {
			t.Fatalf("w%d got %v, not a slot of %v", i, as, slots)
		}
		for _, a := range as {
			if j, dup := owner[a]; dup {
				t.Fatalf("%s given to w%d and w%d", a, j, i)
			}
			owner[a] = i
		}
	}
	var first []string
	for i := range size {
		first = append(first, fmt.Sprintf("w%d", i))
	}
	askedFor(t, s, first...)
	s.open()
	waitSync(t, s.dataDir)

	// The service answers: ADD+DEL pairs and ADDs that stay, at once.
	const pods = 24
	stay := make([][]string, pods)
	for i := range pods {
		wg.Go(func() {
			cid := fmt.Sprintf("x%d", i)
			a := resultAddrs(t, shimAsync(t, "ADD", cid, "eth0", conf).ok(t))
			if i%2 == 0 {
				shimAsync(t, "DEL", cid, "eth0", conf).ok(t)
				return
			}
			stay[i] = a
		})
	}
	wg.Wait()
	shim(t, "STATUS", "", "", conf).ok(t) // sends what a sync left to the next call
	held := noAddressTwice(t, s)
	check := func(cid string, want []string) {
		for _, a := range want {
			if held[a] != cid+"/eth0" {
				t.Fatalf("%s answered %v to %s, the service holds it for %q", cid, a, cid, held[a])
			}
		}
	}
	for i, as := range got {
		check(fmt.Sprintf("w%d", i), as)
	}
	for i, as := range stay {
		if i%2 == 1 {
			check(fmt.Sprintf("x%d", i), as)
		} else if a := s.attachment(t, "worker-1", fmt.Sprintf("x%d", i), "eth0"); a != nil {
			t.Fatalf("x%d was deleted but holds %+v", i, a)
		}
	}
	if st, err := readReserve(s.dataDir); err != nil || st.pending() {
		t.Fatalf("reserve after the sync: %+v %v", st, err)
	}
}

// A pool with 2 free addresses and a reserve of 4: the reserve takes
// both, and both Pods get them at once from the reserve; STATUS is ready
// while a slot is free, and answers 50 only when neither the pool nor the
// reserve has an address.
func TestReserveFastStrandsNothing(t *testing.T) {
	s := dualStack(t, nil)
	s.createPool(t, "tiny", "10.9.0.0/29", 29, "", 0) // one block of 4 leasable addresses
	noReserve := netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "tiny"}), nil)
	shim(t, "ADD", "c0", "eth0", noReserve).ok(t)
	shim(t, "ADD", "c1", "eth0", noReserve).ok(t)
	conf := fastConf(t, s, "tiny", 4)
	shim(t, "STATUS", "", "", conf).ok(t) // the reserve takes the 2 addresses left
	if slots := slotAddrs(t, s.dataDir); len(slots) != 2 {
		t.Fatalf("reserve %v, want the 2 addresses left", slots)
	}
	shim(t, "STATUS", "", "", conf).ok(t)
	p1 := resultAddrs(t, shim(t, "ADD", "p1", "eth0", conf).ok(t))
	p2 := resultAddrs(t, shim(t, "ADD", "p2", "eth0", conf).ok(t))
	if len(p1) != 1 || len(p2) != 1 || p1[0] == p2[0] {
		t.Fatalf("p1 %v, p2 %v: want an address each", p1, p2)
	}
	askedFor(t, s, "p1", "p2")
	shim(t, "STATUS", "", "", conf).fails(t, 50)
	for c, want := range map[string][]string{"p1": p1, "p2": p2} {
		if a := s.attachment(t, "worker-1", c, "eth0"); a == nil || !slices.Equal(addressesOf(a.Addresses), want) {
			t.Fatalf("%s at the service: %+v, want %v", c, a, want)
		}
	}
	noAddressTwice(t, s)
}

// A node dies with handovers it never sent: the slots are leases of the
// reserve at the service, and the next GC reconciles them: with the
// node's file, the handover is sent first (the history sees the Pod) and
// the Pod, gone from the runtime's list, released; without it (a node
// replaced), the slots the file no longer lists are released.
func TestReserveFastUnsentHandoversGC(t *testing.T) {
	s := dualStack(t, nil)
	conf := fastConf(t, s, "default", 2)
	gc := netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "default", "reserve": 2}), map[string]any{"cni.dev/valid-attachments": []any{}})
	shim(t, "STATUS", "", "", conf).ok(t)
	s.down()
	p1 := resultAddrs(t, shim(t, "ADD", "p1", "eth0", conf).ok(t)) // its sync got 503 and stopped
	askedFor(t, s, "p1")
	if st, err := readReserve(s.dataDir); err != nil || st.servedSlot("p1", "eth0") == nil {
		t.Fatalf("reserve: %+v %v, want p1's handover unsent", st, err)
	}
	s.open()
	shim(t, "GC", "", "", gc).ok(t)
	if a := s.attachment(t, "worker-1", "p1", "eth0"); a != nil {
		t.Fatalf("p1, not in the runtime's list, holds %+v after GC", a)
	}
	if trail := s.history(t, p1[0]); !slices.Contains(trail, "lease:from-reserve") {
		t.Fatalf("history of %s: %v, want p1's handover", p1[0], trail)
	}

	// The node is replaced: its file is gone with p2's handover.
	s.down()
	p2 := resultAddrs(t, shim(t, "ADD", "p2", "eth0", conf).ok(t))
	askedFor(t, s, "p2")
	if err := os.Remove(reservePath(s.dataDir)); err != nil {
		t.Fatal(err)
	}
	s.open()
	shim(t, "GC", "", "", gc).ok(t)
	slots, pods := splitReserve(s.serviceLeases(t))
	if len(pods) != 0 {
		t.Fatalf("after GC the service holds %v for Pods, want none", pods)
	}
	st, err := readReserve(s.dataDir)
	if err != nil || len(st.Slots) != 2 || len(slots) != 2 {
		t.Fatalf("after GC: file %+v %v, service slots %v; want 2 new slots", st, err, slots)
	}
	if trail := s.history(t, p2[0]); !slices.Contains(trail, "release:reconcile") {
		t.Fatalf("history of %s: %v, want the slot p2 took released by GC", p2[0], trail)
	}
	noAddressTwice(t, s)
}

// The configuration's pool changes: the slots of the old pool serve no
// Pod, and the sync gives them back and refills from the new pool.
func TestReserveFastPoolChange(t *testing.T) {
	s := dualStack(t, nil)
	s.createPool(t, "other", "10.77.0.0/16", 24, "", 0)
	shim(t, "STATUS", "", "", fastConf(t, s, "default", 2)).ok(t)
	old := slotAddrs(t, s.dataDir)
	conf := fastConf(t, s, "other", 2)
	p1 := resultAddrs(t, shim(t, "ADD", "p1", "eth0", conf).ok(t))
	if len(p1) != 1 || !netip.MustParsePrefix("10.77.0.0/16").Contains(netip.MustParsePrefix(p1[0]).Addr()) {
		t.Fatalf("p1 got %v, want an address of pool other (the slots hold %v)", p1, old)
	}
	slots, _ := splitReserve(s.serviceLeases(t))
	if len(slots) != 2 {
		t.Fatalf("service slots %v, want 2", slots)
	}
	for k, as := range slots {
		if len(as) != 1 || !netip.MustParsePrefix("10.77.0.0/16").Contains(netip.MustParsePrefix(as[0]).Addr()) {
			t.Fatalf("slot %s holds %v, want an address of pool other", k, as)
		}
	}
	noAddressTwice(t, s)
}

// The service refuses a handover for good (here: the slot's lease was
// released behind the node's back, so there is nothing to hand over):
// the Pod keeps its slot in the file, not free, not sent again, and
// listed to GC as the reserve's; the refusal is in sync.log. Its DEL
// releases the slot, and the reserve refills.
func TestReserveFastRefusedHandover(t *testing.T) {
	s := newServiceWith(t, nil, func(o *store.Options) { o.Cooldown = time.Hour; o.ReconcileMinAge = 0 })
	s.createPool(t, "default", "10.244.0.0/16", 24, "fd00:10:244::/104", 120)
	conf := fastConf(t, s, "default", 2)
	shim(t, "STATUS", "", "", conf).ok(t)
	st, err := readReserve(s.dataDir)
	if err != nil || len(st.Slots) != 2 {
		t.Fatalf("reserve %+v %v", st, err)
	}
	first := st.Slots[0]
	for _, sl := range st.Slots[1:] {
		if sl.ID < first.ID {
			first = sl
		}
	}
	r, err := s.client.ReleaseAttachmentWithResponse(context.Background(), "worker-1", slotContainerID(first.ID), reserveInterface,
		&ipamclient.ReleaseAttachmentParams{Network: ptr(testNetwork)})
	if err != nil || r.StatusCode() != 204 {
		t.Fatalf("release the slot's lease: %v %d", err, r.StatusCode())
	}
	p1 := resultAddrs(t, shim(t, "ADD", "p1", "eth0", conf).ok(t))
	if !slices.Equal(p1, addressesOf(first.Addresses)) {
		t.Fatalf("p1 got %v, want slot %d's %v", p1, first.ID, addressesOf(first.Addresses))
	}
	askedFor(t, s, "p1")
	st, err = readReserve(s.dataDir)
	sl := st.servedSlot("p1", "eth0")
	if err != nil || sl == nil || !sl.Refused || st.pending() || st.free() != 2 {
		t.Fatalf("reserve after the refused handover: %+v %v; want p1's slot kept, refused, and 2 free", st, err)
	}
	if log, err := os.ReadFile(filepath.Join(s.dataDir, "sync.log")); err != nil || !strings.Contains(string(log), "refused to hand reserve slot") {
		t.Fatalf("sync.log: %s %v", log, err)
	}
	shim(t, "DEL", "p1", "eth0", conf).ok(t)
	st, err = readReserve(s.dataDir)
	if err != nil || st.pending() || len(st.Slots) != 2 || st.free() != 2 {
		t.Fatalf("reserve after p1's DEL: %+v %v; want the refused slot gone, 2 free", st, err)
	}
	noAddressTwice(t, s)
}

// The fast path needs the configuration to name the pool of every family
// ADD may lease; otherwise the service chooses by the Pod.
func TestNamesPools(t *testing.T) {
	v4, v6 := ipamclient.Ipv4, ipamclient.Ipv6
	for _, c := range []struct {
		cfg  config
		want bool
	}{
		{config{}, false},
		{config{pool: "a"}, true},
		{config{pools: map[ipamclient.Family]string{v4: "a"}}, false},
		{config{pools: map[ipamclient.Family]string{v4: "a"}, families: []ipamclient.Family{v4}}, true},
		{config{pools: map[ipamclient.Family]string{v4: "a", v6: "b"}}, true},
		{config{pools: map[ipamclient.Family]string{v4: "a"}, families: []ipamclient.Family{v4, v6}}, false},
	} {
		if got := c.cfg.namesPools(); got != c.want {
			t.Errorf("%+v: namesPools %v, want %v", c.cfg, got, c.want)
		}
	}
}
