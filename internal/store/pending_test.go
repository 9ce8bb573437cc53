// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// pending answers CloudNodes' Pending of node in cloud pool pool.
func (f *fixture) pending(pool, node string) int {
	f.t.Helper()
	nodes, err := f.s.CloudNodes(f.ctx, alloc.DefaultSpace, pool)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, n := range nodes {
		if n.Name == node {
			return n.Pending
		}
	}
	f.t.Fatalf("node %s is no node of cloud pool %s", node, pool)
	return 0
}

// refuse asks an address for r and wants KindPoolExhausted.
func (f *fixture) refuse(r alloc.LeaseRequest) {
	f.t.Helper()
	_, err := f.s.Allocate(f.ctx, r)
	wantKind(f.t, err, alloc.KindPoolExhausted)
}

// TestCloudPending: the Pods a cloud pool refused for want of an address
// count as waiting on their node, once per Pod and interface whatever
// sandbox (container ID) each retry comes in; a Pod leased since, a
// refusal older than PendingWindow, the node's own reserve and a pool
// with no spec.cloud do not count; a node's records are capped at its max
// Pods, refreshing those it has.
func TestCloudPending(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("cloud", alloc.PoolSpec{IPv4: fam(28, "10.70.0.0/16"), NodeLocal: alloc.DefaultNodeLocal,
		Cloud: &alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 2}}})
	f.pool("carved", alloc.PoolSpec{IPv4: fam(28, "10.80.0.0/28"), NodeLocal: alloc.DefaultNodeLocal})
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "n1", ProviderID: "aws:///eu-west-1a/i-0123456789abcdef0"}); err != nil {
		t.Fatal(err)
	}
	pod := func(name, container string) alloc.LeaseRequest {
		r := req("n1", container)
		r.Pool = "cloud"
		r.Owner = alloc.Owner{Namespace: "default", Name: name, UID: "uid-" + name}
		return r
	}
	// Three Pods, the first retried twice in new sandboxes.
	f.refuse(pod("a", "c1"))
	f.refuse(pod("a", "c2"))
	f.refuse(pod("b", "c3"))
	f.refuse(pod("c", "c4"))
	f.refuse(pod("a", "c5"))
	if n := f.pending("cloud", "n1"); n != 3 {
		t.Fatalf("pending %d after three Pods refused, want 3", n)
	}
	// A second interface of a Pod waits for an address of its own.
	second := pod("c", "c4")
	second.Attachment.Interface = "net1"
	f.refuse(second)
	if n := f.pending("cloud", "n1"); n != 4 {
		t.Fatalf("pending %d after a second interface refused, want 4", n)
	}
	// The node's reserve is no Pod; a pool with no spec.cloud records
	// nothing.
	reserve := pod("reserve", "r1")
	reserve.Owner.Namespace = alloc.ReserveOwnerNamespace
	f.refuse(reserve)
	for i := 0; ; i++ {
		c := fmt.Sprintf("x%d", i)
		_, err := f.s.Allocate(f.ctx, alloc.LeaseRequest{Space: alloc.DefaultSpace, Node: "n1", Pool: "carved",
			Owner: alloc.Owner{Namespace: "default", Name: c}, Attachment: alloc.Attachment{ContainerID: c, Interface: "eth0"}})
		if err != nil {
			wantKind(t, err, alloc.KindPoolExhausted)
			break
		}
		if i > 16 {
			t.Fatal("the carved pool's /28 never ran out")
		}
	}
	if n := f.count(`SELECT count(*) FROM cloud_refusals`); n != 4 {
		t.Fatalf("%d refusals recorded, want the 4 of the cloud pool's Pods", n)
	}

	// The cloud gives the node two addresses: Pod a's next sandbox and
	// Pod b are leased and wait no more.
	f.clock.Advance(time.Second)
	if err := f.s.RecordCloudBlocks(f.ctx, alloc.DefaultSpace, "n1", "cloud", "eni-1",
		[]netip.Prefix{netip.MustParsePrefix("10.70.0.10/32"), netip.MustParsePrefix("10.70.0.11/32")}); err != nil {
		t.Fatal(err)
	}
	f.allocate(pod("a", "c6"))
	f.allocate(pod("b", "c3"))
	if n := f.pending("cloud", "n1"); n != 2 {
		t.Fatalf("pending %d after two Pods leased, want 2 (Pod c's two interfaces)", n)
	}
	// Pod a deleted (released) does not wait again.
	if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "n1", pod("a", "c6").Attachment); err != nil {
		t.Fatal(err)
	}
	if n := f.pending("cloud", "n1"); n != 2 {
		t.Fatalf("pending %d after a leased Pod released, want 2", n)
	}

	// The cap: a node whose Node says 5 Pods records 5 recent refusals
	// (a and b, served, count towards it until they age out), refreshes
	// those, and records no sixth.
	if _, err := f.s.db.Exec(f.ctx, `UPDATE nodes SET max_pods = 5 WHERE name = 'n1'`); err != nil {
		t.Fatal(err)
	}
	f.refuse(pod("d", "c7"))
	f.refuse(pod("e", "c8"))
	if n := f.pending("cloud", "n1"); n != 3 {
		t.Fatalf("pending %d with the node at its cap, want 3", n)
	}
	for i := range 20 {
		f.refuse(pod("spam", "s"+string(rune('a'+i))))
		f.refuse(pod("spam"+string(rune('a'+i)), "t"+string(rune('a'+i))))
	}
	if n := f.count(`SELECT count(*) FROM cloud_refusals`); n != 5 {
		t.Fatalf("%d refusals recorded past a cap of 5", n)
	}
	if n := f.pending("cloud", "n1"); n != 3 {
		t.Fatalf("pending %d past the cap, want 3", n)
	}

	// Old refusals do not count; Pod d, retried, still does, and the
	// next refusal on the node deletes the others.
	f.clock.Advance(PendingWindow - time.Second)
	f.allocate(pod("g", "g1")) // Pod a's address, cooled down
	f.refuse(pod("d", "c9"))
	f.clock.Advance(2 * time.Second)
	if n := f.pending("cloud", "n1"); n != 1 {
		t.Fatalf("pending %d once the others aged out, want 1 (Pod d, retried)", n)
	}
	f.refuse(pod("f", "c10"))
	if n := f.count(`SELECT count(*) FROM cloud_refusals`); n != 2 {
		t.Fatalf("%d refusals recorded after the old ones aged out, want 2", n)
	}
	if n := f.pending("cloud", "n1"); n != 2 {
		t.Fatalf("pending %d, want 2", n)
	}
	f.clock.Advance(PendingWindow)
	if n := f.pending("cloud", "n1"); n != 0 {
		t.Fatalf("pending %d after the window, want 0", n)
	}
}
