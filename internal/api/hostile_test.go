// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/big"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// TestHostileValuesEverywhere feeds values no column or parameter of the
// service can hold into every string, integer and token parameter (path
// and query) and every string and integer property of every request body
// (nested, array items, map keys and values) of every operation of
// api/openapi.yaml, one site and one value at a time, as an admin (so each
// request reaches its handler):
//
//   - strings: NUL, invalid UTF-8 (raw bytes in bodies too), C0 and C1
//     control characters;
//   - integers: 2^31, 2^63-1, 2^63, -1, 1e30, the string
//     "9223372036854775808", and one past each bound the spec declares;
//   - continue tokens: forged, tampered, of the format before version 1,
//     and real tokens of another list;
//   - after a valid body: data of every kind (a letter, a closing brace or
//     bracket, NUL, a second object, a second body), which must be a 400
//     naming "body", never the first value read alone.
//
// Every value outside the site's spec (every string here, every integer
// outside [minimum, maximum]) must be a 4xx application/problem+json naming
// the site (a raw invalid byte in a body names "body"), and a refused
// request must leave every table as it was. Integers inside the spec's
// bounds (a generation of 2^31) may succeed, never with a 5xx. The sites
// are read from the spec, so operations and properties added later are
// covered without touching this test.
func TestHostileValuesEverywhere(t *testing.T) {
	ops := loadOperations(t, "../../api/openapi.yaml")
	e := newEnv(t, nil)
	seedBadInput(e)
	e.mustDo(201, "PUT", "/v1/nodes/n2", map[string]any{}, nil)
	tokens := hostileTokens(e)
	snap := e.snapshotAll()

	var (
		sent, refused, accepted int
		sitesByOp               = map[string]int{}
	)
	hc := &http.Client{}
	for _, op := range ops {
		for _, s := range sitesOf(t, op) {
			sitesByOp[op.id]++
			for _, h := range s.values(tokens(op.id)) {
				req := hostileRequest(op, s, h)
				status, body, header := sendRaw(t, hc, e.srv.URL, req)
				sent++
				what := fmt.Sprintf("%s %s (%s = %s)", op.id, req.path, s, h.label)
				switch {
				case status >= 500:
					t.Errorf("%s: status %d: %s", what, status, body)
				case status >= 400:
					refused++
					if p := checkProblem(status, header, body); p != "" {
						t.Errorf("%s: %s", what, p)
						break
					}
					var p ipamv1.Problem
					_ = json.Unmarshal(body, &p)
					if want := s.field(h); status == 400 && deref(p.Field, "") != want {
						t.Errorf("%s: problem names %q, want %q: %s", what, deref(p.Field, ""), want, body)
					}
				case h.mustRefuse:
					t.Errorf("%s: accepted with %d: %.300s", what, status, body)
				default:
					accepted++
				}
				if op.method == http.MethodGet {
					continue
				}
				after := e.snapshotAll()
				if status >= 400 && !maps.Equal(snap, after) {
					t.Fatalf("%s: refused with %d, but the database changed:\nbefore %v\nafter  %v", what, status, snap, after)
				}
				snap = after
			}
		}
	}
	for _, op := range ops {
		if op.body != nil && sitesByOp[op.id] == 0 {
			t.Errorf("%s takes a body but no site of it was tried", op.id)
		}
	}
	if sent < 1000 {
		t.Errorf("only %d requests", sent)
	}
	t.Logf("%d requests over %d operations: %d refused, %d accepted (values the spec admits); sites per operation %v",
		sent, len(ops), refused, accepted, sitesByOp)
}

// site is one place of a request a value goes: a parameter, or a body
// property given by its JSON path.
type site struct {
	param  *openapi3.Parameter // nil for a body site
	path   []string            // body: property names, "[0]" (array item), "[*]" (a map's value), "{}" (a map's key)
	schema *openapi3.Schema
	// trailing: the site is after the body's JSON value (the body is
	// valid; the value is appended to it).
	trailing bool
}

func (s site) String() string {
	switch {
	case s.param != nil:
		return s.param.In + " " + s.param.Name
	case s.trailing:
		return "after the body"
	}
	return "body " + strings.Join(s.path, ".")
}

