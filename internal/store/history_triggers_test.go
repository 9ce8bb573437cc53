// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/pgtest"
)

// Migration 00006 rewrote the lease history triggers' functions for speed
// only: the same changes, made in SQL by hand, record the same events under
// 00005's functions and under 00006's, field for field.
func TestFasterHistoryTriggersRecordTheSame(t *testing.T) {
	t.Parallel()
	old, current := historiesOfWorkload(t, 5, 6)
	for i := range max(len(old), len(current)) {
		var o, c string
		if i < len(old) {
			o = old[i]
		}
		if i < len(current) {
			c = current[i]
		}
		if o != c {
			t.Errorf("event %d:\n 00005: %s\n 00006: %s", i, o, c)
		}
	}
}

// Migration 00011 taught the lease history triggers Cilium's crd mode; for
// every other change they record what 00008's (as of 00010) recorded.
func TestCrdHistoryTriggersKeepOtherEvents(t *testing.T) {
	t.Parallel()
	old, current := historiesOfWorkload(t, 10, 11)
	if !slices.Equal(old, current) {
		t.Fatalf("00010's triggers recorded\n%s\n00011's\n%s", strings.Join(old, "\n"), strings.Join(current, "\n"))
	}
}

// Migration 00015 records the lease history once per statement instead of
// once per row: the same events, field for field; those of one lease in
// the same order, and those of one statement in any.
func TestStatementHistoryTriggersRecordTheSame(t *testing.T) {
	t.Parallel()
	rows, statements := historiesOfWorkload(t, 14, 15)
	if !slices.Equal(sortedCopy(rows), sortedCopy(statements)) {
		t.Fatalf("00014's triggers recorded\n%s\n00015's\n%s", strings.Join(rows, "\n"), strings.Join(statements, "\n"))
	}
	// Per address, the events in the order they were recorded.
	byAddress := func(events []string) map[string][]string {
		m := map[string][]string{}
		for _, e := range events {
			f := strings.Split(e, ",")
			m[f[4]] = append(m[f[4]], e)
		}
		return m
	}
	want, got := byAddress(rows), byAddress(statements)
	for a, w := range want {
		if !slices.Equal(w, got[a]) {
			t.Errorf("events of %s, in order:\n00014: %s\n00015: %s", a, strings.Join(w, "\n  "), strings.Join(got[a], "\n  "))
		}
	}
}

