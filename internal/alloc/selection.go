// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The annotation and label keys Cilium's multi-pool IPAM reads
// (pkg/annotation/k8s.go). Only ip-pool is the pool key: some upstream
// tutorial text writes ipam.cilium.io/ipam-pool, which does nothing there
// and nothing here.
const (
	AnnotationIPPool           = "ipam.cilium.io/ip-pool"
	AnnotationIPv4Pool         = "ipam.cilium.io/ipv4-pool"
	AnnotationIPv6Pool         = "ipam.cilium.io/ipv6-pool"
	AnnotationRequirePoolMatch = "ipam.cilium.io/require-pool-match"
	AnnotationSkipMasquerade   = "ipam.cilium.io/skip-masquerade"
	// LabelPodNamespace is the synthetic label a podSelector can match the
	// Pod's namespace with.
	LabelPodNamespace = "io.kubernetes.pod.namespace"
)

// SelectedBy names the rule that chose a lease's pool.
type SelectedBy string

const (
	ByRequest             SelectedBy = "request"              // the lease request named it
	ByPodAnnotation       SelectedBy = "pod-annotation"       // ipam.cilium.io/ip[v4|v6]-pool on the Pod
	ByNamespaceAnnotation SelectedBy = "namespace-annotation" // the same keys on the namespace
	BySelector            SelectedBy = "selector"             // the pool's podSelector/namespaceSelector
	ByDefault             SelectedBy = "default"              // the default pool
)

// Metadata is the part of a Kubernetes object pool selection reads.
type Metadata struct {
	Labels      map[string]string
	Annotations map[string]string
}

// Selection is everything a lease request says about where its addresses
// come from.
type Selection struct {
	// Pools names a pool per family; it wins over Pool.
	Pools map[Family]string
	// Pool names one pool for every family.
	Pool string
	// Families lists the families asked for; empty means every family some
	// pool can serve.
	Families []Family
	// Namespace is the Pod's namespace (the synthetic label's value) and
	// PodName its name, for messages.
	Namespace, PodName string
	Pod, NamespaceMeta Metadata
	// DefaultPool is the pool of the last rule (the server's setting).
	DefaultPool string
}

// Candidate is what selection knows of a pool.
type Candidate struct {
	Name     string
	Families []Family
	// Selectors; nil when unset. A pool with neither is never chosen by
	// the selector rule.
	PodSelector, NamespaceSelector labels.Selector
}

func (c Candidate) has(f Family) bool { return slices.Contains(c.Families, f) }

func (c Candidate) selects(podLabels, nsLabels labels.Set) bool {
	if c.PodSelector == nil && c.NamespaceSelector == nil {
		return false
	}
	return (c.PodSelector == nil || c.PodSelector.Matches(podLabels)) &&
		(c.NamespaceSelector == nil || c.NamespaceSelector.Matches(nsLabels))
}

// Choice is the pool chosen for one family.
type Choice struct {
	Family Family
	Pool   string
	By     SelectedBy
}

// LabelSelector converts a Kubernetes label selector, naming field on error.
// A nil selector converts to nil (unset); an empty one matches everything.
func LabelSelector(field string, s *metav1.LabelSelector) (labels.Selector, error) {
	if s == nil {
		return nil, nil
	}
	// Values are a set: duplicates would print as a selector ("k in (,)"
	// for two empty values) that parses back as another one (FuzzLabelSelector).
	if len(s.MatchExpressions) > 0 {
		c := *s
		c.MatchExpressions = make([]metav1.LabelSelectorRequirement, len(s.MatchExpressions))
		for i, r := range s.MatchExpressions {
			r.Values = slices.Compact(slices.Sorted(slices.Values(r.Values)))
			c.MatchExpressions[i] = r
		}
		s = &c
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return nil, Invalid(field, "%s", err)
	}
	return sel, nil
}

// Named lists the pools the request, the Pod and the namespace name, and the
// default pool: with the pools that have selectors, every pool Select may
// need to know.
func (s Selection) Named() []string {
	names := []string{s.DefaultPool}
	for _, f := range Families {
		names = append(names, s.Pools[f])
	}
	names = append(names, s.Pool)
	for _, m := range []Metadata{s.Pod, s.NamespaceMeta} {
		for _, k := range []string{AnnotationIPv4Pool, AnnotationIPv6Pool, AnnotationIPPool} {
			names = append(names, m.Annotations[k])
		}
	}
	names = slices.DeleteFunc(names, func(n string) bool { return n == "" })
	slices.Sort(names)
	return slices.Compact(names)
}

