// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

func svc(ns, name string, labels ...string) alloc.VIPRequest {
	r := alloc.VIPRequest{Space: alloc.DefaultSpace, Owner: alloc.VIPOwner{Namespace: ns, Name: name},
		Families: []alloc.Family{alloc.IPv4}, RequireAll: true, Labels: map[string]string{}}
	for i := 0; i+1 < len(labels); i += 2 {
		r.Labels[labels[i]] = labels[i+1]
	}
	return r
}

func (f *fixture) assign(r alloc.VIPRequest) alloc.VIPAssignment {
	f.t.Helper()
	a, err := f.s.AssignVIPs(f.ctx, r)
	if err != nil {
		f.t.Fatal(err)
	}
	return a
}

// addrs writes an assignment's addresses, stranded ones marked.
func addrs(a alloc.VIPAssignment) string {
	var out []string
	for _, v := range a.Addresses {
		s := v.Addr.String()
		if v.Stranded {
			s += "(stranded)"
		}
		out = append(out, s)
	}
	return strings.Join(out, ",")
}

// TestVIPLab4: the seed's Lab 4: a Service matching the pool's selector
// gets an address of the block and the pool's available count drops; one
// that matches no pool is unsatisfied with no_pool; a disabled pool gives
// nothing new while the Service holding its address keeps it.
func TestVIPLab4(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	spec := lbSpec("10.0.20.100-10.0.20.200")
	spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"color": "blue"}}
	f.lbPool("blue", spec)
	a := f.assign(svc("default", "web", "color", "blue"))
	if !a.Satisfied || a.Reason != alloc.ReasonSatisfied || addrs(a) != "10.0.20.100" || a.Addresses[0].Pool != "blue" || a.Addresses[0].Generation == 0 {
		t.Fatalf("web: %+v", a)
	}
	if again := f.assign(svc("default", "web", "color", "blue")); addrs(again) != "10.0.20.100" || again.Addresses[0].Generation != a.Addresses[0].Generation {
		t.Fatalf("a retry moved web: %+v", again)
	}
	p, _ := f.s.GetLBPool(f.ctx, alloc.DefaultSpace, "blue")
	if st := p.Status.Families[alloc.IPv4]; st.Total != 101 || st.Used != 1 || st.Available() != 100 {
		t.Fatalf("blue counts %+v", st)
	}
	red := f.assign(svc("default", "red", "color", "red"))
	if red.Satisfied || red.Reason != alloc.ReasonNoPool || len(red.Addresses) != 0 {
		t.Fatalf("red: %+v", red)
	}
	spec.Disabled = true
	if _, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "blue", nil, spec); err != nil {
		t.Fatal(err)
	}
	if late := f.assign(svc("default", "late", "color", "blue")); late.Satisfied || late.Reason != alloc.ReasonNoPool {
		t.Fatalf("a disabled pool gave: %+v", late)
	}
	if kept := f.assign(svc("default", "web", "color", "blue")); !kept.Satisfied || addrs(kept) != "10.0.20.100" {
		t.Fatalf("web lost its address to the disabled pool: %+v", kept)
	}
	_, err := f.s.DeleteLBPool(f.ctx, alloc.DefaultSpace, "blue")
	if e := wantKind(t, err, alloc.KindInUse); !strings.Contains(e.Detail, "default/web") {
		t.Fatalf("%+v", e)
	}
	// Fencing: a release naming another lifetime of the owner is refused.
	webOwner := alloc.VIPOwner{Namespace: "default", Name: "web"}
	wantKind(t, f.s.ReleaseVIPs(f.ctx, alloc.DefaultSpace, webOwner, a.Generation+1000), alloc.KindStaleGeneration)
	if kept := f.assign(svc("default", "web", "color", "blue")); addrs(kept) != "10.0.20.100" || kept.Generation != a.Generation {
		t.Fatalf("a stale release changed web: %+v", kept)
	}
	if err := f.s.ReleaseVIPs(f.ctx, alloc.DefaultSpace, webOwner, a.Generation); err != nil {
		t.Fatal(err)
	}
	if err := f.s.ReleaseVIPs(f.ctx, alloc.DefaultSpace, webOwner, 0); err != nil {
		t.Fatalf("a second release: %v", err)
	}
	if _, err := f.s.GetVIPs(f.ctx, alloc.DefaultSpace, alloc.VIPOwner{Namespace: "default", Name: "web"}); err == nil {
		t.Fatal("a released owner is still there")
	}
	events := f.texts(`SELECT kind || ' ' || host(address) || ' ' || owner_namespace || '/' || owner_name || ' ' || pool
		FROM address_events WHERE kind LIKE 'vip-%' ORDER BY id`)
	if strings.Join(events, "|") != "vip-assign 10.0.20.100 default/web blue|vip-release 10.0.20.100 default/web blue" {
		t.Fatalf("history %q", events)
	}
	if _, err := f.s.DeleteLBPool(f.ctx, alloc.DefaultSpace, "blue"); err != nil {
		t.Fatalf("delete after release: %v", err)
	}
}