// historiesOfWorkload answers the events historyWorkload records at
// migration version before and at version after; it fails the test unless
// before's are the 43 the workload makes.
func historiesOfWorkload(t *testing.T, before, after int64) (old, current []string) {
	t.Helper()
	old, current = historyOfWorkload(t, before), historyOfWorkload(t, after)
	if len(old) != 43 {
		t.Fatalf("%05d's triggers recorded %d events, want 43:\n%s", before, len(old), strings.Join(old, "\n"))
	}
	return old, current
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// historyOfWorkload runs historyWorkload on a new database migrated to
// version and answers its events, each as a row's text without its id and
// recorded_at; an at taken from the database's clock reads "now".
func historyOfWorkload(t *testing.T, version int64) []string {
	t.Helper()
	ctx := context.Background()
	conn := pgtest.NewDatabase(t)
	p := migrationProvider(t, conn)
	if _, err := p.DownTo(ctx, version); err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, version); err != nil {
		t.Fatal(err)
	}
	if v, err := p.GetDBVersion(ctx); err != nil || v != version {
		t.Fatalf("version %d, %v; want %d", v, err, version)
	}
	c, err := pgx.Connect(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.PgConn().Exec(ctx, historyWorkload).ReadAll(); err != nil {
		t.Fatalf("workload at version %d: %v", version, err)
	}
	rows, err := c.Query(ctx, `SELECT ROW(CASE WHEN at = recorded_at THEN 'now' ELSE at::text END, kind, space, family,
		address, block, pool, node, state, owner_namespace, owner_name, owner_uid, container_id, interface,
		actor, reason, generation)::text FROM address_events ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	events, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return events
}

// historyWorkload leases, confirms, releases, reuses and deletes leases in
// every way the lease history triggers tell apart, with the history's
// settings (ipam.actor, ipam.reason, ipam.at) set, empty and unset. It
// names the pool, nodes and blocks it makes by id: 1, 2 and 3 in a new
// database.
const historyWorkload = `INSERT INTO pools (space, name, allow_first_ip, allow_last_ip, reserve_router, reserve_health, reserve_ingress, ipv4_mask_size, created_at, updated_at)
VALUES ('default', 'p1', false, false, false, false, false, 24, '2030-01-01', '2030-01-01');
INSERT INTO pool_cidrs (pool_id, space, family, cidr, mask_size, position)
SELECT id, 'default', 4, '10.0.0.0/8', 16, 0 FROM pools;
INSERT INTO nodes (space, name, created_at, updated_at)
SELECT 'default', 'node-' || i, '2030-01-01', '2030-01-01' FROM generate_series(1, 3) i;
INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr, first_offset, last_offset, reserved, capacity, next_offset, created_at)
SELECT 'default', p.id, c.id, '10.0.0.0/8', n.id, 4, ('10.' || substr(n.name, 6) || '.0.0/16')::cidr, 1, 65534, '{}', 65534, 1, '2030-01-01'
FROM pools p, pool_cidrs c, nodes n ORDER BY n.id;
-- inserts, without settings and with
INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface, owner_namespace, owner_name, owner_uid, created_at, expires_at, selected_by, generation)
VALUES ('default', '10.1.0.1', 1, '10.1.0.0/16', 1, 1, 4, 'pending', 'c1', 'eth0', 'ns', 'pod1', 'u1', '2030-01-01 00:00:01', '2030-01-01 00:05:00', 'sel-a', 101),
       ('default', '10.1.0.2', 1, '10.1.0.0/16', 1, 1, 4, 'active', 'c2', 'eth0', 'ns', 'pod2', '', '2030-01-01 00:00:02', NULL, '', 102);
BEGIN;
SELECT ipam_history_context('node:node-2', 'r-insert', '2030-01-02 00:00:00+00');
INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface, owner_namespace, owner_name, owner_uid, created_at, expires_at, selected_by, generation)
VALUES ('default', '10.2.0.1', 2, '10.2.0.0/16', 2, 1, 4, 'pending', 'c3', 'eth0', 'ns', 'pod3', 'u3', '2030-01-01 00:00:03', '2030-01-01 00:05:00', 'sel-b', 103);
COMMIT;
BEGIN;
SELECT ipam_history_context('', '', NULL);
INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface, owner_namespace, owner_name, owner_uid, created_at, expires_at, selected_by, generation)
VALUES ('default', '10.2.0.2', 2, '10.2.0.0/16', 2, 1, 4, 'pending', 'c4', 'eth0', 'ns', 'pod4', 'u4', '2030-01-01 00:00:04', '2030-01-01 00:05:00', 'sel-c', 104),
       ('default', '10.2.0.3', 2, '10.2.0.0/16', 2, 1, 4, 'pending', 'c5', 'eth0', 'ns', 'pod5', 'u5', '2030-01-01 00:00:05', '2030-01-01 00:05:00', 'sel-d', 105),
       ('default', '10.2.0.4', 2, '10.2.0.0/16', 2, 1, 4, 'pending', 'c6', 'eth0', 'ns', 'pod6', 'u6', '2030-01-01 00:00:06', '2030-01-01 00:05:00', '', 106),
       ('default', '10.3.0.1', 3, '10.3.0.0/16', 3, 1, 4, 'active', 'c7', 'eth0', 'ns', 'pod7', 'u7', '2030-01-01 00:00:07', NULL, 'sel-e', 107),
       ('default', '10.3.0.2', 3, '10.3.0.0/16', 3, 1, 4, 'active', 'c8', 'eth0', 'ns', 'pod8', 'u8', '2030-01-01 00:00:08', NULL, 'sel-f', 108),
       ('default', '10.3.0.3', 3, '10.3.0.0/16', 3, 1, 4, 'active', 'c9', 'eth0', 'ns', 'pod9', 'u9', '2030-01-01 00:00:09', NULL, 'sel-g', 109);
