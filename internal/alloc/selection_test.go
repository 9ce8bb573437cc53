// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Pools of the selection tests: dual-stack pools named after the rule that
// should pick them, single-family pools, and one with no family at all.
var (
	dualStack = []Family{IPv4, IPv6}
	v4Only    = []Family{IPv4}
	v6Only    = []Family{IPv6}
)

func selKnown() map[string]Candidate {
	known := map[string]Candidate{}
	for _, n := range []string{"default", "req", "req4", "req6", "pod", "pod4", "pod6", "ns", "ns4", "ns6", "mars"} {
		known[n] = Candidate{Name: n, Families: dualStack}
	}
	known["v4only"] = Candidate{Name: "v4only", Families: v4Only}
	known["v6only"] = Candidate{Name: "v6only", Families: v6Only}
	known["nofamily"] = Candidate{Name: "nofamily"}
	return known
}

// mustSelector converts s for a test, failing it on error.
func mustSelector(t *testing.T, s *metav1.LabelSelector) labels.Selector {
	t.Helper()
	sel, err := LabelSelector("test", s)
	if err != nil {
		t.Fatalf("LabelSelector(%+v): %v", s, err)
	}
	return sel
}

func matchLabels(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func ann(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

func choicesString(cs []Choice) string {
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s=%s(%s)", c.Family, c.Pool, c.By))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// want builds the expected choices: family, pool and rule triples.
func want(args ...any) []Choice {
	var out []Choice
	for i := 0; i+2 < len(args); i += 3 {
		out = append(out, Choice{Family: args[i].(Family), Pool: args[i+1].(string), By: args[i+2].(SelectedBy)})
	}
	return out
}

func checkChoices(t *testing.T, got []Choice, err error, exp []Choice) {
	t.Helper()
	if err != nil {
		t.Fatalf("Select: %v, want %s", err, choicesString(exp))
	}
	if !slices.Equal(got, exp) {
		t.Fatalf("Select = %s, want %s", choicesString(got), choicesString(exp))
	}
}

func checkSelectError(t *testing.T, got []Choice, err error, kind Kind, field string, detail ...string) {
	t.Helper()
	var e *Error
	if !asError(err, &e) {
		t.Fatalf("Select = %s, %v; want %s error at %q", choicesString(got), err, kind, field)
	}
	if got != nil {
		t.Errorf("Select returned choices %s with error %v", choicesString(got), err)
	}
	if e.Kind != kind || e.Field != field {
		t.Fatalf("Select error %v; want %s at %q", err, kind, field)
	}
	for _, d := range detail {
		if !strings.Contains(e.Detail, d) {
			t.Errorf("detail %q does not mention %q", e.Detail, d)
		}
	}
}

// Every rule of the precedence, peeled off one at a time from a request in
// which every rule names a different pool.
func TestSelectPrecedence(t *testing.T) {
	selPool := func(t *testing.T) []Candidate {
		return []Candidate{{Name: "sel", Families: dualStack, PodSelector: mustSelector(t, matchLabels("app", "web"))}}
	}
	full := func() Selection {
		return Selection{
			Pools: map[Family]string{IPv4: "req4", IPv6: "req6"},
			Pool:  "req",
			Pod: Metadata{
				Labels:      map[string]string{"app": "web"},
				Annotations: ann(AnnotationIPv4Pool, "pod4", AnnotationIPv6Pool, "pod6", AnnotationIPPool, "pod"),
			},
			NamespaceMeta: Metadata{
				Annotations: ann(AnnotationIPv4Pool, "ns4", AnnotationIPv6Pool, "ns6", AnnotationIPPool, "ns"),
			},
			Namespace:   "tenant",
			PodName:     "p",
			DefaultPool: "default",
		}
	}
	cases := []struct {
		name   string
		modify func(*Selection)
		want   []Choice
	}{
		{"request pools per family win", func(*Selection) {},
			want(IPv4, "req4", ByRequest, IPv6, "req6", ByRequest)},
		{"request pool", func(s *Selection) { s.Pools = nil },
			want(IPv4, "req", ByRequest, IPv6, "req", ByRequest)},
		{"pod per-family annotations", func(s *Selection) { s.Pools, s.Pool = nil, "" },
			want(IPv4, "pod4", ByPodAnnotation, IPv6, "pod6", ByPodAnnotation)},
		{"pod ip-pool annotation", func(s *Selection) {
			s.Pools, s.Pool = nil, ""
			delete(s.Pod.Annotations, AnnotationIPv4Pool)
			delete(s.Pod.Annotations, AnnotationIPv6Pool)
		}, want(IPv4, "pod", ByPodAnnotation, IPv6, "pod", ByPodAnnotation)},
		{"namespace per-family annotations", func(s *Selection) {
			s.Pools, s.Pool, s.Pod.Annotations = nil, "", nil
		}, want(IPv4, "ns4", ByNamespaceAnnotation, IPv6, "ns6", ByNamespaceAnnotation)},
		{"namespace ip-pool annotation", func(s *Selection) {
			s.Pools, s.Pool, s.Pod.Annotations = nil, "", nil
			delete(s.NamespaceMeta.Annotations, AnnotationIPv4Pool)
			delete(s.NamespaceMeta.Annotations, AnnotationIPv6Pool)
		}, want(IPv4, "ns", ByNamespaceAnnotation, IPv6, "ns", ByNamespaceAnnotation)},
		{"selector", func(s *Selection) {
			s.Pools, s.Pool, s.Pod.Annotations, s.NamespaceMeta.Annotations = nil, "", nil, nil
		}, want(IPv4, "sel", BySelector, IPv6, "sel", BySelector)},
		{"default", func(s *Selection) {
			s.Pools, s.Pool, s.Pod.Annotations, s.NamespaceMeta.Annotations, s.Pod.Labels = nil, "", nil, nil, nil
		}, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},

		// Mixed: each family follows its own highest rule.
		{"request ipv4 pool, request pool for ipv6", func(s *Selection) { s.Pools = map[Family]string{IPv4: "req4"} },
			want(IPv4, "req4", ByRequest, IPv6, "req", ByRequest)},
		{"request ipv6 pool, pod annotations for ipv4", func(s *Selection) {
			s.Pools, s.Pool = map[Family]string{IPv6: "req6"}, ""
		}, want(IPv4, "pod4", ByPodAnnotation, IPv6, "req6", ByRequest)},
		{"pod ipv4-pool, pod ip-pool for ipv6", func(s *Selection) {
			s.Pools, s.Pool = nil, ""
			delete(s.Pod.Annotations, AnnotationIPv6Pool)
		}, want(IPv4, "pod4", ByPodAnnotation, IPv6, "pod", ByPodAnnotation)},
		{"pod ipv6-pool, namespace ipv4-pool", func(s *Selection) {
			s.Pools, s.Pool = nil, ""
			s.Pod.Annotations = ann(AnnotationIPv6Pool, "pod6")
		}, want(IPv4, "ns4", ByNamespaceAnnotation, IPv6, "pod6", ByPodAnnotation)},
		{"pod ip-pool beats namespace per-family", func(s *Selection) {
			s.Pools, s.Pool = nil, ""
			s.Pod.Annotations = ann(AnnotationIPPool, "pod")
		}, want(IPv4, "pod", ByPodAnnotation, IPv6, "pod", ByPodAnnotation)},
		{"namespace ipv4-pool, selector for ipv6", func(s *Selection) {
			s.Pools, s.Pool, s.Pod.Annotations = nil, "", nil
			s.NamespaceMeta.Annotations = ann(AnnotationIPv4Pool, "ns4")
		}, want(IPv4, "ns4", ByNamespaceAnnotation, IPv6, "sel", BySelector)},
		{"pod ipv6-pool, default for ipv4", func(s *Selection) {
			s.Pools, s.Pool, s.NamespaceMeta.Annotations, s.Pod.Labels = nil, "", nil, nil
			s.Pod.Annotations = ann(AnnotationIPv6Pool, "pod6")
		}, want(IPv4, "default", ByDefault, IPv6, "pod6", ByPodAnnotation)},
		{"annotation beats require-pool-match", func(s *Selection) {
			s.Pools, s.Pool, s.Pod.Labels = nil, "", nil
			s.Pod.Annotations = ann(AnnotationIPPool, "pod", AnnotationRequirePoolMatch, "true")
		}, want(IPv4, "pod", ByPodAnnotation, IPv6, "pod", ByPodAnnotation)},
		{"request beats require-pool-match", func(s *Selection) {
			s.Pools, s.Pod.Labels = nil, nil
			s.NamespaceMeta.Annotations = ann(AnnotationRequirePoolMatch, "true")
		}, want(IPv4, "req", ByRequest, IPv6, "req", ByRequest)},
		{"ipam-pool is not a pool key", func(s *Selection) {
			s.Pools, s.Pool, s.Pod.Labels, s.NamespaceMeta.Annotations = nil, "", nil, nil
			s.Pod.Annotations = ann("ipam.cilium.io/ipam-pool", "mars")
		}, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"require-pool-match false is no requirement", func(s *Selection) {
			s.Pools, s.Pool, s.Pod.Labels, s.NamespaceMeta.Annotations = nil, "", nil, nil
			s.Pod.Annotations = ann(AnnotationRequirePoolMatch, "false")
		}, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"require-pool-match met by a selector", func(s *Selection) {
			s.Pools, s.Pool, s.Pod.Annotations = nil, "", nil
			s.NamespaceMeta.Annotations = ann(AnnotationRequirePoolMatch, "true")
		}, want(IPv4, "sel", BySelector, IPv6, "sel", BySelector)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := full()
			c.modify(&s)
			got, err := Select(s, selKnown(), selPool(t))
			checkChoices(t, got, err, c.want)
			for _, ch := range got {
				if n := s.NamedPool(ch.Family); (ch.By == BySelector || ch.By == ByDefault) != (n == "") || (n != "" && n != ch.Pool) {
					t.Errorf("NamedPool(%s) = %q, but %s chose %q", ch.Family, n, ch.By, ch.Pool)
				}
			}
		})
	}
}

func TestSelectSelectors(t *testing.T) {
	type pool struct {
		name     string
		families []Family
		pod, ns  *metav1.LabelSelector
	}
	in := func(key string, values ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: metav1.LabelSelectorOpIn, Values: values}}}
	}
	op := func(key string, o metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: o, Values: values}}}
	}
	cases := []struct {
		name      string
		pools     []pool
		namespace string
		podLabels map[string]string
		nsLabels  map[string]string
		families  []Family
		want      []Choice
	}{
		{"pod selector matches", []pool{{"sel", dualStack, matchLabels("app", "web"), nil}}, "tenant",
			map[string]string{"app": "web"}, nil, nil, want(IPv4, "sel", BySelector, IPv6, "sel", BySelector)},
		{"pod selector does not match", []pool{{"sel", dualStack, matchLabels("app", "web"), nil}}, "tenant",
			map[string]string{"app": "db"}, nil, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"pod selector on the synthetic namespace label", []pool{{"sel", dualStack, matchLabels(LabelPodNamespace, "tenant"), nil}}, "tenant",
			nil, nil, nil, want(IPv4, "sel", BySelector, IPv6, "sel", BySelector)},
		{"synthetic namespace label of another namespace", []pool{{"sel", dualStack, matchLabels(LabelPodNamespace, "tenant"), nil}}, "other",
			nil, nil, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"pod cannot fake the synthetic namespace label", []pool{{"sel", dualStack, matchLabels(LabelPodNamespace, "tenant"), nil}}, "other",
			map[string]string{LabelPodNamespace: "tenant"}, nil, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"namespace selector matches", []pool{{"sel", dualStack, nil, matchLabels("team", "a")}}, "tenant",
			nil, map[string]string{"team": "a"}, nil, want(IPv4, "sel", BySelector, IPv6, "sel", BySelector)},
		{"namespace selector ignores pod labels", []pool{{"sel", dualStack, nil, matchLabels("team", "a")}}, "tenant",
			map[string]string{"team": "a"}, map[string]string{"team": "b"}, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"pod selector ignores namespace labels", []pool{{"sel", dualStack, matchLabels("app", "web"), nil}}, "tenant",
			nil, map[string]string{"app": "web"}, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"both set, both match", []pool{{"sel", dualStack, matchLabels("app", "web"), matchLabels("team", "a")}}, "tenant",
			map[string]string{"app": "web"}, map[string]string{"team": "a"}, nil, want(IPv4, "sel", BySelector, IPv6, "sel", BySelector)},
		{"both set, only pod matches", []pool{{"sel", dualStack, matchLabels("app", "web"), matchLabels("team", "a")}}, "tenant",
			map[string]string{"app": "web"}, map[string]string{"team": "b"}, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"both set, only namespace matches", []pool{{"sel", dualStack, matchLabels("app", "web"), matchLabels("team", "a")}}, "tenant",
			map[string]string{"app": "db"}, map[string]string{"team": "a"}, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"neither set is never selected", []pool{{"sel", dualStack, nil, nil}}, "tenant",
			map[string]string{"app": "web"}, map[string]string{"team": "a"}, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"empty pod selector matches everything", []pool{{"sel", dualStack, &metav1.LabelSelector{}, nil}}, "tenant",
			nil, nil, nil, want(IPv4, "sel", BySelector, IPv6, "sel", BySelector)},
		{"empty namespace selector matches everything", []pool{{"sel", dualStack, nil, &metav1.LabelSelector{}}}, "tenant",
			nil, nil, nil, want(IPv4, "sel", BySelector, IPv6, "sel", BySelector)},
		{"empty pod selector and unmatched namespace selector", []pool{{"sel", dualStack, &metav1.LabelSelector{}, matchLabels("team", "a")}}, "tenant",
			nil, nil, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"In matches", []pool{{"sel", dualStack, in("app", "web", "api"), nil}}, "tenant",
			map[string]string{"app": "api"}, nil, nil, want(IPv4, "sel", BySelector, IPv6, "sel", BySelector)},
		{"NotIn excludes", []pool{{"sel", dualStack, op("app", metav1.LabelSelectorOpNotIn, "web"), nil}}, "tenant",
			map[string]string{"app": "web"}, nil, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"Exists matches", []pool{{"sel", dualStack, op("gpu", metav1.LabelSelectorOpExists), nil}}, "tenant",
			map[string]string{"gpu": ""}, nil, nil, want(IPv4, "sel", BySelector, IPv6, "sel", BySelector)},
		{"DoesNotExist on namespace", []pool{{"sel", dualStack, nil, op("restricted", metav1.LabelSelectorOpDoesNotExist)}}, "tenant",
			nil, map[string]string{"restricted": "yes"}, nil, want(IPv4, "default", ByDefault, IPv6, "default", ByDefault)},
		{"selector pool lacking ipv6 is no ipv6 candidate", []pool{{"sel4", v4Only, matchLabels("app", "web"), nil}}, "tenant",
			map[string]string{"app": "web"}, nil, nil, want(IPv4, "sel4", BySelector, IPv6, "default", ByDefault)},
		{"selector pool lacking ipv4 is no ipv4 candidate", []pool{{"sel6", v6Only, matchLabels("app", "web"), nil}}, "tenant",
			map[string]string{"app": "web"}, nil, nil, want(IPv4, "default", ByDefault, IPv6, "sel6", BySelector)},
		{"one pool per family is not a double match", []pool{
			{"sel4", v4Only, matchLabels("app", "web"), nil},
			{"sel6", v6Only, nil, matchLabels("team", "a")},
		}, "tenant", map[string]string{"app": "web"}, map[string]string{"team": "a"}, nil,
			want(IPv4, "sel4", BySelector, IPv6, "sel6", BySelector)},
		{"only the matching one of two", []pool{
			{"alpha", dualStack, matchLabels("app", "web"), nil},
			{"beta", dualStack, matchLabels("app", "db"), nil},
		}, "tenant", map[string]string{"app": "db"}, nil, nil,
			want(IPv4, "beta", BySelector, IPv6, "beta", BySelector)},
		{"explicit ipv6 only", []pool{{"sel", dualStack, matchLabels("app", "web"), nil}}, "tenant",
			map[string]string{"app": "web"}, nil, []Family{IPv6}, want(IPv6, "sel", BySelector)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			known := selKnown()
			var bySel []Candidate
			for _, p := range c.pools {
				cand := Candidate{Name: p.name, Families: p.families, PodSelector: mustSelector(t, p.pod), NamespaceSelector: mustSelector(t, p.ns)}
				known[p.name] = cand
				bySel = append(bySel, cand)
			}
			s := Selection{Namespace: c.namespace, PodName: "p", Families: c.families, DefaultPool: "default",
				Pod: Metadata{Labels: c.podLabels}, NamespaceMeta: Metadata{Labels: c.nsLabels}}
			got, err := Select(s, known, bySel)
			checkChoices(t, got, err, c.want)
		})
	}
}

