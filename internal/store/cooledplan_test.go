// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"strings"
	"testing"
)

// Every index over released lease rows leads with the block. The
// statements that reuse a cooled address (leaseCooledSQL,
// reserveCooledSQL) read one node's blocks; an index of all released rows
// by cooldown alone let a plan made while the statistics counted few
// released rows walk all of them per block once there were many (257,460
// buffers for a node with 44 blocks, see migration 00013), and no plan over
// an index that leads with the block can.
func TestReleasedRowIndexesLeadWithTheBlock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	rows, err := f.s.db.Query(f.ctx, `SELECT i.indexrelid::regclass::text, a.attname, pg_get_expr(i.indpred, i.indrelid)
		FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = 'leases'::regclass AND i.indpred IS NOT NULL`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var released int
	for rows.Next() {
		var name, first, pred string
		if err := rows.Scan(&name, &first, &pred); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(pred, "'released'") || strings.Contains(pred, "<>") {
			continue
		}
		released++
		if first != "block_id" {
			t.Errorf("index %s over released rows (%s) leads with %s, not block_id", name, pred, first)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if released == 0 {
		t.Fatal("no index over released rows: the purge and the cooling counts would scan the lease table")
	}
}

// The (space, addr) key is the only index of the lease table a lookup of
// one address can use. Every lease statement probes it per candidate
// offset; an index that also led with the space (as the owner index did,
// see migration 00014) let a generic plan made on few leases walk every
// lease of the space per probe.
func TestOnlyTheAddressKeyLeadsWithTheSpace(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	rows, err := f.s.db.Query(f.ctx, `SELECT i.indexrelid::regclass::text, i.indisprimary, i.indpred IS NOT NULL
		FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = 'leases'::regclass AND a.attname = 'space'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var key int
	for rows.Next() {
		var name string
		var primary, partial bool
		if err := rows.Scan(&name, &primary, &partial); err != nil {
			t.Fatal(err)
		}
		switch {
		case primary:
			key++
		case !partial:
			t.Errorf("index %s leads with the space: a plan may probe addresses through it", name)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if key != 1 {
		t.Fatalf("%d primary keys lead with the space, want the (space, addr) key", key)
	}
}
