// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Migration 00005 numbers the leases already there: the held leases of one
// attachment share a generation, as new allocations' do, every other row
// has its own, and new allocations continue above them.
func TestMigrationNumbersExistingLeases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.244.0.0/16"), IPv6: fam(120, "fd00::/104"), NodeLocal: alloc.DefaultNodeLocal})
	f.allocate(req("node-a", "dual", alloc.IPv4, alloc.IPv6))
	f.allocate(req("node-a", "single", alloc.IPv4))
	f.allocate(req("node-b", "gone", alloc.IPv4, alloc.IPv6))
	if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "node-b", alloc.Attachment{ContainerID: "gone", Interface: "eth0"}); err != nil {
		t.Fatal(err)
	}

	p := migrationProvider(t, f.conn)
	if _, err := p.DownTo(f.ctx, 4); err != nil {
		t.Fatalf("down to before 00005: %v", err)
	}
	if n := f.count(`SELECT count(*) FROM information_schema.columns WHERE table_name = 'leases' AND column_name = 'generation'`); n != 0 {
		t.Fatal("00005 down left the generation column")
	}
	if _, err := Migrate(f.ctx, f.conn); err != nil {
		t.Fatal(err)
	}
	f.reopen() // prepared statements of the old columns are gone

	if n := f.count(`SELECT count(DISTINCT generation) FROM leases WHERE container_id = 'dual'`); n != 1 {
		t.Errorf("dual-stack attachment has %d generations, want 1", n)
	}
	if n := f.count(`SELECT count(DISTINCT generation) FROM leases WHERE container_id = 'gone'`); n != 2 {
		t.Errorf("released rows have %d generations, want one each", n)
	}
	if n := f.count(`SELECT count(DISTINCT generation) FROM leases`); n != 4 {
		t.Errorf("%d generations for 3 attachments' 5 rows, want 4", n)
	}
	highest := f.count(`SELECT max(generation) FROM leases`)
	if a := f.allocate(req("node-a", "new", alloc.IPv4)); a.Generation <= highest {
		t.Errorf("new allocation at generation %d, not above the migrated %d", a.Generation, highest)
	}
}
