// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// mtls serves e's store over mutual TLS, as cmd/server does, so requests
// carry the actor of their client certificate into the history.
type mtls struct {
	t       *testing.T
	url     string
	clients map[string]*http.Client // by actor: "node:NAME" or "cert:NAME"
}

func newMTLS(t *testing.T, e *env, nodes []string, operators []string) *mtls {
	t.Helper()
	s := newAuthServer(t, e, Options{})
	m := &mtls{t: t, url: s.url, clients: map[string]*http.Client{}}
	add := func(actor string, certPEM, keyPEM []byte, err error) {
		if err != nil {
			t.Fatal(err)
		}
		m.clients[actor] = s.client(certPEM, keyPEM)
	}
	for _, n := range nodes {
		c, k, err := s.ca.IssueNode(n, time.Hour)
		add("node:"+n, c, k, err)
	}
	for _, o := range operators {
		c, k, err := s.ca.IssueClient(o, time.Hour)
		add("cert:"+o, c, k, err)
	}
	return m
}

// do sends a request as actor and fails unless the status is want; it
// decodes the answer into out when out is not nil.
func (m *mtls) do(actor string, want int, method, path string, body, out any) {
	m.t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			m.t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	res, err := m.clients[actor].Do(jsonRequest(m.t, method, m.url+path, r))
	if err != nil {
		m.t.Fatalf("%s %s as %s: %v", method, path, actor, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		m.t.Fatalf("%s %s as %s: status %d, want %d: %s", method, path, actor, res.StatusCode, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			m.t.Fatalf("%s %s: decoding %s: %v", method, path, b, err)
		}
	}
}

// event is what the tests compare of an AddressEvent.
type event struct {
	Offset time.Duration // after the scenario's start
	Kind   string
	Owner  string // NAMESPACE/NAME
	Node   string
	State  string
	Actor  string
	Reason string
}

func (e event) String() string {
	return fmt.Sprintf("+%v %s %s on %s -> %s by %s (%s)", e.Offset, e.Kind, e.Owner, e.Node, e.State, e.Actor, e.Reason)
}

func eventsOf(t0 time.Time, items []ipamv1.AddressEvent) []event {
	out := make([]event, len(items))
	for i, it := range items {
		ev := event{Offset: it.At.Sub(t0), Kind: string(it.Kind), Node: deref(it.Node, ""), Actor: it.Actor, Reason: it.Reason}
		if it.Owner != nil {
			ev.Owner = it.Owner.Namespace + "/" + it.Owner.Name
		}
		if it.State != nil {
			ev.State = string(*it.State)
		}
		out[i] = ev
	}
	return out
}

func diffEvents(t *testing.T, what string, got, want []event) {
	t.Helper()
	if slices.Equal(got, want) {
		return
	}
	var b strings.Builder
	for i := range max(len(got), len(want)) {
		g, w := "-", "-"
		if i < len(got) {
			g = got[i].String()
		}
		if i < len(want) {
			w = want[i].String()
		}
		mark := " "
		if g != w {
			mark = "!"
		}
		fmt.Fprintf(&b, "%s got  %s\n  want %s\n", mark, g, w)
	}
	t.Errorf("%s:\n%s", what, b.String())
}

// One address, 10.0.3.7 (the only address of a pool of /32 blocks), is
// leased, confirmed, released, reused in place, released by address,
// purged, its block given back, carved for another node, leased, expired
// and reused again, each step at its own instant of the test clock and by
// its own client certificate. The history answers exactly that sequence
// of owners, with who and why; `at` answers the holder inside each holding
// and nobody between them; owner and node histories, time ranges and
// pagination agree; pruning removes exactly the events past the retention.
func TestAddressHistoryOfAReusedAddress(t *testing.T) {
	e := newEnv(t, nil)
	m := newMTLS(t, e, []string{"node-a", "node-b"}, []string{"ops"})
	const addr = "10.0.3.7"
	t0 := e.clock.Now()
	at := func(d time.Duration) { e.clock.Set(t0.Add(d)) }
	lease := func(actor, node, container, owner string) {
		t.Helper()
		ns, name, _ := strings.Cut(owner, "/")
		var a ipamv1.Allocation
		m.do(actor, 201, "POST", "/v1/nodes/"+node+"/leases", map[string]any{
			"owner": map[string]string{"namespace": ns, "name": name}, "containerID": container, "interface": "eth0"}, &a)
		if got := a.Addresses[0].Address; len(a.Addresses) != 1 || got != addr+"/32" {
			t.Fatalf("leased %s, want %s/32", got, addr)
		}
	}
	m.do("cert:ops", 201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": map[string]any{
		"ipv4": map[string]any{"cidrs": []string{addr + "/32"}, "maskSize": 32}, "nodeLocal": map[string]bool{"router": false, "health": false}}}, nil)

	lease("node:node-a", "node-a", "c1", "shop/web-0") // carves node-a's block
	at(10 * time.Second)
	m.do("node:node-a", 200, "POST", "/v1/nodes/node-a/attachments/c1/eth0/confirm", nil, nil)
	at(60 * time.Second)
	m.do("node:node-a", 204, "DELETE", "/v1/nodes/node-a/attachments/c1/eth0", nil, nil) // cools until +90s
	at(120 * time.Second)
	lease("node:node-a", "node-a", "c2", "shop/web-1") // reuses the row in place
	at(180 * time.Second)
	m.do("cert:ops", 204, "DELETE", "/v1/addresses/"+addr, nil, nil) // cools until +210s
	at(240 * time.Second)
	if n, err := e.store.PurgeCooled(alloc.WithActor(t.Context(), alloc.ActorSystem)); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	at(250 * time.Second)
	m.do("cert:ops", 204, "DELETE", "/v1/nodes/node-a/blocks?cidr="+url.QueryEscape(addr+"/32"), nil, nil)
	at(300 * time.Second)
	lease("node:node-b", "node-b", "c3", "db/pg-0") // carves the block again, for node-b; never confirmed
	at(300*time.Second + testLeaseExpiry + time.Minute)
	if n, err := e.store.ExpirePending(alloc.WithActor(t.Context(), alloc.ActorSystem)); err != nil || n != 1 {
		t.Fatalf("expire: %d, %v", n, err)
	}
	expired := 300*time.Second + testLeaseExpiry + time.Minute
	at(expired + time.Minute)
	lease("node:node-b", "node-b", "c4", "shop/web-0")
	end := expired + time.Minute

	a, b := "node:node-a", "node:node-b"
	want := []event{
		{0, "lease", "shop/web-0", "node-a", "pending", a, "default"},
		{10 * time.Second, "confirm", "shop/web-0", "node-a", "active", a, ""},
		{60 * time.Second, "release", "shop/web-0", "node-a", "cooling", a, "attachment-released"},
		{90 * time.Second, "cooldown-end", "shop/web-0", "node-a", "free", a, "reused"},
		{120 * time.Second, "lease", "shop/web-1", "node-a", "pending", a, "default"},
		{180 * time.Second, "release", "shop/web-1", "node-a", "cooling", "cert:ops", "address-released"},
		{210 * time.Second, "cooldown-end", "shop/web-1", "node-a", "free", "system", "purged"},
		{300 * time.Second, "lease", "db/pg-0", "node-b", "pending", b, "default"},
		{expired, "expire", "db/pg-0", "node-b", "cooling", "system", "expired"},
		{expired + testCooldown, "cooldown-end", "db/pg-0", "node-b", "free", b, "reused"},
		{end, "lease", "shop/web-0", "node-b", "pending", b, "default"},
	}
	history := func(query string) ([]event, string) {
		t.Helper()
		var h ipamv1.AddressHistory
		e.mustDo(200, "GET", "/v1/addresses/"+addr+"/history"+query, nil, &h)
		for _, it := range h.Items {
			if it.Address == nil || *it.Address != addr || it.Space != "default" || it.Pool == nil || *it.Pool != "default" ||
				it.Block == nil || *it.Block != addr+"/32" || it.Family == nil || *it.Family != ipamv1.Ipv4 {
				t.Errorf("event %s", dump(it))
			}
		}
		return eventsOf(t0, h.Items), deref(h.Continue, "")
	}
	got, next := history("")
	diffEvents(t, "history of "+addr, got, want)
	if next != "" {
		t.Errorf("continue %q after the whole history", next)
	}
	var owners []string
	for _, ev := range got {
		if ev.Kind == "lease" {
			owners = append(owners, ev.Owner)
		}
	}
	if w := []string{"shop/web-0", "shop/web-1", "db/pg-0", "shop/web-0"}; !slices.Equal(owners, w) {
		t.Errorf("owners %v, want %v", owners, w)
	}

	// Pages of 4 chain to the same sequence.
	var paged []event
	for q, pages := "?limit=4", 0; ; pages++ {
		if pages > 3 {
			t.Fatal("more than 3 pages of 4 for 11 events")
		}
		page, next := history(q)
		if len(page) > 4 {
			t.Fatalf("page of %d", len(page))
		}
		paged = append(paged, page...)
		if next == "" {
			break
		}
		q = "?limit=4&continue=" + url.QueryEscape(next)
	}
	diffEvents(t, "paged history", paged, want)

	// [from, to): from is inclusive, to exclusive.
	rfc := func(d time.Duration) string { return url.QueryEscape(t0.Add(d).Format(time.RFC3339Nano)) }
	got, _ = history("?from=" + rfc(60*time.Second) + "&to=" + rfc(210*time.Second))
	diffEvents(t, "history in [+60s, +210s)", got, want[2:6])
	got, _ = history("?from=" + rfc(expired))
	diffEvents(t, "history from the expiry", got, want[8:])

	// Who held it at each instant: inside each holding, its holder; at its
	// end and between holdings, nobody.
	type holding struct {
		owner, node string
		from, to    time.Duration
		hasTo       bool
		kinds       []string
		containerID string
	}
	holders := []struct {
		at   time.Duration
		want *holding
	}{
		{-time.Hour, nil},
		{0, &holding{owner: "shop/web-0", node: "node-a", from: 0, to: 60 * time.Second, hasTo: true, kinds: []string{"lease", "confirm", "release"}, containerID: "c1"}},
		{30 * time.Second, &holding{owner: "shop/web-0", node: "node-a", from: 0, to: 60 * time.Second, hasTo: true, kinds: []string{"lease", "confirm", "release"}, containerID: "c1"}},
		{60*time.Second - time.Microsecond, &holding{owner: "shop/web-0", node: "node-a", from: 0, to: 60 * time.Second, hasTo: true, kinds: []string{"lease", "confirm", "release"}, containerID: "c1"}},
		{60 * time.Second, nil},
		{100 * time.Second, nil},
		{150 * time.Second, &holding{owner: "shop/web-1", node: "node-a", from: 120 * time.Second, to: 180 * time.Second, hasTo: true, kinds: []string{"lease", "release"}, containerID: "c2"}},
		{200 * time.Second, nil},
		{280 * time.Second, nil},
		{500 * time.Second, &holding{owner: "db/pg-0", node: "node-b", from: 300 * time.Second, to: expired, hasTo: true, kinds: []string{"lease", "expire"}, containerID: "c3"}},
		{expired + time.Second, nil},
		{end, &holding{owner: "shop/web-0", node: "node-b", from: end, kinds: []string{"lease"}, containerID: "c4"}},
		{end + 24*time.Hour, &holding{owner: "shop/web-0", node: "node-b", from: end, kinds: []string{"lease"}, containerID: "c4"}},
	}
	for _, c := range holders {
		var h ipamv1.AddressHistory
		e.mustDo(200, "GET", "/v1/addresses/"+addr+"/history?at="+rfc(c.at), nil, &h)
		if c.want == nil {
			if h.Holder != nil || len(h.Items) != 0 {
				t.Errorf("at +%v: holder %s, want none", c.at, dump(h))
			}
			continue
		}
		if h.Holder == nil {
			t.Errorf("at +%v: no holder, want %s", c.at, c.want.owner)
			continue
		}
		got := h.Holder
		var kinds []string
		for _, it := range h.Items {
			kinds = append(kinds, string(it.Kind))
		}
		gotTo := time.Duration(-1)
		if got.To != nil {
			gotTo = got.To.Sub(t0)
		}
		wantTo := time.Duration(-1)
		if c.want.hasTo {
			wantTo = c.want.to
		}
		if got.Owner.Namespace+"/"+got.Owner.Name != c.want.owner || got.Node != c.want.node || got.From.Sub(t0) != c.want.from ||
			gotTo != wantTo || !slices.Equal(kinds, c.want.kinds) || got.ContainerID != c.want.containerID ||
			got.Interface != "eth0" || got.Address != addr || got.Pool != "default" {
			t.Errorf("at +%v: holder %s with %v, want %+v", c.at, dump(got), kinds, *c.want)
		}
	}

	// One owner, one node.
	list := func(query string) []event {
		t.Helper()
		var all []event
		for q := query + "&limit=3"; ; {
			var l ipamv1.EventList
			e.mustDo(200, "GET", "/v1/history?"+q, nil, &l)
			all = append(all, eventsOf(t0, l.Items)...)
			if l.Continue == nil {
				return all
			}
			q = query + "&limit=3&continue=" + url.QueryEscape(*l.Continue)
		}
	}
	diffEvents(t, "history of shop/web-0", list("owner=shop/web-0"), []event{want[0], want[1], want[2], want[3], want[10]})
	diffEvents(t, "history of db/pg-0", list("owner=db/pg-0"), want[7:10])
	nodeA := []event{{0, "block-carve", "", "node-a", "", a, ""}}
	nodeA = append(nodeA, want[:7]...)
	nodeA = append(nodeA, event{250 * time.Second, "block-release", "", "node-a", "", "cert:ops", "block-released"})
	diffEvents(t, "history of node-a", list("node=node-a"), nodeA)
	nodeB := append([]event{{300 * time.Second, "block-carve", "", "node-b", "", b, ""}}, want[7:]...)
	diffEvents(t, "history of node-b", list("node=node-b"), nodeB)
	diffEvents(t, "history of node-a before +100s", list("node=node-a&to="+rfc(100*time.Second)), nodeA[:5])
	if got := list("node=node-c"); len(got) != 0 {
		t.Errorf("history of an unknown node: %v", got)
	}

	// Pruning with a retention that reaches back to +300s removes every
	// event before it (the pool's creation included) and nothing else.
	retention := end - 300*time.Second
	pruner, err := store.Open(t.Context(), e.conn, store.Options{LeaseExpiry: testLeaseExpiry, Cooldown: testCooldown,
		HistoryRetention: retention, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer pruner.Close()
	var before, old int64
	cutoff := t0.Add(300 * time.Second)
	if err := e.db.QueryRow(t.Context(), `SELECT count(*), count(*) FILTER (WHERE at < $1) FROM address_events`, cutoff).Scan(&before, &old); err != nil {
		t.Fatal(err)
	}
	if n, err := pruner.PruneHistory(t.Context()); err != nil || n != old || old == 0 {
		t.Fatalf("pruned %d (%v), want the %d events before +300s", n, err, old)
	}
	got, _ = history("")
	diffEvents(t, "history after pruning", got, want[7:])
	diffEvents(t, "history of node-b after pruning", list("node=node-b"), nodeB)
	if got := list("node=node-a"); len(got) != 0 {
		t.Errorf("node-a's events survived pruning: %v", got)
	}
	var after int64
	if err := e.db.QueryRow(t.Context(), `SELECT count(*) FROM address_events`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before-old {
		t.Errorf("%d events after pruning, want %d", after, before-old)
	}
	var h ipamv1.AddressHistory
	e.mustDo(200, "GET", "/v1/addresses/"+addr+"/history?at="+rfc(30*time.Second), nil, &h)
	if h.Holder != nil {
		t.Errorf("a pruned holding is still answered: %s", dump(h))
	}
}

// Pool changes and node deletion are recorded with their actor and reason.
func TestHistoryOfPoolsAndNodeDeletion(t *testing.T) {
	e := newEnv(t, nil)
	m := newMTLS(t, e, []string{"node-a"}, []string{"ops"})
	t0 := e.clock.Now()
	pool := map[string]any{"name": "default", "labels": map[string]string{"v": "1"}, "spec": map[string]any{
		"ipv4": map[string]any{"cidrs": []string{"10.0.0.0/16"}, "maskSize": 24}}}
	m.do("cert:ops", 201, "POST", "/v1/pools", pool, nil)
	e.clock.Advance(time.Second)
	pool["labels"] = map[string]string{"v": "2"}
	m.do("cert:ops", 200, "PUT", "/v1/pools/default", pool, nil)
	e.clock.Advance(time.Second)
	m.do("node:node-a", 201, "POST", "/v1/nodes/node-a/leases", map[string]any{
		"owner": map[string]string{"namespace": "shop", "name": "web-0"}, "containerID": "c1", "interface": "eth0"}, nil)
	e.clock.Advance(time.Second)
	m.do("cert:ops", 204, "DELETE", "/v1/nodes/node-a?force=true", nil, nil)
	e.clock.Advance(time.Second)
	m.do("cert:ops", 204, "DELETE", "/v1/pools/default", nil, nil)

	rows, err := e.db.Query(t.Context(), `SELECT at, kind, coalesce(node, ''), coalesce(host(address), ''), actor, reason
		FROM address_events ORDER BY at, id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var at time.Time
		var kind, node, address, actor, reason string
		if err := rows.Scan(&at, &kind, &node, &address, &actor, &reason); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("+%v %s %s %s by %s (%s)", at.Sub(t0), kind, node, address, actor, reason))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"+0s pool-create   by cert:ops ()",
		"+1s pool-update   by cert:ops ()",
		"+2s block-carve node-a  by node:node-a ()",
		"+2s lease node-a 10.0.0.3 by node:node-a (default)",
		"+3s release node-a 10.0.0.3 by cert:ops (node-deleted)",
		"+3s block-release node-a  by cert:ops (node-deleted)",
		"+4s pool-delete   by cert:ops ()",
	}
	if !slices.Equal(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Bad history and consistency requests are 4xx problems naming the field.
func TestHistoryBadInput(t *testing.T) {
	e := newEnv(t, nil)
	cases := []struct {
		path   string
		status int
		field  string
	}{
		{"/v1/addresses/10.0.0.300/history", 400, "address"},
		{"/v1/addresses/10.0.0.0%2F24/history", 400, "address"},
		{"/v1/addresses/10.0.0.1/history?from=yesterday", 400, "from"},
		{"/v1/addresses/10.0.0.1/history?to=2030-13-01T00:00:00Z", 400, "to"},
		{"/v1/addresses/10.0.0.1/history?from=2030-01-02T00:00:00Z&to=2030-01-01T00:00:00Z", 400, "to"},
		{"/v1/addresses/10.0.0.1/history?from=2030-01-01T00:00:00Z&to=2030-01-01T00:00:00Z", 400, "to"},
		{"/v1/addresses/10.0.0.1/history?at=noon", 400, "at"},
		{"/v1/addresses/10.0.0.1/history?at=2030-01-01T00:00:00Z&limit=5", 400, "at"},
		{"/v1/addresses/10.0.0.1/history?at=2030-01-01T00:00:00Z&from=2029-01-01T00:00:00Z", 400, "at"},
		{"/v1/addresses/10.0.0.1/history?limit=0", 400, "limit"},
		{"/v1/addresses/10.0.0.1/history?limit=1001", 400, "limit"},
		{"/v1/addresses/10.0.0.1/history?continue=not-a-token", 400, "continue"},
		{"/v1/addresses/10.0.0.1/history?continue=" + url.QueryEscape("eHl6"), 400, "continue"},
		{"/v1/addresses/10.0.0.1/history?space=Bad_Space", 400, "space"},
		{"/v1/addresses/10.0.0.1/history?space=nope", 404, "space"},
		{"/v1/addresses/10.0.0.1/history?space=nope&at=2030-01-01T00:00:00Z", 404, "space"},
		{"/v1/history", 400, "owner"},
		{"/v1/history?owner=web-0", 400, "owner"},
		{"/v1/history?owner=shop/", 400, "owner"},
		{"/v1/history?owner=a/b/c", 400, "owner"},
		{"/v1/history?owner=shop/web-0&node=n1", 400, "node"},
		{"/v1/history?node=Bad_Node", 400, "node"},
		{"/v1/history?node=n1&from=2030-01-01", 400, "from"},
		{"/v1/history?node=n1&limit=-1", 400, "limit"},
		{"/v1/history?node=n1&space=nope", 404, "space"},
	}
	before := e.snapshot()
	for _, c := range cases {
		res := e.do("GET", c.path, nil)
		if res.status != c.status {
			t.Errorf("GET %s: status %d, want %d: %s", c.path, res.status, c.status, res.body)
			continue
		}
		if p := res.problem(t); deref(p.Field, "") != c.field {
			t.Errorf("GET %s: field %q, want %q (%s)", c.path, deref(p.Field, ""), c.field, res.body)
		}
	}
	if res := e.do("POST", "/v1/consistency", nil); res.status != 405 {
		t.Errorf("POST /v1/consistency: status %d", res.status)
	}
	if after := e.snapshot(); !maps.Equal(before, after) {
		t.Errorf("bad requests changed the database: %v -> %v", before, after)
	}
}

// GET /v1/consistency answers a clean report on a healthy database and
// names what a planted corruption broke.
func TestConsistencyEndpoint(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": map[string]any{
		"ipv4": map[string]any{"cidrs": []string{"10.0.0.0/16"}, "maskSize": 24}}}, nil)
	e.lease("n1", "", "c1")
	e.lease("n1", "", "c2")
	var r ipamv1.ConsistencyReport
	e.mustDo(200, "GET", "/v1/consistency", nil, &r)
	if !r.Consistent || len(r.Findings) != 0 || r.Truncated || r.Counts.Leases != 2 || r.Counts.Blocks != 1 || r.Counts.Nodes != 1 ||
		!r.CheckedAt.Equal(e.clock.Now()) {
		t.Fatalf("healthy database: %s", dump(r))
	}
	if _, err := e.db.Exec(t.Context(), `UPDATE blocks SET allocated = allocated + 1`); err != nil {
		t.Fatal(err)
	}
	e.mustDo(200, "GET", "/v1/consistency", nil, &r)
	want := []ipamv1.ConsistencyFinding{{Kind: ipamv1.FindingBlockCounter, Space: "default",
		Detail:  "block 10.0.0.0/24 counts 3 allocated of capacity 252 but holds 2 lease rows",
		Objects: []string{"block 10.0.0.0/24 (id 1)"}}}
	if r.Consistent || !slices.EqualFunc(r.Findings, want, func(a, b ipamv1.ConsistencyFinding) bool {
		return a.Kind == b.Kind && a.Space == b.Space && a.Detail == b.Detail && slices.Equal(a.Objects, b.Objects)
	}) {
		t.Fatalf("counter off by one: %s", dump(r))
	}
}

// A sticky address recreated within its binding (here within the
// cooldown) is reused at once: its cooldown ends at that instant, not at
// the end of the binding. The history never dates an event after the
// change that wrote it, so the events stay in order and ?at= between the
// release and the reuse finds nobody.
func TestHistoryOfAStickyReuse(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": map[string]any{
		"ipv4":      map[string]any{"cidrs": []string{"10.9.0.0/29"}, "maskSize": 29},
		"nodeLocal": map[string]any{"health": false},
	}}, nil)
	const id = "statefulset/ns/web/0"
	t0 := e.clock.Now()
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", stickyLease("web-a", "web-0", id, map[string]any{"retention": "1h"}), &a)
	addr := strings.TrimSuffix(a.Addresses[0].Address, "/29")
	e.clock.Set(t0.Add(10 * time.Second))
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/web-a/eth0", nil, nil)
	e.clock.Set(t0.Add(20 * time.Second)) // within the cooldown and the binding
	var back ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", stickyLease("web-b", "web-0", id, nil), &back)
	if back.Addresses[0].Address != a.Addresses[0].Address {
		t.Fatalf("reuse got %s, want %s", back.Addresses[0].Address, a.Addresses[0].Address)
	}

	var h ipamv1.AddressHistory
	e.mustDo(200, "GET", "/v1/addresses/"+addr+"/history", nil, &h)
	want := []event{
		{0, "lease", "ns/web-0", "n1", "pending", "anonymous", "default"},
		{10 * time.Second, "release", "ns/web-0", "n1", "cooling", "anonymous", "attachment-released"},
		{20 * time.Second, "cooldown-end", "ns/web-0", "n1", "free", "anonymous", "reused"},
		{20 * time.Second, "lease", "ns/web-0", "n1", "pending", "anonymous", "default"},
	}
	diffEvents(t, "history of "+addr, eventsOf(t0, h.Items), want)

	e.mustDo(200, "GET", "/v1/addresses/"+addr+"/history?at="+url.QueryEscape(t0.Add(15*time.Second).Format(time.RFC3339Nano)), nil, &h)
	if h.Holder != nil {
		t.Errorf("between the release and the reuse: holder %s", dump(h.Holder))
	}
	e.mustDo(200, "GET", "/v1/addresses/"+addr+"/history?at="+url.QueryEscape(t0.Add(25*time.Second).Format(time.RFC3339Nano)), nil, &h)
	if h.Holder == nil || h.Holder.ContainerID != "web-b" {
		t.Errorf("after the reuse: holder %s, want the attachment web-b", dump(h.Holder))
	}
}