// hostileTrailing is what may follow a body's JSON value: anything but
// whitespace makes it more than one value.
var hostileTrailing = []hostile{
	{label: "a letter", json: " x"},
	{label: "a closing brace", json: "}"},
	{label: "a closing bracket", json: "]"},
	{label: "NUL", json: "\x00"},
	{label: "a second object", json: `{"zzUnknown": 1}`},
	{label: "the body again", json: "\n{}"},
	{label: "a comma and a property", json: `,"zzUnknown": 1}`},
	{label: "a number after whitespace", json: " \t\r\n 1"},
}

// field is the field a 400 for value h at s must name, as checkRequestText
// and the parsers name it.
func (s site) field(h hostile) string {
	if s.param != nil {
		return s.param.Name
	}
	if h.rawBytes || s.trailing {
		return "body"
	}
	var b strings.Builder
	for i, p := range s.path {
		switch {
		case p == "{}": // a bad key names its map
			return b.String()
		case p == "[0]":
			b.WriteString("[0]")
		case p == "[*]":
			b.WriteString("[" + hostileMapKey + "]")
		default:
			if i > 0 {
				b.WriteString(".")
			}
			b.WriteString(p)
		}
	}
	return b.String()
}

// freeText reports whether s is a value of a map freeTextFields names.
func (s site) freeText() bool {
	n := len(s.path)
	return s.param == nil && n >= 2 && s.path[n-1] == "[*]" && freeTextFields[s.path[n-2]]
}

func (s site) isKey() bool { return s.param == nil && s.path[len(s.path)-1] == "{}" }

// hostile is one value: its JSON text in a body (raw: without quotes for
// a string) or its text in a parameter.
type hostile struct {
	label      string
	json       string // the JSON token put in a body
	text       string // the parameter value
	rawBytes   bool   // the body carries bytes that are not UTF-8
	mustRefuse bool
}

// hostileMapKey is the key of a map whose value is the site.
const hostileMapKey = "example.com/k"

var hostileStrings = []hostile{
	{label: "NUL", json: `"a\u0000b"`, text: "a\x00b"},
	{label: "lone NUL", json: `"\u0000"`, text: "\x00"},
	{label: "0xFF", json: "\"a\xffb\"", text: "a\xffb", rawBytes: true},
	{label: "0xC3 0x28", json: "\"ns/\xc3\x28\"", text: "ns/\xc3\x28", rawBytes: true},
	{label: "BEL", json: `"a\u0007b"`, text: "a\x07b"},
	{label: "C1 NEL", json: `"\u0085x"`, text: "\u0085x"},
	{label: "DEL", json: `"x\u007f"`, text: "x\x7f"},
}

// values are the hostile values of s, each marked mustRefuse unless the
// spec admits it.
func (s site) values(tokens []hostile) []hostile {
	if s.trailing {
		out := slices.Clone(hostileTrailing)
		for i := range out {
			out[i].mustRefuse = true
		}
		return out
	}
	typ := s.schema.Type
	var out []hostile
	switch {
	case s.isKey() || typ.Is("string"):
		for _, h := range hostileStrings {
			if s.isKey() && h.text == "\x00" {
				continue // one NUL key is enough
			}
			// Annotation values may hold any text but NUL
			// (freeTextFields); bytes that are not UTF-8 are refused in
			// any body.
			h.mustRefuse = !s.freeText() || h.rawBytes || strings.ContainsRune(h.text, 0)
			out = append(out, h)
		}
		if s.param != nil && s.param.Name == "continue" {
			out = append(out, tokens...)
		}
	case typ.Is("integer"):
		nums := []string{"2147483648", "9223372036854775807", "9223372036854775808", "-1", "1e30"}
		if s.schema.Min != nil {
			nums = append(nums, big.NewFloat(*s.schema.Min-1).Text('f', 0))
		}
		if s.schema.Max != nil {
			max := new(big.Float).SetFloat64(*s.schema.Max)
			if *s.schema.Max >= math.MaxInt64 {
				max.SetInt64(math.MaxInt64)
			}
			nums = append(nums, new(big.Float).Add(max, big.NewFloat(1)).Text('f', 0))
		}
		for _, n := range nums {
			out = append(out, hostile{label: n, json: n, text: n, mustRefuse: !s.admits(n)})
		}
		if s.param == nil {
			out = append(out, hostile{label: `"9223372036854775808"`, json: `"9223372036854775808"`, mustRefuse: true})
		}
	}
	return out
}