// TestVIPRequestedAddresses: a named address is given when a pool that
// selects the owner offers it, and refused, with Cilium's reasons,
// outside every pool, in a pool that does not select the owner, on a
// first or last address kept out, and when another owner holds it.
func TestVIPRequestedAddresses(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	blue := lbSpec("10.0.10.0/24")
	blue.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"color": "blue"}}
	blue.ReserveFirstLast = true
	f.lbPool("blue", blue)
	grey := lbSpec("10.0.12.0/24")
	grey.Disabled = true
	f.lbPool("grey", grey)
	named := func(name string, a ...string) alloc.VIPRequest {
		r := svc("default", name, "color", "blue")
		for _, s := range a {
			r.Addresses = append(r.Addresses, netip.MustParseAddr(s))
		}
		return r
	}
	if a := f.assign(named("two", "10.0.10.100", "10.0.10.101")); !a.Satisfied || addrs(a) != "10.0.10.100,10.0.10.101" {
		t.Fatalf("two: %+v", a)
	}
	for _, c := range []struct {
		r      alloc.VIPRequest
		reason string
	}{
		{named("outside", "10.0.11.5"), alloc.ReasonNoPool},
		{func() alloc.VIPRequest { r := named("red", "10.0.10.50"); r.Labels["color"] = "red"; return r }(), alloc.ReasonPoolSelectorMismatch},
		// Cilium's reasons: first and last under allowFirstLastIPs: No are
		// marked allocated; a disabled pool is as good as none; a holder
		// of another sharing key is an incompatible service.
		{named("first", "10.0.10.0"), alloc.ReasonAlreadyAllocated},
		{named("last", "10.0.10.255"), alloc.ReasonAlreadyAllocated},
		{named("disabled", "10.0.12.5"), alloc.ReasonNoPool},
		{named("taken", "10.0.10.100"), alloc.ReasonAlreadyAllocated},
		{func() alloc.VIPRequest { r := named("keyed", "10.0.10.100"); r.Sharing.Key = "k"; return r }(), alloc.ReasonIncompatibleSharing},
	} {
		a := f.assign(c.r)
		if a.Satisfied || a.Reason != c.reason || len(a.Addresses) != 0 {
			t.Errorf("%s: %+v, want %s", c.r.Owner, a, c.reason)
		}
	}
	// Naming other addresses gives those and releases the rest.
	if a := f.assign(named("two", "10.0.10.101", "10.0.10.102")); !a.Satisfied || addrs(a) != "10.0.10.101,10.0.10.102" {
		t.Fatalf("two again: %+v", a)
	}
	if a := f.assign(named("now-free", "10.0.10.100")); !a.Satisfied {
		t.Fatalf("10.0.10.100 was not released: %+v", a)
	}
}

