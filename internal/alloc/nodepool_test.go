// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSelectNodePool(t *testing.T) {
	rack := func(r string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"rack": r}}
	}
	zoneExists := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "topology.kubernetes.io/zone", Operator: metav1.LabelSelectorOpExists}}}
	cand := func(t *testing.T, name string, fams []Family, sel *metav1.LabelSelector) NodePoolCandidate {
		return NodePoolCandidate{Name: name, Families: fams, NodeSelector: mustSelector(t, sel)}
	}
	cases := []struct {
		name     string
		labels   map[string]string
		f        Family
		pools    func(t *testing.T) []NodePoolCandidate
		def      string
		want     Choice
		wantOK   bool
		wantKind Kind
		wantMsg  string
	}{
		{name: "no selector pool: the default", labels: map[string]string{"rack": "r1"}, f: IPv4,
			pools: func(t *testing.T) []NodePoolCandidate { return []NodePoolCandidate{cand(t, "default", dualStack, nil)} },
			def:   "default", want: Choice{Family: IPv4, Pool: "default", By: ByDefault}, wantOK: true},
		{name: "one match wins over the default", labels: map[string]string{"rack": "r1"}, f: IPv4,
			pools: func(t *testing.T) []NodePoolCandidate {
				return []NodePoolCandidate{cand(t, "default", dualStack, nil), cand(t, "r1", dualStack, rack("r1")), cand(t, "r2", dualStack, rack("r2"))}
			},
			def: "default", want: Choice{Family: IPv4, Pool: "r1", By: ByNodeSelector}, wantOK: true},
		{name: "no match: the default", labels: map[string]string{"rack": "r3"}, f: IPv6,
			pools: func(t *testing.T) []NodePoolCandidate {
				return []NodePoolCandidate{cand(t, "default", dualStack, nil), cand(t, "r1", dualStack, rack("r1"))}
			},
			def: "default", want: Choice{Family: IPv6, Pool: "default", By: ByDefault}, wantOK: true},
		{name: "no labels match nothing but an empty selector", labels: nil, f: IPv4,
			pools: func(t *testing.T) []NodePoolCandidate {
				return []NodePoolCandidate{cand(t, "r1", dualStack, rack("r1")), cand(t, "all", dualStack, &metav1.LabelSelector{})}
			},
			def: "default", want: Choice{Family: IPv4, Pool: "all", By: ByNodeSelector}, wantOK: true},
		{name: "two matches are a pool-match error", labels: map[string]string{"rack": "r1", "topology.kubernetes.io/zone": "a"}, f: IPv4,
			pools: func(t *testing.T) []NodePoolCandidate {
				return []NodePoolCandidate{cand(t, "default", dualStack, nil), cand(t, "zoned", dualStack, zoneExists), cand(t, "r1", dualStack, rack("r1"))}
			},
			def: "default", wantKind: KindPoolMatch, wantMsg: "multiple pools match node n1 for ipv4: r1, zoned"},
		{name: "two matches but one lacks the family", labels: map[string]string{"rack": "r1", "topology.kubernetes.io/zone": "a"}, f: IPv6,
			pools: func(t *testing.T) []NodePoolCandidate {
				return []NodePoolCandidate{cand(t, "zoned", v4Only, zoneExists), cand(t, "r1", dualStack, rack("r1"))}
			},
			def: "default", want: Choice{Family: IPv6, Pool: "r1", By: ByNodeSelector}, wantOK: true},
		{name: "the match lacks the family: the default has it", labels: map[string]string{"rack": "r1"}, f: IPv6,
			pools: func(t *testing.T) []NodePoolCandidate {
				return []NodePoolCandidate{cand(t, "default", dualStack, nil), cand(t, "r1", v4Only, rack("r1"))}
			},
			def: "default", want: Choice{Family: IPv6, Pool: "default", By: ByDefault}, wantOK: true},
		{name: "the default lacks the family: nothing to hold", labels: nil, f: IPv6,
			pools: func(t *testing.T) []NodePoolCandidate { return []NodePoolCandidate{cand(t, "default", v4Only, nil)} },
			def:   "default", wantOK: false},
		{name: "no default, the match lacks the family: nothing to hold", labels: map[string]string{"rack": "r1"}, f: IPv6,
			pools: func(t *testing.T) []NodePoolCandidate { return []NodePoolCandidate{cand(t, "r1", v4Only, rack("r1"))} },
			def:   "default", wantOK: false},
		{name: "no default and no match: not found", labels: map[string]string{"rack": "r9"}, f: IPv4,
			pools: func(t *testing.T) []NodePoolCandidate {
				return []NodePoolCandidate{cand(t, "r1", dualStack, rack("r1"))}
			},
			def: "default", wantKind: KindNotFound, wantMsg: `default pool "default" not found`},
		{name: "the default pool's own selector does not keep it from being the fallback", labels: map[string]string{"rack": "r2"}, f: IPv4,
			pools: func(t *testing.T) []NodePoolCandidate {
				return []NodePoolCandidate{cand(t, "main", dualStack, rack("r1"))}
			},
			def: "main", want: Choice{Family: IPv4, Pool: "main", By: ByDefault}, wantOK: true},
		{name: "the default pool matched by its selector", labels: map[string]string{"rack": "r1"}, f: IPv4,
			pools: func(t *testing.T) []NodePoolCandidate {
				return []NodePoolCandidate{cand(t, "main", dualStack, rack("r1"))}
			},
			def: "main", want: Choice{Family: IPv4, Pool: "main", By: ByNodeSelector}, wantOK: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok, err := SelectNodePool("n1", c.labels, c.f, c.pools(t), c.def)
			if c.wantKind != "" {
				if !IsKind(err, c.wantKind) || !strings.Contains(err.Error(), c.wantMsg) {
					t.Fatalf("err %v, want %s containing %q", err, c.wantKind, c.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ok != c.wantOK || got != c.want {
				t.Fatalf("got %+v ok=%v, want %+v ok=%v", got, ok, c.want, c.wantOK)
			}
		})
	}
}

func TestCiliumOwner(t *testing.T) {
	cases := []struct {
		in   string
		want Owner
	}{
		{"shop/web-0", Owner{Namespace: "shop", Name: "web-0"}},
		{"kube-system/coredns-5d78c9869d-x2v4k", Owner{Namespace: "kube-system", Name: "coredns-5d78c9869d-x2v4k"}},
		{"shop/web.0", Owner{Namespace: "shop", Name: "web.0"}},
		{"shop/web-0 [restored]", Owner{Namespace: "shop", Name: "web-0"}},
		{"router", Owner{Namespace: CiliumAgentNamespace, Name: "router"}},
		{"health", Owner{Namespace: CiliumAgentNamespace, Name: "health"}},
		{"ingress", Owner{Namespace: CiliumAgentNamespace, Name: "ingress"}},
		{"1234 [restored]", Owner{Namespace: CiliumAgentNamespace, Name: "1234"}},
		{"", Owner{Namespace: CiliumAgentNamespace, Name: "unknown"}},
		{"///", Owner{Namespace: CiliumAgentNamespace, Name: "unknown"}},
		{"Bad_NS/pod", Owner{Namespace: CiliumAgentNamespace, Name: "bad-ns-pod"}},
		{"a/b/c", Owner{Namespace: CiliumAgentNamespace, Name: "a-b-c"}},
		{"..x..Y..", Owner{Namespace: CiliumAgentNamespace, Name: "x.y"}},
		{"-é-", Owner{Namespace: CiliumAgentNamespace, Name: "unknown"}},
		{strings.Repeat("a", 300), Owner{Namespace: CiliumAgentNamespace, Name: strings.Repeat("a", 253)}},
		{strings.Repeat("a", 252) + ".b", Owner{Namespace: CiliumAgentNamespace, Name: strings.Repeat("a", 252)}},
	}
	for _, c := range cases {
		got := CiliumOwner(c.in)
		if got != c.want {
			t.Errorf("CiliumOwner(%q) = %+v, want %+v", c.in, got, c.want)
		}
		if err := ValidateOwner("owner.", got); err != nil {
			t.Errorf("CiliumOwner(%q) = %+v, which the owner validation refuses: %v", c.in, got, err)
		}
	}
}

// FuzzCiliumOwner: whatever the agent writes, the owner passes the lease
// owner validation and maps the same way twice.
func FuzzCiliumOwner(f *testing.F) {
	for _, s := range []string{"ns/pod", "router", "a/b [restored]", "", "Ä/ö", strings.Repeat("x.", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o := CiliumOwner(s)
		if err := ValidateOwner("owner.", o); err != nil {
			t.Fatalf("CiliumOwner(%q) = %+v: %v", s, o, err)
		}
		if CiliumOwner(s) != o {
			t.Fatalf("CiliumOwner(%q) is not stable", s)
		}
	})
}

func TestParseLeaseStateReserved(t *testing.T) {
	if st, err := ParseLeaseState("reserved"); err != nil || st != StateReserved {
		t.Fatalf("ParseLeaseState(reserved) = %q, %v", st, err)
	}
}

func TestHeldAddressReleasable(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := HeldAddress{Addr: netip.MustParseAddr("10.0.0.1"), State: StateReserved}
	if !a.Releasable(now) {
		t.Fatal("a reserved address without cooldown is not releasable")
	}
	a.CoolUntil = now.Add(time.Second)
	if a.Releasable(now) {
		t.Fatal("a cooling reserved address is releasable")
	}
	if !a.Releasable(now.Add(time.Second)) {
		t.Fatal("a reserved address whose cooldown ended is not releasable")
	}
	a.State, a.CoolUntil = StateActive, time.Time{}
	if a.Releasable(now) {
		t.Fatal("an active address is releasable")
	}
}
