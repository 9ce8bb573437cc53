// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// TestCloudPool: a cloud pool carves nothing, inline, by the top-up or on
// request; its nodes lease only the addresses the cloud gave them, every
// address of a recorded /32 and /28, and its spec round-trips.
func TestCloudPool(t *testing.T) {
	f := newFixture(t, nil)
	cloud := &alloc.CloudSpec{Provider: alloc.CloudAWS, Prefixes: true, SubnetIDs: []string{"subnet-0123456789abcdef0"},
		WarmTargets: &alloc.WarmTargets{WarmPrefix: 1}, ReleaseDelay: time.Minute}
	p := f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.70.0.0/16"), NodeLocal: alloc.DefaultNodeLocal, Cloud: cloud})
	if p.Spec.Cloud == nil || p.Spec.Cloud.Provider != alloc.CloudAWS || p.Spec.Cloud.WarmTargets.WarmPrefix != 1 ||
		p.Spec.Cloud.ReleaseDelay != time.Minute || p.Spec.Cloud.SubnetIDs[0] != "subnet-0123456789abcdef0" {
		t.Fatalf("spec.cloud read back as %+v", p.Spec.Cloud)
	}
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "n1", ProviderID: "aws:///eu-west-1a/i-0123456789abcdef0"}); err != nil {
		t.Fatal(err)
	}
	_, err := f.s.Allocate(f.ctx, req("n1", "c0"))
	e := wantKind(t, err, alloc.KindPoolExhausted)
	if e.Pool != "default" {
		t.Fatalf("problem %+v", e)
	}
	if _, err := f.s.CarveBlock(f.ctx, alloc.DefaultSpace, "n1", "default", alloc.IPv4); err == nil {
		t.Fatal("a cloud pool carved on request")
	}
	if n := f.count(`SELECT count(*) FROM blocks`); n != 0 {
		t.Fatalf("%d blocks carved in a cloud pool", n)
	}
	recorded := []netip.Prefix{netip.MustParsePrefix("10.70.0.5/32"), netip.MustParsePrefix("10.70.1.16/28")}
	if err := f.s.RecordCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", "eni-0123", recorded); err != nil {
		t.Fatal(err)
	}
	// A retry records nothing twice.
	if err := f.s.RecordCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", "eni-0123", recorded[:1]); err != nil {
		t.Fatal(err)
	}
	got := map[netip.Addr]bool{}
	for i := range 17 {
		a := f.allocate(req("n1", "c"+string(rune('a'+i))))
		addr := a.Leases[0].Addr
		if got[addr] || !(recorded[0].Contains(addr) || recorded[1].Contains(addr)) {
			t.Fatalf("lease %d: %v (held %v)", i, addr, got)
		}
		got[addr] = true
	}
	// The network and broadcast addresses of the /28 are Pod addresses too.
	for _, a := range []string{"10.70.1.16", "10.70.1.31", "10.70.0.5"} {
		if !got[netip.MustParseAddr(a)] {
			t.Errorf("%s was not leased", a)
		}
	}
	_, err = f.s.Allocate(f.ctx, req("n1", "c-18th"))
	wantKind(t, err, alloc.KindPoolExhausted)
	if n := f.count(`SELECT count(*) FROM blocks WHERE source = 'cloud' AND cloud_interface = 'eni-0123'`); n != 2 {
		t.Fatalf("%d cloud blocks, want 2", n)
	}
	if n := f.count(`SELECT count(*) FROM address_events WHERE kind = 'block-adopt' AND pool = 'default'`); n != 2 {
		t.Fatalf("%d block-adopt events, want 2", n)
	}
}

