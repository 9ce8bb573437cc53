// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestStrictBodies sends bodies the generated decoder used to accept and
// misread, and checks that each is a 400 naming the property, with the
// database unchanged.
func TestStrictBodies(t *testing.T) {
	e := newEnv(t, nil)
	seedBadInput(e)

	cases := []struct {
		name, method, path, body, field, detail string
	}{
		{"letter case decides a lease's expiry", "POST", "/v1/nodes/n1/leases",
			`{"owner":{"namespace":"ns","name":"p"},"containerID":"c5","interface":"eth0","expire":true,"Expire":false}`,
			"Expire", `did you mean "expire"`},
		{"a property in another case only", "POST", "/v1/nodes/n1/leases",
			`{"owner":{"namespace":"ns","name":"p"},"ContainerID":"c5","containerID":"c5","interface":"eth0"}`,
			"ContainerID", `did you mean "containerID"`},
		{"a nested property in another case", "POST", "/v1/pools",
			`{"name":"p","spec":{"ipv4":{"cidrs":["10.50.0.0/16"],"MaskSize":24,"maskSize":24}}}`,
			"spec.ipv4.MaskSize", `did you mean "maskSize"`},
		{"an unknown property", "POST", "/v1/nodes/n1/leases",
			`{"owner":{"namespace":"ns","name":"p"},"containerID":"c5","interface":"eth0","expires":false}`,
			"expires", "is not a property"},
		{"an unknown nested property", "POST", "/v1/pools",
			`{"name":"p","spec":{"ipv4":{"cidrs":["10.50.0.0/16"],"maskSize":24,"maskSise":26}}}`,
			"spec.ipv4.maskSise", "is not a property"},
		{"an unknown property in an array's object", "POST", "/v1/nodes/n1/reconcile",
			`{"attachments":[{"containerID":"c1","interface":"eth0"},{"containerID":"c2","interface":"eth0","iface":"x"}]}`,
			"attachments[1].iface", "is not a property"},
		{"a property given twice", "POST", "/v1/nodes/n1/leases",
			`{"owner":{"namespace":"ns","name":"p"},"containerID":"c5","interface":"eth0","expire":true,"expire":false}`,
			"expire", "more than once"},
		{"a label given twice", "PUT", "/v1/nodes/n1",
			`{"labels":{"zone":"a","zone":"b"}}`,
			"labels.zone", "more than once"},
		{"null for a boolean", "POST", "/v1/nodes/n1/leases",
			`{"owner":{"namespace":"ns","name":"p"},"containerID":"c5","interface":"eth0","expire":null}`,
			"expire", "must not be null"},
		{"null for a required object", "POST", "/v1/nodes/n1/leases",
			`{"owner":null,"containerID":"c5","interface":"eth0"}`,
			"owner", "must not be null"},
		{"null in an array", "POST", "/v1/pools",
			`{"name":"p","spec":{"ipv4":{"cidrs":["10.50.0.0/16",null],"maskSize":24}}}`,
			"spec.ipv4.cidrs[1]", "must not be null"},
		{"null as a label value", "PUT", "/v1/nodes/n1",
			`{"labels":{"zone":null}}`,
			"labels.zone", "must not be null"},
		{"null after nested objects and arrays", "PUT", "/v1/nodes/n1",
			`{"labels":{"a":"b"},"addresses":[{"type":"InternalIP","address":"192.0.2.1"}],"providerID":null}`,
			"providerID", "must not be null"},
		{"a null body", "POST", "/v1/pools", `null`, "body", "not null"},
		{"a property with an empty name", "POST", "/v1/pools",
			`{"name":"p","":1,"spec":{"ipv4":{"cidrs":["10.50.0.0/16"],"maskSize":24}}}`, "body", "empty name"},
		{"a nested property with an empty name", "POST", "/v1/pools",
			`{"name":"p","spec":{"ipv4":{"cidrs":["10.50.0.0/16"],"maskSize":24,"":[]}}}`, "spec.ipv4", "empty name"},
		{"an empty name given twice", "PUT", "/v1/nodes/n1", `{"":1,"":2}`, "body", "empty name"},

		// One byte after the value used to switch the checks above off
		// (the generated decoder reads the first value alone, leniently):
		// the reproducers of outside testing.
		{"letter case decides, then a letter", "POST", "/v1/nodes/n1/leases",
			`{"owner":{"namespace":"ns","name":"p"},"containerID":"t","interface":"eth0","expire":true,"Expire":false} x`,
			"body", "more data follows it at byte 106"},
		{"a role given twice, then !", "POST", "/v1/tokens",
			`{"name":"d","role":"viewer","role":"admin"}!`, "body", "more data follows it at byte 43"},
		{"a name given twice, then }", "POST", "/v1/pools",
			`{"name":"dupa","name":"dupb","spec":{"ipv4":{"cidrs":["10.50.0.0/16"],"maskSize":24}}}}`, "body", "more data follows"},
		{"an unknown property, then ]", "PUT", "/v1/nodes/n1",
			`{"labels":{"zone":"u"},"bogus":1}]`, "body", "more data follows"},
		{"a second object", "POST", "/v1/nodes/n1/leases",
			`{"owner":{"namespace":"ns","name":"p"},"containerID":"c5","interface":"eth0"}{"expire":true}`, "body", "more data follows"},
		{"NUL after the value", "POST", "/v1/nodes/n1/leases",
			"{\"owner\":{\"namespace\":\"ns\",\"name\":\"p\"},\"containerID\":\"c5\",\"interface\":\"eth0\"}\x00", "body", "more data follows"},
		{"a value cut short", "POST", "/v1/nodes/n1/leases",
			`{"owner":{"namespace":"ns","name":"p"},"containerID":"c5"`, "body", "ends early"},
		{"a top-level number, then a letter", "POST", "/v1/pools", `1x`, "body", "more data follows it at byte 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			before := e.snapshot()
			res := e.do(c.method, c.path, c.body)
			if res.status != 400 {
				t.Fatalf("status %d, want 400: %s", res.status, res.body)
			}
			p := res.problem(t)
			if p.Type != "urn:ipam:problem:invalid-input" || deref(p.Field, "") != c.field || !strings.Contains(deref(p.Detail, ""), c.detail) {
				t.Errorf("problem %s, want invalid-input of field %q saying %q", res.body, c.field, c.detail)
			}
			after := e.snapshot()
			for _, tbl := range tables {
				if before[tbl] != after[tbl] {
					t.Errorf("table %s changed: %s -> %s", tbl, before[tbl], after[tbl])
				}
			}
		})
	}
	e.t = t

	// The same bodies without the fault are served, with whitespace
	// around the value too.
	e.mustDo(201, "POST", "/v1/nodes/n1/leases",
		" \r\n\t"+`{"owner":{"namespace":"ns","name":"p"},"containerID":"c5","interface":"eth0","expire":false}`+" \r\n\t", nil)
	e.mustDo(200, "PUT", "/v1/nodes/n1", `{"labels":{"zone":"b"}}`, nil)
}