COMMIT;
-- confirmations: with confirmed_at, with ipam.at, with neither (now())
BEGIN;
SELECT ipam_history_context('cert:x', 'r-confirm', '2030-01-03 00:00:00+00');
UPDATE leases SET state = 'active', expires_at = NULL, confirmed_at = '2030-01-01 00:01:00' WHERE addr = '10.1.0.1';
UPDATE leases SET state = 'active', expires_at = NULL WHERE addr = '10.2.0.1';
COMMIT;
UPDATE leases SET state = 'active', expires_at = NULL WHERE addr = '10.2.0.2';
-- updates that record nothing
UPDATE leases SET state = 'pending', expires_at = '2030-01-09' WHERE addr = '10.2.0.2';
UPDATE leases SET sticky_identity = 'sts/web-0', sticky_retention = '1 hour' WHERE addr = '10.3.0.1';
UPDATE leases SET owner_uid = 'changed' WHERE addr = '10.3.0.2';
-- releases and expiries
BEGIN;
SELECT ipam_history_context('system', 'expired', '2030-01-04 00:00:00+00');
UPDATE leases SET state = 'released', expires_at = NULL, released_at = '2030-01-01 00:10:00', cooldown_until = '2030-01-01 00:10:30' WHERE addr IN ('10.2.0.2', '10.2.0.3');
COMMIT;
BEGIN;
SELECT ipam_history_context('node:n', 'attachment-released', '2030-01-04 00:00:00+00');
UPDATE leases SET state = 'released', expires_at = NULL, released_at = '2030-01-01 00:11:00', cooldown_until = '2030-01-01 00:11:30' WHERE addr IN ('10.1.0.1', '10.3.0.1');
COMMIT;
BEGIN;
SELECT ipam_history_context('node:n', '', '2030-01-04 00:00:00+00');
UPDATE leases SET state = 'released', expires_at = NULL, released_at = '2030-01-01 00:12:00', cooldown_until = '2030-01-01 00:12:30' WHERE addr = '10.1.0.2';
COMMIT;
UPDATE leases SET state = 'released', expires_at = NULL, released_at = '2030-01-01 00:13:00', cooldown_until = '2030-01-01 00:13:30' WHERE addr IN ('10.2.0.1', '10.2.0.4', '10.3.0.2', '10.3.0.3');
-- reuse in place
BEGIN;
SELECT ipam_history_context('node:node-1', 'r-reuse', '2030-01-05 00:00:00+00');
UPDATE leases SET state = 'pending', container_id = 'c10', owner_name = 'pod10', owner_uid = 'u10', created_at = '2030-01-01 00:20:00', expires_at = '2030-01-01 00:25:00', selected_by = 'sel-h', generation = 201,
    confirmed_at = NULL, released_at = NULL, cooldown_until = NULL WHERE addr = '10.1.0.1';
COMMIT;
BEGIN;
SELECT ipam_history_context('node:node-1', '', NULL);
UPDATE leases SET state = 'active', container_id = 'c11', owner_name = 'pod11', owner_uid = 'u11', created_at = '2030-01-01 00:21:00', expires_at = NULL, selected_by = 'sel-i', generation = 202,
    confirmed_at = NULL, released_at = NULL, cooldown_until = NULL WHERE addr = '10.1.0.2';
COMMIT;
UPDATE leases SET state = 'pending', container_id = 'c12', owner_name = 'pod12', owner_uid = 'u12', created_at = '2030-01-01 00:22:00', expires_at = '2030-01-01 00:25:00', selected_by = '', generation = 203,
    confirmed_at = NULL, released_at = NULL, cooldown_until = NULL WHERE addr = '10.2.0.3';
-- leased again on another node
UPDATE leases SET state = 'active', node_id = 3, container_id = 'c13', created_at = '2030-01-01 00:23:00', expires_at = NULL, selected_by = 'sel-j', generation = 204,
    released_at = NULL, cooldown_until = NULL WHERE addr = '10.2.0.4';