func TestRecordCloudBlocksRefusals(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.71.0.0/16"), NodeLocal: alloc.DefaultNodeLocal, Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS}})
	f.pool("carved", alloc.PoolSpec{IPv4: fam(28, "10.72.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	for _, n := range []string{"n1", "n2"} {
		if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	one := []netip.Prefix{netip.MustParsePrefix("10.71.0.9/32")}
	for _, c := range []struct {
		name            string
		node, pool, nic string
		prefixes        []netip.Prefix
		kind            alloc.Kind
	}{
		{"outside the pool's CIDRs", "n1", "default", "eni-1", []netip.Prefix{netip.MustParsePrefix("10.99.0.1/32")}, alloc.KindInvalid},
		{"no interface", "n1", "default", "", one, alloc.KindInvalid},
		{"a pool that carves", "n1", "carved", "eni-1", []netip.Prefix{netip.MustParsePrefix("10.72.0.1/32")}, alloc.KindInvalid},
		{"an unknown node", "n9", "default", "eni-1", one, alloc.KindNotFound},
		{"IPv6", "n1", "default", "eni-1", []netip.Prefix{netip.MustParsePrefix("fd00::1/128")}, alloc.KindInvalid},
	} {
		err := f.s.RecordCloudBlocks(f.ctx, alloc.DefaultSpace, c.node, c.pool, c.nic, c.prefixes)
		var ae *alloc.Error
		if !errors.As(err, &ae) || ae.Kind != c.kind {
			t.Errorf("%s: %v, want %s", c.name, err, c.kind)
		}
	}
	// Another node's address: an overlap, and the batch records nothing.
	if err := f.s.RecordCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", "eni-1", one); err != nil {
		t.Fatal(err)
	}
	err := f.s.RecordCloudBlocks(f.ctx, alloc.DefaultSpace, "n2", "default", "eni-2", []netip.Prefix{netip.MustParsePrefix("10.71.0.10/32"), one[0]})
	wantKind(t, err, alloc.KindOverlap)
	if n := f.count(`SELECT count(*) FROM blocks`); n != 1 {
		t.Fatalf("%d blocks after a refused batch, want 1", n)
	}
}

func TestCloudPoolImmutable(t *testing.T) {
	f := newFixture(t, nil)
	spec := alloc.PoolSpec{IPv4: fam(28, "10.73.0.0/16"), NodeLocal: alloc.DefaultNodeLocal, Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS}}
	f.pool("cloudy", spec)
	f.pool("carving", alloc.PoolSpec{IPv4: fam(28, "10.74.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	azure := spec
	azure.Cloud = &alloc.CloudSpec{Provider: alloc.CloudAzure}
	_, err := f.s.UpdatePool(f.ctx, alloc.DefaultSpace, "cloudy", nil, azure)
	if e := wantKind(t, err, alloc.KindImmutable); e.Field != "spec.cloud.provider" {
		t.Fatalf("field %s", e.Field)
	}
	none := spec
	none.Cloud = nil
	_, err = f.s.UpdatePool(f.ctx, alloc.DefaultSpace, "cloudy", nil, none)
	if e := wantKind(t, err, alloc.KindImmutable); e.Field != "spec.cloud" {
		t.Fatalf("field %s", e.Field)
	}
	_, err = f.s.UpdatePool(f.ctx, alloc.DefaultSpace, "carving", nil, alloc.PoolSpec{IPv4: fam(28, "10.74.0.0/16"), NodeLocal: alloc.DefaultNodeLocal, Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS}})
	wantKind(t, err, alloc.KindImmutable)
	// Its other settings change.
	more := spec
	more.Cloud = &alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 16}}
	p, err := f.s.UpdatePool(f.ctx, alloc.DefaultSpace, "cloudy", nil, more)
	if err != nil || p.Spec.Cloud.Watermarks == nil || p.Spec.Cloud.Watermarks.PreAllocate != 16 {
		t.Fatalf("update: %+v, %v", p.Spec.Cloud, err)
	}
}

// cloudFixture is a cloud pool with node n1 holding 10.75.0.5/32,
// 10.75.0.6/32 and 10.75.1.16/28 on eni-1.
func cloudFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.75.0.0/16"), NodeLocal: alloc.DefaultNodeLocal, Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS}})
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "n1", ProviderID: "aws:///eu-west-1a/i-0123456789abcdef0"}); err != nil {
		t.Fatal(err)
	}
	if err := f.s.RecordCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", "eni-1", prefixes("10.75.0.5/32", "10.75.0.6/32", "10.75.1.16/28")); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestDrainCloudBlocks: only a block without a lease row drains; a
