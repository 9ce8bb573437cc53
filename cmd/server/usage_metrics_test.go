// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
)

// After a scripted sequence of allocations and releases on three nodes and
// two pools, the Cilium-named gauges (after the prefix cilium_operator)
// equal what the database says when counted directly: addresses held and
// used per node from the blocks and lease rows, the need from
// neededIPCeil over those counts, and the nodes at capacity or in deficit.
// The counters count what the script did, and the pool gauges match the
// lease rows.
func TestUsageMetricsMatchDatabase(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	// The script's state stays as it made it: no top-up after its
	// allocations, no GC pass within the test to carve toward the needs.
	base := startServer(t, dbURL, "--metrics-prefix", "cilium_operator", "--usage-metrics-refresh", "1ms",
		"--block-top-up=false", "--gc-interval", "1h")
	mustCall(t, 201, "POST", base+"/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/24"],"maskSize":28}}}`)
	mustCall(t, 201, "POST", base+"/v1/pools", `{"name":"blue","spec":{"ipv4":{"cidrs":["10.8.0.0/24"],"maskSize":28}}}`)
	for _, n := range []string{"n1", "n2", "n3"} {
		mustCall(t, 201, "PUT", base+"/v1/nodes/"+n, `{}`)
	}
	lease := func(node, container, pool string) {
		mustCall(t, 201, "POST", base+"/v1/nodes/"+node+"/leases", fmt.Sprintf(
			`{"containerID":%q,"interface":"eth0","owner":{"namespace":"ns","name":%q},"pool":%q}`, container, container, pool))
	}
	// n1 fills its first /28 of default (12 leasable addresses): at capacity.
	for i := range 12 {
		lease("n1", fmt.Sprint("a", i), "default")
	}
	// n2: three from default, one released (cooling: still used), one from blue.
	for i := range 3 {
		lease("n2", fmt.Sprint("b", i), "default")
	}
	mustCall(t, 204, "DELETE", base+"/v1/nodes/n2/attachments/b0/eth0", "")
	lease("n2", "c0", "blue")
	// n3 holds nothing but should pre-allocate 8 from default.

	got := mustCall(t, 200, "GET", base+"/metrics", "")

	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	// Per node, pool and family, counted from the rows themselves (not the
	// blocks' counters): capacity of the blocks and lease rows in them.
	rows, err := conn.Query(t.Context(), `SELECT n.name, p.name, p.mode, coalesce(p.pre_allocate, CASE WHEN p.name = 'default' THEN 8 ELSE 0 END),
			count(b.id), coalesce(sum(b.capacity), 0),
			coalesce(sum((SELECT count(*) FROM leases l WHERE l.block_id = b.id)), 0)
		FROM nodes n CROSS JOIN pools p LEFT JOIN blocks b ON b.node_id = n.id AND b.pool_id = p.id
		GROUP BY n.name, p.name, p.mode, p.pre_allocate`)
	if err != nil {
		t.Fatal(err)
	}
	type totals struct {
		available, used, needed int64
		atCapacity              bool
	}
	want := map[string]*totals{}
	var node, pool, mode string
	var pre, blocks, capacity, used int64
	if _, err := pgx.ForEachRow(rows, []any{&node, &pool, &mode, &pre, &blocks, &capacity, &used}, func() error {
		w := want[node]
		if w == nil {
			w = &totals{}
			want[node] = w
		}
		w.available += capacity
		w.used += used
		if mode == string(alloc.ModeMultiPool) && (blocks > 0 || pre > 0) {
			w.needed += max(alloc.NeededIPCeil(used, pre)-capacity, 0)
		}
		w.atCapacity = w.atCapacity || blocks > 0 && used == capacity
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(want) != 3 || !want["n1"].atCapacity || want["n2"].used != 4 {
		t.Fatalf("the script did not make the state it means to: %+v %+v", *want["n1"], *want["n2"])
	}
	var inDeficit, atCapacity int
	for n, w := range want {
		for name, v := range map[string]int64{"available": w.available, "used": w.used, "needed": w.needed} {
			series := fmt.Sprintf(`cilium_operator_ipam_%s_ips{space="default",target_node=%q}`, name, n)
			if g, ok := sample(got, series); g != strconv.FormatInt(v, 10) {
				t.Errorf("%s = %q (present %v), the database says %d", series, g, ok, v)
			}
		}
		if w.needed > 0 {
			inDeficit++
		}
		if w.atCapacity {
			atCapacity++
		}
	}
	for category, v := range map[string]int{"total": len(want), "in-deficit": inDeficit, "at-capacity": atCapacity} {
		series := fmt.Sprintf(`cilium_operator_ipam_nodes{category=%q}`, category)
		if g, ok := sample(got, series); g != strconv.Itoa(v) {
			t.Errorf("%s = %q (present %v), the database says %d", series, g, ok, v)
		}
	}

	// Pool gauges against the lease rows.
	for _, p := range []string{"default", "blue"} {
		var leased, cooling int64
		if err := conn.QueryRow(t.Context(), `SELECT count(*) FILTER (WHERE l.state <> 'released'),
				count(*) FILTER (WHERE l.state = 'released' AND l.cooldown_until > now())
			FROM leases l JOIN pools p ON p.id = l.pool_id WHERE p.name = $1`, p).Scan(&leased, &cooling); err != nil {
			t.Fatal(err)
		}
		for state, v := range map[string]int64{"leased": leased, "cooling": cooling} {
			series := fmt.Sprintf(`ipam_pool_addresses{family="ipv4",pool=%q,space="default",state=%q}`, p, state)
			if g, ok := sample(got, series); g != strconv.FormatInt(v, 10) {
				t.Errorf("%s = %q (present %v), the database says %d", series, g, ok, v)
			}
		}
	}

	// What the script did, counted by the Cilium-named counters.
	for series, v := range map[string]string{
		`cilium_operator_ipam_ip_allocation_ops{pool="default"}`:                                  "15",
		`cilium_operator_ipam_ip_allocation_ops{pool="blue"}`:                                     "1",
		`cilium_operator_ipam_ip_release_ops{pool="default"}`:                                     "1",
		`cilium_operator_ipam_events_total{action="allocate",family="ipv4"}`:                      "16",
		`cilium_operator_ipam_events_total{action="release",family="ipv4"}`:                       "1",
		`cilium_operator_ipam_events_total{action="allocate",family="ipv6"}`:                      "0",
		`cilium_operator_ipam_allocation_duration_seconds_count{status="success",type="pod"}`:     "16",
		`cilium_operator_ipam_release_duration_seconds_count{status="success",type="attachment"}`: "1",
	} {
		if g, ok := sample(got, series); g != v {
			t.Errorf("%s = %q (present %v), want %s", series, g, ok, v)
		}
	}
	if t.Failed() {
		t.Logf("exposition:\n%s", got)
	}
}

// The usage report is read at most once per refresh whatever the number
// of scrapes; a failed read leaves the series out (not frozen at stale
// values) and is not retried before the refresh either.
func TestUsageReportsCache(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	reads := 0
	fail := false
	u := &usageReports{
		read: func(context.Context, time.Duration) (store.UsageReport, error) {
			reads++
			if fail {
				return store.UsageReport{}, errors.New("database down")
			}
			return store.UsageReport{Nodes: []store.NodeTotals{{Node: fmt.Sprint("n", reads)}}}, nil
		},
		refresh: 15 * time.Second, timeout: time.Second, log: slog.New(slog.DiscardHandler), now: func() time.Time { return now },
	}
	get := func() string {
		r, ok := u.get(t.Context())
		if !ok {
			return "absent"
		}
		return r.Nodes[0].Node
	}
	steps := []struct {
		advance time.Duration
		fail    bool
		want    string
		reads   int
	}{
		{0, false, "n1", 1},
		{5 * time.Second, false, "n1", 1},  // cached
		{10 * time.Second, false, "n2", 2}, // refresh reached
		{15 * time.Second, true, "absent", 3},
		{time.Second, false, "absent", 3}, // a failure is not retried at once
		{14 * time.Second, false, "n4", 4},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		fail = s.fail
		if got := get(); got != s.want || reads != s.reads {
			t.Fatalf("step %d: got %s after %d reads, want %s after %d", i, got, reads, s.want, s.reads)
		}
	}
}

// A crd-mode node is reported in Cilium's terms: its CiliumNode's pool,
// what Pods use of it, and the operator's need; other nodes as they are.
func TestCRDNodesInCiliumTerms(t *testing.T) {
	n := store.NodeTotals{Space: "default", Node: "n1", Available: 60, Used: 10, CiliumPool: 10, CiliumUsed: 3}
	needed := func(space, node string) (int64, bool) {
		if space == "default" && node == "n1" {
			return 5, true
		}
		return 0, false
	}
	got := crdTerms(n, needed)
	if got.Available != 10 || got.Used != 3 || got.Needed != 5 || !got.InDeficit {
		t.Errorf("crdTerms with the leader's need = %+v; want available 10, used 3, needed 5, in deficit", got)
	}
	got = crdTerms(n, nil)
	if got.Available != 10 || got.Used != 3 || got.Needed != 0 || got.InDeficit {
		t.Errorf("crdTerms without the operator = %+v; want available 10, used 3, no need", got)
	}
	n.Node = "n2"
	if got := crdTerms(n, needed); got.Needed != 0 || got.InDeficit {
		t.Errorf("crdTerms of a node the operator has not reconciled = %+v", got)
	}
}
