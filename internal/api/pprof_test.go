// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"io"
	"strings"
	"testing"
	"time"
)

// With Options.Pprof the Go profiler answers admins only; without it
// there is no such route.
func TestPprofAdminOnly(t *testing.T) {
	e := newEnv(t, nil)
	on := newAuthServer(t, e, Options{Pprof: true})
	off := newAuthServer(t, e, Options{})
	issue := func(s *authServer, role string) ([]byte, []byte) {
		var cert, key []byte
		var err error
		if role == "node" {
			cert, key, err = s.ca.IssueNode("node-a", time.Hour)
		} else {
			cert, key, err = s.ca.IssueOperator("ops-"+role, role, time.Hour)
		}
		if err != nil {
			t.Fatal(err)
		}
		return cert, key
	}
	get := func(s *authServer, cert, key []byte, path string) (int, string) {
		t.Helper()
		res, err := s.client(cert, key).Get(s.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, tc := range []struct {
		role string
		want int
	}{{"admin", 200}, {"operator", 403}, {"viewer", 403}, {"node", 403}, {"", 401}} {
		var cert, key []byte
		if tc.role != "" {
			cert, key = issue(on, tc.role)
		}
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/cmdline"} {
			status, body := get(on, cert, key, path)
			if status != tc.want {
				t.Errorf("%q GET %s: %d, want %d: %.200s", tc.role, path, status, tc.want, body)
			}
			if status == 200 && path == "/debug/pprof/heap?debug=1" && !strings.Contains(body, "heap profile") {
				t.Errorf("the heap profile is not one: %.200s", body)
			}
		}
	}
	cert, key := issue(off, "admin")
	if status, body := get(off, cert, key, "/debug/pprof/"); status != 404 || !strings.Contains(body, "urn:ipam:problem:not-found") {
		t.Errorf("without Pprof: %d %.200s", status, body)
	}
}