// drained block is leased no more; it is restored, or dropped, and a block
// not drained is never dropped.
func TestDrainCloudBlocks(t *testing.T) {
	f := cloudFixture(t)
	// The lowest address first: 10.75.0.5 is leased.
	if a := f.allocate(req("n1", "c1")); a.Leases[0].Addr != netip.MustParseAddr("10.75.0.5") {
		t.Fatalf("leased %v", a.Leases[0].Addr)
	}
	all := prefixes("10.75.0.5/32", "10.75.0.6/32", "10.75.1.16/28")
	drained, err := f.s.DrainCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", all)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(drained, all[1:]) {
		t.Fatalf("drained %v, want %v", drained, all[1:])
	}
	_, err = f.s.Allocate(f.ctx, req("n1", "c2"))
	wantKind(t, err, alloc.KindPoolExhausted)
	err = f.s.DropCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", all)
	wantKind(t, err, alloc.KindInUse)
	if n := f.count(`SELECT count(*) FROM blocks`); n != 3 {
		t.Fatalf("a refused drop left %d blocks", n)
	}
	if err := f.s.RestoreCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", all[2:]); err != nil {
		t.Fatal(err)
	}
	if a := f.allocate(req("n1", "c2")); !all[2].Contains(a.Leases[0].Addr) {
		t.Fatalf("after the restore, leased %v", a.Leases[0].Addr)
	}
	if err := f.s.DropCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", all[1:2]); err != nil {
		t.Fatal(err)
	}
	nodes, err := f.s.CloudNodes(f.ctx, alloc.DefaultSpace, "default")
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || len(nodes[0].Blocks) != 2 || nodes[0].Blocks[0].Prefix != all[0] || nodes[0].Blocks[0].Interface != "eni-1" ||
		nodes[0].Blocks[0].Drained || len(nodes[0].Used) != 2 || nodes[0].ProviderID == "" {
		t.Fatalf("cloud nodes %+v", nodes)
	}
}