// TestVIPSharing: the sharing matrix. Owners of one key share an address
// when their terms are compatible and get another address of the key's
// set when not.
func TestVIPSharing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.lbPool("vips", lbSpec("10.0.10.0/24", "fd00:10::/120"))
	shared := func(ns, name string, port int32, mod func(*alloc.VIPSharing)) alloc.VIPRequest {
		r := svc(ns, name)
		r.Sharing = alloc.VIPSharing{Key: "web", Ports: []alloc.VIPPort{{Port: port, Protocol: "TCP"}}}
		if mod != nil {
			mod(&r.Sharing)
		}
		return r
	}
	first := addrs(f.assign(shared("a", "http", 80, nil)))
	for _, c := range []struct {
		name  string
		r     alloc.VIPRequest
		share bool
	}{
		{"other ports", shared("a", "https", 443, nil), true},
		{"the same port", shared("a", "http2", 80, nil), false},
		{"the same port over UDP", shared("a", "dns", 53, func(s *alloc.VIPSharing) { s.Ports[0].Protocol = "UDP" }), true},
		{"another namespace, not admitted", shared("b", "other", 8080, nil), false},
		{"another namespace admitting, not admitted back", shared("b", "other2", 8081, func(s *alloc.VIPSharing) { s.CrossNamespace = []string{"a"} }), false},
		{"another key", shared("a", "mail", 25, func(s *alloc.VIPSharing) { s.Key = "mail" }), false},
		{"no key", func() alloc.VIPRequest { r := shared("a", "plain", 26, nil); r.Sharing.Key = ""; return r }(), false},
		{"another traffic policy", shared("a", "local", 8082, func(s *alloc.VIPSharing) {
			s.ExternalTrafficPolicy = alloc.TrafficPolicyLocal
			s.PodSelector = map[string]string{"app": "x"}
		}), false},
	} {
		got := addrs(f.assign(c.r))
		if (got == first) != c.share || got == "" {
			t.Errorf("%s: got %s, first %s, want shared %v", c.name, got, first, c.share)
		}
	}
	// Cross-namespace sharing admitted both ways.
	both := func(ns, name string, port int32, admit string) alloc.VIPRequest {
		return shared(ns, name, port, func(s *alloc.VIPSharing) { s.Key = "cross"; s.CrossNamespace = []string{admit} })
	}
	x := addrs(f.assign(both("c", "one", 80, "d")))
	if y := addrs(f.assign(both("d", "two", 81, "c"))); y != x {
		t.Errorf("admitted both ways: %s vs %s", x, y)
	}
	if z := addrs(f.assign(both("e", "three", 82, alloc.SharingCrossNamespaceAll))); z == x {
		t.Errorf("c and d do not admit e, yet it shares %s", z)
	}
	// Local: the same Pods share; other Pods do not, unless both permit.
	local := func(name string, port int32, pods string, permit bool) alloc.VIPRequest {
		return shared("l", name, port, func(s *alloc.VIPSharing) {
			s.Key, s.ExternalTrafficPolicy, s.PodSelector, s.PermitDifferentPods = "local", alloc.TrafficPolicyLocal, map[string]string{"app": pods}, permit
		})
	}
	l1 := addrs(f.assign(local("l1", 80, "web", false)))
	if l2 := addrs(f.assign(local("l2", 81, "web", false))); l2 != l1 {
		t.Errorf("the same Pods: %s vs %s", l1, l2)
	}
	if l3 := addrs(f.assign(local("l3", 82, "db", true))); l3 == l1 {
		t.Errorf("other Pods, only one side permitting, shared %s", l3)
	}
	p1 := addrs(f.assign(local("p1", 90, "a", true)))
	if p1 == l1 {
		t.Fatalf("p1 joined l1's address")
	}
	// p1 took the key's next address, or l3's; either way p2 may join it.
	if p2 := addrs(f.assign(local("p2", 91, "b", true))); p2 != p1 && p2 != l1 {
		t.Errorf("both permitting different Pods: %s, want to share with p1 %s", p2, p1)
	}
	// An address goes with its last holder only.
	if err := f.s.ReleaseVIPs(f.ctx, alloc.DefaultSpace, alloc.VIPOwner{Namespace: "a", Name: "http"}, 0); err != nil {
		t.Fatal(err)
	}
	if got := addrs(f.assign(shared("a", "https", 443, nil))); got != first {
		t.Errorf("https lost the shared address %s: %s", first, got)
	}
	if n := f.count(`SELECT count(*) FROM vips v WHERE NOT EXISTS (SELECT 1 FROM vip_holders h WHERE h.vip_id = v.id)`); n != 0 {
		t.Errorf("%d addresses without holders", n)
	}
}