func TestSelectFailures(t *testing.T) {
	web := map[string]string{"app": "web"}
	twoMatch := func(t *testing.T) []Candidate {
		return []Candidate{
			{Name: "beta", Families: dualStack, PodSelector: mustSelector(t, matchLabels("app", "web"))},
			{Name: "alpha", Families: dualStack, NamespaceSelector: mustSelector(t, &metav1.LabelSelector{})},
		}
	}
	v6Clash := func(t *testing.T) []Candidate {
		return []Candidate{
			{Name: "delta", Families: dualStack, PodSelector: mustSelector(t, matchLabels("app", "web"))},
			{Name: "omega", Families: v6Only, PodSelector: mustSelector(t, matchLabels(LabelPodNamespace, "tenant"))},
		}
	}
	noSel := func(*testing.T) []Candidate { return nil }
	unmatched := func(t *testing.T) []Candidate {
		return []Candidate{{Name: "mars", Families: dualStack, PodSelector: mustSelector(t, matchLabels("app", "db"))}}
	}
	v4Sel := func(t *testing.T) []Candidate {
		return []Candidate{{Name: "v4only", Families: v4Only, PodSelector: mustSelector(t, matchLabels("app", "web"))}}
	}
	require := ann(AnnotationRequirePoolMatch, "true")
	cases := []struct {
		name   string
		s      Selection
		known  map[string]Candidate // nil: selKnown()
		bySel  func(*testing.T) []Candidate
		kind   Kind
		field  string
		detail []string
	}{
		// More than one selector pool.
		{"two pools match", Selection{Pod: Metadata{Labels: web}}, nil, twoMatch,
			KindPoolMatch, "owner", []string{"alpha", "beta", "tenant/p", "ipv4"}},
		{"two pools match for ipv6 only", Selection{Pod: Metadata{Labels: web}}, nil, v6Clash,
			KindPoolMatch, "owner", []string{"delta", "omega", "ipv6"}},
		{"two pools match, explicit family", Selection{Pod: Metadata{Labels: web}, Families: []Family{IPv6}}, nil, twoMatch,
			KindPoolMatch, "owner", []string{"alpha", "beta", "ipv6"}},

		// require-pool-match.
		{"pod requires a match, explicit ipv4", Selection{Pod: Metadata{Annotations: require}, Families: []Family{IPv4}}, nil, unmatched,
			KindPoolMatch, "owner", []string{AnnotationRequirePoolMatch, "ipv4"}},
		{"namespace requires a match, explicit ipv6", Selection{NamespaceMeta: Metadata{Annotations: require}, Families: []Family{IPv6}}, nil, unmatched,
			KindPoolMatch, "owner", []string{AnnotationRequirePoolMatch, "ipv6"}},
		{"require, explicit dual, only ipv4 matches", Selection{Pod: Metadata{Labels: web, Annotations: require}, Families: dualStack}, nil, v4Sel,
			KindPoolMatch, "owner", []string{"ipv6"}},
		{"require, implicit, nothing matches", Selection{NamespaceMeta: Metadata{Annotations: require}}, nil, noSel,
			KindPoolMatch, "owner", []string{AnnotationRequirePoolMatch, "ipv4"}},

		// Unknown named pools, named by their source.
		{"unknown request ipv4 pool", Selection{Pools: map[Family]string{IPv4: "nope"}}, nil, noSel, KindNotFound, "pools.ipv4", []string{"nope"}},
		{"unknown request ipv6 pool", Selection{Pools: map[Family]string{IPv6: "nope"}}, nil, noSel, KindNotFound, "pools.ipv6", []string{"nope"}},
		{"unknown request pool", Selection{Pool: "nope"}, nil, noSel, KindNotFound, "pool", []string{"nope"}},
		{"unknown pod ipv4-pool", Selection{Pod: Metadata{Annotations: ann(AnnotationIPv4Pool, "nope")}}, nil, noSel,
			KindNotFound, "pod.annotations[ipam.cilium.io/ipv4-pool]", []string{"nope"}},
		{"unknown pod ipv6-pool", Selection{Pod: Metadata{Annotations: ann(AnnotationIPv6Pool, "nope")}}, nil, noSel,
			KindNotFound, "pod.annotations[ipam.cilium.io/ipv6-pool]", []string{"nope"}},
		{"unknown pod ip-pool", Selection{Pod: Metadata{Annotations: ann(AnnotationIPPool, "nope")}}, nil, noSel,
			KindNotFound, "pod.annotations[ipam.cilium.io/ip-pool]", []string{"nope"}},
		{"unknown namespace ipv4-pool", Selection{NamespaceMeta: Metadata{Annotations: ann(AnnotationIPv4Pool, "nope")}}, nil, noSel,
			KindNotFound, "namespace.annotations[ipam.cilium.io/ipv4-pool]", []string{"nope"}},
		{"unknown namespace ipv6-pool", Selection{NamespaceMeta: Metadata{Annotations: ann(AnnotationIPv6Pool, "nope")}}, nil, noSel,
			KindNotFound, "namespace.annotations[ipam.cilium.io/ipv6-pool]", []string{"nope"}},
		{"unknown namespace ip-pool", Selection{NamespaceMeta: Metadata{Annotations: ann(AnnotationIPPool, "nope")}}, nil, noSel,
			KindNotFound, "namespace.annotations[ipam.cilium.io/ip-pool]", []string{"nope"}},
		{"unknown default pool, explicit", Selection{DefaultPool: "gone", Families: []Family{IPv4}}, nil, noSel,
			KindNotFound, "pool", []string{"gone"}},
		{"unknown default pool, implicit", Selection{DefaultPool: "gone"}, nil, noSel,
			KindNotFound, "pool", []string{"gone"}},

		// A pool named for one family must have it.
		{"request ipv6 pool without ipv6", Selection{Pools: map[Family]string{IPv6: "v4only"}}, nil, noSel,
			KindInvalid, "pools.ipv6", []string{"v4only", "ipv6"}},
		{"request ipv4 pool without ipv4", Selection{Pools: map[Family]string{IPv4: "v6only"}}, nil, noSel,
			KindInvalid, "pools.ipv4", []string{"v6only", "ipv4"}},
		{"pod ipv6-pool without ipv6", Selection{Pod: Metadata{Annotations: ann(AnnotationIPv6Pool, "v4only")}}, nil, noSel,
			KindInvalid, "pod.annotations[ipam.cilium.io/ipv6-pool]", []string{"v4only"}},
		{"namespace ipv4-pool without ipv4", Selection{NamespaceMeta: Metadata{Annotations: ann(AnnotationIPv4Pool, "v6only")}}, nil, noSel,
			KindInvalid, "namespace.annotations[ipam.cilium.io/ipv4-pool]", []string{"v6only"}},

		// A pool named for all families must have every explicit one.
		{"request pool without ipv6, explicit dual", Selection{Pool: "v4only", Families: dualStack}, nil, noSel,
			KindInvalid, "families[1]", []string{"v4only", "ipv6"}},
		{"request pool without ipv6, explicit ipv6", Selection{Pool: "v4only", Families: []Family{IPv6}}, nil, noSel,
			KindInvalid, "families[0]", []string{"v4only"}},
		{"pod ip-pool without ipv4, explicit ipv4", Selection{Pod: Metadata{Annotations: ann(AnnotationIPPool, "v6only")}, Families: []Family{IPv4}}, nil, noSel,
			KindInvalid, "families[0]", []string{"v6only"}},
		{"namespace ip-pool without ipv6, explicit dual", Selection{NamespaceMeta: Metadata{Annotations: ann(AnnotationIPPool, "v4only")}, Families: dualStack}, nil, noSel,
			KindInvalid, "families[1]", []string{"v4only"}},
		{"default pool without ipv6, explicit ipv6", Selection{DefaultPool: "v4only", Families: []Family{IPv6}}, nil, noSel,
			KindInvalid, "families[0]", []string{"v4only"}},

		// No family served at all.
		{"named pool with no family", Selection{Pool: "nofamily"}, nil, noSel, KindInvalid, "pool", nil},
		{"default pool with no family", Selection{DefaultPool: "nofamily"}, nil, noSel, KindInvalid, "pool", nil},
		{"no pools at all", Selection{}, map[string]Candidate{}, noSel, KindNotFound, "pool", []string{"default"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := c.s
			s.Namespace, s.PodName = "tenant", "p"
			if s.DefaultPool == "" {
				s.DefaultPool = "default"
			}
			known := c.known
			if known == nil {
				known = selKnown()
			}
			got, err := Select(s, known, c.bySel(t))
			checkSelectError(t, got, err, c.kind, c.field, c.detail...)
		})
	}
}