// TestDrainRacesALease: a lease in flight on a block holds its row; the
// drain waits for it, reads the block again, and leaves it.
func TestDrainRacesALease(t *testing.T) {
	f := cloudFixture(t)
	tx := f.otherTx(t)
	if _, err := tx.Exec(f.ctx, `UPDATE blocks SET allocated = allocated + 1 WHERE cidr = '10.75.0.6/32'`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		drained []netip.Prefix
		err     error
	}
	done := make(chan result, 1)
	go func() {
		d, err := f.s.DrainCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", prefixes("10.75.0.6/32"))
		done <- result{d, err}
	}()
	for f.count(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%SET capacity = 0%'`) == 0 {
		select {
		case r := <-done:
			t.Fatalf("the drain did not wait for the lease in flight: %+v", r)
		default:
		}
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || len(r.drained) != 0 {
		t.Fatalf("drained %v, %v: a block a lease took was drained", r.drained, r.err)
	}
}

func TestCloudNodes(t *testing.T) {
	f := cloudFixture(t)
	for _, n := range []alloc.Node{
		{Space: alloc.DefaultSpace, Name: "n2", ProviderID: "aws:///eu-west-1b/i-0fedcba987654321"},
		{Space: alloc.DefaultSpace, Name: "n3", ProviderID: "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm"},
		{Space: alloc.DefaultSpace, Name: "n4"},
	} {
		if _, _, err := f.s.PutNode(f.ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	nodes, err := f.s.CloudNodes(f.ctx, alloc.DefaultSpace, "default")
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes[0].Name != "n1" || nodes[1].Name != "n2" || len(nodes[0].Blocks) != 3 || len(nodes[1].Blocks) != 0 {
		t.Fatalf("cloud nodes %+v", nodes)
	}
	f.pool("carved", alloc.PoolSpec{IPv4: fam(28, "10.76.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	_, err = f.s.CloudNodes(f.ctx, alloc.DefaultSpace, "carved")
	wantKind(t, err, alloc.KindInvalid)
	_, err = f.s.CloudNodes(f.ctx, alloc.DefaultSpace, "none")
	wantKind(t, err, alloc.KindNotFound)
}

// TestWithCloudLock: while one replica's pass runs, another's is
// skipped; after it, the lock is free.
func TestWithCloudLock(t *testing.T) {
	f := newFixture(t, nil)
	inner := false
	ran, err := f.s.WithCloudLock(f.ctx, func(ctx context.Context) error {
		ran, err := f.s.WithCloudLock(ctx, func(context.Context) error { inner = true; return nil })
		if err != nil || ran {
			t.Errorf("a second pass while the first runs: ran %v, %v", ran, err)
		}
		return nil
	})
	if err != nil || !ran || inner {
		t.Fatalf("ran %v inner %v: %v", ran, inner, err)
	}
	if ran, err := f.s.WithCloudLock(f.ctx, func(context.Context) error { return nil }); err != nil || !ran {
		t.Fatalf("the lock was not given back: ran %v, %v", ran, err)
	}
}

// TestCloudNodesCooledAreFree: a released address counts as used while it
// cools down and as free once its cooldown ended (it is leasable again at
// once), yet its row still keeps its block from draining until the purge.
// Counted used, every Pod replacement under WARM_IP_TARGET made the
// workers assign an address and later give one back
// (amazon-vpc-cni-k8s#730).
func TestCloudNodesCooledAreFree(t *testing.T) {
	f := cloudFixture(t)
	a := f.allocate(req("n1", "c1")).Leases[0].Addr
	used := func() []netip.Addr {
		t.Helper()
		nodes, err := f.s.CloudNodes(f.ctx, alloc.DefaultSpace, "default")
		if err != nil {
			t.Fatal(err)
		}
		return nodes[0].Used
	}
	if u := used(); !slices.Equal(u, []netip.Addr{a}) {
		t.Fatalf("leased: used %v", u)
	}
	if _, err := f.s.ReleaseAddress(f.ctx, alloc.DefaultSpace, a); err != nil {
		t.Fatal(err)
	}
	if u := used(); !slices.Equal(u, []netip.Addr{a}) {
		t.Fatalf("cooling: used %v", u)
	}
	f.clock.Advance(f.opts.Cooldown)
	if u := used(); len(u) != 0 {
		t.Fatalf("cooled: used %v, want none", u)
	}
	drained, err := f.s.DrainCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", []netip.Prefix{netip.PrefixFrom(a, 32)})
	if err != nil || len(drained) != 0 {
		t.Fatalf("a block with a cooled row drained: %v, %v", drained, err)
	}
}

// TestCloudNodesReserved: addresses a CiliumNode's pool reserves from the
// node's cloud blocks are Reserved, not Used (the cloud's sizing counts
// them free), and their blocks never drain; a Pod's lease is Used.
func TestCloudNodesReserved(t *testing.T) {
	f := cloudFixture(t)
	reserved, err := f.s.ReserveNodeAddresses(f.ctx, alloc.DefaultSpace, "n1", nil, "default", alloc.IPv4, 2)
	if err != nil || len(reserved) != 2 {
		t.Fatalf("reserved %v, %v", reserved, err)
	}
	leased := f.allocate(req("n1", "c1")).Leases[0].Addr
	nodes, err := f.s.CloudNodes(f.ctx, alloc.DefaultSpace, "default")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{reserved[0].Addr, reserved[1].Addr}
	if n := nodes[0]; !slices.Equal(n.Used, []netip.Addr{leased}) || !slices.Equal(n.Reserved, want) {
		t.Fatalf("used %v, reserved %v; want [%v] and %v", n.Used, n.Reserved, leased, want)
	}
	var blocks []netip.Prefix
	for _, a := range want {
		blocks = append(blocks, netip.PrefixFrom(a, 32))
	}
	if drained, err := f.s.DrainCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", blocks); err != nil || len(drained) != 0 {
		t.Fatalf("reserved blocks drained: %v, %v", drained, err)
	}
}

// TestSetCiliumNodeProviderID: a CiliumNode's providerID is recorded only
// when its labels select a cloud pool of that cloud; then the pool's
// CloudNodes list it.
func TestSetCiliumNodeProviderID(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.80.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	f.pool("eni", alloc.PoolSpec{IPv4: fam(28, "10.81.0.0/16"), NodeLocal: alloc.DefaultNodeLocal, Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS},
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "eni"}}})
	for _, n := range []string{"n1", "n2"} {
		if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: n}); err != nil {
			t.Fatal(err)
		}
	}
	onENI := map[string]string{"pool": "eni"}
	for _, c := range []struct {
		name, node string
		labels     map[string]string
		providerID string
		want       bool
	}{
		{"a node of a carved pool", "n2", nil, "aws:///eu-west-1a/i-2", false},
		{"a node of the cloud pool, another cloud's id", "n1", onENI, "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm", false},
		{"a node the store does not know", "n3", onENI, "aws:///eu-west-1a/i-3", false},
		{"a node of the cloud pool", "n1", onENI, "aws:///eu-west-1a/i-1", true},
		{"again: nothing changes", "n1", onENI, "aws:///eu-west-1a/i-1", true},
	} {
		got, err := f.s.SetCiliumNodeProviderID(f.ctx, alloc.DefaultSpace, c.node, c.labels, "", c.providerID, PodInterfaces{})
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	nodes, err := f.s.CloudNodes(f.ctx, alloc.DefaultSpace, "eni")
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].Name != "n1" || nodes[0].ProviderID != "aws:///eu-west-1a/i-1" {
		t.Fatalf("cloud nodes %+v, want n1 alone", nodes)
	}
	if pi := nodes[0].PodInterfaces; pi.FirstIndex != nil || pi.ExcludeTags != nil {
		t.Fatalf("a node that says nothing of its interfaces: %+v", pi)
	}
	// The CiliumNode's spec.eni, recorded with the providerID and changed
	// with it, then unset again.
	first := 1
	for _, pi := range []PodInterfaces{
		{FirstIndex: &first, ExcludeTags: map[string]string{"no-pods": "true"}},
		{ExcludeTags: map[string]string{"role": "system", "team": "net"}},
		{},
	} {
		if _, err := f.s.SetCiliumNodeProviderID(f.ctx, alloc.DefaultSpace, "n1", onENI, "", "aws:///eu-west-1a/i-1", pi); err != nil {
			t.Fatal(err)
		}
		nodes, err = f.s.CloudNodes(f.ctx, alloc.DefaultSpace, "eni")
		if err != nil || len(nodes) != 1 || !reflect.DeepEqual(nodes[0].PodInterfaces, pi) {
			t.Fatalf("recorded %+v; read back %+v, %v", pi, nodes, err)
		}
	}
	negative := -1
	if _, err := f.s.SetCiliumNodeProviderID(f.ctx, alloc.DefaultSpace, "n1", onENI, "", "aws:///eu-west-1a/i-1", PodInterfaces{FirstIndex: &negative}); !alloc.IsKind(err, alloc.KindInvalid) {
		t.Fatalf("a negative first interface index: %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("a", 513), "aws:///z/i-1\n"} {
		_, err := f.s.SetCiliumNodeProviderID(f.ctx, alloc.DefaultSpace, "n1", onENI, "", bad, PodInterfaces{})
		if e := wantKind(t, err, alloc.KindInvalid); e.Field != "providerID" {
			t.Errorf("%q: refused naming %q", bad, e.Field)
		}
	}
}

// TestCloudPoolIPv6: an AWS pool with IPv6 CIDRs records the first /96 of
// a delegated /80 as the node's IPv6 block and leases dual-stack from the
// cloud's addresses; a /80 itself, or an IPv6 block outside the pool, is
// refused without recording anything.
func TestCloudPoolIPv6(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.76.0.0/16"), IPv6: fam(96, "2600:1f18:aaaa:bb00::/56"),
		NodeLocal: alloc.DefaultNodeLocal, Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS}})
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "n1"}); err != nil {
		t.Fatal(err)
	}
	pools, err := f.s.CloudPools(f.ctx)
	if err != nil || len(pools) != 1 || !pools[0].IPv6 {
		t.Fatalf("cloud pools %+v, %v; want one taking IPv6", pools, err)
	}
	for _, c := range []struct {
		name   string
		prefix string
	}{
		{"a whole /80", "2600:1f18:aaaa:bb01:1::/80"},
		{"outside the pool", "2600:1f18:aaaa:cc01:1::/96"},
	} {
		err := f.s.RecordCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", "eni-1", prefixes("10.76.0.5/32", c.prefix))
		wantKind(t, err, alloc.KindInvalid)
		if n := f.count(`SELECT count(*) FROM blocks`); n != 0 {
			t.Fatalf("%s: %d blocks recorded", c.name, n)
		}
	}
	v6 := netip.MustParsePrefix("2600:1f18:aaaa:bb01:1::/96")
	if err := f.s.RecordCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "default", "eni-1", prefixes("10.76.0.5/32", v6.String())); err != nil {
		t.Fatal(err)
	}
	a := f.allocate(req("n1", "c1", alloc.IPv4, alloc.IPv6))
	got := map[alloc.Family]netip.Addr{}
	for _, l := range a.Leases {
		got[l.Family] = l.Addr
	}
	if got[alloc.IPv4] != netip.MustParseAddr("10.76.0.5") || got[alloc.IPv6] != v6.Addr() {
		t.Fatalf("leased %v; want 10.76.0.5 and %v", got, v6.Addr())
	}
	b := f.allocate(req("n1", "c2", alloc.IPv6))
	if b.Leases[0].Addr != v6.Addr().Next() {
		t.Fatalf("second IPv6 lease %v, want %v", b.Leases[0].Addr, v6.Addr().Next())
	}
	if n := f.count(`SELECT count(*) FROM blocks WHERE family = 6 AND source = 'cloud' AND capacity = 4294967296`); n != 1 {
		t.Fatalf("%d IPv6 cloud blocks of 2^32 addresses, want 1", n)
	}
	// The /56 holds 2^40 blocks of /96: the counts saturate, and the
	// usage sample (whose capacity must be >= 0) is taken.
	if n, err := f.s.SampleUsage(f.ctx, time.Minute); err != nil || n != 2 {
		t.Fatalf("usage samples: %d, %v; want 2", n, err)
	}
	c, err := f.s.PoolCapacity(f.ctx, alloc.DefaultSpace, "default", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if c[alloc.IPv6].BlocksPossible != 1<<40 || c[alloc.IPv6].AddressesPossible != math.MaxInt64 || c[alloc.IPv6].Leased != 2 {
		t.Fatalf("IPv6 capacity %+v", c[alloc.IPv6])
	}
}

