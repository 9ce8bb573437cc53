// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
)

// fuzzBodyRoutes are the requests that carry a JSON body; FuzzRequestBody
// picks one by its first input. %s is the node or pool name input.
var fuzzBodyRoutes = []struct{ method, path string }{
	{"POST", "/v1/pools"},
	{"PUT", "/v1/pools/%s"},
	{"POST", "/v1/spaces"},
	{"PUT", "/v1/nodes/%s"},
	{"POST", "/v1/nodes/%s/leases"},
	{"POST", "/v1/nodes/%s/reconcile"},
	{"POST", "/v1/nodes/%s/blocks"},
}

// FuzzRequestBody sends arbitrary JSON bodies to every endpoint that takes
// one, through the whole handler (routing, decoding, validation, the store)
// over a real database made once for the fuzz target. Valid bodies may
// change its state; what must hold for every input is: no 5xx, every error
// a problem+json whose status matches the HTTP status, every success JSON.
func FuzzRequestBody(f *testing.F) {
	seeds := []struct {
		route int
		name  string
		body  string
	}{
		{0, "", `{"name":"default","spec":{"ipv4":{"cidrs":["10.0.0.0/16"],"maskSize":24},"ipv6":{"cidrs":["fd00::/104"],"maskSize":120}}}`},
		{0, "", `{"name":"p2","spec":{"ipv4":{"cidrs":["10.1.0.0/16"],"maskSize":26,"pool":[{"cidr":"10.1.0.0/16","reservedRanges":[{"start":"10.1.0.0","end":"10.1.3.255"}]}]},"podSelector":{"matchExpressions":[{"key":"app","operator":"In","values":["a"]}]}}}`},
		{0, "", `{"name":"p3","spec":{"ipv4":{"cidrs":["10.2.0.0/16"],"maskSize":"24"}}}`},
		{0, "", `{"name":"p3","spec":{"ipv4":{"cidrs":["10.2.0.0/16"],"maskSize":1e400}}}`},
		{1, "default", `{"spec":{"ipv4":{"cidrs":["10.0.0.0/16","10.3.0.0/16"],"maskSize":24},"ipv6":{"cidrs":["fd00::/104"],"maskSize":120}}}`},
		{1, "default", `{"spec":{"mode":"cluster-pool","preAllocate":-1}}`},
		{2, "", `{"name":"blue"}`},
		{2, "", `{"name":["blue"]}`},
		{3, "n1", `{"labels":{"zone":"a"},"addresses":[{"type":"InternalIP","address":"192.168.0.1"}],"podCIDRs":["10.0.9.0/24"]}`},
		{3, "N_1", `{}`},
		{4, "n1", `{"owner":{"namespace":"ns","name":"pod"},"containerID":"c1","interface":"eth0"}`},
		{4, "n1", `{"owner":{"namespace":"ns","name":"pod"},"containerID":"c2","interface":"eth0","families":["ipv6"],"pod":{"annotations":{"ipam.cilium.io/ip-pool":"default"}}}`},
		{4, "n1", `{"owner":{"namespace":"ns","name":"pod"},"containerID":"c 3","interface":"eth0"}`},
		{5, "n1", `{"attachments":[{"containerID":"c1","interface":"eth0"}]}`},
		{5, "n1", `{"attachments":null}`},
		{6, "n1", `{"pool":"default","family":"ipv4"}`},
		{4, "n1", `[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[`},
		// Values no column can hold: NUL, raw invalid UTF-8,
		// integers past int4 and int64.
		{3, "n1", `{"providerID":"a\u0000b"}`},
		{3, "n1", "{\"providerID\":\"a\xffb\",\"labels\":{\"a\u0000\":\"x\"}}"},
		{5, "n1", `{"attachments":[],"generation":2147483648}`},
		{5, "n1", `{"attachments":[],"generation":9223372036854775808}`},
		{1, "default", `{"spec":{"ipv4":{"cidrs":["10.0.0.0/16"],"maskSize":2147483648},"preAllocate":1e30}}`},
		{4, "n1", `{"owner":{"namespace":"ns","name":"pod","uid":"\u0007"},"containerID":"c1","interface":"eth0","pod":{"annotations":{"a":"\u0000"}}}`},
		{4, "n1", "{\"owner\":{\"namespace\":\"\xff\xfe\",\"name\":\"pod\"},\"containerID\":\"c1\",\"interface\":\"eth0\"}"},
		// More than one value: what follows must not switch the strict
		// decoding off.
		{4, "n1", `{"owner":{"namespace":"ns","name":"pod"},"containerID":"c4","interface":"eth0","expire":true,"Expire":false} x`},
		{2, "", `{"name":"dupa","name":"dupb"}}`},
		{3, "n1", `{"labels":{"a":"b"},"bogus":1}]`},
		{6, "n1", "{\"pool\":\"default\",\"family\":\"ipv4\"}\x00"},
		{0, "", `{"name":"p9","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}{"name":"p10"}`},
	}
	for _, s := range seeds {
		f.Add(uint8(s.route), s.name, []byte(s.body))
	}
	h := newFuzzHandler(f)
	f.Fuzz(func(t *testing.T, route uint8, name string, body []byte) {
		r := fuzzBodyRoutes[int(route)%len(fuzzBodyRoutes)]
		// Escaped, so that the name stays one path segment.
		path := strings.Replace(r.path, "%s", url.PathEscape(name), 1)
		req := httptest.NewRequest(r.method, path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		checkAnswer(t, r.method+" "+path, body, rec.Result())
		if !json.Valid(body) && rec.Code < 400 {
			t.Fatalf("%s %s with a body that is not one JSON value (%.300q): status %d", r.method, path, body, rec.Code)
		}
	})
}

// FuzzOneJSONValue checks the body's first gate against encoding/json's
// own validity: data passes exactly when it is one JSON value with only
// whitespace around it, and is otherwise refused as invalid input naming
// body; checkStrictJSON then never panics on what passed, whatever the
// operation's type.
func FuzzOneJSONValue(f *testing.F) {
	for _, s := range []string{`{}`, ` {"a":1} `, `{} x`, `{}}`, `[]]`, "{}\x00", `{}{}`, `1x`, `"a"`, ``, ` `, `{"a":`,
		`{"owner":{"namespace":"ns","name":"p"},"expire":true,"Expire":false} x`, `{"a":[1,2,{"b":null}]}` + "\n\t"} {
		f.Add([]byte(s))
	}
	types := make([]reflect.Type, 0, len(bodyTypes))
	for _, t := range bodyTypes {
		types = append(types, t)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := oneJSONValue(data)
		if valid := json.Valid(data); valid != (err == nil) {
			t.Fatalf("%q: json.Valid %v, oneJSONValue %v", data, valid, err)
		}
		if err != nil {
			var ae *alloc.Error
			if !errors.As(err, &ae) || ae.Kind != alloc.KindInvalid || ae.Field != "body" {
				t.Fatalf("%q: %v, want invalid input of body", data, err)
			}
			return
		}
		for _, ty := range types {
			if err := checkStrictJSON(data, ty); err != nil {
				var ae *alloc.Error
				if !errors.As(err, &ae) || ae.Kind != alloc.KindInvalid || ae.Field == "" {
					t.Fatalf("%q as %v: %v, want invalid input naming a field", data, ty, err)
				}
			}
		}
	})
}

