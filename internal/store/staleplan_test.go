// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The statements every allocation and release runs stay probes of their
// keys under a generic plan made on the statistics of a nearly empty
// database, once the tables hold thousands of rows. Such plans are what a
// prepared statement settles on after five executions, and they are kept
// until the next ANALYZE: an index that could also answer a probe by
// walking a whole space (migrations 00013, 00014), or a join hashed over
// every held lease, looked as cheap as the key while the tables were small,
// and cost ten to a thousand times more once they were not.
func TestHotStatementsStayProbesOnStaleStatistics(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/8"), NodeLocal: alloc.DefaultNodeLocal})
	f.allocate(req("n0", "c0"))
	const nodes, perNode = 1000, 40
	for _, sql := range []string{
		`ALTER TABLE leases SET (autovacuum_enabled = off)`,
		`ALTER TABLE blocks SET (autovacuum_enabled = off)`,
		`ALTER TABLE nodes SET (autovacuum_enabled = off)`,
		`ANALYZE leases, blocks, nodes, pools`,
		// Grown after the statistics: nodes g-1..g-1000, a /24 each
		// beyond n0's, 40 active leases and 10 cooling ones in each.
		`INSERT INTO nodes (space, name, created_at, updated_at)
		 SELECT 'default', 'g-' || i, now(), now() FROM generate_series(1, ` + fmt.Sprint(nodes) + `) i`,
		`INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr, first_offset, last_offset,
			reserved, capacity, allocated, next_offset, created_at)
		 SELECT 'default', c.pool_id, c.id, c.cidr, n.id, 4, set_masklen('10.128.0.0'::inet + 256 * substr(n.name, 3)::int, 24)::cidr,
			1, 254, '{}', 254, ` + fmt.Sprint(perNode+10) + `, ` + fmt.Sprint(perNode+11) + `, now()
		 FROM nodes n, pool_cidrs c WHERE n.name LIKE 'g-%'`,
		`INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state, container_id, interface,
			owner_namespace, owner_name, owner_uid, created_at, released_at, cooldown_until)
		 SELECT 'default', set_masklen(b.cidr::inet, 32) + o, b.id, b.cidr, b.node_id, b.pool_id, 4,
			CASE WHEN o > ` + fmt.Sprint(perNode) + ` THEN 'released' ELSE 'active' END, 'g' || b.id || '-' || o, 'eth0',
			'ns', 'pod-' || o, '', now(),
			CASE WHEN o > ` + fmt.Sprint(perNode) + ` THEN now() END, CASE WHEN o > ` + fmt.Sprint(perNode) + ` THEN now() + interval '1 hour' END
		 FROM blocks b, generate_series(1, ` + fmt.Sprint(perNode+10) + `) o WHERE b.cidr <<= '10.128.0.0/9'`,
	} {
		if _, err := f.s.db.Exec(f.ctx, sql); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	if n := f.count(`SELECT count(*) FROM leases`); n < nodes*(perNode+10) {
		t.Fatalf("%d leases, want %d and more", n, nodes*(perNode+10))
	}

	// Five requests of five nodes, as a batch brings them.
	var names, networks, containers, ifaces []string
	for i := 1; i <= 5; i++ {
		names = append(names, fmt.Sprintf("g-%d", i*170))
		networks, containers, ifaces = append(networks, ""), append(containers, fmt.Sprint("new-", i)), append(ifaces, "eth0")
	}
	var nodeIDs, poolIDs, gens []int64
	var families []int16
	var states, nss, podNames, uids, selected, held []string
	var expires []*time.Time
	var nows []time.Time
	for _, n := range names {
		var id, pool, block int64
		if err := f.s.db.QueryRow(f.ctx, `SELECT n.id, b.pool_id, b.id FROM nodes n JOIN blocks b ON b.node_id = n.id WHERE n.name = $1`,
			n).Scan(&id, &pool, &block); err != nil {
			t.Fatal(err)
		}
		held = append(held, fmt.Sprintf("g%d-1", block))
		nodeIDs, poolIDs, gens, families = append(nodeIDs, id), append(poolIDs, pool), append(gens, int64(1000+len(gens))), append(families, 4)
		states, nss, podNames, uids, selected = append(states, "active"), append(nss, "ns"), append(podNames, "pod"), append(uids, ""), append(selected, "")
		expires, nows = append(expires, nil), append(nows, time.Now())
	}
	at := time.Now()
	cases := []struct {
		name string
		sql  string
		args namedArgs
		// most buffers per request: a probe-only plan reads a few pages
		// per request, a walk of a space or a hashed join hundreds.
		most int
	}{
		{"one lookup", lookupSQL, namedArgs{"space": "default", "node": "g-170", "container": "x", "iface": "eth0",
			"named": []string{"default"}, "network": ""}, 16},
		{"merged lookups", lookupManySQL, namedArgs{"space": "default", "named": []string{"default"}, "nodes": names,
			"networks": networks, "containers": containers, "ifaces": ifaces}, 12},
		{"merged leases", leaseManySQL, namedArgs{"space": "default", "actors": `{}`, "reason": "", "at": at,
			"nodes": nodeIDs, "pools": poolIDs, "families": families, "states": states, "containers": containers,
			"ifaces": ifaces, "networks": networks, "nss": nss, "names": podNames, "uids": uids, "selectedBys": selected,
			"expiresAll": expires, "nows": nows, "generations": gens}, 40},
		{"merged releases", releaseManySQL, namedArgs{"now": at, "until": at.Add(time.Minute), "space": "default",
			"nodes": names, "actors": []string{"a", "a", "a", "a", "a"}, "networks": networks,
			"containers": held, "ifaces": ifaces, "reason": "r", "at": at}, 30},
		{"cooled reuse", leaseCooledSQL, namedArgs{"space": "default", "node": nodeIDs[0], "pool": poolIDs[0], "family": int16(4),
			"state": "active", "network": "", "container": "cool", "iface": "eth0", "ns": "ns", "name": "pod", "uid": "",
			"now": at.Add(2 * time.Hour), "expires": nil, "selectedBy": "", "generation": int64(2000)}, 80},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			buffers, rows, requests := genericPlanBuffers(t, f, c.sql, c.args)
			if requests != 5 && c.sql != lookupSQL && c.sql != leaseCooledSQL {
				t.Fatalf("%d requests, want the batch of 5", requests)
			}
			if rows != requests {
				// A statement that found nothing to do proves nothing.
				t.Fatalf("%d rows answered for %d requests", rows, requests)
			}
			if buffers > c.most*requests {
				t.Errorf("%d buffers for %d requests under a generic plan on stale statistics, want at most %d each",
					buffers, requests, c.most)
			}
		})
	}
}

