// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/store"
)

// The admission flags: by default as many requests in flight as database
// connections, four times as many in line, a second's wait, half the
// in-flight limit per caller and 5 s for a body.
func TestAdmissionFlags(t *testing.T) {
	conns := int(store.DefaultMaxConns())
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want api.Admission
	}{
		{nil, nil, api.Admission{InFlight: conns, Queue: 4 * conns, Wait: time.Second, PerCaller: conns / 2, BodyTimeout: 5 * time.Second}},
		{[]string{"--max-conns", "10"}, nil, api.Admission{InFlight: 10, Queue: 40, Wait: time.Second, PerCaller: 5, BodyTimeout: 5 * time.Second}},
		{[]string{"--max-in-flight", "8", "--admission-queue", "3", "--admission-wait", "200ms"}, nil,
			api.Admission{InFlight: 8, Queue: 3, Wait: 200 * time.Millisecond, PerCaller: 4, BodyTimeout: 5 * time.Second}},
		{nil, map[string]string{"IPAM_MAX_IN_FLIGHT": "5"}, api.Admission{InFlight: 5, Queue: 20, Wait: time.Second, PerCaller: 2, BodyTimeout: 5 * time.Second}},
		{[]string{"--max-per-caller", "3", "--body-timeout", "2s"}, nil,
			api.Admission{InFlight: conns, Queue: 4 * conns, Wait: time.Second, PerCaller: 3, BodyTimeout: 2 * time.Second}},
		{nil, map[string]string{"IPAM_MAX_PER_CALLER": "1", "IPAM_BODY_TIMEOUT": "10s"},
			api.Admission{InFlight: conns, Queue: 4 * conns, Wait: time.Second, PerCaller: 1, BodyTimeout: 10 * time.Second}},
	} {
		c, err := parseConfig("serve", append(tc.args, "--database-url", "postgres://x"), func(k string) string { return tc.env[k] })
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := c.admission(); got != tc.want {
			t.Errorf("%v %v: %+v, want %+v", tc.args, tc.env, got, tc.want)
		}
	}
	for _, args := range [][]string{
		{"--max-in-flight", "-1"},
		{"--admission-queue", "-1"},
		{"--admission-wait", "0s"},
		{"--max-per-caller", "-1"},
		{"--body-timeout", "0s"},
	} {
		if _, err := parseConfig("serve", append(args, "--database-url", "postgres://x"), func(string) string { return "" }); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