// TestStrictBodiesEveryOperation sends, to every operation of the spec
// that takes a body, the body {"zzUnknown": 1}, a body with its first
// property twice and a body with its first property null, and expects a
// 400 naming that property each time: no operation decodes leniently.
// Each of these bodies followed by data (a letter, a closing brace or
// bracket, NUL, a second object) is a 400 naming "body": the checks
// cannot be switched off by what follows the value.
func TestStrictBodiesEveryOperation(t *testing.T) {
	e := newEnv(t, nil)
	seedBadInput(e)
	doc := loadSpec(t)
	seen := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if op.RequestBody == nil {
				continue
			}
			seen++
			schema := op.RequestBody.Value.Content.Get("application/json").Schema.Value
			props := make([]string, 0, len(schema.Properties))
			for name := range schema.Properties {
				props = append(props, name)
			}
			sort.Strings(props)
			first := props[0]
			url := strings.NewReplacer("{node}", "n1", "{pool}", "default", "{space}", "default",
				"{containerID}", "c1", "{interface}", "eth0", "{name}", "x").Replace(path)
			bodies := map[string]string{
				"unknown":   `{"zzUnknown": 1}`,
				"duplicate": fmt.Sprintf(`{%q: %s, %q: %s}`, first, jsonSample(schema.Properties[first].Value), first, jsonSample(schema.Properties[first].Value)),
				"null":      fmt.Sprintf(`{%q: null}`, first),
			}
			want := map[string]string{"unknown": "zzUnknown", "duplicate": first, "null": first}
			for kind, body := range maps.Clone(bodies) {
				for name, trail := range map[string]string{"x": " x", "brace": "}", "bracket": "]", "NUL": "\x00", "object": `{"a": 1}`} {
					bodies[kind+"+"+name] = body + trail
					want[kind+"+"+name] = "body"
				}
			}
			for kind, body := range bodies {
				t.Run(op.OperationID+"/"+kind, func(t *testing.T) {
					e.t = t
					before := e.snapshot()
					res := e.do(method, url, body)
					if res.status != 400 {
						t.Fatalf("%s %s %s: status %d, want 400: %s", method, url, body, res.status, res.body)
					}
					if p := res.problem(t); deref(p.Field, "") != want[kind] {
						t.Errorf("%s %s %s: field %q, want %q", method, url, body, deref(p.Field, ""), want[kind])
					}
					after := e.snapshot()
					for _, tbl := range tables {
						if before[tbl] != after[tbl] {
							t.Errorf("table %s changed", tbl)
						}
					}
				})
			}
		}
	}
	e.t = t
	if seen != len(bodyTypes) || seen < 8 {
		t.Errorf("the spec has %d operations with a body, the strict decoder knows %d", seen, len(bodyTypes))
	}
}

