// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// Interfaces the workers do not own (issue 35): a trunk, an EFA, one
// tagged no_manage=true, one a user attached. The scenarios run
// capacity.Worker passes against the EC2 fake and count the changing
// calls naming each such interface: there must be none.

// newTypedScen is newScen with an instance of type typ in a /22, and the
// pool's IPv6 family v6 (none when nil).
func newTypedScen(t *testing.T, typ string, spec alloc.CloudSpec, v6 *alloc.PoolFamily) *scen {
	t.Helper()
	return &scen{buildWorld(t, typ, netip.MustParsePrefix("10.90.0.0/22"), spec, v6, nil)}
}

// attachForeign attaches an interface the workers did not create.
func (x *scen) attachForeign(t *testing.T, device int, typ string, tags map[string]string, addrs int) string {
	t.Helper()
	id, err := x.fake.AttachTypedInterface(ec2fake.TypedInterface{Instance: x.inst, Subnet: scenSubnet, Device: device, Type: typ, Tags: tags, Addresses: addrs})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// untouched fails the test when a changing call named one of ids, or one
// of ids is no longer attached, or holds other addresses than it did.
func (x *scen) untouched(t *testing.T, held map[string][]netip.Addr) {
	t.Helper()
	for id, was := range held {
		if n := x.fake.Changes(id); n != 0 {
			t.Errorf("%d changing calls on %s, not the workers'", n, id)
		}
		now, _ := x.fake.Held(id)
		if !slices.Equal(now, was) {
			t.Errorf("%s holds %v, it held %v", id, now, was)
		}
		for _, f := range x.fake.Interfaces() {
			if f.ID == id && (f.Instance != x.inst || f.Status != "in-use") {
				t.Errorf("%s is %s on %q", id, f.Status, f.Instance)
			}
		}
	}
}

// TestScenarioUnmanagedInterfacesGetNoPodAddresses: on a c5.xlarge
// holding a trunk, an EFA with 3 addresses and an interface tagged
// no_manage=true with 3, a pre-allocation of 12 goes on the primary
// interface (the only one that is the workers'); the others' addresses
// are never recorded for Pods nor leased, and no call names them.
// Before, their 6 addresses counted as the node's and Pods leased them.
func TestScenarioUnmanagedInterfacesGetNoPodAddresses(t *testing.T) {
	x := newTypedScen(t, "c5.xlarge", alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 12}}, nil)
	foreign := map[string][]netip.Addr{}
	for _, id := range []string{
		x.attachForeign(t, 1, "trunk", nil, 0),
		x.attachForeign(t, 2, "efa", map[string]string{cloud.TagCluster: "test"}, 3),
		x.attachForeign(t, 3, "", map[string]string{cloud.TagNoManage: "true"}, 3),
	} {
		foreign[id], _ = x.fake.Held(id)
	}
	for range 3 {
		x.pass(t)
		x.clock.Advance(time.Minute)
	}
	own, _ := x.fake.Held(x.eni0)
	if len(own) != 12 {
		t.Fatalf("the primary interface holds %d addresses, want the 12 pre-allocated", len(own))
	}
	for _, b := range x.nodeBlocks(t, "eni")["n1"] {
		if !slices.Contains(own, b.Addr()) {
			t.Errorf("block %s recorded for Pods is not the primary interface's", b)
		}
	}
	for i := range 12 {
		a, err := x.lease(t, "c"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(own, a) {
			t.Fatalf("a Pod leased %s, not an address of the primary interface", a)
		}
	}
	x.untouched(t, foreign)
}

