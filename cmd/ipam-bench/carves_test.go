// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import "testing"

// The carve counters are read from the exposition as the server exports
// them, the background carves apart by who carved them; a server that
// exports neither is an error, not zero carves.
func TestParseCarves(t *testing.T) {
	text := `# HELP ipam_inline_carves_total Allocations that found no address on their node and carved a block themselves.
# TYPE ipam_inline_carves_total counter
ipam_inline_carves_total 7
# TYPE ipam_background_carves_total counter
ipam_background_carves_total{by="rebalance"} 2
ipam_background_carves_total{by="top-up"} 40
ipam_gc_expired_total 3
`
	got, err := parseCarves(text)
	if err != nil {
		t.Fatal(err)
	}
	if want := (carveCounts{Inline: 7, TopUp: 40, Rebalance: 2}); got != want {
		t.Fatalf("%+v, want %+v", got, want)
	}
	if d := got.minus(carveCounts{Inline: 5, TopUp: 10}); d != (carveCounts{Inline: 2, TopUp: 30, Rebalance: 2}) {
		t.Fatalf("difference %+v", d)
	}
	if _, err := parseCarves("ipam_gc_expired_total 3\n"); err == nil {
		t.Fatal("an exposition without the carve counters parsed")
	}
}
