// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"net/netip"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// TestLBOwnership: a pool or group imported from Kubernetes changes only
// through a writer of its origin, and one of the database only through the
// REST API's; a Kubernetes deletion of another UID (the object re-created
// since) is stale. A pool of Kubernetes deleted with holders releases
// their addresses and leaves them unsatisfied, as Cilium strips them; one
// of the database with holders is still refused.
func TestLBOwnership(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	kube := alloc.AsOrigin(alloc.FromKubernetes("uid-1"))
	if _, err := f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: "k", Spec: lbSpec("10.0.10.0/30"),
		Origin: alloc.FromKubernetes("uid-1")}); err != nil {
		t.Fatal(err)
	}
	f.lbPool("d", lbSpec("10.0.11.0/30"))
	wantKind := func(what string, err error, kind alloc.Kind) {
		t.Helper()
		if !alloc.IsKind(err, kind) {
			t.Errorf("%s: %v, want %s", what, err, kind)
		}
	}
	_, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "k", nil, lbSpec("10.0.10.0/29"))
	wantKind("the REST API edits a pool of Kubernetes", err, alloc.KindConflict)
	_, err = f.s.DeleteLBPool(f.ctx, alloc.DefaultSpace, "k")
	wantKind("the REST API deletes a pool of Kubernetes", err, alloc.KindConflict)
	_, err = f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "d", nil, lbSpec("10.0.11.0/29"), kube)
	wantKind("Kubernetes edits a pool of the database", err, alloc.KindConflict)
	_, err = f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: "d", Spec: lbSpec("10.0.11.0/30"), Origin: alloc.FromKubernetes("uid-2")})
	wantKind("Kubernetes imports a name of the database", err, alloc.KindConflict)
	_, err = f.s.DeleteLBPool(f.ctx, alloc.DefaultSpace, "k", alloc.AsOrigin(alloc.FromKubernetes("uid-other")))
	wantKind("a deletion of another object of the name", err, alloc.KindStaleGeneration)
	if p, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "k", nil, lbSpec("10.0.10.0/29"), kube); err != nil || p.Origin != alloc.FromKubernetes("uid-1") {
		t.Fatalf("Kubernetes edits its pool: %+v, %v", p.Origin, err)
	}

	a := f.assign(svc("a", "one"))
	b := f.assign(svc("a", "two"))
	f.assign(svc("a", "three"))
	if !a.Satisfied || a.Addresses[0].Pool != "k" || b.Addresses[0].Pool != "k" {
		t.Fatalf("assigned %+v, %+v", a, b)
	}
	if _, err := f.s.DeleteLBPool(f.ctx, alloc.DefaultSpace, "k", kube); err != nil {
		t.Fatal(err)
	}
	got, err := f.s.GetVIPs(f.ctx, alloc.DefaultSpace, alloc.VIPOwner{Namespace: "a", Name: "one"})
	if err != nil || got.Satisfied || len(got.Addresses) != 0 || got.Reason != alloc.ReasonNoPool {
		t.Fatalf("after its pool was deleted, a/one holds %+v (%v)", got, err)
	}
	// Its Service asks again: served by the pool left.
	if again := f.assign(svc("a", "one")); !again.Satisfied || again.Addresses[0].Addr != netip.MustParseAddr("10.0.11.0") {
		t.Fatalf("asked again: %+v", again)
	}
	_, err = f.s.DeleteLBPool(f.ctx, alloc.DefaultSpace, "d")
	wantKind("the REST API deletes its pool with holders", err, alloc.KindInUse)

	// CIDR groups: the same rule.
	if _, err := f.s.CreateCIDRGroup(f.ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "g", CIDRs: []netip.Prefix{netip.MustParsePrefix("10.30.0.0/16")},
		Origin: alloc.FromKubernetes("uid-g")}); err != nil {
		t.Fatal(err)
	}
	_, err = f.s.UpdateCIDRGroup(f.ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "g"})
	wantKind("the REST API edits a group of Kubernetes", err, alloc.KindConflict)
	_, err = f.s.DeleteCIDRGroup(f.ctx, alloc.DefaultSpace, "g")
	wantKind("the REST API deletes a group of Kubernetes", err, alloc.KindConflict)
	_, err = f.s.DeleteCIDRGroup(f.ctx, alloc.DefaultSpace, "g", alloc.AsOrigin(alloc.FromKubernetes("uid-other")))
	wantKind("a deletion of another object of the name", err, alloc.KindStaleGeneration)
	if g, err := f.s.UpdateCIDRGroup(f.ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "g"}, alloc.AsOrigin(alloc.FromKubernetes("uid-g"))); err != nil || len(g.CIDRs) != 0 {
		t.Fatalf("Kubernetes edits its group: %+v, %v", g, err)
	}
	if _, err := f.s.DeleteCIDRGroup(f.ctx, alloc.DefaultSpace, "g", alloc.AsOrigin(alloc.FromKubernetes("uid-g"))); err != nil {
		t.Fatal(err)
	}
}