// admits reports whether the integer n lies within the bounds the spec
// declares for s (an integer site without both bounds admits nothing: its
// bounds are part of the contract).
func (s site) admits(n string) bool {
	v, err := strconv.ParseInt(n, 10, 64)
	if err != nil || s.schema.Min == nil || s.schema.Max == nil {
		return false
	}
	maxV := int64(math.MaxInt64)
	if *s.schema.Max < math.MaxInt64 {
		maxV = int64(*s.schema.Max)
	}
	return float64(v) >= *s.schema.Min && v <= maxV
}

// sitesOf lists every string and integer parameter and body site of op.
func sitesOf(t *testing.T, op operation) []site {
	var out []site
	for _, p := range op.params {
		if p.Schema == nil || p.Schema.Value == nil || p.Schema.Value.Type == nil {
			continue
		}
		if ty := p.Schema.Value.Type; ty.Is("string") || ty.Is("integer") {
			if ty.Is("integer") && (p.Schema.Value.Min == nil || p.Schema.Value.Max == nil) {
				t.Errorf("%s: integer parameter %s declares no minimum or maximum", op.id, p.Name)
			}
			out = append(out, site{param: p, schema: p.Schema.Value})
		}
	}
	if op.body == nil {
		return out
	}
	out = append(out, site{trailing: true})
	var walk func(s *openapi3.Schema, path []string, depth int)
	walk = func(s *openapi3.Schema, path []string, depth int) {
		if s == nil || s.Type == nil || depth > 8 {
			return
		}
		switch {
		case s.Type.Is("object"):
			for _, name := range slices.Sorted(maps.Keys(s.Properties)) {
				walk(s.Properties[name].Value, append(slices.Clone(path), name), depth+1)
			}
			if ap := s.AdditionalProperties.Schema; ap != nil && ap.Value != nil {
				out = append(out, site{path: append(slices.Clone(path), "{}"), schema: ap.Value})
				walk(ap.Value, append(slices.Clone(path), "[*]"), depth+1)
			}
		case s.Type.Is("array"):
			if s.Items != nil {
				walk(s.Items.Value, append(slices.Clone(path), "[0]"), depth+1)
			}
		case s.Type.Is("string"):
			out = append(out, site{path: path, schema: s})
		case s.Type.Is("integer"):
			if s.Min == nil || s.Max == nil {
				t.Errorf("%s: integer property %s declares no minimum or maximum", op.id, strings.Join(path, "."))
			}
			out = append(out, site{path: path, schema: s})
		}
	}
	walk(op.body, nil, 0)
	return out
}

// Good values that reach past validation, for the parameters and bodies
// around the site under test (seedBadInput makes them exist).
var hostileGoodParams = map[string]string{
	"space": "default", "pool": "default", "node": "n1", "containerID": "c1", "interface": "eth0",
	"address": "10.0.0.3", "cidr": "10.0.0.0/24", "maskSize": "24", "identity": "statefulset/ns/web/0",
	"owner": "ns/pod1", "name": "nobody",
}