// TestScenarioUserInterfaceNeverDetached: sized by WARM_ENI_TARGET=1, a
// c5.xlarge node with a user's interface at device 3 scales up to 30
// Pods on interfaces of its own (devices 1 and 2) and back down to one:
// the surplus interface detached is the workers', never the user's, and
// no call names the user's. Before, the user's interface got the node's
// addresses, then was the one detached.
func TestScenarioUserInterfaceNeverDetached(t *testing.T) {
	x := newTypedScen(t, "c5.xlarge", alloc.CloudSpec{Provider: alloc.CloudAWS, WarmTargets: &alloc.WarmTargets{WarmENI: 1}, ReleaseDelay: time.Minute}, nil)
	user, err := x.fake.AttachInterface(x.inst, scenSubnet, 3)
	if err != nil {
		t.Fatal(err)
	}
	foreign := map[string][]netip.Addr{user: nil}
	var pods []string
	for range 8 {
		x.pass(t)
		for len(pods) < 30 {
			c := "c" + strconv.Itoa(len(pods))
			if _, err := x.lease(t, c); err != nil {
				break
			}
			pods = append(pods, c)
		}
	}
	if len(pods) != 30 {
		t.Fatalf("%d Pods served, want 30", len(pods))
	}
	for _, c := range pods[1:] {
		x.release(t, c)
	}
	x.cooledAndPurged(t)
	for range 5 {
		x.clock.Advance(time.Minute)
		x.pass(t)
	}
	if n := x.fake.Calls("DetachNetworkInterface"); n != 1 {
		t.Fatalf("%d detaches, want 1 (the workers' interface in surplus)", n)
	}
	for _, f := range x.fake.Interfaces() {
		if f.Status == "detaching" && f.Tags[cloud.TagCluster] != "test" {
			t.Fatalf("detaching %s, not the workers'", f.ID)
		}
	}
	x.untouched(t, foreign)
}

// TestScenarioIPv6InterfaceNeverDetached: a dual-stack pool from the
// first interface index 1 on a c5.xlarge (WARM_ENI_TARGET=1): the node's
// IPv6 /80 is delegated to its first interface for Pods (device 1), and
// devices 2 and 3 come as 30 Pods arrive. When one Pod remains on each of
// devices 2 and 3, device 1 is the interface in surplus with no IPv4
// address in use, but every Pod's IPv6 address is in its /80: it stays
// attached, and the Pods' IPv6 addresses with it. Before, it was
// detached.
func TestScenarioIPv6InterfaceNeverDetached(t *testing.T) {
	v6 := &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("2600:1f18:aaaa:bb00::/56")}, MaskSize: 96}
	x := newTypedScen(t, "c5.xlarge", alloc.CloudSpec{Provider: alloc.CloudAWS, WarmTargets: &alloc.WarmTargets{WarmENI: 1},
		FirstInterfaceIndex: 1, ReleaseDelay: time.Minute}, v6)
	x.fake.AddSubnetIPv6(scenSubnet, netip.MustParsePrefix("2600:1f18:aaaa:bb01::/64"))
	leased := map[string]netip.Addr{}
	for range 8 {
		x.pass(t)
		for len(leased) < 30 {
			c := "c" + strconv.Itoa(len(leased))
			a, err := x.lease(t, c)
			if err != nil {
				break
			}
			leased[c] = a
		}
	}
	byDevice := map[int]string{}
	for _, f := range x.fake.Interfaces() {
		if f.Instance == x.inst {
			byDevice[f.Device] = f.ID
		}
	}
	if len(leased) != 30 || len(byDevice) != 4 {
		t.Fatalf("%d Pods on interfaces %v, want 30 on 4", len(leased), byDevice)
	}
	inst, err := x.provider.Instance(t.Context(), x.inst)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range inst.Interfaces {
		if f.ID == byDevice[1] && len(f.IPv6Prefixes) != 1 {
			t.Fatalf("device 1 (%s) holds IPv6 prefixes %v, want the node's /80", f.ID, f.IPv6Prefixes)
		}
	}
	// One Pod stays on each of devices 2 and 3; none on device 1.
	kept := map[int]bool{}
	for _, c := range slices.Sorted(maps.Keys(leased)) {
		device := -1
		for d, id := range byDevice {
			if held, _ := x.fake.Held(id); slices.Contains(held, leased[c]) {
				device = d
			}
		}
		if (device == 2 || device == 3) && !kept[device] {
			kept[device] = true
			continue
		}
		x.release(t, c)
	}
	if !kept[2] || !kept[3] {
		t.Fatalf("Pods kept on devices %v, want 2 and 3", kept)
	}
	x.cooledAndPurged(t)
	for range 5 {
		x.clock.Advance(time.Minute)
		x.pass(t)
	}
	for _, f := range x.fake.Interfaces() {
		if f.ID == byDevice[1] && (f.Status != "in-use" || f.Instance != x.inst) {
			t.Fatalf("the interface holding the node's IPv6 /80 is %s on %q", f.Status, f.Instance)
		}
	}
	if n := x.fake.Calls("DetachNetworkInterface"); n != 0 {
		t.Fatalf("%d detaches, want none", n)
	}
}
