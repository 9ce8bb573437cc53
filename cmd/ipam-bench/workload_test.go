// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"net/http"
	"slices"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pki"
)

func TestNodesFor(t *testing.T) {
	tests := []struct {
		name    string
		i, c, n int
		want    []int
	}{
		{"32 workers split 64 nodes", 0, 32, 64, []int{0, 32}},
		{"last of 32 workers", 31, 32, 64, []int{31, 63}},
		{"3 workers, uneven split", 2, 3, 8, []int{2, 5}},
		{"as many workers as nodes", 5, 8, 8, []int{5}},
		{"more workers than nodes share", 9, 16, 8, []int{1}},
		{"one worker drives every node", 0, 1, 3, []int{0, 1, 2}},
	}
	for _, tt := range tests {
		if got := nodesFor(tt.i, tt.c, tt.n); !slices.Equal(got, tt.want) {
			t.Errorf("%s: nodesFor(%d, %d, %d) = %v; want %v", tt.name, tt.i, tt.c, tt.n, got, tt.want)
		}
	}
}

// TestFleetHandsOver checks that held attachments follow their nodes from
// one worker set to the next, and wait parked when no worker drives them.
func TestFleetHandsOver(t *testing.T) {
	p, err := newBenchPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{pki: p, servers: []string{"https://127.0.0.1:1"}, ledger: newLedger(), perHost: 4,
		parked: []attachment{{node: "a", containerID: "1"}, {node: "b", containerID: "2"}, {node: "c", containerID: "3"}, {node: "a", containerID: "4"}}}
	ws, err := f.workers(2, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	held := func(w *worker) []string {
		var s []string
		for _, a := range w.held {
			s = append(s, a.node+a.containerID)
		}
		return s
	}
	if !slices.Equal(ws[0].nodes, []string{"a"}) || !slices.Equal(held(ws[0]), []string{"a1", "a4"}) ||
		!slices.Equal(ws[1].nodes, []string{"b"}) || !slices.Equal(held(ws[1]), []string{"b2"}) ||
		len(f.parked) != 1 || f.parked[0].node != "c" {
		t.Fatalf("workers hold %v and %v, parked %v", held(ws[0]), held(ws[1]), f.parked)
	}
	if ws[0].clients["a"] == nil || ws[1].clients["b"] == nil {
		t.Fatal("a worker lacks its node's client")
	}
	if len(f.open(ws)) != 4 {
		t.Fatalf("open %v", f.open(ws))
	}
	// Two workers on one node (the hot node) share its attachments.
	f.retire(ws)
	hot, err := f.workers(2, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(hot[0].held) != 1 || len(hot[1].held) != 1 || len(f.parked) != 2 {
		t.Fatalf("hot workers hold %v and %v, parked %v", held(hot[0]), held(hot[1]), f.parked)
	}
	if hot[0].clients["a"] == nil || hot[1].clients["a"] == nil {
		t.Fatal("a hot worker lacks the node's client")
	}
}

// TestFleetCertifiesItsSpace checks that the nodes' certificates name the
// space the fleet works in (a shared database's bench space, or the
// default one), as the server requires of a node acting in a space.
func TestFleetCertifiesItsSpace(t *testing.T) {
	p, err := newBenchPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	space := "bench-1"
	for _, tc := range []struct {
		space *string
		want  string
	}{{nil, alloc.DefaultSpace}, {&space, space}} {
		f := &fleet{pki: p, servers: []string{"https://127.0.0.1:1"}, space: tc.space, ledger: newLedger(), perHost: 1}
		if _, err := f.workers(1, []string{"n1"}); err != nil {
			t.Fatal(err)
		}
		hc, err := p.nodeClient(f.spaceName(), "n1", 1)
		if err != nil {
			t.Fatal(err)
		}
		leaf := hc.Transport.(*http.Transport).TLSClientConfig.Certificates[0].Leaf
		if leaf == nil || len(leaf.URIs) != 1 || leaf.URIs[0].String() != pki.SpaceURI(tc.want).String() {
			t.Fatalf("node certificate for space %q names %v", tc.want, leaf.URIs)
		}
	}
}