// hostileBodies are valid bodies of each operation, with every optional
// property the checks reach; a site they lack is added from the schema.
var hostileBodies = map[string]string{
	"createSpace": `{"name": "blue"}`,
	"createPool": `{"name": "p-new", "labels": {"team": "a"}, "spec": {
		"ipv4": {"cidrs": ["10.50.0.0/16"], "maskSize": 24, "pool": [{"cidr": "10.50.0.0/16", "reservedRanges": [{"start": "10.50.0.1", "end": "10.50.0.9"}]}]},
		"ipv6": {"cidrs": ["fd09::/104"], "maskSize": 120}, "mode": "multi-pool", "preAllocate": 8,
		"podSelector": {"matchLabels": {"app": "a"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]},
		"namespaceSelector": {"matchLabels": {"team": "a"}, "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]},
		"nodeSelector": {"matchLabels": {"rack": "a"}, "matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}}}`,
	"updatePool": `{"labels": {"team": "a"}, "spec": {
		"ipv4": {"cidrs": ["10.0.0.0/16"], "maskSize": 24, "pool": [{"cidr": "10.0.0.0/16", "reservedRanges": [{"start": "10.0.200.1", "end": "10.0.200.9"}]}]},
		"ipv6": {"cidrs": ["fd00::/104"], "maskSize": 120}, "preAllocate": 8,
		"podSelector": {"matchLabels": {"app": "a"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]},
		"namespaceSelector": {"matchLabels": {"team": "a"}, "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]},
		"nodeSelector": {"matchLabels": {"rack": "a"}, "matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}}}`,
	"createLBPool": `{"name": "vip-new", "labels": {"team": "a"}, "spec": {
		"blocks": [{"cidr": "192.168.20.0/24"}, {"start": "192.168.21.1", "stop": "192.168.21.9"}],
		"serviceSelector": {"matchLabels": {"color": "blue"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]},
		"allowFirstLastIPs": "No", "disabled": false, "reservedCIDRGroups": ["corp"]}}`,
	"updateLBPool": `{"name": "default", "labels": {"team": "a"}, "spec": {
		"blocks": [{"cidr": "192.168.10.0/24"}, {"start": "fd10::1", "stop": "fd10::ff"}],
		"serviceSelector": {"matchLabels": {"color": "blue"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]},
		"allowFirstLastIPs": "No", "disabled": true, "reservedCIDRGroups": ["corp"]}}`,
	"assignVIPs": `{"labels": {"color": "blue"}, "families": ["ipv4"], "addresses": ["192.168.10.7"], "requireAllFamilies": true,
		"sharing": {"key": "web", "crossNamespace": ["other"], "ports": [{"port": 80, "protocol": "TCP"}], "externalTrafficPolicy": "Local",
		"podSelector": {"app": "web"}, "permitDifferentPods": false}, "reassign": false}`,
	"createCIDRGroup": `{"name": "g-new", "labels": {"tier": "a"}, "externalCIDRs": ["10.30.0.0/16", "fd30::/48"]}`,
	"updateCIDRGroup": `{"name": "corp", "labels": {"tier": "a"}, "externalCIDRs": ["10.30.0.0/16"]}`,
	"putNode": `{"labels": {"zone": "a"}, "addresses": [{"type": "InternalIP", "address": "192.168.0.1"}],
		"providerID": "aws:///zone-a/i-1", "podCIDRs": ["10.0.7.0/24"]}`,
	"allocateLease": `{"owner": {"namespace": "ns", "name": "pod9", "uid": "u-9"}, "containerID": "c9", "interface": "eth0",
		"pool": "default", "pools": {"ipv4": "default", "ipv6": "default"}, "families": ["ipv4"],
		"pod": {"labels": {"app": "a"}, "annotations": {"example.com/a": "x"}},
		"namespace": {"labels": {"team": "a"}, "annotations": {"example.com/b": "y"}},
		"sticky": {"identity": "statefulset/ns/web/9", "retention": "1h"}}`,
	"reconcileNode": `{"attachments": [{"containerID": "c1", "interface": "eth0"}, {"containerID": "t1", "interface": "eth0"}], "generation": 1}`,
	"carveBlock":    `{"pool": "default", "family": "ipv4"}`,
	"createToken":   `{"name": "tok-new", "role": "viewer", "expiresIn": "1h"}`,
}

// hostileExclusive names, by operation and top-level property, the
// property of hostileBodies that may not go with it.
var hostileExclusive = map[string]string{"allocateLease fromReserve": "sticky"}

// hostileRequest is op's request with h at s and good values elsewhere.
func hostileRequest(op operation, s site, h hostile) badRequest {
	const placeholder = "HOSTILE-PLACEHOLDER-7f3a"
	path := op.path
	query := url.Values{}
	if op.id == "listHistory" {
		query.Set("node", "n1") // one subject is required
	}
	for _, p := range op.params {
		v, ok := hostileGoodParams[p.Name]
		if p.Schema != nil && p.Schema.Value != nil && len(p.Schema.Value.Enum) > 0 {
			v, ok = fmt.Sprint(p.Schema.Value.Enum[0]), true
		}
		if s.param == p {
			v, ok = h.text, true
		} else if p.In == "query" && !p.Required {
			continue
		}
		if !ok {
			v = "x1"
		}
		if p.In == "path" {
			path = strings.ReplaceAll(path, "{"+p.Name+"}", url.PathEscape(v))
		} else {
			query.Set(p.Name, v)
		}
	}
	r := badRequest{method: op.method, path: path}
	if q := query.Encode(); q != "" {
		r.path += "?" + q
	}
	if op.body == nil {
		return r
	}
	var body any
	if b, ok := hostileBodies[op.id]; ok {
		d := json.NewDecoder(strings.NewReader(b))
		d.UseNumber()
		if err := d.Decode(&body); err != nil {
			panic(fmt.Sprintf("%s: %v", op.id, err))
		}
	} else {
		body = sampleOf(op.body, "", 0)
	}
	token := `"` + placeholder + `"`
	if s.trailing {
		b, err := json.Marshal(body)
		if err != nil {
			panic(err)
		}
		r.body, r.contentType = append(b, h.json...), "application/json"
		return r
	}
	if s.param == nil {
		// A site of a property that excludes another of the valid body
		// goes in without the other, or the exclusion is all it meets.
		if m, ok := body.(map[string]any); ok && len(s.path) > 0 {
			delete(m, hostileExclusive[op.id+" "+s.path[0]])
		}
		body = setAt(body, op.body, s.path, placeholder)
	}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	if s.param == nil {
		b = bytes.Replace(b, []byte(token), []byte(h.json), 1)
	}
	r.body, r.contentType = b, "application/json"
	return r
}