// jsonSample is a JSON value of s's type.
func jsonSample(s *openapi3.Schema) string {
	switch {
	case s.Type.Is("string"):
		return `"a"`
	case s.Type.Is("integer"), s.Type.Is("number"):
		return "1"
	case s.Type.Is("boolean"):
		return "true"
	case s.Type.Is("array"):
		return "[]"
	}
	return "{}"
}

// TestSpecHasNoNullable keeps the strict decoder's rule true: it refuses
// every null, which is right only while no property is nullable.
func TestSpecHasNoNullable(t *testing.T) {
	doc := loadSpec(t)
	for name, s := range doc.Components.Schemas {
		var walk func(path string, s *openapi3.Schema)
		walk = func(path string, s *openapi3.Schema) {
			if s == nil {
				return
			}
			if s.Nullable {
				t.Errorf("%s is nullable; checkBody refuses every null", path)
			}
			for p, ps := range s.Properties {
				walk(path+"."+p, ps.Value)
			}
			if s.Items != nil {
				walk(path+"[]", s.Items.Value)
			}
			for _, a := range s.AllOf {
				walk(path, a.Value)
			}
		}
		walk(name, s.Value)
	}
}

// TestFirstNull checks the null finder's paths on nesting it must track.
func TestFirstNull(t *testing.T) {
	for in, want := range map[string]string{
		`null`:                                 "",
		`{"a":null}`:                           "a",
		`{"a":{"b":[1,{"c":[[],null]}]}}`:      "a.b[1].c[1]",
		`{"a":[{},{"b":1}],"c":{"d":null}}`:    "c.d",
		`[1,2,null]`:                           "[2]",
		`{"a":"null","b":["x"],"c":{"":null}}`: "c.",
	} {
		got, ok := firstNull([]byte(in))
		if !ok || got != want {
			t.Errorf("firstNull(%s) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{`{}`, `{"a":"null"}`, `[1,"x",{"b":false}]`, `{"a":`} {
		if got, ok := firstNull([]byte(in)); ok {
			t.Errorf("firstNull(%s) = %q, want none", in, got)
		}
	}
}

// loadSpec loads api/openapi.yaml.
func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return doc
}