-- a confirmation without confirmed_at
BEGIN;
SELECT ipam_history_context('node:x', 'confirm-reason', NULL);
UPDATE leases SET state = 'active', expires_at = NULL WHERE addr = '10.1.0.1';
COMMIT;
-- deletions: cooling (due or not) and held, with and without ipam.at
BEGIN;
SELECT ipam_history_context('system', 'purged', '2030-01-01 00:13:10+00');
DELETE FROM leases WHERE addr IN ('10.3.0.1', '10.3.0.2');
COMMIT;
BEGIN;
SELECT ipam_history_context('system', '', '2030-01-01 00:14:00+00');
DELETE FROM leases WHERE addr IN ('10.2.0.1', '10.2.0.2');
COMMIT;
BEGIN;
SELECT ipam_history_context('admin', 'node-deleted', NULL);
DELETE FROM leases WHERE addr IN ('10.1.0.1');
COMMIT;
DELETE FROM leases WHERE addr IN ('10.1.0.2', '10.3.0.3', '10.2.0.3');
DELETE FROM leases;
`

// Migration 00024 dates the cooldown-end of a reuse at the reusing lease
// when that comes first (a sticky address taken back within its binding),
// and moves such events already written with a date in the future. Every
// other event is what 00023's triggers recorded.
func TestStickyReuseEndsTheCooldownWhenReused(t *testing.T) {
	t.Parallel()
	old, current := historiesOfWorkload(t, 23, 24)
	if !slices.Equal(old, current) {
		t.Fatalf("00023's triggers recorded\n%s\n00024's\n%s", strings.Join(old, "\n"), strings.Join(current, "\n"))
	}

	ctx := context.Background()
	conn := pgtest.NewDatabase(t)
	p := migrationProvider(t, conn)
	if _, err := p.DownTo(ctx, 23); err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	// Two addresses released a day ago with a binding of 30 days, which
	// keeps them cooling past the migration, each taken back by its
	// identity hours later.
	const reuse = `UPDATE leases SET state = 'active', container_id = $2, created_at = now() - $3::interval, expires_at = NULL, generation = generation + 100,
		released_at = NULL, cooldown_until = NULL WHERE addr = $1`
	const setup = `INSERT INTO pools (space, name, allow_first_ip, allow_last_ip, reserve_router, reserve_health, reserve_ingress, ipv4_mask_size, created_at, updated_at)
VALUES ('default', 'p1', false, false, false, false, false, 24, '2030-01-01', '2030-01-01');
INSERT INTO pool_cidrs (pool_id, space, family, cidr, mask_size, position) SELECT id, 'default', 4, '10.0.0.0/8', 16, 0 FROM pools;
INSERT INTO nodes (space, name, created_at, updated_at) VALUES ('default', 'node-1', '2030-01-01', '2030-01-01');
INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr, first_offset, last_offset, reserved, capacity, next_offset, created_at)
SELECT 'default', p.id, c.id, '10.0.0.0/8', n.id, 4, '10.1.0.0/16', 1, 65534, '{}', 65534, 1, '2030-01-01' FROM pools p, pool_cidrs c, nodes n;
INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface, owner_namespace, owner_name, owner_uid,
    created_at, selected_by, generation, sticky_identity, sticky_retention, released_at, cooldown_until)
SELECT 'default', a::inet, b.id, b.cidr, b.node_id, b.pool_id, 4, 'released', 'c0', 'eth0', 'ns', 'web-0', '', now() - interval '2 days', '', 1,
    'sts/ns/web/0-' || a, '30 days', now() - interval '1 day', now() + interval '29 days'
FROM blocks b, unnest(ARRAY['10.1.0.1', '10.1.0.2']) a;`
	if _, err := c.PgConn().Exec(ctx, setup).ReadAll(); err != nil {
		t.Fatal(err)
	}
	// cooldownEnd answers how long after the reusing lease the address's
	// cooldown-end is dated: 0 when it is the reuse's instant.
	cooldownEnd := func(addr string) string {
		t.Helper()
		var d string
		if err := c.QueryRow(ctx, `SELECT (max(at) FILTER (WHERE kind = 'cooldown-end') - max(at) FILTER (WHERE kind = 'lease'))::text
			FROM address_events WHERE address = $1`, addr).Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	if _, err := c.Exec(ctx, reuse, "10.1.0.1", "c1", "12 hours"); err != nil {
		t.Fatal(err)
	}
	if d := cooldownEnd("10.1.0.1"); !strings.HasPrefix(d, "29 days 1") {
		t.Fatalf("under 00023 the reuse's cooldown ended %s after it; the test expects the binding's end", d)
	}
	if _, err := p.UpTo(ctx, 24); err != nil {
		t.Fatal(err)
	}
	if d := cooldownEnd("10.1.0.1"); d != "00:00:00" {
		t.Errorf("00024 left the event written under 00023 %s after the reuse, want at it", d)
	}
	if _, err := c.Exec(ctx, reuse, "10.1.0.2", "c2", "6 hours"); err != nil {
		t.Fatal(err)
	}
	if d := cooldownEnd("10.1.0.2"); d != "00:00:00" {
		t.Errorf("under 00024 the reuse's cooldown ended %s after it, want at it", d)
	}
}
