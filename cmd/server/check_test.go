// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
)

// `ipam-server check` prints a clean report and succeeds on a healthy
// database, and prints the finding and fails with findingsError (exit 2)
// once a lease row is planted behind its block's counter; flags come from
// the environment as for serve.
func TestCheckSubcommand(t *testing.T) {
	ctx := t.Context()
	dbURL := pgtest.NewDatabase(t)
	st, err := store.Open(ctx, dbURL, store.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreatePool(ctx, alloc.Pool{Space: "default", Name: "default", Spec: alloc.PoolSpec{
		IPv4: &alloc.PoolFamily{MaskSize: 24, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Allocate(ctx, alloc.LeaseRequest{Space: "default", Node: "n1", Owner: alloc.Owner{Namespace: "ns", Name: "p"},
		Attachment: alloc.Attachment{ContainerID: "c1", Interface: "eth0"}}); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string {
		if k == "IPAM_DATABASE_URL" {
			return dbURL
		}
		return ""
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"check", "--log-level", "error"}, env, nil); err != nil {
		t.Fatalf("healthy database: %v", err)
	}
	if err := check(ctx, nil, env, &out); err != nil {
		t.Fatalf("healthy database: %v", err)
	}
	var r ipamv1.ConsistencyReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("report %s: %v", out.Bytes(), err)
	}
	if !r.Consistent || len(r.Findings) != 0 || r.Counts.Leases != 1 {
		t.Fatalf("healthy database: %s", out.Bytes())
	}

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET session_replication_role = replica;
		INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface,
			owner_namespace, owner_name, created_at)
		SELECT space, '10.0.0.9', block_id, block_cidr, node_id, pool_id, family, 'active', 'c2', 'eth0', 'ns', 'q', created_at
		FROM leases`); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = check(ctx, []string{"--database-url", dbURL}, func(string) string { return "" }, &out)
	if !errors.As(err, new(findingsError)) {
		t.Fatalf("corrupt database: error %v, want findingsError", err)
	}
	r = ipamv1.ConsistencyReport{}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("report %s: %v", out.Bytes(), err)
	}
	if r.Consistent || len(r.Findings) != 1 || r.Findings[0].Kind != ipamv1.FindingBlockCounter {
		t.Fatalf("corrupt database: %s", out.Bytes())
	}
}