// A pool named for every family that lacks one is skipped for it when the
// request leaves the families implicit; require-pool-match leaves out the
// families no selector serves as long as one is served.
func TestSelectImplicitFamilies(t *testing.T) {
	cases := []struct {
		name  string
		s     Selection
		bySel []Candidate
		want  []Choice
	}{
		{"request pool without ipv6", Selection{Pool: "v4only"}, nil, want(IPv4, "v4only", ByRequest)},
		{"pod ip-pool without ipv4", Selection{Pod: Metadata{Annotations: ann(AnnotationIPPool, "v6only")}}, nil,
			want(IPv6, "v6only", ByPodAnnotation)},
		{"namespace ip-pool without ipv6", Selection{NamespaceMeta: Metadata{Annotations: ann(AnnotationIPPool, "v4only")}}, nil,
			want(IPv4, "v4only", ByNamespaceAnnotation)},
		{"generic pool without ipv6 does not fall back to the default", Selection{Pool: "v4only", DefaultPool: "mars"}, nil,
			want(IPv4, "v4only", ByRequest)},
		{"default pool without ipv6", Selection{DefaultPool: "v4only"}, nil, want(IPv4, "v4only", ByDefault)},
		{"require-pool-match, only ipv4 matched", Selection{Pod: Metadata{Labels: map[string]string{"app": "web"}, Annotations: ann(AnnotationRequirePoolMatch, "true")}},
			[]Candidate{{Name: "v4only", Families: v4Only, PodSelector: labels.SelectorFromSet(labels.Set{"app": "web"})}},
			want(IPv4, "v4only", BySelector)},
		{"explicit ipv6 only from a dual pool", Selection{Pool: "mars", Families: []Family{IPv6}}, nil, want(IPv6, "mars", ByRequest)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := c.s
			s.Namespace, s.PodName = "tenant", "p"
			if s.DefaultPool == "" {
				s.DefaultPool = "default"
			}
			got, err := Select(s, selKnown(), c.bySel)
			checkChoices(t, got, err, c.want)
		})
	}
}

