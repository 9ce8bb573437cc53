// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// The server tells the reserve's slots from Pods by their owner namespace
// (alloc.ReserveOwnerNamespace): it asks Kubernetes for no such Pod, and
// lets a node certificate lease them, although no Pod of that name is
// bound to the node.
func TestReserveOwnerNamespaceIsTheServers(t *testing.T) {
	if reserveOwnerNamespace != alloc.ReserveOwnerNamespace {
		t.Errorf("the shim owns its reserve as %q, the server knows %q", reserveOwnerNamespace, alloc.ReserveOwnerNamespace)
	}
}

// deadServer is a server URL nothing listens on: the service "down".
const deadServer = "http://127.0.0.1:1"

// reserveConfs are the configurations of one network with a reserve of
// size, talking to the service (up) or to nothing (down).
func reserveConfs(t *testing.T, s *service, size int) (up, down []byte) {
	up = netconf(t, "1.1.0", s.ipam(map[string]any{"reserve": size}), nil)
	down = netconf(t, "1.1.0", s.ipam(map[string]any{"reserve": size, "server": deadServer}), nil)
	return up, down
}

// resultAddrs are the addresses of an ADD's result, sorted.
func resultAddrs(t *testing.T, out []byte) []string {
	t.Helper()
	var r current.Result
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("ADD printed %s: %v", out, err)
	}
	var addrs []string
	for _, ip := range r.IPs {
		addrs = append(addrs, ip.Address.String())
	}
	slices.Sort(addrs)
	return addrs
}

// serviceLeases lists the service's held leases of worker-1 by attachment
// (containerID/interface) in testNetwork.
func (s *service) serviceLeases(t *testing.T) map[string][]string {
	t.Helper()
	node := "worker-1"
	r, err := s.client.ListLeasesWithResponse(context.Background(), &ipamclient.ListLeasesParams{Node: &node, Limit: ptr(1000)})
	if err != nil || r.JSON200 == nil {
		t.Fatalf("list leases: %v %s", err, r.Body)
	}
	out := map[string][]string{}
	for _, l := range r.JSON200.Items {
		if l.State == ipamclient.Cooling {
			continue
		}
		if l.Network == nil || *l.Network != testNetwork {
			t.Fatalf("lease %s is of network %v, want %s", l.Address, l.Network, testNetwork)
		}
		k := l.ContainerID + "/" + l.Interface
		out[k] = append(out[k], l.Address)
		slices.Sort(out[k])
	}
	return out
}

// splitReserve answers the service's leases of the reserve's slots and of
// everything else, apart.
func splitReserve(leases map[string][]string) (slots, pods map[string][]string) {
	slots, pods = map[string][]string{}, map[string][]string{}
	for k, v := range leases {
		if strings.HasPrefix(k, "ipam-shim-reserve-") {
			slots[k] = v
		} else {
			pods[k] = v
		}
	}
	return slots, pods
}