// genericPlanBuffers runs sql once, in a transaction it rolls back, with
// the generic plan of its prepared statement, and answers the buffers the
// plan read, the rows it answered, and the requests in args (the length of
// its "nodes", else 1).
func genericPlanBuffers(t *testing.T, f *fixture, sql string, args namedArgs) (buffers, rows, requests int) {
	t.Helper()
	conn, err := f.s.db.Acquire(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	p, err := compileNamed(f.ctx, conn.Conn(), sql)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(f.ctx) }()
	if _, err := tx.Exec(f.ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `PREPARE hot AS `+p.sql); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(f.ctx, `DEALLOCATE hot`) }()
	// EXPLAIN EXECUTE takes no bound parameters: the simple protocol
	// writes the values into the text. The statement's parameters are
	// named in the order of its positional ones (p.names).
	params := make([]string, len(p.names))
	requests = 1
	for i, name := range p.names {
		params[i] = "@" + name
		if name == "nodes" {
			switch v := args[name].(type) {
			case []string:
				requests = len(v)
			case []int64:
				requests = len(v)
			}
		}
	}
	var plan []struct {
		Plan struct {
			Hit  int `json:"Shared Hit Blocks"`
			Read int `json:"Shared Read Blocks"`
			Rows int `json:"Actual Rows"`
		}
	}
	var text string
	if err := tx.QueryRow(f.ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE hot(`+strings.Join(params, ", ")+`)`,
		pgx.QueryExecModeSimpleProtocol, args).Scan(&text); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(text), &plan); err != nil || len(plan) != 1 {
		t.Fatalf("plan %s: %v", text, err)
	}
	return plan[0].Plan.Hit + plan[0].Plan.Read, plan[0].Plan.Rows, requests
}