// Choices come in lock order, IPv4 first, whatever order the families are
// asked in.
func TestSelectOrder(t *testing.T) {
	cases := []struct {
		name     string
		families []Family
	}{
		{"implicit", nil},
		{"explicit ipv4 ipv6", []Family{IPv4, IPv6}},
		{"explicit ipv6 ipv4", []Family{IPv6, IPv4}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := Selection{Families: c.families, DefaultPool: "default", Namespace: "tenant", PodName: "p",
				Pools: map[Family]string{IPv6: "req6"}}
			got, err := Select(s, selKnown(), nil)
			checkChoices(t, got, err, want(IPv4, "default", ByDefault, IPv6, "req6", ByRequest))
		})
	}
}

func TestSelectValidatesInput(t *testing.T) {
	cases := []struct {
		name  string
		s     Selection
		field string
	}{
		{"request ipv4 pool", Selection{Pools: map[Family]string{IPv4: "Mars"}}, "pools.ipv4"},
		{"request ipv6 pool", Selection{Pools: map[Family]string{IPv6: "mars_6"}}, "pools.ipv6"},
		{"request pool", Selection{Pool: "a.b"}, "pool"},
		{"request pool too long", Selection{Pool: strings.Repeat("a", 64)}, "pool"},
		{"pod ip-pool", Selection{Pod: Metadata{Annotations: ann(AnnotationIPPool, "Bad Name")}}, "pod.annotations[ipam.cilium.io/ip-pool]"},
		{"pod ipv4-pool", Selection{Pod: Metadata{Annotations: ann(AnnotationIPv4Pool, "-mars")}}, "pod.annotations[ipam.cilium.io/ipv4-pool]"},
		{"pod ipv6-pool", Selection{Pod: Metadata{Annotations: ann(AnnotationIPv6Pool, "mars-")}}, "pod.annotations[ipam.cilium.io/ipv6-pool]"},
		{"namespace ip-pool", Selection{NamespaceMeta: Metadata{Annotations: ann(AnnotationIPPool, "MARS")}}, "namespace.annotations[ipam.cilium.io/ip-pool]"},
		{"namespace ipv4-pool", Selection{NamespaceMeta: Metadata{Annotations: ann(AnnotationIPv4Pool, "a/b")}}, "namespace.annotations[ipam.cilium.io/ipv4-pool]"},
		{"namespace ipv6-pool", Selection{NamespaceMeta: Metadata{Annotations: ann(AnnotationIPv6Pool, "ü")}}, "namespace.annotations[ipam.cilium.io/ipv6-pool]"},
		{"bad pool name in an annotation the families do not use", Selection{Families: []Family{IPv4},
			Pod: Metadata{Annotations: ann(AnnotationIPv6Pool, "Bad")}}, "pod.annotations[ipam.cilium.io/ipv6-pool]"},
		{"bad name is invalid before unknown", Selection{Pool: "Nope"}, "pool"},
		{"pod label key", Selection{Pod: Metadata{Labels: map[string]string{"bad key": "x"}}}, "pod.labels[bad key]"},
		{"pod label value", Selection{Pod: Metadata{Labels: map[string]string{"app": "bad value"}}}, "pod.labels[app]"},
		{"namespace label key", Selection{NamespaceMeta: Metadata{Labels: map[string]string{"-team": "a"}}}, "namespace.labels[-team]"},
		{"namespace label value too long", Selection{NamespaceMeta: Metadata{Labels: map[string]string{"team": strings.Repeat("a", 64)}}}, "namespace.labels[team]"},
		{"unknown family", Selection{Families: []Family{IPv4, Family(5)}}, "families[1]"},
		{"zero family", Selection{Families: []Family{0}}, "families[0]"},
		{"family twice", Selection{Families: []Family{IPv6, IPv6}}, "families[1]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := c.s
			s.Namespace, s.PodName, s.DefaultPool = "tenant", "p", "default"
			got, err := Select(s, selKnown(), nil)
			checkSelectError(t, got, err, KindInvalid, c.field)
		})
	}
}