// TestVIPFamilies: RequireAll stays unsatisfied, holding what it got,
// while a family has no pool; PreferDualStack is satisfied with one.
func TestVIPFamilies(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.lbPool("v4", lbSpec("10.0.10.0/24"))
	dual := svc("default", "require")
	dual.Families = []alloc.Family{alloc.IPv4, alloc.IPv6}
	a := f.assign(dual)
	if a.Satisfied || a.Reason != alloc.ReasonNoPool || addrs(a) != "10.0.10.0" {
		t.Fatalf("require: %+v", a)
	}
	prefer := dual
	prefer.Owner.Name, prefer.RequireAll = "prefer", false
	if a := f.assign(prefer); !a.Satisfied || addrs(a) != "10.0.10.1" {
		t.Fatalf("prefer: %+v", a)
	}
	f.lbPool("v6", lbSpec("fd00:10::/120"))
	if a := f.assign(dual); !a.Satisfied || addrs(a) != "10.0.10.0,fd00:10::" {
		t.Fatalf("require, once a v6 pool exists: %+v", a)
	}
	v6 := svc("default", "v6only")
	v6.Families = []alloc.Family{alloc.IPv6}
	if a := f.assign(v6); !a.Satisfied || addrs(a) != "fd00:10::1" {
		t.Fatalf("v6 only: %+v", a)
	}
}

// TestVIPSharingBothFamilies: a dual-stack Service joining a sharing key
// whose holder has an address of each family shares both in one pass,
// for PreferDualStack and RequireDualStack alike (fill once stopped after
// the first family it shared, leaving the second to a later pass).
func TestVIPSharingBothFamilies(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.lbPool("vips", lbSpec("10.0.10.0/24", "fd00:10::/120"))
	shared := func(name string, port int32, requireAll bool) alloc.VIPRequest {
		r := svc("a", name)
		r.Families, r.RequireAll = []alloc.Family{alloc.IPv4, alloc.IPv6}, requireAll
		r.Sharing = alloc.VIPSharing{Key: "web", Ports: []alloc.VIPPort{{Port: port, Protocol: "TCP"}}}
		return r
	}
	first := f.assign(shared("http", 80, true))
	if !first.Satisfied || addrs(first) != "10.0.10.0,fd00:10::" {
		t.Fatalf("the first holder: %+v", first)
	}
	for i, requireAll := range []bool{false, true} {
		a := f.assign(shared(fmt.Sprintf("joiner-%d", i), int32(81+i), requireAll))
		if !a.Satisfied || a.Reason != first.Reason || addrs(a) != addrs(first) {
			t.Errorf("requireAll %v: %+v, want both of %s shared at once", requireAll, a, addrs(first))
		}
	}
}

