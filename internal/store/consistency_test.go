// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
)

// consistencyFixture is a healthy database: pool "default" with two CIDRs
// (/24 blocks), pool "other", nodes n1 and n2 with three leases each (the
// first of n1 pending, the rest confirmed).
func consistencyFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/16", "10.1.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	f.pool("other", alloc.PoolSpec{IPv4: fam(24, "10.9.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	for _, node := range []string{"n1", "n2"} {
		for i := range 3 {
			r := req(node, fmt.Sprintf("%s-c%d", node, i))
			f.allocate(r)
			if node == "n1" && i == 0 {
				continue
			}
			if _, err := f.s.Confirm(f.ctx, alloc.DefaultSpace, node, r.Attachment); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

// plant runs SQL directly in the test's database, as a bug or a hand edit
// would, on a connection of its own.
func (f *fixture) plant(sql string) {
	f.t.Helper()
	c, err := pgx.Connect(f.ctx, f.conn)
	if err != nil {
		f.t.Fatal(err)
	}
	defer c.Close(f.ctx)
	if _, err := c.Exec(f.ctx, sql); err != nil {
		f.t.Fatalf("planting %s: %v", sql, err)
	}
}

// dropCheck drops the CHECK constraint of table whose definition contains
// def (the core schema leaves CHECKs unnamed).
func dropCheck(table, def string) string {
	return fmt.Sprintf(`DO $$ DECLARE c text; BEGIN
		SELECT conname INTO STRICT c FROM pg_constraint
		WHERE conrelid = '%s'::regclass AND contype = 'c' AND pg_get_constraintdef(oid) LIKE '%%%s%%';
		EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %%I', c);
	END $$;`, table, def, table)
}

func (f *fixture) check() alloc.ConsistencyReport {
	f.t.Helper()
	r, err := f.s.CheckConsistency(f.ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

func kindsOf(r alloc.ConsistencyReport) []alloc.FindingKind {
	var ks []alloc.FindingKind
	for _, x := range r.Findings {
		ks = append(ks, x.Kind)
	}
	return ks
}

func TestConsistencyHealthy(t *testing.T) {
	f := consistencyFixture(t)
	r := f.check()
	if len(r.Findings) != 0 || r.Truncated {
		t.Fatalf("findings on a healthy database: %+v", r.Findings)
	}
	want := alloc.ConsistencyCounts{Spaces: 1, Pools: 2, PoolCIDRs: 3, Nodes: 2, Blocks: 2, Leases: 6}
	if r.Counts != want {
		t.Errorf("counts %+v, want %+v", r.Counts, want)
	}
	if !r.CheckedAt.Equal(f.clock.Now()) {
		t.Errorf("checkedAt %v, want %v", r.CheckedAt, f.clock.Now())
	}
}

// Each corruption is planted in a database of its own, behind the
// constraint that would refuse it, and the check must report exactly it:
// the kind, once per row concerned, naming those rows.
func TestConsistencyFindsPlantedCorruption(t *testing.T) {
	// n1's leases are 10.0.0.3 (pending), .4 and .5 of block 10.0.0.0/24
	// (id 1, capacity 252: network, broadcast, router and health are not
	// leased); n2's are 10.0.1.3-5 of block 10.0.1.0/24 (id 2).
	const n1Block = `(SELECT block_id FROM leases WHERE container_id = 'n1-c1' LIMIT 1)`
	cases := []struct {
		name    string
		sql     string
		kind    alloc.FindingKind
		n       int      // findings
		objects []string // in the first finding
		detail  string   // part of the first finding's detail
	}{
		{
			name: "duplicate address",
			sql: `ALTER TABLE leases DROP CONSTRAINT leases_one_holder_per_address;
				INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface,
					owner_namespace, owner_name, created_at)
				SELECT space, addr, block_id, block_cidr, node_id, pool_id, family, 'active', 'intruder', 'eth0', 'x', 'y', created_at
				FROM leases WHERE container_id = 'n1-c1';
				UPDATE blocks SET allocated = allocated + 1 WHERE id = ` + n1Block,
			kind: alloc.FindingDuplicateAddress, n: 1, detail: "address 10.0.0.4 has 2 lease rows",
		},
		{
			name: "duplicate attachment",
			sql: `DROP INDEX leases_attachment;
				INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface,
					owner_namespace, owner_name, created_at)
				SELECT space, '10.0.0.100', block_id, block_cidr, node_id, pool_id, family, 'active', container_id, interface,
					owner_namespace, owner_name, created_at
				FROM leases WHERE container_id = 'n1-c1';
				UPDATE blocks SET allocated = allocated + 1 WHERE id = ` + n1Block,
			kind: alloc.FindingDuplicateAttachment, n: 1, objects: []string{"lease 10.0.0.4", "lease 10.0.0.100"},
		},
		{
			name: "overlapping blocks",
			sql: `ALTER TABLE blocks DROP CONSTRAINT blocks_no_overlap;
				INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr, first_offset, last_offset,
					reserved, capacity, next_offset, created_at)
				SELECT space, pool_id, pool_cidr_id, parent_cidr, (SELECT id FROM nodes WHERE name = 'n2'), family,
					'10.0.0.128/25', 1, 126, '{}', 126, 1, created_at
				FROM blocks WHERE id = ` + n1Block,
			kind: alloc.FindingBlockOverlap, n: 1, detail: "block 10.0.0.0/24 (id 1) overlaps 10.0.0.128/25",
		},
		{
			name: "overlapping pool CIDRs",
			sql: `ALTER TABLE pool_cidrs DROP CONSTRAINT pool_cidrs_no_overlap;
				INSERT INTO pool_cidrs (pool_id, space, family, cidr, mask_size, position)
				SELECT id, space, 4, '10.1.128.0/17', 24, 1 FROM pools WHERE name = 'other'`,
			kind: alloc.FindingPoolCIDROverlap, n: 1, detail: "pool CIDR 10.1.0.0/16",
		},
		{
			name: "block outside its pool CIDR",
			sql: dropCheck("blocks", "<<=%parent_cidr") + `
				UPDATE blocks SET pool_cidr_id = c.id, parent_cidr = c.cidr FROM pool_cidrs c
				WHERE c.cidr = '10.1.0.0/16' AND blocks.id = ` + n1Block,
			kind: alloc.FindingBlockOutsidePool, n: 1, detail: "block 10.0.0.0/24 lies outside its pool CIDR 10.1.0.0/16",
		},
		{
			name: "lease outside its block",
			sql: dropCheck("leases", "<<=%block_cidr") + `
				UPDATE leases SET addr = '10.0.200.7' WHERE container_id = 'n1-c1'`,
			kind: alloc.FindingLeaseOutsideBlock, n: 1, objects: []string{"lease 10.0.200.7", "block 10.0.0.0/24 (id 1)"},
		},
		{
			name: "lease of another node than its block",
			sql:  `UPDATE leases SET node_id = (SELECT id FROM nodes WHERE name = 'n2') WHERE container_id = 'n1-c1'`,
			kind: alloc.FindingLeaseBlockMismatch, n: 1, detail: "lease 10.0.0.4 is of node n2 but its block 10.0.0.0/24 is of node n1",
		},
		{
			name: "lease of a reserved address",
			sql:  `UPDATE leases SET addr = '10.0.0.0' WHERE container_id = 'n1-c1'`,
			kind: alloc.FindingLeaseReservedAddress, n: 1, objects: []string{"lease 10.0.0.0", "block 10.0.0.0/24 (id 1)"},
		},
		{
			name: "block counter",
			sql:  `UPDATE blocks SET allocated = allocated + 2 WHERE id = ` + n1Block,
			kind: alloc.FindingBlockCounter, n: 1, detail: "block 10.0.0.0/24 counts 5 allocated of capacity 252 but holds 3 lease rows",
		},
		{
			name: "leases and block of a deleted node",
			sql:  `SET session_replication_role = replica; DELETE FROM nodes WHERE name = 'n2'`,
			kind: alloc.FindingMissingNode, n: 4, objects: []string{"lease 10.0.1.3"},
		},
		{
			name: "leases and block of a deleted pool",
			sql:  `SET session_replication_role = replica; DELETE FROM pools WHERE name = 'default'`,
			kind: alloc.FindingMissingPool, n: 8, detail: "lease 10.0.0.3 is of pool id 1, which does not exist",
		},
		{
			name: "a pool CIDR without its claim",
			sql:  `DELETE FROM address_ranges WHERE pool_cidr_id = (SELECT id FROM pool_cidrs WHERE cidr = '10.9.0.0/16')`,
			kind: alloc.FindingPoolCIDRClaim, n: 1, detail: "pool CIDR 10.9.0.0/16 (id 3) has no address range",
		},
		{
			name: "a VIP block on a Pod pool CIDR",
			sql: `ALTER TABLE address_ranges DROP CONSTRAINT address_ranges_pod_vip;
				INSERT INTO lb_pools (space, name, created_at, updated_at) VALUES ('default', 'vip', now(), now());
				INSERT INTO address_ranges (space, kind, first_addr, last_addr, lb_pool_id, position)
				SELECT 'default', 'vip', '10.9.3.1', '10.9.3.9', id, 0 FROM lb_pools`,
			kind: alloc.FindingAddressRangeOverlap, n: 1, objects: []string{"pod range 10.9.0.0-10.9.255.255 (id 3)", "vip range 10.9.3.1-10.9.3.9 (id 4)"},
		},
		{
			name: "two unmarked VIP pools overlapping",
			sql: `ALTER TABLE address_ranges DROP CONSTRAINT address_ranges_vip;
				INSERT INTO lb_pools (space, name, created_at, updated_at) VALUES ('default', 'a', now(), now()), ('default', 'b', now(), now());
				INSERT INTO address_ranges (space, kind, first_addr, last_addr, lb_pool_id, position)
				SELECT 'default', 'vip', ('192.168.0.' || (10 * id))::inet, ('192.168.0.' || (10 * id + 15))::inet, id, 0 FROM lb_pools;
				-- A conflicting pool's range overlaps both, which is no finding.
				INSERT INTO lb_pools (space, name, conflict, created_at, updated_at) VALUES ('default', 'c', 'planted', now(), now());
				INSERT INTO address_ranges (space, kind, first_addr, last_addr, lb_pool_id, position, conflicting)
				SELECT 'default', 'vip', '192.168.0.0', '192.168.0.255', id, 0, true FROM lb_pools WHERE name = 'c'`,
			kind: alloc.FindingAddressRangeOverlap, n: 1, detail: "vip range 192.168.0.10-192.168.0.25 (id 4) overlaps vip range 192.168.0.20-192.168.0.35 (id 5)",
		},
		{
			name: "a VIP nobody holds",
			sql: `INSERT INTO lb_pools (space, name, created_at, updated_at) VALUES ('default', 'vip', now(), now());
				INSERT INTO vips (space, addr, lb_pool_id, created_at) SELECT 'default', '192.168.0.7', id, now() FROM lb_pools`,
			kind: alloc.FindingVIPState, n: 1, detail: "VIP 192.168.0.7 has no holder",
		},
		{
			name: "a VIP in a Pod pool CIDR",
			sql: `INSERT INTO lb_pools (space, name, created_at, updated_at) VALUES ('default', 'vip', now(), now());
				INSERT INTO vip_owners (space, namespace, name, request, satisfied, reason, created_at, updated_at)
				VALUES ('default', 'ns', 'svc', '{}', true, 'satisfied', now(), now());
				INSERT INTO vips (space, addr, lb_pool_id, created_at) SELECT 'default', '10.9.0.7', id, now() FROM lb_pools;
				INSERT INTO vip_holders (vip_id, owner_id, created_at) SELECT v.id, o.id, now() FROM vips v, vip_owners o`,
			kind: alloc.FindingVIPState, n: 1, detail: "VIP 10.9.0.7 lies in Pod pool CIDR 10.9.0.0/16",
		},
		{
			name: "pending lease without expiry",
			sql: dropCheck("leases", "expires_at IS NOT NULL") + `
				UPDATE leases SET expires_at = NULL WHERE container_id = 'n1-c0'`,
			kind: alloc.FindingLeaseState, n: 1, detail: "lease 10.0.0.3 is pending but has no expiry",
		},
		{
			name: "released lease without cooldown",
			sql: dropCheck("leases", "cooldown_until IS NOT NULL") + `
				UPDATE leases SET state = 'released', released_at = created_at WHERE container_id = 'n1-c2'`,
			kind: alloc.FindingLeaseState, n: 1, detail: "lease 10.0.0.5 is released but has no release time or cooldown",
		},
		{
			name: "reserved lease of no node's Cilium pool",
			sql: `ALTER TABLE leases DROP CONSTRAINT leases_reserved_on_node;
				UPDATE leases SET state = 'reserved' WHERE container_id = 'n1-c2'`,
			kind: alloc.FindingLeaseState, n: 1, detail: `lease 10.0.0.5 is reserved but is not a node's address for Cilium (network '')`,
		},
		{
			name: "node address for Cilium on another attachment",
			sql: `ALTER TABLE leases DROP CONSTRAINT leases_node_address;
				UPDATE leases SET network = 'cilium:crd' WHERE container_id = 'n1-c2'`,
			kind: alloc.FindingLeaseState, n: 1,
			detail: "lease 10.0.0.5 is active but is a node's address for Cilium on attachment n1-c2/eth0, not 10.0.0.5/pool",
		},
		{
			name: "reserved node address with an owner",
			sql: `UPDATE leases SET state = 'reserved', network = 'cilium:crd', container_id = host(addr), interface = 'pool'
				WHERE container_id = 'n1-c2'`,
			kind: alloc.FindingLeaseState, n: 1, detail: "lease 10.0.0.5 is reserved but has an owner, default/pod-n1-c2",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := consistencyFixture(t)
			f.plant(c.sql)
			r := f.check()
			want := slices.Repeat([]alloc.FindingKind{c.kind}, c.n)
			if got := kindsOf(r); !slices.Equal(got, want) {
				t.Fatalf("findings %v, want %v:\n%+v", got, want, r.Findings)
			}
			first := r.Findings[0]
			if first.Space != alloc.DefaultSpace {
				t.Errorf("space %q", first.Space)
			}
			if c.detail != "" && !strings.Contains(first.Detail, c.detail) {
				t.Errorf("detail %q, want it to contain %q", first.Detail, c.detail)
			}
			if c.objects != nil && !slices.Equal(first.Objects, c.objects) {
				t.Errorf("objects %q, want %q", first.Objects, c.objects)
			}
		})
	}
}

// The report lists at most MaxFindingsPerCheck findings per check.
func TestConsistencyTruncates(t *testing.T) {
	f := consistencyFixture(t)
	f.plant(fmt.Sprintf(`SET session_replication_role = replica;
		INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr, first_offset, last_offset,
			reserved, capacity, next_offset, created_at)
		SELECT 'default', p.id, c.id, c.cidr, 999, 4, set_masklen(('10.1.0.0'::inet + i * 256), 24)::cidr, 1, 254, '{}', 254, 1, now()
		FROM pools p JOIN pool_cidrs c ON c.pool_id = p.id AND c.cidr = '10.1.0.0/16', generate_series(0, %d) i
		WHERE p.name = 'default'`, alloc.MaxFindingsPerCheck+5))
	r := f.check()
	if len(r.Findings) != alloc.MaxFindingsPerCheck || !r.Truncated {
		t.Fatalf("%d findings, truncated %v", len(r.Findings), r.Truncated)
	}
}

// The check runs in a snapshot while 16 goroutines allocate, confirm,
// release, and purge and reuse cooled addresses: it must never see a lease
// without its block's count, or anything else half-done.
func TestConsistencyUnderLoad(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.Cooldown = 0 })
	f.pool("default", alloc.PoolSpec{IPv4: fam(26, "10.0.0.0/16"), IPv6: fam(120, "fd00::/104"), NodeLocal: alloc.DefaultNodeLocal})
	var (
		wg     sync.WaitGroup
		stop   atomic.Bool
		ops    atomic.Int64
		errsMu sync.Mutex
		errs   []error
	)
	fail := func(err error) {
		errsMu.Lock()
		defer errsMu.Unlock()
		errs = append(errs, err)
	}
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				r := req(fmt.Sprintf("node-%d", w%6), fmt.Sprintf("w%d-%d", w, i))
				if _, err := f.s.Allocate(f.ctx, r); err != nil {
					fail(err)
					return
				}
				if i%3 == 0 {
					if _, err := f.s.Confirm(f.ctx, alloc.DefaultSpace, r.Node, r.Attachment); err != nil {
						fail(err)
						return
					}
				}
				if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, r.Node, r.Attachment); err != nil {
					fail(err)
					return
				}
				ops.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if _, err := f.s.PurgeCooled(f.ctx); err != nil {
				fail(err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	var checks int
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) || checks < 5 {
		r, err := f.s.CheckConsistency(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Findings) > 0 {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("check %d found %+v", checks, r.Findings)
		}
		checks++
	}
	stop.Store(true)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if ops.Load() < 100 {
		t.Fatalf("only %d allocate/release cycles ran alongside the checks", ops.Load())
	}
	t.Logf("%d checks, none found anything, alongside %d allocate/release cycles", checks, ops.Load())
	if r := f.check(); len(r.Findings) > 0 {
		t.Fatalf("after the load: %+v", r.Findings)
	}
}

// BenchmarkCheckConsistency times one check of the design's scale: 5,000
// nodes with a /24 block each holding 110 leases (550,000), loaded in bulk.
func BenchmarkCheckConsistency(b *testing.B) {
	ctx := b.Context()
	conn := pgtest.NewDatabase(b)
	s, err := Open(ctx, conn, DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.CreatePool(ctx, alloc.Pool{Space: "default", Name: "default", Spec: alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/8"), NodeLocal: alloc.DefaultNodeLocal}}); err != nil {
		b.Fatal(err)
	}
	c, err := pgx.Connect(ctx, conn)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(ctx)
	// Loaded as the allocation path would leave it, without its history.
	if _, err := c.Exec(ctx, `SET session_replication_role = replica;
		INSERT INTO nodes (space, name, created_at, updated_at) SELECT 'default', 'node-' || i, now(), now() FROM generate_series(1, 5000) i;
		INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr, first_offset, last_offset, reserved,
			router, health, capacity, allocated, next_offset, created_at)
		SELECT 'default', c.pool_id, c.id, c.cidr, n.id, 4, set_masklen('10.0.0.0'::inet + (n.id - 1) * 256, 24)::cidr, 1, 254, '{1,2}',
			'10.0.0.0'::inet + (n.id - 1) * 256 + 1, '10.0.0.0'::inet + (n.id - 1) * 256 + 2, 252, 110, 113, now()
		FROM nodes n, pool_cidrs c;
		INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface,
			owner_namespace, owner_name, created_at)
		SELECT 'default', set_masklen(b.cidr::inet + 3 + i, 32), b.id, b.cidr, b.node_id, b.pool_id, 4, 'active', 'c' || i, 'eth0',
			'ns', 'pod-' || b.id || '-' || i, now()
		FROM blocks b, generate_series(0, 109) i;
		ANALYZE`); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		r, err := s.CheckConsistency(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if len(r.Findings) > 0 || r.Counts.Leases != 550000 {
			b.Fatalf("%d leases, findings %+v", r.Counts.Leases, r.Findings[:min(3, len(r.Findings))])
		}
	}
}