// newFuzzHandler is the API over a store on a database of its own, made
// once per fuzz target (each fuzzing worker process makes its own).
func newFuzzHandler(f *testing.F) http.Handler {
	f.Helper()
	conn := pgtest.NewDatabase(f)
	st, err := store.Open(f.Context(), conn, store.Options{
		LeaseExpiry: testLeaseExpiry, Cooldown: testCooldown, AutoRegisterNodes: true,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(st.Close)
	// Internal errors are logged at error level; the assertion on the
	// status catches them, so the log stays quiet.
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return NewHandler(StoresOf(st), Options{Logger: log, IsUnavailable: store.IsUnavailable, AnonymousRole: alloc.RoleAdmin})
}

// checkAnswer fails t unless res is a success with a JSON (or no) body or
// a 4xx problem+json whose status field matches.
func checkAnswer(t *testing.T, what string, body []byte, res *http.Response) {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s: reading the answer: %v", what, err)
	}
	if res.StatusCode >= 500 {
		t.Fatalf("%s with body %.300q: status %d: %s", what, body, res.StatusCode, b)
	}
	if res.StatusCode >= 400 {
		if err := checkProblem(res.StatusCode, res.Header, b); err != "" {
			t.Fatalf("%s with body %.300q: %s", what, body, err)
		}
		return
	}
	if len(b) > 0 && !json.Valid(b) {
		t.Fatalf("%s with body %.300q: status %d with a body that is not JSON: %.300q", what, body, res.StatusCode, b)
	}
}

// checkProblem says what is wrong with an error answer, or "" when it is a
// well-formed problem+json of its status.
func checkProblem(status int, h http.Header, b []byte) string {
	if ct := h.Get("Content-Type"); ct != problemContentType {
		return "status " + http.StatusText(status) + " with Content-Type " + ct + ", not " + problemContentType
	}
	var p ipamv1.Problem
	if err := json.Unmarshal(b, &p); err != nil {
		return "problem body does not decode: " + err.Error()
	}
	if p.Status != status || p.Title == "" || !strings.HasPrefix(p.Type, problemTypePrefix) {
		return "problem does not match its answer: " + string(b)
	}
	return ""
}
