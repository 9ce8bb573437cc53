// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"slices"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

func onNetwork(r alloc.LeaseRequest, network string) alloc.LeaseRequest {
	r.Attachment.Network = network
	return r
}

// A reconcile of one CNI network releases only that network's leases: the
// GC of network "cmp" with an empty valid list once freed network
// "labnet"'s live addresses, which were then leased again (duplicate
// addresses on one node).
func TestReconcileIsScopedToItsNetwork(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.ReconcileMinAge = 0 })
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	lab := f.allocate(onNetwork(req("node-a", "lab-1"), "labnet"))
	f.allocate(onNetwork(req("node-a", "cmp-1"), "cmp"))
	unnamed := f.allocate(req("node-a", "plain"))

	released, err := f.s.Reconcile(f.ctx, alloc.DefaultSpace, "node-a", "cmp", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(released) != 1 || released[0].Attachment != (alloc.Attachment{Network: "cmp", ContainerID: "cmp-1", Interface: "eth0"}) {
		t.Fatalf("GC of cmp released %+v, want cmp's lease only", released)
	}
	for _, a := range []alloc.Allocation{lab, unnamed} {
		got, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", a.Attachment)
		if err != nil || got.Leases[0].Addr != a.Leases[0].Addr {
			t.Fatalf("%+v after cmp's GC: %+v %v", a.Attachment, got, err)
		}
	}
	// The unnamed network is reconciled by reconciles without a network.
	if released, err := f.s.Reconcile(f.ctx, alloc.DefaultSpace, "node-a", "", nil); err != nil || len(released) != 1 ||
		released[0].Attachment.ContainerID != "plain" {
		t.Fatalf("reconcile of the unnamed network released %+v, %v", released, err)
	}
	// A valid list naming another network's attachment is refused.
	if _, err := f.s.Reconcile(f.ctx, alloc.DefaultSpace, "node-a", "cmp", []alloc.Attachment{lab.Attachment}); !alloc.IsKind(err, alloc.KindInvalid) {
		t.Fatalf("mixed networks: %v", err)
	}
	if got, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", lab.Attachment); err != nil || len(got.Leases) != 1 {
		t.Fatalf("labnet after the refused reconcile: %+v %v", got, err)
	}
}

// The attachment key includes the network, as the CNI specification's
// (network, container ID, interface): the same container and interface on
// two networks hold two leases, and each network's release, confirm and
// lookup see their own.
func TestAttachmentKeyIncludesNetwork(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	a := f.allocate(onNetwork(req("node-a", "c1"), "net-a"))
	b := f.allocate(onNetwork(req("node-a", "c1"), "net-b"))
	if !a.Created || !b.Created || a.Leases[0].Addr == b.Leases[0].Addr {
		t.Fatalf("two networks of one container: %+v %+v", a, b)
	}
	if again := f.allocate(onNetwork(req("node-a", "c1"), "net-a")); again.Created || again.Leases[0].Addr != a.Leases[0].Addr {
		t.Fatalf("retry on net-a: %+v", again)
	}
	if _, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", alloc.Attachment{ContainerID: "c1", Interface: "eth0"}); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("the unnamed network's c1/eth0: %v", err)
	}
	if c, err := f.s.Confirm(f.ctx, alloc.DefaultSpace, "node-a", a.Attachment); err != nil || c.State != alloc.StateActive {
		t.Fatalf("confirm net-a: %+v %v", c, err)
	}
	if got, _ := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", b.Attachment); got.State != alloc.StatePending {
		t.Fatalf("confirming net-a confirmed net-b: %+v", got)
	}
	released, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "node-a", b.Attachment)
	if err != nil || len(released) != 1 || released[0].Addr != b.Leases[0].Addr || released[0].Attachment.Network != "net-b" {
		t.Fatalf("release net-b: %+v %v", released, err)
	}
	if _, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", a.Attachment); err != nil {
		t.Fatalf("releasing net-b released net-a: %v", err)
	}
	if _, err := f.s.ReleaseAttachmentAt(f.ctx, alloc.DefaultSpace, "node-a", alloc.Attachment{Network: "net-b", ContainerID: "c1", Interface: "eth0"}, a.Generation); err != nil {
		t.Fatalf("release net-b at net-a's generation: %v", err)
	}
	if _, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", a.Attachment); err != nil {
		t.Fatalf("releasing net-b at a generation released net-a: %v", err)
	}
	bad := onNetwork(req("node-a", "c2"), "-bad")
	if _, err := f.s.Allocate(f.ctx, bad); !alloc.IsKind(err, alloc.KindInvalid) {
		t.Fatalf("network %q: %v", bad.Attachment.Network, err)
	}
}

