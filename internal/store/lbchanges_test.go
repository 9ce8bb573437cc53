// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// TestListenLBChanges: a pool created, edited or deleted, an address
// freed and a holder leaving a shared address are announced with their
// space (the holder with ""); an assignment that changes nothing, and one
// that only takes an address, announce nothing.
func TestListenLBChanges(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	var (
		mu  sync.Mutex
		got []string
	)
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() {
		done <- f.s.ListenLBChanges(ctx, func(c alloc.LBChange) {
			mu.Lock()
			defer mu.Unlock()
			if c.Owner != (alloc.VIPOwner{}) {
				got = append(got, c.Space+" "+c.Owner.String())
				return
			}
			got = append(got, c.Space)
		})
	}()
	// Announced, in order: what each step should add.
	expect := func(what string, want ...string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			seen := slices.Clone(got)
			got = got[:0]
			mu.Unlock()
			if slices.Equal(seen, want) {
				return
			}
			if len(seen) > len(want) || time.Now().After(deadline) {
				t.Fatalf("%s: announced %q, want %q", what, seen, want)
			}
			mu.Lock()
			got = append(seen, got...)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
		}
	}
	quiet := func(what string) {
		t.Helper()
		time.Sleep(300 * time.Millisecond)
		expect(what)
	}
	expect("listening", "")
	spec := lbSpec("10.0.10.0/30")
	f.lbPool("p", spec)
	expect("a pool created", alloc.DefaultSpace)
	shared := func(name string, port int32) alloc.VIPRequest {
		r := svc("a", name)
		r.Sharing = alloc.VIPSharing{Key: "k", Ports: []alloc.VIPPort{{Port: port, Protocol: "TCP"}}}
		return r
	}
	f.assign(shared("one", 80))
	f.assign(shared("two", 81))
	quiet("addresses taken")
	f.assign(shared("one", 80))
	quiet("an assignment that changes nothing")
	if err := f.s.ReleaseVIPs(f.ctx, alloc.DefaultSpace, alloc.VIPOwner{Namespace: "a", Name: "two"}, 0); err != nil {
		t.Fatal(err)
	}
	expect("a holder gone from a shared address", "")
	if err := f.s.ReleaseVIPs(f.ctx, alloc.DefaultSpace, alloc.VIPOwner{Namespace: "a", Name: "one"}, 0); err != nil {
		t.Fatal(err)
	}
	// One transaction: PostgreSQL folds equal notifications into one.
	expect("an address freed", "", alloc.DefaultSpace)
	spec.Disabled = true
	if _, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "p", nil, spec); err != nil {
		t.Fatal(err)
	}
	expect("a pool edited", alloc.DefaultSpace)
	if _, err := f.s.DeleteLBPool(f.ctx, alloc.DefaultSpace, "p"); err != nil {
		t.Fatal(err)
	}
	expect("a pool deleted", alloc.DefaultSpace)

	// A pool of Kubernetes deleted with a holder names it: nobody waits
	// for a satisfied owner, yet it lost its address.
	if _, err := f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: "k", Spec: lbSpec("10.0.11.0/30"),
		Origin: alloc.FromKubernetes("uid-k")}); err != nil {
		t.Fatal(err)
	}
	expect("a pool of Kubernetes created", alloc.DefaultSpace)
	f.assign(svc("a", "three"))
	quiet("an address taken")
	if _, err := f.s.DeleteLBPool(f.ctx, alloc.DefaultSpace, "k", alloc.AsOrigin(alloc.FromKubernetes("uid-k"))); err != nil {
		t.Fatal(err)
	}
	expect("a pool of Kubernetes deleted with a holder", "", alloc.DefaultSpace, alloc.DefaultSpace+" a/three")
	cancel()
	if err := <-done; err == nil {
		t.Error("ListenLBChanges ended without an error")
	}
}
