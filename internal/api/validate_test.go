// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// The inputs outside testers saw answered 500: forged continue
// tokens (decoding to NUL or invalid UTF-8), a reconcile generation past
// int4, NUL in a stored string, NUL and invalid UTF-8 in query parameters.
// Each is a 400 naming its field (or, for the generation, a success), and
// no refused request changes the database.
func TestReportedBadInputs(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.9.0.0/16"), nil)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "p1"), nil)
	before := e.snapshotAll()
	cases := []struct {
		name, method, path string
		body               any
		status             int
		field              string
	}{
		{"spaces, zzz", "GET", "/v1/spaces?continue=zzz", nil, 400, "continue"},
		{"pools, zzz", "GET", "/v1/pools?continue=zzz", nil, 400, "continue"},
		{"nodes, zzz", "GET", "/v1/nodes?continue=zzz", nil, 400, "continue"},
		{"tokens, zzz", "GET", "/v1/tokens?continue=zzz", nil, 400, "continue"},
		{"leases, zzz", "GET", "/v1/leases?continue=zzz", nil, 400, "continue"},
		{"history, zzz", "GET", "/v1/history?node=n1&continue=zzz", nil, 400, "continue"},
		{"address history, zzz", "GET", "/v1/addresses/10.9.0.2/history?continue=zzz", nil, 400, "continue"},
		{"token of NUL", "GET", "/v1/nodes?continue=AA", nil, 400, "continue"},
		{"token of 0xFF", "GET", "/v1/pools?continue=_w", nil, 400, "continue"},
		{"token of 0xC3 0x28", "GET", "/v1/spaces?continue=wyg", nil, 400, "continue"},
		{"token of NUL, percent-encoded", "GET", "/v1/tokens?continue=%00", nil, 400, "continue"},
		{"providerID with NUL", "PUT", "/v1/nodes/n1", `{"providerID": "a\u0000b"}`, 400, "providerID"},
		{"providerID with raw 0xFF", "PUT", "/v1/nodes/n1", "{\"providerID\": \"a\xffb\"}", 400, "body"},
		{"label value with raw 0xC3 0x28", "PUT", "/v1/nodes/n1", "{\"labels\": {\"zone\": \"\xc3\x28\"}}", 400, "body"},
		{"providerID with a control character", "PUT", "/v1/nodes/n1", `{"providerID": "a\u0007b"}`, 400, "providerID"},
		{"label value with NUL", "PUT", "/v1/nodes/n1", `{"labels": {"zone": "a\u0000"}}`, 400, "labels[zone]"},
		{"label key with NUL", "PUT", "/v1/nodes/n1", `{"labels": {"a\u0000": "x"}}`, 400, "labels"},
		{"owner uid with NUL", "POST", "/v1/nodes/n1/leases",
			`{"owner": {"namespace": "ns", "name": "p", "uid": "u\u0000"}, "containerID": "c2", "interface": "eth0"}`, 400, "owner.uid"},
		{"annotation value with NUL", "POST", "/v1/nodes/n1/leases",
			`{"owner": {"namespace": "ns", "name": "p"}, "containerID": "c2", "interface": "eth0", "pod": {"annotations": {"a": "\u0000"}}}`,
			400, "pod.annotations[a]"},
		{"history owner a/NUL", "GET", "/v1/history?owner=a/%00", nil, 400, "owner"},
		{"history owner 0xFF/b", "GET", "/v1/history?owner=%FF/b", nil, 400, "owner"},
		{"history owner ns/0xC3 0x28", "GET", "/v1/history?owner=ns/%C3%28", nil, 400, "owner"},
		{"history owner not a name", "GET", "/v1/history?owner=ns/a%20b", nil, 400, "owner"},
		{"history node with NUL", "GET", "/v1/history?node=n%00", nil, 400, "node"},
		{"leases node with 0xFF", "GET", "/v1/leases?node=%FF", nil, 400, "node"},
		{"sticky identity with NUL", "GET", "/v1/sticky-bindings?identity=a%00", nil, 400, "identity"},
		{"path node with NUL", "GET", "/v1/nodes/n%00", nil, 400, "node"},
		{"path containerID with 0xFF", "GET", "/v1/nodes/n1/attachments/c%FF/eth0", nil, 400, "containerID"},
		{"window with NUL", "GET", "/v1/pools/default/capacity?window=1h%00", nil, 400, "window"},
		{"from with 0xFF", "GET", "/v1/history?node=n1&from=%FF", nil, 400, "from"},
	}
	for _, c := range cases {
		res := e.do(c.method, c.path, c.body)
		if res.status != c.status {
			t.Errorf("%s: %s %s answered %d, want %d: %s", c.name, c.method, c.path, res.status, c.status, res.body)
			continue
		}
		if p := res.problem(t); deref(p.Field, "") != c.field || p.Type != problemTypePrefix+"invalid-input" {
			t.Errorf("%s: problem %s, want invalid-input on %q", c.name, res.body, c.field)
		}
	}
	if after := e.snapshotAll(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("refused requests changed the database:\nbefore %v\nafter  %v", before, after)
	}
	// A reconcile watermark past int4 is a watermark, not a 500.
	var res ipamv1.ReconcileResult
	e.mustDo(200, "POST", "/v1/nodes/n1/reconcile", `{"attachments": [{"containerID": "c1", "interface": "eth0"}], "generation": 2147483648}`, &res)
	// Annotation values are any text but NUL: a newline is fine.
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", `{"owner": {"namespace": "ns", "name": "p"}, "containerID": "c3", "interface": "eth0",
		"pod": {"annotations": {"example.com/config": "line 1\nline 2\t\u00e9"}}}`, nil)
}

func TestBadTextRules(t *testing.T) {
	for s, want := range map[string]string{
		"":                "",
		"plain":           "",
		"é 名前 \U0001D518": "",
		"\uFFFD":          "", // an encoded replacement character is valid UTF-8
		"a\x00":           "NUL",
		"\xff":            "UTF-8",
		"ok\xc3\x28":      "UTF-8",
		"\xed\xa0\x80":    "UTF-8", // a surrogate
		"a\nb":            "control",
		"\x7f":            "control",
		"\u0085":          "control",
	} {
		got := badText(s, false)
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("badText(%q) = %q, want %q", s, got, want)
		}
	}
	if got := badText("a\nb\tc\u0085", true); got != "" {
		t.Errorf("free text refused: %s", got)
	}
	if got := badText("a\x00", true); !strings.Contains(got, "NUL") {
		t.Errorf("free text with NUL: %q", got)
	}
}

// sqlStateStore is the real store whose GetSpace fails, for some names,
// with a real PostgreSQL error of a value the database cannot hold: the
// safety net behind the edge's checks.
type sqlStateStore struct {
	*store.Store
	db *pgx.Conn
}

func (s *sqlStateStore) GetSpace(ctx context.Context, name string) (alloc.Space, error) {
	var v any
	switch name {
	case "nul": // 22021
		return alloc.Space{}, s.db.QueryRow(ctx, `SELECT $1::text`, "a\x00b").Scan(&v)
	case "jsonb": // 22P05
		return alloc.Space{}, s.db.QueryRow(ctx, `SELECT '"\u0000"'::jsonb`).Scan(&v)
	case "range": // 22003
		return alloc.Space{}, s.db.QueryRow(ctx, `SELECT 2147483647::int4 + 1`).Scan(&v)
	case "shutdown": // 57P01, as every session gets from pg_ctl restart -m fast
		c, err := pgx.Connect(ctx, s.db.Config().ConnString())
		if err != nil {
			return alloc.Space{}, err
		}
		defer c.Close(ctx)
		return alloc.Space{}, c.QueryRow(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`).Scan(&v)
	}
	return s.Store.GetSpace(ctx, name)
}