func TestSelectionNamed(t *testing.T) {
	cases := []struct {
		name string
		s    Selection
		want []string
	}{
		{"nothing", Selection{}, nil},
		{"default only", Selection{DefaultPool: "default"}, []string{"default"}},
		{"every source once, sorted", Selection{
			DefaultPool:   "default",
			Pools:         map[Family]string{IPv4: "req4", IPv6: "req6"},
			Pool:          "req",
			Pod:           Metadata{Annotations: ann(AnnotationIPv4Pool, "pod4", AnnotationIPv6Pool, "pod6", AnnotationIPPool, "pod", "other", "ignored")},
			NamespaceMeta: Metadata{Annotations: ann(AnnotationIPv4Pool, "ns4", AnnotationIPv6Pool, "ns6", AnnotationIPPool, "ns")},
		}, []string{"default", "ns", "ns4", "ns6", "pod", "pod4", "pod6", "req", "req4", "req6"}},
		{"duplicates and empties", Selection{
			DefaultPool:   "mars",
			Pools:         map[Family]string{IPv4: "mars", IPv6: ""},
			Pool:          "",
			Pod:           Metadata{Annotations: ann(AnnotationIPPool, "mars", AnnotationIPv6Pool, "")},
			NamespaceMeta: Metadata{Annotations: ann(AnnotationIPv4Pool, "alpha", AnnotationIPPool, "alpha")},
		}, []string{"alpha", "mars"}},
		{"no default pool", Selection{Pool: "zeta", Pod: Metadata{Annotations: ann(AnnotationIPv6Pool, "beta")}}, []string{"beta", "zeta"}},
		{"selector-only keys are not names", Selection{Pod: Metadata{Labels: map[string]string{"app": "web"},
			Annotations: ann(AnnotationRequirePoolMatch, "true", AnnotationSkipMasquerade, "true")}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := c.s.Named()
			if !slices.Equal(got, c.want) {
				t.Fatalf("Named() = %q, want %q", got, c.want)
			}
		})
	}
}

func TestLabelSelector(t *testing.T) {
	sel, err := LabelSelector("spec.podSelector", nil)
	if sel != nil || err != nil {
		t.Fatalf("nil selector = %v, %v; want nil, nil", sel, err)
	}
	everything := mustSelector(t, &metav1.LabelSelector{})
	for _, l := range []labels.Set{nil, {}, {"app": "web"}} {
		if !everything.Matches(l) {
			t.Errorf("empty selector does not match %v", l)
		}
	}
	bad := []struct {
		name string
		s    *metav1.LabelSelector
	}{
		{"operator Foo", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Foo", Values: []string{"x"}}}}},
		{"invalid key", matchLabels("bad key!", "x")},
		{"invalid value", matchLabels("app", "bad value")},
		{"In without values", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn}}}},
		{"Exists with values", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists, Values: []string{"x"}}}}},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			sel, err := LabelSelector("spec.namespaceSelector", c.s)
			var e *Error
			if !asError(err, &e) || e.Kind != KindInvalid || e.Field != "spec.namespaceSelector" {
				t.Fatalf("got %v, %v; want invalid-input at spec.namespaceSelector", sel, err)
			}
		})
	}
}
