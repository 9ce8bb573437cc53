// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
)

// randomBadRequests is how many requests TestRandomBadInput sends.
const randomBadRequests = 12000

// randomSeedEnv fixes the seed of TestRandomBadInput to replay a failure.
const randomSeedEnv = "IPAM_RANDOM_SEED"

// TestRandomBadInput sends thousands of requests generated from
// api/openapi.yaml itself, so that endpoints added later are covered
// without touching this test. Each request is made invalid on purpose by
// at least one mutation that no handler may accept (a path or space name
// that is no DNS label nor token, a query parameter of the wrong type or
// missing, an undeclared method or route, a body that is not JSON, of a
// wrong type somewhere, too large, or not application/json), with more
// noise on top (unknown fields, unicode, huge strings, boundary numbers).
// Every answer must be a 4xx application/problem+json (never a 5xx, never a
// success), and the database must be exactly as before.
func TestRandomBadInput(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(randomSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", randomSeedEnv, s, err)
		}
	}
	t.Logf("seed %d (replay with %s=%d)", seed, randomSeedEnv, seed)

	ops := loadOperations(t, "../../api/openapi.yaml")
	e := newEnv(t, nil)
	seedBadInput(e)
	before := e.snapshotAll()

	const workers = 8
	var (
		mu       sync.Mutex
		failures []string
		byOp     = map[string]int{}
		byStatus = map[int]int{}
		byMut    = map[string]int{}
	)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}, Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := w; i < randomBadRequests; i += workers {
				g := &badGen{rng: rng}
				op := ops[rng.IntN(len(ops))]
				req := g.request(op)
				status, problem := send(hc, e.srv.URL, req)
				mu.Lock()
				byOp[op.id]++
				byStatus[status]++
				byMut[req.mutation]++
				if problem != "" && len(failures) < 20 {
					failures = append(failures, fmt.Sprintf("%s (%s): %s", req, req.mutation, problem))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	if t.Failed() {
		t.Fatalf("seed %d: replay with %s=%d", seed, randomSeedEnv, seed)
	}
	if after := e.snapshotAll(); !maps.Equal(before, after) {
		t.Fatalf("seed %d: the database changed:\nbefore %v\nafter  %v", seed, before, after)
	}
	for _, op := range ops {
		if byOp[op.id] < 50 {
			t.Errorf("operation %s got only %d requests", op.id, byOp[op.id])
		}
	}
	t.Logf("%d requests over %d operations; by status %v; by mutation %v", randomBadRequests, len(ops), byStatus, byMut)
}

// operation is one method of one path of the OpenAPI document.
type operation struct {
	id      string
	method  string
	path    string // template, e.g. /v1/nodes/{node}
	params  []*openapi3.Parameter
	body    *openapi3.Schema // nil when the operation takes no body
	methods []string         // every method the path declares
}

// loadOperations reads every operation of the document, with path-level
// parameters merged into each.
func loadOperations(t *testing.T, file string) []operation {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var ops []operation
	for path, item := range doc.Paths.Map() {
		var methods []string
		for m := range item.Operations() {
			methods = append(methods, m)
		}
		for m, o := range item.Operations() {
			op := operation{id: o.OperationID, method: m, path: path, methods: methods}
			for _, p := range append(slices.Clone(item.Parameters), o.Parameters...) {
				op.params = append(op.params, p.Value)
			}
			if rb := o.RequestBody; rb != nil && rb.Value != nil {
				if mt := rb.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil {
					op.body = mt.Schema.Value
				}
			}
			ops = append(ops, op)
		}
	}
	// Map order is random; the seed must replay the same requests.
	sort.Slice(ops, func(i, j int) bool { return ops[i].id < ops[j].id })
	if len(ops) < 20 {
		t.Fatalf("%s declares only %d operations", file, len(ops))
	}
	return ops
}

// badRequest is one generated request.
type badRequest struct {
	method      string
	path        string // escaped, with the query
	contentType string
	body        []byte
	mutation    string // the mutation that makes it invalid
}

func (r badRequest) String() string {
	return fmt.Sprintf("%s %.200s [%s] %.200q", r.method, r.path, r.contentType, r.body)
}

// send makes the request; problem is "" when the answer is as required.
func send(hc *http.Client, base string, r badRequest) (status int, problem string) {
	req, err := http.NewRequest(r.method, base+r.path, bytes.NewReader(r.body))
	if err != nil {
		return 0, "building the request: " + err.Error()
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.body == nil {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	res, err := hc.Do(req)
	if err != nil {
		return 0, "no answer: " + err.Error()
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil && res.StatusCode != http.StatusRequestEntityTooLarge {
		return res.StatusCode, "reading the answer: " + err.Error()
	}
	switch {
	case res.StatusCode >= 500:
		return res.StatusCode, fmt.Sprintf("status %d: %s", res.StatusCode, b)
	case res.StatusCode < 400:
		return res.StatusCode, fmt.Sprintf("an invalid request was accepted with %d: %.300s", res.StatusCode, b)
	}
	if p := checkProblem(res.StatusCode, res.Header, b); p != "" {
		return res.StatusCode, p
	}
	return res.StatusCode, ""
}

// badGen generates one invalid request.
type badGen struct{ rng *rand.Rand }

func (g *badGen) pick(s []string) string { return s[g.rng.IntN(len(s))] }
func (g *badGen) chance(p float64) bool  { return g.rng.Float64() < p }

// Values that reach past validation: the names seedBadInput creates.
var goodParams = map[string][]string{
	"space":       {"default"},
	"pool":        {"default", "tiny"},
	"node":        {"n1", "n2"},
	"containerID": {"c1", "t1", "c9"},
	"interface":   {"eth0"},
	"address":     {"10.0.0.3", "fd00::3", "10.9.0.2"},
	"cidr":        {"10.0.0.0/24", "10.0.1.0/24", "10.0.0.0/16"},
	"window":      {"1h", "5m"},
	"maskSize":    {"24", "28"},
	"continue":    {"abc"},
}

// badNames fail every name and token rule (DNS label, DNS subdomain,
// container ID, interface, IP address): each has a space, a control
// character or a non-ASCII letter. They are path-escaped, so none can reach
// another route.
var badNames = []string{
	"bad name", "ü", "a\x01b", "Ünïcödé-名前", " ", "a b/c", "\u202eevil", "x\ty",
	strings.Repeat("a b", 300), "%zz and space", "n1 ", " n1", "10.0.0.3 ", "c1\n",
	"a\x00b", "\xffn1", "ns/\xc3\x28", "n1\u0085",
}

// badTyped are values of an integer or boolean query parameter that no
// binder accepts.
var badTyped = []string{"abc", "1.5", "1e3", "0x10", "99999999999999999999", "yes", "maybe", "-", "2 ", "truee", "∞", "NaN"}

// noiseStrings go into bodies and unknown parameters.
var noiseStrings = []string{
	"", "ü", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "\u0000", "\u202e", "' OR 1=1 --", "<script>", "../../etc/passwd",
	"10.0.0.0/16", "fd00::/104", "10.0.0.1/8", "300.1.1.1/8", "::ffff:10.0.0.0/104", "10.0.0.0/33",
	"default", "n1", "eth0", "ipv4", "ipv6", "multi-pool", "cluster-pool", "In", "Exists",
}

func (g *badGen) noiseString() string {
	switch g.rng.IntN(10) {
	case 0:
		return strings.Repeat(g.pick([]string{"a", "ü", "10.0.0.0/8,"}), 1+g.rng.IntN(40000))
	case 1:
		return string(rune(g.rng.IntN(0x10FFFF)))
	}
	return g.pick(noiseStrings)
}

func (g *badGen) noiseNumber() any {
	return []any{0, -1, 1, 24, 32, 33, 128, 129, 1 << 31, -1 << 31, json.Number("9223372036854775807"),
		json.Number("-9223372036854775808"), 9007199254740993, 0.5, json.Number("-0.0")}[g.rng.IntN(15)]
}

// request builds a request of op with one invalidating mutation and noise.
func (g *badGen) request(op operation) badRequest {
	path := map[string]string{}
	query := url.Values{}
	for _, p := range op.params {
		switch {
		case p.In == "path":
			path[p.Name] = g.goodValue(p)
		case p.Required || g.chance(0.5):
			query.Set(p.Name, g.goodValue(p))
		}
	}
	var body any
	if op.body != nil {
		body = g.value(op.body, "", 0)
	}
	r := badRequest{method: op.method, contentType: "application/json"}

	// The mutations this operation admits; one is chosen.
	type mutation struct {
		name  string
		apply func()
	}
	var params, routing, bodies []mutation
	for _, p := range op.params {
		switch {
		case p.In == "path":
			params = append(params, mutation{"bad path " + p.Name, func() { path[p.Name] = g.pick(badNames) }})
		case p.In != "query":
		case p.Name == "space":
			params = append(params, mutation{"bad space", func() { query.Set("space", g.pick(badNames)) }})
		case p.Required:
			params = append(params, mutation{"missing " + p.Name, func() { query.Del(p.Name) }})
			if isTyped(p) {
				params = append(params, mutation{"bad " + p.Name, func() { query.Set(p.Name, g.pick(badTyped)) }})
			}
		case isTyped(p):
			params = append(params, mutation{"bad " + p.Name, func() { query.Set(p.Name, g.pick(badTyped)) }})
		case p.Schema != nil && len(p.Schema.Value.Enum) > 0:
			params = append(params, mutation{"bad enum " + p.Name, func() { query.Set(p.Name, g.pick(badNames)) }})
		}
	}
	undeclared := slices.DeleteFunc([]string{"GET", "POST", "PUT", "DELETE", "PATCH"}, func(m string) bool {
		return slices.Contains(op.methods, m)
	})
	routing = append(routing,
		mutation{"undeclared method", func() { r.method = g.pick(undeclared) }},
		// Suffixes that are no name either, so that they cannot reach a
		// route with one more segment (/v1/spaces/{space}).
		mutation{"unknown route", func() { path["#suffix"] = g.pick([]string{"/no%20such", "/%20/x", "/..", "/%C3%BC/confirm"}) }},
	)
	if op.body != nil {
		bodies = append(bodies,
			mutation{"not JSON", func() {
				r.contentType = g.pick([]string{"text/plain", "application/xml", "", "application/jsonx", "multipart/form-data"})
			}},
			mutation{"broken JSON", func() { body = brokenJSON{g.brokenJSON(body)} }},
			mutation{"wrong type", func() { body = g.wrongType(body, op.body) }},
			mutation{"wrong top-level type", func() { body = g.pick([]string{"[]", `"x"`, "42", "true", "[{}]"}) }},
			mutation{"no body", func() { body = nil }},
		)
		if g.chance(0.05) { // costly: keep it rare
			bodies = append(bodies, mutation{"too large", func() {
				body = map[string]any{"name": strings.Repeat("x", 1<<20+g.rng.IntN(1000))}
			}})
		}
	}
	// Noise first, so that the mutation has the last word.
	if body != nil && g.chance(0.5) {
		body = g.noise(body, 0)
	}
	if g.chance(0.3) {
		query.Set("x-"+g.pick([]string{"unknown", "débug", "limit "}), g.pick(noiseStrings))
	}
	// Weighted by kind, so that bodies and parameters, where the handlers'
	// own checks run, get most requests.
	muts := routing
	switch r := g.rng.Float64(); {
	case r < 0.6 && len(bodies) > 0:
		muts = bodies
	case r < 0.85 && len(params) > 0:
		muts = params
	}
	m := muts[g.rng.IntN(len(muts))]
	m.apply()
	r.mutation = m.name

	p := op.path
	for name, v := range path {
		if name == "#suffix" {
			continue
		}
		p = strings.ReplaceAll(p, "{"+name+"}", url.PathEscape(v))
	}
	p += path["#suffix"]
	if q := query.Encode(); q != "" {
		p += "?" + q
	}
	r.path = p
	switch b := body.(type) {
	case nil:
	case brokenJSON:
		r.body = []byte(b.s)
	case string:
		r.body = []byte(b)
	default:
		r.body, _ = json.Marshal(b)
	}
	if op.body == nil {
		r.contentType = ""
	}
	return r
}

// brokenJSON is a body sent as is.
type brokenJSON struct{ s string }

func isTyped(p *openapi3.Parameter) bool {
	if p.Schema == nil || p.Schema.Value == nil || p.Schema.Value.Type == nil {
		return false
	}
	return p.Schema.Value.Type.Is("integer") || p.Schema.Value.Type.Is("boolean") || p.Schema.Value.Type.Is("number")
}

func (g *badGen) goodValue(p *openapi3.Parameter) string {
	if vs, ok := goodParams[p.Name]; ok {
		return g.pick(vs)
	}
	if s := p.Schema; s != nil && s.Value != nil {
		switch {
		case len(s.Value.Enum) > 0:
			return fmt.Sprint(s.Value.Enum[g.rng.IntN(len(s.Value.Enum))])
		case s.Value.Type != nil && s.Value.Type.Is("boolean"):
			return g.pick([]string{"true", "false"})
		case s.Value.Type != nil && s.Value.Type.Is("integer"):
			return g.pick([]string{"1", "10", "1000"})
		}
	}
	return "x1"
}

// stringHints are plausible values by property name, so that generated
// bodies get past the first checks.
var stringHints = map[string][]string{
	"name":        {"default", "tiny", "p-new", "n1"},
	"pool":        {"default", "tiny"},
	"cidrs":       {"10.0.0.0/16", "10.50.0.0/16", "fd00::/104", "fd09::/104"},
	"cidr":        {"10.0.0.0/16", "10.50.0.0/16", "fd00::/104"},
	"podCIDRs":    {"10.0.7.0/24", "fd00::700/120"},
	"containerID": {"c1", "c9", "t1"},
	"interface":   {"eth0"},
	"namespace":   {"ns", "kube-system"},
	"address":     {"192.168.0.1", "fd00::1"},
	"start":       {"10.0.0.10", "10.50.0.1"},
	"end":         {"10.0.0.20", "10.50.0.9"},
	"key":         {"app", "zone"},
	"type":        {"InternalIP", "ExternalIP"},
	// Cloud pools' ids.
	"subnetIDs":      {"subnet-0123456789abcdef0", "subnet-89abcdef"},
	"securityGroups": {"sg-0123456789abcdef0", "sg-89abcdef"},
}

// value generates a plausible value of schema s for a property named name.
func (g *badGen) value(s *openapi3.Schema, name string, depth int) any {
	switch {
	case len(s.Enum) > 0:
		return s.Enum[g.rng.IntN(len(s.Enum))]
	case s.Type == nil:
		return g.pick(noiseStrings)
	case s.Type.Is("object"):
		o := map[string]any{}
		for pn, ps := range s.Properties {
			if depth < 6 && (slices.Contains(s.Required, pn) || g.chance(0.6)) {
				o[pn] = g.value(ps.Value, pn, depth+1)
			}
		}
		if ap := s.AdditionalProperties.Schema; ap != nil && ap.Value != nil {
			for range g.rng.IntN(3) {
				o[g.pick([]string{"app", "zone", "ipam.cilium.io/ip-pool", "example.com/x"})] = g.value(ap.Value, "", depth+1)
			}
		}
		return o
	case s.Type.Is("array"):
		n := 1 + g.rng.IntN(2)
		a := make([]any, n)
		for i := range a {
			a[i] = g.value(s.Items.Value, name, depth+1)
		}
		return a
	case s.Type.Is("integer"):
		return json.Number(g.pick([]string{"0", "1", "8", "24", "26", "120", "32"}))
	case s.Type.Is("number"):
		return 1.5
	case s.Type.Is("boolean"):
		return g.chance(0.5)
	}
	if h, ok := stringHints[name]; ok {
		return g.pick(h)
	}
	return g.pick(noiseStrings)
}

// wrongType replaces one typed value inside v (or v itself) with a value of
// another JSON type, which the generated types cannot decode. null is never
// used: it decodes as absent.
func (g *badGen) wrongType(v any, s *openapi3.Schema) any {
	type site struct {
		set func(any)
		s   *openapi3.Schema
	}
	var sites []site
	var walk func(v any, s *openapi3.Schema, set func(any))
	walk = func(v any, s *openapi3.Schema, set func(any)) {
		if s == nil || s.Type == nil {
			return
		}
		sites = append(sites, site{set, s})
		switch x := v.(type) {
		case map[string]any:
			for k, child := range x {
				var cs *openapi3.Schema
				if ps, ok := s.Properties[k]; ok {
					cs = ps.Value
				} else if ap := s.AdditionalProperties.Schema; ap != nil {
					cs = ap.Value
				}
				walk(child, cs, func(nv any) { x[k] = nv })
			}
		case []any:
			for i, child := range x {
				if s.Items != nil {
					walk(child, s.Items.Value, func(nv any) { x[i] = nv })
				}
			}
		}
	}
	root := v
	walk(v, s, func(nv any) { root = nv })
	st := sites[g.rng.IntN(len(sites))]
	var wrong []any
	switch {
	case st.s.Type.Is("object"):
		wrong = []any{[]any{}, "x", 1, true}
	case st.s.Type.Is("array"):
		wrong = []any{map[string]any{}, "x", 1, false}
	case st.s.Type.Is("integer"):
		wrong = []any{"24", 1.5, json.Number("1e400"), json.Number("99999999999999999999"), true, map[string]any{}, []any{}}
	case st.s.Type.Is("number"):
		wrong = []any{"1", true, []any{}}
	case st.s.Type.Is("boolean"):
		wrong = []any{"true", 1, []any{}, map[string]any{}}
	default: // string
		wrong = []any{1, 2.5, true, []any{"x"}, map[string]any{"a": "b"}}
	}
	st.set(wrong[g.rng.IntN(len(wrong))])
	return root
}

// brokenJSON returns text that no JSON decoder accepts: v's encoding cut
// short or corrupted, or nested beyond the decoder's depth limit.
func (g *badGen) brokenJSON(v any) string {
	b, _ := json.Marshal(v)
	s := string(b)
	switch g.rng.IntN(6) {
	case 0:
		return s[:g.rng.IntN(len(s))] // a proper prefix of a JSON value is never JSON
	case 1:
		return strings.Repeat("[", 10001+g.rng.IntN(1000)) + strings.Repeat("]", 10001)
	case 2:
		return `{"name": ` + strings.Repeat(`{"a":`, 10001) + "1" + strings.Repeat("}", 10001) + "}"
	case 3:
		if strings.Contains(s, ":") {
			return strings.Replace(s, ":", "=", 1) // {"name"="x"}
		}
		return "{" + s
	case 4:
		return "{" + s[1:len(s)-1] + ",}" // a trailing comma
	}
	return "\xff\xfe" + s
}

// noise adds unknown fields, odd strings and boundary numbers to v.
func (g *badGen) noise(v any, depth int) any {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			x[k] = g.noise(c, depth+1)
		}
		if g.chance(0.3) {
			x[g.pick([]string{"unknownField", "Name", "spec ", "ü", ""})] = g.pick([]string{"x", "1"})
		}
		return x
	case []any:
		for i, c := range x {
			x[i] = g.noise(c, depth+1)
		}
		return x
	case string:
		if g.chance(0.2) {
			return g.noiseString()
		}
	case json.Number:
		if g.chance(0.3) {
			return g.noiseNumber()
		}
	}
	return v
}

// snapshotAll is snapshot over every table of the public schema, found at
// run time, so that tables added later are compared too.
func (e *env) snapshotAll() map[string]string {
	e.t.Helper()
	rows, err := e.db.Query(e.t.Context(), `SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1`)
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	s := map[string]string{}
	for _, tbl := range names {
		var n int64
		var digest string
		err := e.db.QueryRow(e.t.Context(), `SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
			FROM `+quoteIdent(tbl)+` t`).Scan(&n, &digest)
		if err != nil {
			e.t.Fatalf("snapshot of %s: %v", tbl, err)
		}
		s[tbl] = fmt.Sprintf("%d rows, md5 %s", n, digest)
	}
	if len(s) < len(tables) {
		e.t.Fatalf("snapshot found %d tables, fewer than the %d known", len(s), len(tables))
	}
	return s
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }
