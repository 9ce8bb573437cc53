// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"net/netip"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// VIP pools and CIDR groups refuse special-purpose ranges unless they
// allow it (issue 33: owners were given 127.0.0.1 and 224.0.0.0-224.0.0.3),
// on create and on update, writing nothing; the flag is stored, read back,
// and part of what a retry must repeat.
func TestSpecialPurposeLBPoolsAndGroups(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	for _, c := range []struct {
		block, field string
	}{
		{"127.0.0.0/30", "spec.blocks[0].cidr"},
		{"224.0.0.0-224.0.0.3", "spec.blocks[0].start"},
	} {
		_, err := f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: "sp", Spec: lbSpec(c.block)})
		if e := wantKind(t, err, alloc.KindInvalid); e.Field != c.field {
			t.Fatalf("%s: field %q", c.block, e.Field)
		}
		if n := f.count(`SELECT count(*) FROM lb_pools`) + f.count(`SELECT count(*) FROM address_ranges`); n != 0 {
			t.Fatalf("%s: a refused create wrote %d rows", c.block, n)
		}
		spec := lbSpec(c.block)
		spec.AllowSpecialPurpose = true
		p := f.lbPool("sp", spec)
		if !p.Spec.AllowSpecialPurpose || p.Spec.Blocks[0].String() != lbSpec(c.block).Blocks[0].String() {
			t.Fatalf("%s: created %+v", c.block, p.Spec)
		}
		if got, err := f.s.GetLBPool(f.ctx, alloc.DefaultSpace, "sp"); err != nil || !got.Spec.AllowSpecialPurpose {
			t.Fatalf("%s: read %+v %v", c.block, got.Spec, err)
		}
		// Owners get its addresses.
		if a := f.assign(svc("ns", "web")); !a.Satisfied || !lbSpec(c.block).Offers(a.Addresses[0].Addr) {
			t.Fatalf("%s: assignment %+v", c.block, a)
		}
		if err := f.s.ReleaseVIPs(f.ctx, alloc.DefaultSpace, alloc.VIPOwner{Namespace: "ns", Name: "web"}, 0); err != nil {
			t.Fatal(err)
		}
		// A retry without the flag is refused as any such write; with the
		// flag answers the pool.
		if again := f.lbPool("sp", spec); !again.CreatedAt.Equal(p.CreatedAt) {
			t.Fatalf("%s: retry answered %+v", c.block, again)
		}
		// An update without the flag is refused and changes nothing.
		_, err = f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "sp", map[string]string{"x": "y"}, lbSpec(c.block))
		if e := wantKind(t, err, alloc.KindInvalid); e.Field != c.field {
			t.Fatalf("%s: update field %q", c.block, e.Field)
		}
		if got, err := f.s.GetLBPool(f.ctx, alloc.DefaultSpace, "sp"); err != nil || !got.Spec.AllowSpecialPurpose || got.Labels["x"] != "" ||
			!got.UpdatedAt.Equal(p.UpdatedAt) {
			t.Fatalf("%s: after a refused update %+v %v", c.block, got, err)
		}
		// Dropping the flag with the block goes through.
		got, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "sp", nil, lbSpec("10.0.10.0/24"))
		if err != nil || got.Spec.AllowSpecialPurpose {
			t.Fatalf("%s: update to an ordinary block: %+v %v", c.block, got.Spec, err)
		}
		// Adding a special-purpose block to an ordinary pool is refused.
		_, err = f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "sp", nil, lbSpec("10.0.10.0/24", c.block))
		if e := wantKind(t, err, alloc.KindInvalid); e.Field != "spec.blocks[1]"+c.field[len("spec.blocks[0]"):] {
			t.Fatalf("%s: added block, field %q", c.block, e.Field)
		}
		if _, err := f.s.DeleteLBPool(f.ctx, alloc.DefaultSpace, "sp"); err != nil {
			t.Fatal(err)
		}
	}

	meta := alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "meta", CIDRs: prefixes("10.30.0.0/16", "169.254.169.254/32")}
	_, err := f.s.CreateCIDRGroup(f.ctx, meta)
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "externalCIDRs[1]" {
		t.Fatalf("group: field %q", e.Field)
	}
	if n := f.count(`SELECT count(*) FROM cidr_groups`); n != 0 {
		t.Fatalf("a refused group wrote %d rows", n)
	}
	meta.AllowSpecialPurpose = true
	g, err := f.s.CreateCIDRGroup(f.ctx, meta)
	if err != nil || !g.AllowSpecialPurpose {
		t.Fatalf("group with the flag: %+v %v", g, err)
	}
	if got, err := f.s.GetCIDRGroup(f.ctx, alloc.DefaultSpace, "meta"); err != nil || !got.AllowSpecialPurpose {
		t.Fatalf("group read: %+v %v", got, err)
	}
	if ms, err := f.s.CIDRGroupsContaining(f.ctx, alloc.DefaultSpace, netip.MustParseAddr("169.254.169.254")); err != nil || len(ms) != 1 {
		t.Fatalf("groups holding the metadata address: %v %v", ms, err)
	}
	// An update without the flag is refused and changes nothing.
	upd := meta
	upd.AllowSpecialPurpose, upd.Labels = false, map[string]string{"x": "y"}
	_, err = f.s.UpdateCIDRGroup(f.ctx, upd)
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "externalCIDRs[1]" {
		t.Fatalf("group update: field %q", e.Field)
	}
	if got, err := f.s.GetCIDRGroup(f.ctx, alloc.DefaultSpace, "meta"); err != nil || !got.AllowSpecialPurpose || len(got.CIDRs) != 2 || got.Labels["x"] != "" {
		t.Fatalf("group after a refused update: %+v %v", got, err)
	}
	// The flag is part of what a retry repeats: a group of ordinary CIDRs
	// created with it is another group than one without.
	corp := alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "corp", CIDRs: prefixes("10.40.0.0/16"), AllowSpecialPurpose: true}
	if _, err := f.s.CreateCIDRGroup(f.ctx, corp); err != nil {
		t.Fatal(err)
	}
	corp.AllowSpecialPurpose = false
	_, err = f.s.CreateCIDRGroup(f.ctx, corp)
	wantKind(t, err, alloc.KindConflict)
	if got, err := f.s.UpdateCIDRGroup(f.ctx, corp); err != nil || got.AllowSpecialPurpose {
		t.Fatalf("group update clearing the flag: %+v %v", got, err)
	}
}