// A reserve attachment's leases are handed over to a Pod's attachment in
// place: same addresses, the Pod's owner, a new generation, and the
// history shows the reserve letting go and the Pod leasing.
func TestHandOverFromReserve(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.244.0.0/16"), IPv6: fam(120, "fd00::/104"), NodeLocal: alloc.DefaultNodeLocal})
	slotReq := onNetwork(req("node-a", "reserve-0"), "net")
	slotReq.Owner = alloc.Owner{Namespace: "cni-reserve", Name: "net"}
	slotReq.Attachment.Interface = "reserve"
	slotReq.Expire = false
	slot := f.allocate(slotReq)
	if len(slot.Leases) != 2 {
		t.Fatalf("slot %+v", slot)
	}
	other := f.allocate(onNetwork(req("node-a", "other"), "net"))

	pod := onNetwork(req("node-a", "pod-1"), "net")
	pod.Expire = false
	pod.FromReserve = &alloc.ReserveHandover{ContainerID: "reserve-0", Interface: "reserve", Generation: slot.Generation + 1}
	if _, err := f.s.Allocate(f.ctx, pod); !alloc.IsKind(err, alloc.KindStaleGeneration) {
		t.Fatalf("handover of another generation: %v", err)
	}
	pod.FromReserve.Generation = slot.Generation
	got, err := f.s.Allocate(f.ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	addrs := func(a alloc.Allocation) []string {
		var out []string
		for _, l := range a.Leases {
			out = append(out, l.Addr.String())
		}
		return out
	}
	if !got.Created || !slices.Equal(addrs(got), addrs(slot)) || got.Owner != pod.Owner || got.State != alloc.StateActive ||
		got.Generation <= other.Generation || got.Leases[0].Generation != got.Leases[1].Generation {
		t.Fatalf("handed over %+v, want the slot's addresses %v, the pod's owner, active, one new generation", got, addrs(slot))
	}
	if _, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", slot.Attachment); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("the slot after the handover: %v", err)
	}
	// A retry answers the same leases.
	again, err := f.s.Allocate(f.ctx, pod)
	if err != nil || again.Created || !slices.Equal(addrs(again), addrs(slot)) {
		t.Fatalf("retry: %+v %v", again, err)
	}
	// The history of the address: leased by the slot, released by it
	// (handed over, still active), leased by the pod.
	events, _, err := f.s.History(f.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Address: slot.Leases[0].Addr}, alloc.Page{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var trail []string
	for _, e := range events {
		trail = append(trail, string(e.Kind)+":"+e.Attachment.Network+"/"+e.Attachment.ContainerID+":"+e.State+":"+e.Reason)
	}
	want := []string{"lease:net/reserve-0:active:default", "release:net/reserve-0:active:handed-over", "lease:net/pod-1:active:from-reserve"}
	if !slices.Equal(trail, want) {
		t.Fatalf("history %v, want %v", trail, want)
	}
	// A pod whose attachment held leases of an ADD whose answer was lost
	// takes the reserve address; its own leases are released.
	slot2Req := slotReq
	slot2Req.Attachment.ContainerID = "reserve-1"
	slot2 := f.allocate(slot2Req)
	lost := f.allocate(onNetwork(req("node-a", "pod-2"), "net"))
	pod2 := onNetwork(req("node-a", "pod-2"), "net")
	pod2.FromReserve = &alloc.ReserveHandover{ContainerID: "reserve-1", Interface: "reserve", Generation: slot2.Generation}
	got2, err := f.s.Allocate(f.ctx, pod2)
	if err != nil || !slices.Equal(addrs(got2), addrs(slot2)) || got2.State != alloc.StatePending {
		t.Fatalf("handover over a lost ADD: %+v %v", got2, err)
	}
	if l, err := f.s.GetAddress(f.ctx, alloc.DefaultSpace, lost.Leases[0].Addr); err != nil || l.State != alloc.StateCooling {
		t.Fatalf("the lost ADD's lease: %+v %v", l, err)
	}
	// Nothing held by either side: not found.
	pod3 := onNetwork(req("node-a", "pod-3"), "net")
	pod3.FromReserve = &alloc.ReserveHandover{ContainerID: "reserve-9", Interface: "reserve", Generation: 1}
	if _, err := f.s.Allocate(f.ctx, pod3); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("handover of an empty slot: %v", err)
	}
	// Another network's slot of the same name is not this network's.
	slot3Req := slotReq
	slot3Req.Attachment.ContainerID = "reserve-2"
	slot3 := f.allocate(slot3Req)
	pod3.Attachment.Network = "elsewhere"
	pod3.FromReserve = &alloc.ReserveHandover{ContainerID: "reserve-2", Interface: "reserve", Generation: slot3.Generation}
	if _, err := f.s.Allocate(f.ctx, pod3); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("handover across networks: %v", err)
	}
	if _, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", slot3.Attachment); err != nil {
		t.Fatalf("net's slot after another network's handover: %v", err)
	}
	if r := f.check(); len(r.Findings) != 0 {
		t.Fatalf("inconsistent: %+v", r)
	}
}