// TestCloudNodesByNodeSelector: a node belongs to the cloud pool whose
// node selector takes it, else to the one pool of its cloud without a
// selector; never to every pool of its cloud (two node groups, one pool
// each, fought over every node). A node two pools claim is listed by the
// first by name alone, with the conflict; a pool of another cloud takes
// none of these nodes.
func TestCloudNodesByNodeSelector(t *testing.T) {
	f := newFixture(t, nil)
	aws := func(sel map[string]string, cidr string) alloc.PoolSpec {
		s := alloc.PoolSpec{IPv4: fam(28, cidr), NodeLocal: alloc.DefaultNodeLocal, Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS}}
		if sel != nil {
			s.NodeSelector = &metav1.LabelSelector{MatchLabels: sel}
		}
		return s
	}
	f.pool("group-a", aws(map[string]string{"group": "a"}, "10.71.0.0/16"))
	f.pool("group-b", aws(map[string]string{"group": "b"}, "10.72.0.0/16"))
	f.pool("rest", aws(nil, "10.73.0.0/16"))
	f.pool("zone-1", aws(map[string]string{"zone": "1"}, "10.74.0.0/16"))
	azure := aws(nil, "10.77.0.0/16")
	azure.Cloud = &alloc.CloudSpec{Provider: alloc.CloudAzure}
	f.pool("vms", azure)
	for _, n := range []alloc.Node{
		{Name: "na", Labels: map[string]string{"group": "a"}},
		{Name: "nb", Labels: map[string]string{"group": "b"}},
		{Name: "nc", Labels: map[string]string{"group": "c"}},
		{Name: "nd", Labels: map[string]string{"group": "a", "zone": "1"}},
	} {
		n.Space, n.ProviderID = alloc.DefaultSpace, "aws:///eu-west-1a/i-0"+n.Name
		if _, _, err := f.s.PutNode(f.ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	list := func(pool string) map[string][]string {
		t.Helper()
		nodes, err := f.s.CloudNodes(f.ctx, alloc.DefaultSpace, pool)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, n := range nodes {
			out[n.Name] = n.Conflict
		}
		return out
	}
	for pool, want := range map[string]map[string][]string{
		"group-a": {"na": nil, "nd": {"group-a", "zone-1"}},
		"group-b": {"nb": nil},
		"rest":    {"nc": nil},
		"zone-1":  {},
		"vms":     {},
	} {
		if got := list(pool); !reflect.DeepEqual(got, want) {
			t.Errorf("pool %s: nodes %v, want %v", pool, got, want)
		}
	}
	// A second pool without a selector: the nodes no selector takes are
	// claimed by both, and served by neither.
	f.pool("rest-2", aws(nil, "10.78.0.0/16"))
	if got, want := list("rest"), map[string][]string{"nc": {"rest", "rest-2"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("pool rest: nodes %v, want %v", got, want)
	}
	if got := list("rest-2"); len(got) != 0 {
		t.Errorf("pool rest-2: nodes %v, want none", got)
	}
}

// TestDropGoneCloudNode: once its instance is gone, a node's cloud blocks
// of every pool go with every lease row in them, whatever its state, so
// that another node can record the addresses at once; its other blocks
// and the node stay, and a node back on another instance under the same
// name keeps everything.
func TestDropGoneCloudNode(t *testing.T) {
	f := cloudFixture(t)
	f.pool("carved", alloc.PoolSpec{IPv4: fam(28, "10.76.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	f.allocate(req("n1", "c1"))
	a := f.allocate(req("n1", "c2"))
	if _, err := f.s.ReleaseAddress(f.ctx, alloc.DefaultSpace, a.Leases[0].Addr); err != nil {
		t.Fatal(err)
	}
	carved := req("n1", "c3")
	carved.Pool = "carved"
	f.allocate(carved)
	// Another instance now: nothing goes.
	blocks, leases, err := f.s.DropGoneCloudNode(f.ctx, alloc.DefaultSpace, "n1", "aws:///eu-west-1a/i-0fedcba987654321")
	if err != nil || blocks != 0 || leases != 0 {
		t.Fatalf("dropped %d blocks, %d leases of another instance: %v", blocks, leases, err)
	}
	blocks, leases, err = f.s.DropGoneCloudNode(f.ctx, alloc.DefaultSpace, "n1", "aws:///eu-west-1a/i-0123456789abcdef0")
	if err != nil || blocks != 3 || leases != 2 {
		t.Fatalf("dropped %d blocks, %d leases, want 3 and 2: %v", blocks, leases, err)
	}
	if n := f.count(`SELECT count(*) FROM blocks WHERE source = 'cloud'`); n != 0 {
		t.Fatalf("%d cloud blocks left", n)
	}
	if n := f.count(`SELECT count(*) FROM leases`); n != 1 {
		t.Fatalf("%d leases left, want the carved pool's", n)
	}
	if n := f.count(`SELECT count(*) FROM address_events WHERE reason = 'cloud-instance-gone'`); n == 0 {
		t.Fatal("the history does not say why")
	}
	// Another node records an address at once.
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "n2", ProviderID: "aws:///eu-west-1a/i-0aaaaaaaaaaaaaaaa"}); err != nil {
		t.Fatal(err)
	}
	if err := f.s.RecordCloudBlocks(f.ctx, alloc.DefaultSpace, "n2", "default", "eni-2", prefixes("10.75.0.5/32")); err != nil {
		t.Fatal(err)
	}
	if a := f.allocate(req("n2", "c1")); a.Leases[0].Addr != netip.MustParseAddr("10.75.0.5") {
		t.Fatalf("n2 leased %v", a.Leases[0].Addr)
	}
	if blocks, _, err := f.s.DropGoneCloudNode(f.ctx, alloc.DefaultSpace, "gone", "aws:///x/i-0"); err != nil || blocks != 0 {
		t.Fatalf("an unknown node: %d blocks, %v", blocks, err)
	}
}

// TestCloudBlockHolder: the holder of the block an address overlaps.
func TestCloudBlockHolder(t *testing.T) {
	f := cloudFixture(t)
	h, err := f.s.CloudBlockHolder(f.ctx, alloc.DefaultSpace, netip.MustParsePrefix("10.75.1.20/32"))
	want := cloudHolderOf("n1", "aws:///eu-west-1a/i-0123456789abcdef0", "default", "10.75.1.16/28", "eni-1")
	if err != nil || h != want {
		t.Fatalf("holder %+v, %v; want %+v", h, err, want)
	}
	_, err = f.s.CloudBlockHolder(f.ctx, alloc.DefaultSpace, netip.MustParsePrefix("10.75.0.7/32"))
	wantKind(t, err, alloc.KindNotFound)
}

func cloudHolderOf(node, providerID, pool, block, iface string) CloudHolder {
	return CloudHolder{Node: node, ProviderID: providerID, Pool: pool, Block: netip.MustParsePrefix(block), Cloud: true, Interface: iface}
}