// TestVIPAdopt: an owner adopts the first address of Adopt per family it
// can have (in a pool that gives it, free or shared on compatible terms)
// and passes over the others without a refusal; with a named address
// Adopt is not used; an invalid entry is refused naming it.
func TestVIPAdopt(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.lbPool("vips", lbSpec("10.0.10.0/24", "fd00:10::/120"))
	named := func(name, a string) alloc.VIPRequest {
		r := svc("a", name)
		r.Addresses = []netip.Addr{netip.MustParseAddr(a)}
		return r
	}
	f.assign(named("holder", "10.0.10.9"))
	r := svc("a", "adopter")
	r.Families = []alloc.Family{alloc.IPv4, alloc.IPv6}
	r.Adopt = []netip.Addr{netip.MustParseAddr("10.0.10.9"), netip.MustParseAddr("10.99.0.1"), netip.MustParseAddr("10.0.10.20"),
		netip.MustParseAddr("10.0.10.21"), netip.MustParseAddr("fd00:10::30")}
	if a := f.assign(r); !a.Satisfied || a.Message != "" || addrs(a) != "10.0.10.20,fd00:10::30" {
		t.Errorf("adopted %+v, want 10.0.10.20 and fd00:10::30 without a word on the others", a)
	}
	// Again: it keeps them, whatever Adopt now says.
	r.Adopt = []netip.Addr{netip.MustParseAddr("10.0.10.21")}
	if a := f.assign(r); addrs(a) != "10.0.10.20,fd00:10::30" {
		t.Errorf("again: %+v", a)
	}
	n := named("namer", "10.0.10.40")
	n.Adopt = []netip.Addr{netip.MustParseAddr("10.0.10.41")}
	if a := f.assign(n); addrs(a) != "10.0.10.40" {
		t.Errorf("with a named address: %+v", a)
	}
	bad := svc("a", "bad")
	bad.Adopt = []netip.Addr{{}}
	var ae *alloc.Error
	if _, err := f.s.AssignVIPs(f.ctx, bad); !errors.As(err, &ae) || ae.Field != "adopt[0]" {
		t.Errorf("an invalid adopt entry: %v", err)
	}
}

// TestVIPRelabelMoves: an owner whose own labels take its address out of
// the pool that gave it moves, as Cilium moves a relabelled Service
// (TestRemoveServiceLabel): to the pool its labels now select, or to none
// (no_pool); an address a pool edit stranded before stays stranded
// through a relabel, as pool edits never move addresses (cilium#40358).
func TestVIPRelabelMoves(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	colored := func(color, cidr string) alloc.LBPoolSpec {
		s := lbSpec(cidr)
		s.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"color": color}}
		return s
	}
	f.lbPool("blue", colored("blue", "10.0.10.0/24"))
	f.lbPool("red", colored("red", "10.0.20.0/24"))
	if a := f.assign(svc("a", "web", "color", "blue")); addrs(a) != "10.0.10.0" {
		t.Fatalf("blue: %+v", a)
	}
	if a := f.assign(svc("a", "web", "color", "red")); !a.Satisfied || addrs(a) != "10.0.20.0" || a.Addresses[0].Stranded {
		t.Errorf("relabelled red: %+v, want moved to 10.0.20.0", a)
	}
	if a := f.assign(svc("a", "web", "color", "none")); a.Satisfied || a.Reason != alloc.ReasonNoPool || addrs(a) != "" {
		t.Errorf("relabelled out of every pool: %+v", a)
	}
	// Stranded by a pool edit first: a relabel keeps it.
	f.assign(svc("a", "db", "color", "blue", "tier", "x"))
	if _, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "blue", nil, colored("green", "10.0.10.0/24")); err != nil {
		t.Fatal(err)
	}
	if a := f.assign(svc("a", "db", "color", "blue", "tier", "x")); addrs(a) != "10.0.10.0(stranded)" {
		t.Fatalf("after the pool edit: %+v, want 10.0.10.0 stranded", a)
	}
	if a := f.assign(svc("a", "db", "color", "blue", "tier", "y")); addrs(a) != "10.0.10.0(stranded)" {
		t.Errorf("relabelled after the pool edit: %+v, want still 10.0.10.0 stranded", a)
	}
}