// Pods start and stop while the service is unreachable: ADDs are served
// from the node's reserve, DELs recorded; the next call that reaches the
// service hands the reserve addresses over to their Pods, replays the DELs
// and refills the reserve. No address is ever held twice.
func TestReserveOutage(t *testing.T) {
	s := dualStack(t, nil)
	up, down := reserveConfs(t, s, 3)
	first := resultAddrs(t, shim(t, "ADD", "online-1", "eth0", up).ok(t))
	slots, pods := splitReserve(s.serviceLeases(t))
	if len(slots) != 3 || len(pods) != 1 {
		t.Fatalf("after the first ADD: slots %v, pods %v; want 3 slots filled", slots, pods)
	}
	reserved := map[string]bool{}
	for _, a := range slots {
		for _, x := range a {
			reserved[x] = true
		}
	}
	// Outage: three ADDs take the three slots; a fourth finds it empty.
	got := map[string][]string{}
	for _, c := range []string{"p1", "p2", "p3"} {
		got[c] = resultAddrs(t, shim(t, "ADD", c, "eth0", down).ok(t))
		if len(got[c]) != 2 || !reserved[got[c][0]] || !reserved[got[c][1]] {
			t.Fatalf("offline ADD %s got %v, not reserve addresses %v", c, got[c], slots)
		}
	}
	if again := resultAddrs(t, shim(t, "ADD", "p1", "eth0", down).ok(t)); !slices.Equal(again, got["p1"]) {
		t.Fatalf("offline retry of p1: %v, want %v", again, got["p1"])
	}
	e := shim(t, "ADD", "p4", "eth0", down).fails(t, 11)
	if !strings.Contains(e.Msg, "unreachable") || !strings.Contains(e.Msg, "reserve is empty") {
		t.Fatalf("ADD with an empty reserve: %+v", e)
	}
	shim(t, "STATUS", "", "", down).fails(t, 11) // neither the service nor the reserve serves
	// p2 stops: its addresses are not given to another Pod before the
	// service's cooldown has run for them, so p4 still waits.
	shim(t, "DEL", "p2", "eth0", down).ok(t)
	shim(t, "STATUS", "", "", down).fails(t, 11)
	shim(t, "ADD", "p4", "eth0", down).fails(t, 11)
	returned := got["p2"]
	delete(got, "p2")
	// online-1 stops too: recorded, replayed later.
	shim(t, "DEL", "online-1", "eth0", down).ok(t)
	// CHECK of a reserve-served Pod compares with the reserve.
	prev := func(addrs []string) []byte {
		var ips []map[string]string
		for _, a := range addrs {
			ips = append(ips, map[string]string{"address": a})
		}
		return netconf(t, "1.1.0", s.ipam(map[string]any{"reserve": 3, "server": deadServer}),
			map[string]any{"prevResult": map[string]any{"cniVersion": "1.1.0", "ips": ips}})
	}
	shim(t, "CHECK", "p3", "eth0", prev(got["p3"])).ok(t)
	shim(t, "CHECK", "p3", "eth0", prev(got["p1"])).fails(t, ErrCheckMismatch)

	// The service is back: one call syncs.
	shim(t, "STATUS", "", "", up).ok(t)
	slots, pods = splitReserve(s.serviceLeases(t))
	wantPods := map[string][]string{}
	for c, a := range got {
		wantPods[c+"/eth0"] = a
	}
	if fmt.Sprint(pods) != fmt.Sprint(wantPods) {
		t.Fatalf("the service holds %v for Pods, want %v (online-1 released)", pods, wantPods)
	}
	if len(slots) != 3 {
		t.Fatalf("the reserve holds %v after the sync, want 3 slots again", slots)
	}
	seen := map[string]string{}
	for k, as := range s.serviceLeases(t) {
		for _, a := range as {
			if other, dup := seen[a]; dup {
				t.Fatalf("%s held by %s and %s", a, other, k)
			}
			seen[a] = k
		}
	}
	for _, a := range append(first, returned...) {
		if _, held := seen[a]; held {
			t.Fatalf("%s still held after online-1's replayed DEL and p2's returned slot's release", a)
		}
	}
	a := s.attachment(t, "worker-1", "p1", "eth0")
	if a == nil || a.Owner.Namespace != fallbackNamespace || a.Owner.Name != "p1" || a.State != ipamclient.Active {
		t.Fatalf("p1 at the service: %+v", a)
	}
	st, err := readReserve(s.dataDir)
	if err != nil || st.pending() || st.free() != 3 {
		t.Fatalf("reserve file after the sync: %+v %v", st, err)
	}
	// The history shows the handover.
	r, err := s.client.GetAddressHistoryWithResponse(context.Background(), netip.MustParsePrefix(got["p1"][0]).Addr().String(), nil)
	if err != nil || r.JSON200 == nil {
		t.Fatalf("history: %v %s", err, r.Body)
	}
	var trail []string
	for _, ev := range r.JSON200.Items {
		trail = append(trail, string(ev.Kind)+":"+ev.Reason)
	}
	if !slices.Contains(trail, "release:handed-over") || !slices.Contains(trail, "lease:from-reserve") {
		t.Fatalf("history of %s: %v", got["p1"][0], trail)
	}
	// A Pod retrying its ADD now gets the same addresses from the service.
	if again := resultAddrs(t, shim(t, "ADD", "p3", "eth0", up).ok(t)); !slices.Equal(again, got["p3"]) {
		t.Fatalf("online retry of p3: %v, want %v", again, got["p3"])
	}
}