// Migration 00025 marks the VIP pools and CIDR groups already holding a
// special-purpose range as allowing it, whether a block is a CIDR, a range
// starting, ending or passing over one, or an IPv6 range through the
// IPv4-mapped addresses; the others stay unmarked. The marked ones keep
// giving, take their own spec written back, and the history says why
// they changed.
func TestSpecialPurposeMigration00025(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	p := migrationProvider(t, f.conn)
	if _, err := p.DownTo(f.ctx, 24); err != nil {
		t.Fatal(err)
	}
	pools := []struct {
		name, block string
		want        bool
	}{
		{"lo", "127.0.0.0/30", true},
		{"mc", "224.0.0.0-224.0.0.3", true},
		{"over", "169.253.255.0-169.255.0.0", true},
		{"into", "0.255.255.250-1.0.0.5", true},
		{"mapped", "::fffe:ffff:ffff-::1:0:0:0", true},
		{"ll6", "fe80::/64", true},
		{"ok", "10.0.10.0/24", false},
		{"ok6", "fd00::1-fd00::ff", false},
		{"below", "223.255.255.0-223.255.255.255", false},
	}
	for i, c := range pools {
		var id int64
		if err := f.s.db.QueryRow(f.ctx, `INSERT INTO lb_pools (space, name, created_at, updated_at)
			VALUES ('default', $1, now() - interval '1 day', now() - interval '1 day') RETURNING id`, c.name).Scan(&id); err != nil {
			t.Fatal(err)
		}
		b := lbSpec(c.block).Blocks[0]
		r := b.Range()
		var cidr *netip.Prefix
		if b.CIDR.IsValid() {
			cidr = &b.CIDR
		}
		if _, err := f.s.db.Exec(f.ctx, `INSERT INTO address_ranges (space, kind, first_addr, last_addr, lb_pool_id, position, cidr)
			VALUES ('default', 'vip', $1, $2, $3, 0, $4)`, r.From(), r.To(), id, cidr); err != nil {
			t.Fatalf("pool %d %s: %v", i, c.name, err)
		}
	}
	groups := []struct {
		name  string
		cidrs []string
		want  bool
	}{
		{"meta", []string{"10.0.0.0/8", "169.254.169.254/32"}, true},
		{"world", []string{"0.0.0.0/0"}, true},
		{"mcast6", []string{"ff02::/16"}, true},
		{"corp", []string{"10.30.0.0/16", "fd30::/48"}, false},
		{"empty", nil, false},
	}
	for _, c := range groups {
		var id int64
		if err := f.s.db.QueryRow(f.ctx, `INSERT INTO cidr_groups (space, name, created_at, updated_at)
			VALUES ('default', $1, now(), now()) RETURNING id`, c.name).Scan(&id); err != nil {
			t.Fatal(err)
		}
		for i, cidr := range c.cidrs {
			if _, err := f.s.db.Exec(f.ctx, `INSERT INTO cidr_group_cidrs (group_id, space, position, cidr) VALUES ($1, 'default', $2, $3)`,
				id, i, cidr); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := Migrate(f.ctx, f.conn); err != nil {
		t.Fatal(err)
	}
	f.reopen()
	for _, c := range pools {
		got, err := f.s.GetLBPool(f.ctx, alloc.DefaultSpace, c.name)
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.AllowSpecialPurpose != c.want || got.Spec.Blocks[0].String() != lbSpec(c.block).Blocks[0].String() {
			t.Errorf("pool %s after the migration: allowSpecialPurpose %v, blocks %v", c.name, got.Spec.AllowSpecialPurpose, got.Spec.Blocks)
		}
		marked := f.count(`SELECT count(*) FROM address_events WHERE kind = 'lbpool-update' AND pool = $1
			AND reason LIKE 'migration 00025: allowSpecialPurpose set%'`, c.name)
		if want := map[bool]int64{true: 1, false: 0}[c.want]; marked != want {
			t.Errorf("pool %s: %d history events of the mark, want %d", c.name, marked, want)
		}
		if _, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, c.name, got.Labels, got.Spec); err != nil {
			t.Errorf("pool %s: writing its spec back: %v", c.name, err)
		}
	}
	for _, c := range groups {
		got, err := f.s.GetCIDRGroup(f.ctx, alloc.DefaultSpace, c.name)
		if err != nil {
			t.Fatal(err)
		}
		if got.AllowSpecialPurpose != c.want || len(got.CIDRs) != len(c.cidrs) {
			t.Errorf("group %s after the migration: allowSpecialPurpose %v, CIDRs %v", c.name, got.AllowSpecialPurpose, got.CIDRs)
		}
		if _, err := f.s.UpdateCIDRGroup(f.ctx, got); err != nil {
			t.Errorf("group %s: writing it back: %v", c.name, err)
		}
	}
	// The loopback pool still gives 127.0.0.x; the reason set by the
	// migration did not leak into later writes.
	r := svc("ns", "web")
	r.Addresses = []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	r.Families = nil
	if a := f.assign(r); !a.Satisfied || addrs(a) != "127.0.0.1" {
		t.Fatalf("assignment from the marked pool: %+v", a)
	}
	if n := f.count(`SELECT count(*) FROM address_events WHERE reason LIKE 'migration 00025%'`); n != 6 {
		t.Fatalf("%d events with the migration's reason, want the 6 marks", n)
	}
}