// A value the database refuses is the input's fault: 400, never 500, and
// logged, since it means an edge check is missing.
func TestUnstorableValueIsInvalidInput(t *testing.T) {
	wrapped := &sqlStateStore{}
	e := newEnv(t, func(s *store.Store) Stores { wrapped.Store = s; st := StoresOf(s); st.Spaces = wrapped; return st })
	wrapped.db = e.db
	for _, name := range []string{"nul", "jsonb", "range"} {
		res := e.do("GET", "/v1/spaces/"+name, nil)
		if res.status != 400 {
			t.Fatalf("%s: %d %s", name, res.status, res.body)
		}
		if p := res.problem(t); p.Type != problemTypePrefix+"invalid-input" {
			t.Errorf("%s: %s", name, res.body)
		}
	}
	if logs := e.logs.String(); strings.Count(logs, "the database refused a value") != 3 {
		t.Errorf("not logged:\n%s", logs)
	}
	e.mustDo(200, "GET", "/v1/spaces/default", nil, nil)
}

// A session the database ends (SQLSTATE 57P01, a server shutting down)
// carries a SQLSTATE too, but is no fault of the input: it is a 503, and
// logged as an outage (class unavailable), never as a missing check.
func TestLostSessionIsLoggedAsUnavailable(t *testing.T) {
	wrapped := &sqlStateStore{}
	e := newEnv(t, func(s *store.Store) Stores { wrapped.Store = s; st := StoresOf(s); st.Spaces = wrapped; return st })
	wrapped.db = e.db
	res := e.do("GET", "/v1/spaces/shutdown", nil)
	if res.status != 503 || res.problem(t).Type != problemTypePrefix+"unavailable" {
		t.Fatalf("%d %s", res.status, res.body)
	}
	var lines []map[string]any
	for line := range strings.Lines(e.logs.String()) {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && strings.HasPrefix(fmt.Sprint(m["msg"]), "api: ") {
			lines = append(lines, m)
		}
	}
	if len(lines) != 1 || lines[0]["msg"] != "api: unavailable" || lines[0]["class"] != "unavailable" || lines[0]["dependency"] != "the database" {
		t.Errorf("logged %v, want one line of class unavailable", lines)
	}
}
