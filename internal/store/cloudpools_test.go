package store

import (
	"errors"
	"net/netip"
	"testing"
	"time"

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