// A pool with nothing left for the node strands no address in the
// reserve: ADD takes a free slot when the service answers the pool
// exhausted, STATUS counts the free slots, and the next call hands the
// slot over to its Pod.
func TestReserveServesAnExhaustedPool(t *testing.T) {
	s := dualStack(t, nil)
	s.createPool(t, "tiny", "10.9.0.0/29", 29, "", 0) // one block of 4 leasable addresses
	conf := netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "tiny", "reserve": 2}), nil)
	// c0 from the service, two slots, c1 the last address.
	shim(t, "ADD", "c0", "eth0", conf).ok(t)
	shim(t, "ADD", "c1", "eth0", conf).ok(t)
	if st, err := readReserve(s.dataDir); err != nil || st.free() != 2 {
		t.Fatalf("reserve %+v %v, want 2 free slots", st, err)
	}
	shim(t, "STATUS", "", "", conf).ok(t) // the pool is full, the reserve is not
	c2 := resultAddrs(t, shim(t, "ADD", "c2", "eth0", conf).ok(t))
	c3 := resultAddrs(t, shim(t, "ADD", "c3", "eth0", conf).ok(t))
	if len(c2) != 1 || len(c3) != 1 || c2[0] == c3[0] {
		t.Fatalf("c2 %v, c3 %v: want an address each from the reserve", c2, c3)
	}
	e := shim(t, "ADD", "c4", "eth0", conf).fails(t, ErrPoolExhausted)
	if !strings.Contains(e.Msg, "reserve is empty") {
		t.Errorf("ADD with the pool and the reserve empty: %+v", e)
	}
	shim(t, "STATUS", "", "", conf).fails(t, 50)
	// The next call hands the slots over: the service records c2 and c3.
	shim(t, "DEL", "c0", "eth0", conf).ok(t)
	for c, want := range map[string][]string{"c2": c2, "c3": c3} {
		a := s.attachment(t, "worker-1", c, "eth0")
		if a == nil || len(a.Addresses) != 1 || a.Addresses[0].Address != want[0] {
			t.Fatalf("%s at the service: %+v, want %v", c, a, want)
		}
	}
}

// Several shims at once while the service is down: the lock gives each
// slot to one Pod only.
func TestReserveConcurrentAdds(t *testing.T) {
	s := dualStack(t, nil)
	up, down := reserveConfs(t, s, 4)
	shim(t, "STATUS", "", "", up).ok(t) // fills the reserve
	var wg sync.WaitGroup
	runs := make([]run, 7)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runs[i] = shim(t, "ADD", fmt.Sprintf("c%d", i), "eth0", down)
		}()
	}
	wg.Wait()
	owner := map[string]int{}
	served := 0
	for i, r := range runs {
		if r.exit != 0 {
			r.fails(t, 11)
			continue
		}
		served++
		for _, a := range resultAddrs(t, r.stdout) {
			if j, dup := owner[a]; dup {
				t.Fatalf("%s given to c%d and c%d", a, j, i)
			}
			owner[a] = i
		}
	}
	if served != 4 {
		t.Fatalf("%d ADDs served from a reserve of 4", served)
	}
	st, err := readReserve(s.dataDir)
	if err != nil || len(st.Slots) != 4 || st.free() != 0 {
		t.Fatalf("reserve file: %+v %v", st, err)
	}
	shim(t, "STATUS", "", "", up).ok(t)
	_, pods := splitReserve(s.serviceLeases(t))
	if len(pods) != 4 {
		t.Fatalf("the service holds %v, want the 4 Pods served offline", pods)
	}
	for i, r := range runs {
		if r.exit == 0 && !slices.Equal(pods[fmt.Sprintf("c%d/eth0", i)], resultAddrs(t, r.stdout)) {
			t.Fatalf("c%d holds %v at the service, %v in the Pod", i, pods[fmt.Sprintf("c%d/eth0", i)], resultAddrs(t, r.stdout))
		}
	}
}

