// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import "testing"

func TestParseCeiling(t *testing.T) {
	tests := []struct {
		name    string
		out     string
		want    ceilingResult
		wantErr bool
	}{
		{name: "the script's line", out: "ceiling_tps=1234.567890 clients=32 seconds=20 p99_ms=41.25\n",
			want: ceilingResult{TPS: 1234.56789, P99ms: 41.25}},
		{name: "noise before", out: "NOTICE: something\nceiling_tps=10 clients=1 seconds=1 p99_ms=0.50\n",
			want: ceilingResult{TPS: 10, P99ms: 0.5}},
		{name: "no line", out: "pgbench: error\n", wantErr: true},
		{name: "empty tps (pgbench failed)", out: "ceiling_tps= clients=32 seconds=20 p99_ms=\n", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseCeiling(tt.out)
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Errorf("%s: parseCeiling = %+v, %v; want %+v, error %v", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}
