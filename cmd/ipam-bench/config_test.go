// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseConfigDefaults(t *testing.T) {
	c, err := parseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Concurrency, []int{8, 32, 64}) || !slices.Equal(c.Fill, []int{0, 100_000, 550_000}) ||
		c.Nodes != 256 || c.Duration != 20*time.Second || c.HotConcurrency != 32 || c.FillPerNode != 110 {
		t.Fatalf("defaults %+v", c)
	}
	var runs []int
	for i := range c.Concurrency {
		runs = append(runs, c.runsAt(i))
	}
	if !slices.Equal(runs, []int{1, 3, 1}) {
		t.Fatalf("default runs per level %v; want 1,3,1", runs)
	}
	if !c.Timeouts || c.ClientTimeout != 300*time.Millisecond || c.TimeoutsConcurrency != 256 || c.TimeoutsDuration != 10*time.Second {
		t.Fatalf("timeouts phase defaults %+v", c)
	}
	if c.maxConcurrency() != 256 {
		t.Fatalf("maxConcurrency %d", c.maxConcurrency())
	}
}

func TestParseConfig(t *testing.T) {
	tests := []struct {
		name string
		args []string
		// wantErr lists parts of the error; none means it must parse.
		wantErr []string
		check   func(config) bool
	}{
		{name: "tiny development run", args: strings.Fields("-duration 2s -runs 1 -concurrency-list 8 -fill 0,5000 -shim=false"),
			check: func(c config) bool { return c.runsAt(0) == 1 && slices.Equal(c.Fill, []int{0, 5000}) && !c.Shim }},
		{name: "runs per level", args: []string{"-concurrency-list", "8,32", "-runs", "2,5"},
			check: func(c config) bool { return c.runsAt(0) == 2 && c.runsAt(1) == 5 }},
		{name: "empty fill skips the curve", args: []string{"-fill", ""},
			check: func(c config) bool { return len(c.Fill) == 0 }},
		{name: "underscores group digits", args: []string{"-fill", "0,100_000"},
			check: func(c config) bool { return slices.Equal(c.Fill, []int{0, 100000}) }},
		{name: "server args split", args: []string{"-server-args", "--gc-interval 5s"},
			check: func(c config) bool { return slices.Equal(c.ServerArgs, []string{"--gc-interval", "5s"}) }},
		{name: "runs list of the wrong length", args: []string{"-concurrency-list", "8,32", "-runs", "1,2,3"}, wantErr: []string{"-runs has 3 entries"}},
		{name: "fill must ascend", args: []string{"-fill", "0,5000,5000"}, wantErr: []string{"ascend strictly"}},
		{name: "fill beyond the fill CIDR", args: []string{"-fill", "0,2000000"}, wantErr: []string{"16,384 blocks"}},
		{name: "fractional seconds", args: []string{"-duration", "1500ms"}, wantErr: []string{"-duration must be whole seconds"}},
		{name: "not a number", args: []string{"-concurrency-list", "8,x"}, wantErr: []string{`"x" is not an integer`}},
		{name: "every error at once", args: strings.Fields("-nodes 0 -mask 31 -replicas 0 -hot-concurrency -1 -concurrency-list 0 -server-cpuprofile p.out -duration 30s"),
			wantErr: []string{"-nodes must be positive", "-mask must be within 8..30", "-replicas must be positive",
				"-hot-concurrency must not be negative", "-concurrency-list entries must be positive", "-server-cpuprofile needs -duration under 30s"}},
		{name: "timeouts phase", args: strings.Fields("-client-timeout 100ms -timeouts-concurrency 16 -timeouts-duration 3s"),
			check: func(c config) bool {
				return c.ClientTimeout == 100*time.Millisecond && c.TimeoutsConcurrency == 16 && c.TimeoutsDuration == 3*time.Second
			}},
		{name: "timeouts phase off", args: strings.Fields("-timeouts=false -timeouts-duration 1500ms"),
			check: func(c config) bool { return !c.Timeouts }},
		{name: "timeouts phase errors", args: strings.Fields("-client-timeout 0s -timeouts-concurrency 0 -timeouts-duration 1500ms"),
			wantErr: []string{"-client-timeout must be positive", "-timeouts-concurrency must be positive", "-timeouts-duration must be whole seconds"}},
		{name: "cilium phase defaults", args: nil,
			check: func(c config) bool {
				return c.Cilium && c.CiliumNodes == 5000 && c.CiliumQPS == 100 && c.CiliumBurst == 200 && c.CiliumBound == 2*time.Minute && c.CiliumReplicas == 2
			}},
		{name: "lbipam phase defaults", args: nil,
			check: func(c config) bool {
				return c.LBIPAM && c.LBServices == 5000 && c.LBWaiting == 500 && c.LBReplicas == 2 && c.LBBound == 3*time.Minute
			}},
		{name: "lbipam phase errors", args: strings.Fields("-lbipam-services 9000 -lbipam-waiting 0 -lbipam-replicas 0"),
			wantErr: []string{"at most 8,000", "-lbipam-waiting must be positive", "-lbipam-replicas must be positive"}},
		{name: "cilium phase off ignores its flags", args: strings.Fields("-cilium=false -cilium-nodes 0"),
			check: func(c config) bool { return !c.Cilium }},
		{name: "cilium phase errors", args: strings.Fields("-cilium-nodes 0 -cilium-qps 0 -cilium-burst -1 -cilium-bound 0s"),
			wantErr: []string{"-cilium-nodes must be positive", "-cilium-qps must be positive", "-cilium-burst must be positive", "-cilium-bound must be positive"}},
		{name: "cilium nodes beyond the pool", args: strings.Fields("-cilium-nodes 20000"), wantErr: []string{"at most 10,000"}},
		{name: "stray argument", args: []string{"extra"}, wantErr: []string{"unexpected arguments"}},
	}
	for _, tt := range tests {
		c, err := parseConfig(tt.args)
		switch {
		case len(tt.wantErr) == 0 && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case len(tt.wantErr) == 0 && !tt.check(c):
			t.Errorf("%s: parsed %+v", tt.name, c)
		case len(tt.wantErr) > 0 && err == nil:
			t.Errorf("%s: no error", tt.name)
		case len(tt.wantErr) > 0:
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: error %q lacks %q", tt.name, err, w)
				}
			}
		}
	}
}