// Select chooses a pool per family in Cilium's precedence (evaluated once,
// at allocation):
//
//  1. the request: its per-family pool, then its pool;
//  2. the Pod's annotations: ipam.cilium.io/ipv4-pool or ipv6-pool, then
//     ipam.cilium.io/ip-pool;
//  3. the same keys on the namespace;
//  4. the pools whose podSelector and namespaceSelector (both, when both are
//     set) match; exactly one may match per family;
//  5. the default pool, unless the Pod or its namespace carries
//     ipam.cilium.io/require-pool-match: "true".
//
// known maps the pools of Named (those that exist) by name; bySelector lists
// the pools that have a selector. A pool named for all families (rules 1-3,
// and the default) that lacks a family is skipped for that family, as
// Cilium skips a pool with no block for a family; a pool named for one
// family must have it. When Families is empty, a family no rule finds a
// pool for is left out; when it lists families, each must get a pool.
func Select(s Selection, known map[string]Candidate, bySelector []Candidate) ([]Choice, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	// Choices come IPv4 first, whatever the request's order: it is the
	// order the store locks blocks in.
	wanted, explicit := slices.Sorted(slices.Values(s.Families)), true
	if len(wanted) == 0 {
		wanted, explicit = Families, false
	}
	podLabels := labels.Set{}
	for k, v := range s.Pod.Labels {
		podLabels[k] = v
	}
	podLabels[LabelPodNamespace] = s.Namespace
	nsLabels := labels.Set(s.NamespaceMeta.Labels)
	requireMatch := s.Pod.Annotations[AnnotationRequirePoolMatch] == "true" ||
		s.NamespaceMeta.Annotations[AnnotationRequirePoolMatch] == "true"

	var out []Choice
	var blocked []Family
	for _, f := range wanted {
		famField := "families"
		if explicit {
			famField = fmt.Sprintf("families[%d]", slices.Index(s.Families, f))
		}
		named, by, field, perFamily := s.namedPool(f)
		if named != "" {
			c, ok := known[named]
			switch {
			case !ok:
				return nil, NotFound(field, "pool", named)
			case c.has(f):
				out = append(out, Choice{Family: f, Pool: named, By: by})
			case perFamily:
				return nil, Invalid(field, "pool %q has no %s CIDRs", named, f)
			case explicit:
				return nil, Invalid(famField, "pool %q (%s) has no %s CIDRs", named, by, f)
			}
			continue
		}
		var matched []string
		for _, c := range bySelector {
			if c.has(f) && c.selects(podLabels, nsLabels) {
				matched = append(matched, c.Name)
			}
		}
		slices.Sort(matched)
		switch {
		case len(matched) > 1:
			return nil, &Error{Kind: KindPoolMatch, Field: "owner",
				Detail: fmt.Sprintf("multiple pools match pod %s/%s for %s: %s", s.Namespace, s.PodName, f, strings.Join(matched, ", "))}
		case len(matched) == 1:
			out = append(out, Choice{Family: f, Pool: matched[0], By: BySelector})
			continue
		case requireMatch:
			if explicit {
				return nil, noMatch(s, f)
			}
			blocked = append(blocked, f)
			continue
		}
		c, ok := known[s.DefaultPool]
		switch {
		case ok && c.has(f):
			out = append(out, Choice{Family: f, Pool: s.DefaultPool, By: ByDefault})
		case explicit && !ok:
			return nil, NotFound("pool", "default pool", s.DefaultPool)
		case explicit:
			return nil, Invalid(famField, "no pool matches and the default pool %q has no %s CIDRs", s.DefaultPool, f)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	if len(blocked) > 0 {
		return nil, noMatch(s, blocked[0])
	}
	if _, ok := known[s.DefaultPool]; !ok {
		return nil, NotFound("pool", "default pool", s.DefaultPool)
	}
	return nil, Invalid("pool", "no pool serves this request")
}

func noMatch(s Selection, f Family) *Error {
	return &Error{Kind: KindPoolMatch, Field: "owner",
		Detail: fmt.Sprintf("no pool matches pod %s/%s for %s and %s is \"true\"", s.Namespace, s.PodName, f, AnnotationRequirePoolMatch)}
}

// NamedPool answers the pool the request, the Pod or the namespace names
// for family f, or "" when none does.
func (s Selection) NamedPool(f Family) string {
	name, _, _, _ := s.namedPool(f)
	return name
}

// namedPool answers the pool rules 1-3 name for family f, the rule, the
// request field or annotation that named it, and whether it was named for f
// alone.
func (s Selection) namedPool(f Family) (name string, by SelectedBy, field string, perFamily bool) {
	key := AnnotationIPv4Pool
	if f == IPv6 {
		key = AnnotationIPv6Pool
	}
	switch {
	case s.Pools[f] != "":
		return s.Pools[f], ByRequest, "pools." + f.String(), true
	case s.Pool != "":
		return s.Pool, ByRequest, "pool", false
	}
	for _, src := range []struct {
		m     Metadata
		by    SelectedBy
		field string
	}{{s.Pod, ByPodAnnotation, "pod.annotations"}, {s.NamespaceMeta, ByNamespaceAnnotation, "namespace.annotations"}} {
		if v := src.m.Annotations[key]; v != "" {
			return v, src.by, fmt.Sprintf("%s[%s]", src.field, key), true
		}
		if v := src.m.Annotations[AnnotationIPPool]; v != "" {
			return v, src.by, fmt.Sprintf("%s[%s]", src.field, AnnotationIPPool), false
		}
	}
	return "", "", "", false
}

// validate checks the names the request and the annotations give, so a bad
// one is a 400 naming where it came from rather than a "not found".
func (s Selection) validate() error {
	for _, f := range Families {
		if n := s.Pools[f]; n != "" {
			if err := ValidateLabelName("pools."+f.String(), n); err != nil {
				return err
			}
		}
	}
	if s.Pool != "" {
		if err := ValidateLabelName("pool", s.Pool); err != nil {
			return err
		}
	}
	for _, src := range []struct {
		m     Metadata
		field string
	}{{s.Pod, "pod"}, {s.NamespaceMeta, "namespace"}} {
		if err := ValidateLabels(src.field+".labels", src.m.Labels); err != nil {
			return err
		}
		for _, k := range []string{AnnotationIPv4Pool, AnnotationIPv6Pool, AnnotationIPPool} {
			if v := src.m.Annotations[k]; v != "" {
				if err := ValidateLabelName(fmt.Sprintf("%s.annotations[%s]", src.field, k), v); err != nil {
					return err
				}
			}
		}
	}
	for i, f := range s.Families {
		if f != IPv4 && f != IPv6 {
			return Invalid(fmt.Sprintf("families[%d]", i), "unknown family")
		}
		if slices.Index(s.Families, f) != i {
			return Invalid(fmt.Sprintf("families[%d]", i), "%s listed twice", f)
		}
	}
	return nil
}