// setAt answers v with the site at path set to the string placeholder,
// creating what is missing from the schema.
func setAt(v any, s *openapi3.Schema, path []string, placeholder string) any {
	if len(path) == 0 {
		return placeholder
	}
	switch step := path[0]; step {
	case "[0]":
		a, _ := v.([]any)
		if len(a) == 0 {
			a = []any{sampleOf(s.Items.Value, "", 1)}
		}
		a[0] = setAt(a[0], s.Items.Value, path[1:], placeholder)
		return a
	case "{}", "[*]":
		m, _ := v.(map[string]any)
		if m == nil {
			m = map[string]any{}
		}
		ap := s.AdditionalProperties.Schema.Value
		if step == "{}" {
			m[placeholder] = sampleOf(ap, "", 1)
			return m
		}
		m[hostileMapKey] = setAt(m[hostileMapKey], ap, path[1:], placeholder)
		return m
	default:
		m, _ := v.(map[string]any)
		if m == nil {
			m, _ = sampleOf(s, "", 1).(map[string]any)
		}
		m[step] = setAt(m[step], s.Properties[step].Value, path[1:], placeholder)
		return m
	}
}

// sampleOf is a plausible value of s with every property, deterministic.
func sampleOf(s *openapi3.Schema, name string, depth int) any {
	switch {
	case len(s.Enum) > 0:
		return s.Enum[0]
	case s.Type == nil:
		return "x1"
	case s.Type.Is("object"):
		o := map[string]any{}
		for pn, ps := range s.Properties {
			if depth < 6 {
				o[pn] = sampleOf(ps.Value, pn, depth+1)
			}
		}
		return o
	case s.Type.Is("array"):
		return []any{sampleOf(s.Items.Value, name, depth+1)}
	case s.Type.Is("integer"):
		if s.Min != nil {
			return int64(*s.Min)
		}
		return 1
	case s.Type.Is("boolean"):
		return false
	}
	if h, ok := stringHints[name]; ok {
		return h[0]
	}
	return "x1"
}

// hostileTokens answers the continue tokens no list of an operation may
// take: forged ones, one of the format before version 1, a real one
// altered, and a real one of another list (a leases token, or for the
// lease list a pools token).
func hostileTokens(e *env) func(opID string) []hostile {
	e.t.Helper()
	var pools ipamv1.PoolList
	e.mustDo(200, "GET", "/v1/pools?limit=1", nil, &pools)
	var leases ipamv1.LeaseList
	e.mustDo(200, "GET", "/v1/leases?limit=1", nil, &leases)
	if pools.Continue == nil || leases.Continue == nil {
		e.t.Fatal("the seed lists fit in one page")
	}
	altered := []byte(*pools.Continue)
	altered[len(altered)/2] ^= 1
	toks := []string{"zzz", "AA", "_w", "wyg", base64.RawURLEncoding.EncodeToString([]byte("default")), string(altered)}
	common := make([]hostile, 0, len(toks)+1)
	for _, tok := range toks {
		common = append(common, hostile{label: "token " + tok, text: tok, mustRefuse: true})
	}
	return func(opID string) []hostile {
		other := *leases.Continue
		if opID == "listLeases" {
			other = *pools.Continue
		}
		return append(slices.Clone(common), hostile{label: "token of another list", text: other, mustRefuse: true})
	}
}

// sendRaw sends r and answers the status, body and headers.
func sendRaw(t *testing.T, hc *http.Client, base string, r badRequest) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(r.method, base+r.path, bytes.NewReader(r.body))
	if err != nil {
		t.Fatalf("%s: %v", r, err)
	}
	if r.body == nil {
		req.Body, req.ContentLength = http.NoBody, 0
	} else {
		req.Header.Set("Content-Type", r.contentType)
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", r, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s: reading the answer: %v", r, err)
	}
	return res.StatusCode, b, res.Header
}