// TestVIPPoolEditsNeverMove is cilium/cilium#40358: an edit of a pool
// (a block added, labels, the selector widened, another block removed)
// leaves 100 Services' addresses where they are; an edit that removes the
// block three of them hold strands those three, reported and kept, and
// only a request with Reassign moves them.
func TestVIPPoolEditsNeverMove(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	spec := lbSpec("10.0.10.0/25", "10.0.10.128/25", "10.0.99.0/30")
	f.lbPool("p", spec)
	before := map[string]string{}
	for i := range 103 {
		r := svc("default", fmt.Sprintf("s%03d", i))
		before[r.Owner.Name] = addrs(f.assign(r))
	}
	spec.Blocks = append([]alloc.LBBlock{{CIDR: netip.MustParsePrefix("10.0.9.0/24")}}, spec.Blocks...)
	spec.ServiceSelector = &metav1.LabelSelector{}
	if _, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "p", map[string]string{"edited": "yes"}, spec); err != nil {
		t.Fatal(err)
	}
	for name, was := range before {
		if got := f.assign(svc("default", name)); addrs(got) != was || !got.Satisfied {
			t.Fatalf("%s moved from %s to %s after an edit", name, was, addrs(got))
		}
	}
	// s000..s099 hold 10.0.10.0-99; s100..s102 hold 10.0.10.100-102.
	// Cut the first /25 to 10.0.10.0-99: three Services are stranded.
	spec.Blocks = []alloc.LBBlock{{CIDR: netip.MustParsePrefix("10.0.9.0/24")},
		{Start: netip.MustParseAddr("10.0.10.0"), Stop: netip.MustParseAddr("10.0.10.99")}, {CIDR: netip.MustParsePrefix("10.0.10.128/25")}}
	if _, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "p", nil, spec); err != nil {
		t.Fatal(err)
	}
	// The edit itself reports them: the marks, the history, the owners.
	if n := f.count(`SELECT count(*) FROM vip_holders WHERE stranded`); n != 3 {
		t.Fatalf("%d holdings marked stranded by the edit, want 3", n)
	}
	if ev := f.texts(`SELECT host(address) || ' ' || owner_name FROM address_events WHERE kind = 'vip-stranded' ORDER BY address`); strings.Join(ev, ",") !=
		"10.0.10.100 s100,10.0.10.101 s101,10.0.10.102 s102" {
		t.Fatalf("history of the stranding: %q", ev)
	}
	if n := f.count(`SELECT count(*) FROM vip_owners WHERE NOT satisfied AND reason = 'stranded'`); n != 3 {
		t.Fatalf("%d owners unsatisfied as stranded, want 3", n)
	}
	strandedN := 0
	for name, was := range before {
		got, err := f.s.GetVIPs(f.ctx, alloc.DefaultSpace, alloc.VIPOwner{Namespace: "default", Name: name})
		if err != nil {
			t.Fatal(err)
		}
		if got.Addresses[0].Addr.String() != was {
			t.Fatalf("%s moved", name)
		}
		if got.Addresses[0].Stranded {
			strandedN++
			if got.Satisfied || got.Reason != alloc.ReasonStranded {
				t.Errorf("%s stranded but %+v", name, got)
			}
			again := f.assign(svc("default", name))
			if addrs(again) != was+"(stranded)" || again.Reason != alloc.ReasonStranded {
				t.Errorf("%s: a request without reassign moved it or did not report it: %+v", name, again)
			}
		}
	}
	if strandedN != 3 {
		t.Fatalf("%d stranded, want 3", strandedN)
	}
	// No Pod pool takes the stranded addresses, past the store or not.
	_, err := f.s.CreatePool(f.ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: "pods", Spec: alloc.PoolSpec{IPv4: fam(32, "10.0.10.100/30")}})
	if e := wantKind(t, err, alloc.KindOverlap); !strings.Contains(e.Detail, "holds the VIP 10.0.10.100") {
		t.Fatalf("%+v", e)
	}
	f.pool("pods", alloc.PoolSpec{IPv4: fam(32, "10.244.0.0/24")})
	if _, err := f.s.db.Exec(f.ctx, `INSERT INTO pool_cidrs (pool_id, space, family, cidr, mask_size, position, reserved_start, reserved_end)
		SELECT id, space, 4, '10.0.10.100/30', 32, 1, '{}', '{}' FROM pools WHERE name = 'pods'`); err == nil || !strings.Contains(err.Error(), "holds the VIP 10.0.10.100 (SQLSTATE 23P01)") {
		t.Fatalf("the database let a Pod CIDR take a held VIP: %v", err)
	}
	r := svc("default", "s101")
	r.Reassign = true
	if a := f.assign(r); !a.Satisfied || addrs(a) != "10.0.9.0" {
		t.Fatalf("reassigned: %+v", a)
	}
}