// GC keeps the reserve's slots: they are this network's attachments that
// no runtime lists.
func TestReserveSurvivesGC(t *testing.T) {
	s := dualStack(t, nil)
	up, _ := reserveConfs(t, s, 2)
	shim(t, "ADD", "c1", "eth0", up).ok(t)
	gc := netconf(t, "1.1.0", s.ipam(map[string]any{"reserve": 2}), map[string]any{"cni.dev/valid-attachments": []any{}})
	shim(t, "GC", "", "", gc).ok(t)
	slots, pods := splitReserve(s.serviceLeases(t))
	if len(slots) != 2 || len(pods) != 0 {
		t.Fatalf("after GC with an empty list: slots %v, pods %v; want the 2 slots only", slots, pods)
	}
	// A smaller reserve gives the extra slot back.
	shim(t, "STATUS", "", "", netconf(t, "1.1.0", s.ipam(map[string]any{"reserve": 1}), nil)).ok(t)
	if slots, _ := splitReserve(s.serviceLeases(t)); len(slots) != 1 {
		t.Fatalf("after shrinking the reserve to 1: %v", slots)
	}
}

// The reserve file under its lock, in process: concurrent takers never
// share a slot, and a held lock is reported when not waiting.
func TestReserveFileLock(t *testing.T) {
	dir := t.TempDir()
	r, err := lockReserve(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	for id := range 5 {
		r.st.Slots = append(r.st.Slots, reserveSlot{ID: id, Generation: int64(id + 1),
			Addresses: []ipamclient.LeaseAddress{{Address: fmt.Sprintf("10.0.0.%d/24", id+10)}}})
	}
	if err := r.save(true); err != nil {
		t.Fatal(err)
	}
	if _, err := lockReserve(dir, 0); !errors.Is(err, errLocked) {
		t.Fatalf("a second lock while held: %v", err)
	}
	r.close()

	var wg sync.WaitGroup
	taken := make([]int, 8)
	for i := range taken {
		wg.Add(1)
		go func() {
			defer wg.Done()
			taken[i] = -1
			f, err := lockReserve(dir, lockWait)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.close()
			if sl := f.st.take(reserveUse{ContainerID: fmt.Sprintf("c%d", i), IfName: "eth0"}, ""); sl != nil {
				taken[i] = sl.ID
				if err := f.save(true); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	var ids []int
	for _, id := range taken {
		if id >= 0 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("slots taken %v, want each of 0-4 once", taken)
	}
	st, err := readReserve(dir)
	if err != nil || st.free() != 0 || len(st.Slots) != 5 {
		t.Fatalf("file after the takers: %+v %v", st, err)
	}
	for _, sl := range st.Slots {
		if sl.UsedBy == nil || taken[int(sl.UsedBy.ContainerID[1]-'0')] != sl.ID {
			t.Fatalf("slot %d recorded for %+v, taken %v", sl.ID, sl.UsedBy, taken)
		}
	}
}

// The reserve is on by default, in a directory of the network's own.
func TestReserveDefaults(t *testing.T) {
	c, err := loadConfig([]byte(`{"cniVersion": "1.1.0", "name": "pods", "ipam": {"type": "ipam-shim", "server": "http://127.0.0.1:1", "node": "n"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.reserve != defaultReserve || c.dataDir != "/var/lib/cni/ipam-shim/pods" {
		t.Fatalf("reserve %d in %s", c.reserve, c.dataDir)
	}
	c, err = loadConfig([]byte(`{"cniVersion": "1.1.0", "name": "pods", "ipam": {"type": "ipam-shim", "server": "http://127.0.0.1:1", "node": "n", "reserve": 0, "dataDir": "/tmp/x"}}`))
	if err != nil || c.reserve != 0 || c.dataDir != "/tmp/x" {
		t.Fatalf("reserve 0 in /tmp/x: %+v %v", c, err)
	}
}