// TestVIPConcurrentOwners: owners asking at once, from several pools and
// named addresses, never share an address without a key.
func TestVIPConcurrentOwners(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.lbPool("a", lbSpec("10.0.10.0/28"))
	f.lbPool("b", lbSpec("10.0.11.0/24"))
	var wg sync.WaitGroup
	errs := make(chan error, 60)
	for i := range 60 {
		wg.Go(func() {
			r := svc("default", fmt.Sprintf("s%d", i))
			if i%5 == 0 {
				r.Addresses = []netip.Addr{netip.MustParseAddr("10.0.11.200")}
			}
			_, err := f.s.AssignVIPs(f.ctx, r)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := f.count(`SELECT count(*) FROM vip_holders`); n != 49 {
		t.Fatalf("%d holdings, want 48 fresh and one of the named address", n)
	}
	if n := f.count(`SELECT count(*) FROM vip_owners WHERE NOT satisfied AND reason = 'already_allocated'`); n != 11 {
		t.Fatalf("%d refused the named address, want 11", n)
	}
	if n := f.count(`SELECT count(*) FROM (SELECT vip_id FROM vip_holders GROUP BY vip_id HAVING count(*) > 1) x`); n != 0 {
		t.Fatalf("%d addresses shared without a key", n)
	}
}

// TestVIPReservedGroups: a VIP pool keeps the CIDRs of the groups it
// names out of what it gives; the group cannot go while named; an edit of
// the group moves the reservation, and an address held where it now
// reaches is stranded, not moved.
func TestVIPReservedGroups(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	spec := lbSpec("10.0.10.0/29")
	spec.ReservedGroups = []string{"infra"}
	_, err := f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: "p", Spec: spec})
	if e := wantKind(t, err, alloc.KindNotFound); e.Field != "spec.reservedCIDRGroups[0]" {
		t.Fatalf("%+v", e)
	}
	infra := alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "infra", CIDRs: prefixes("10.0.10.0/30")}
	if _, err := f.s.CreateCIDRGroup(f.ctx, infra); err != nil {
		t.Fatal(err)
	}
	p := f.lbPool("p", spec)
	if p.Status.Families[alloc.IPv4].Total != 4 || len(p.Spec.Reserved) != 1 {
		t.Fatalf("p: %+v %+v", p.Spec, p.Status)
	}
	if again := f.lbPool("p", spec); !again.CreatedAt.Equal(p.CreatedAt) {
		t.Fatal("a retry of a pool with reserved groups was not the same pool")
	}
	if a := f.assign(svc("default", "web")); addrs(a) != "10.0.10.4" {
		t.Fatalf("web: %+v", a)
	}
	_, err = f.s.DeleteCIDRGroup(f.ctx, alloc.DefaultSpace, "infra")
	if e := wantKind(t, err, alloc.KindInUse); !strings.Contains(e.Detail, "p") {
		t.Fatalf("%+v", e)
	}
	infra.CIDRs = prefixes("10.0.10.4/30")
	if _, err := f.s.UpdateCIDRGroup(f.ctx, infra); err != nil {
		t.Fatal(err)
	}
	if a := f.assign(svc("default", "web")); addrs(a) != "10.0.10.4(stranded)" {
		t.Fatalf("web after the group's edit: %+v", a)
	}
	if a := f.assign(svc("default", "api")); addrs(a) != "10.0.10.0" {
		t.Fatalf("api: %+v", a)
	}
	spec.ReservedGroups = nil
	if _, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "p", nil, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.DeleteCIDRGroup(f.ctx, alloc.DefaultSpace, "infra"); err != nil {
		t.Fatalf("a group no pool names: %v", err)
	}
	// The group's edit stranded web's address, the pool's edit offered it
	// again: both are in its history.
	if ev := f.texts(`SELECT kind FROM address_events WHERE address = '10.0.10.4' ORDER BY id`); strings.Join(ev, ",") != "vip-assign,vip-stranded,vip-offered" {
		t.Fatalf("history of 10.0.10.4: %q", ev)
	}
}
