// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package lbipam

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The Service annotations and classes of Cilium's LB IPAM
// (operator/pkg/lbipam, pkg/annotation), spelled as Cilium's users write
// them.
const (
	AnnotationIPs                     = "lbipam.cilium.io/ips"
	AnnotationSharingKey              = "lbipam.cilium.io/sharing-key"
	AnnotationSharingCrossNamespace   = "lbipam.cilium.io/sharing-cross-namespace"
	AnnotationSharingPermitDifferentP = "lbipam.cilium.io/sharing-permit-different-pods"
	// The deprecated spellings of the first three, which Cilium v1.20
	// still reads when the new one is absent.
	AnnotationIPsDeprecated                   = "io.cilium/lb-ipam-ips"
	AnnotationSharingKeyDeprecated            = "io.cilium/lb-ipam-sharing-key"
	AnnotationSharingCrossNamespaceDeprecated = "io.cilium/lb-ipam-sharing-cross-namespace"
	// ConditionSatisfied is the Service condition LB IPAM writes.
	ConditionSatisfied = "cilium.io/IPAMRequestSatisfied"
	// ClassL2 and ClassBGP are the classes Cilium's LB IPAM serves
	// besides Services without one.
	ClassL2  = "io.cilium/l2-announcer"
	ClassBGP = "io.cilium/bgp-control-plane"
	// ClassNode is Node IPAM's class, which LB IPAM leaves alone.
	ClassNode = "io.cilium/node"
)

// ReasonInvalid is the condition's reason for a Service whose annotations
// cannot be read (an address that is none, a bad sharing key).
const ReasonInvalid = "invalid_request"

// families are the families the cluster has enabled.
type families struct{ v4, v6 bool }

// requestOf is what Service svc asks of LB IPAM, as Cilium reads it: the
// families of ipFamilyPolicy and ipFamilies (single stack by default, the
// first enabled family), the addresses of lbipam.cilium.io/ips and the
// deprecated spec.loadBalancerIP, and the sharing terms; each annotation
// under its deprecated io.cilium/ name when the new one is absent. An
// entry that is no address is left out, as Cilium leaves it out (the
// rest of the Service is served), and answered in dropped for the log. A
// request that does not validate is answered by the store; its error
// goes to the condition.
func requestOf(space string, svc *corev1.Service, fams families) (r alloc.VIPRequest, dropped []string) {
	r = alloc.VIPRequest{
		Space:      space,
		Owner:      alloc.VIPOwner{Namespace: svc.Namespace, Name: svc.Name},
		Labels:     svc.Labels,
		RequireAll: true,
		Source:     alloc.VIPSourceKubernetes,
	}
	r.Families, r.RequireAll = familiesOf(svc.Spec, fams)
	named := splitList(annotation(svc, AnnotationIPs, AnnotationIPsDeprecated))
	if ip := svc.Spec.LoadBalancerIP; ip != "" {
		named = append(named, ip)
	}
	for _, s := range named {
		a, err := netip.ParseAddr(strings.TrimSpace(s))
		switch {
		case err != nil:
			dropped = append(dropped, s)
		case !slices.Contains(r.Addresses, a):
			r.Addresses = append(r.Addresses, a)
		}
	}
	// What the Service's status already holds, in the families it asks
	// and unless it names its addresses: a cluster moving over from
	// Cilium's LB IPAM keeps each Service's address where a pool gives
	// it (Cilium's stripOrImportIngresses).
	if len(r.Addresses) == 0 {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			a, err := netip.ParseAddr(in.IP)
			if err != nil || a.Zone() != "" || a.Is4In6() || !slices.Contains(r.Families, alloc.FamilyOf(a)) || slices.Contains(r.Adopt, a) {
				continue
			}
			if len(r.Adopt) == alloc.MaxVIPAddresses {
				break
			}
			r.Adopt = append(r.Adopt, a)
		}
	}
	r.Sharing = alloc.VIPSharing{
		Key:                   annotation(svc, AnnotationSharingKey, AnnotationSharingKeyDeprecated),
		CrossNamespace:        splitList(annotation(svc, AnnotationSharingCrossNamespace, AnnotationSharingCrossNamespaceDeprecated)),
		ExternalTrafficPolicy: string(svc.Spec.ExternalTrafficPolicy),
		PodSelector:           svc.Spec.Selector,
		PermitDifferentPods:   svc.Annotations[AnnotationSharingPermitDifferentP] == "true",
	}
	if r.Sharing.ExternalTrafficPolicy == "" {
		r.Sharing.ExternalTrafficPolicy = alloc.TrafficPolicyCluster
	}
	for _, p := range svc.Spec.Ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = string(corev1.ProtocolTCP)
		}
		r.Sharing.Ports = append(r.Sharing.Ports, alloc.VIPPort{Port: p.Port, Protocol: proto})
	}
	return r, dropped
}

// annotation is svc's annotation key, else its deprecated spelling: the
// new one wins when present, even empty (Cilium's annotation.Get).
func annotation(svc *corev1.Service, key, deprecated string) string {
	if v, ok := svc.Annotations[key]; ok {
		return v
	}
	return svc.Annotations[deprecated]
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// familiesOf is Cilium's serviceIPFamilyRequest: SingleStack (or no
// policy) asks for ipFamilies[0], or the first enabled family;
// PreferDualStack for the enabled families of ipFamilies (all enabled when
// none are listed), one being enough; RequireDualStack for every enabled
// family, all required.
func familiesOf(spec corev1.ServiceSpec, fams families) ([]alloc.Family, bool) {
	enabled := func(f alloc.Family) bool { return (f == alloc.IPv4 && fams.v4) || (f == alloc.IPv6 && fams.v6) }
	of := func(f corev1.IPFamily) alloc.Family {
		if f == corev1.IPv6Protocol {
			return alloc.IPv6
		}
		return alloc.IPv4
	}
	all := func() []alloc.Family {
		var out []alloc.Family
		for _, f := range alloc.Families {
			if enabled(f) {
				out = append(out, f)
			}
		}
		return out
	}
	policy := corev1.IPFamilyPolicySingleStack
	if spec.IPFamilyPolicy != nil {
		policy = *spec.IPFamilyPolicy
	}
	switch policy {
	case corev1.IPFamilyPolicyPreferDualStack:
		if len(spec.IPFamilies) == 0 {
			return all(), false
		}
		var out []alloc.Family
		for _, f := range spec.IPFamilies {
			if enabled(of(f)) && !slices.Contains(out, of(f)) {
				out = append(out, of(f))
			}
		}
		return out, false
	case corev1.IPFamilyPolicyRequireDualStack:
		// Every enabled family, as Cilium asks: with --lbipam-families
		// IPv4 only, an IPv6 request could never be met.
		return all(), true
	}
	if len(spec.IPFamilies) > 0 {
		return []alloc.Family{of(spec.IPFamilies[0])}, true
	}
	if a := all(); len(a) > 0 {
		return a[:1], true
	}
	return []alloc.Family{alloc.IPv4}, true
}

// desiredStatus is svc's status with the assignment's addresses as its
// load balancer ingress, in Cilium's order (ingressOrder), and the
// condition saying whether the request was satisfied. It answers whether
// anything changed.
func desiredStatus(svc *corev1.Service, a alloc.VIPAssignment, now metav1.Time) (corev1.ServiceStatus, bool) {
	st := *svc.Status.DeepCopy()
	var ingress []corev1.LoadBalancerIngress
	for _, addr := range ingressOrder(svc, a) {
		ingress = append(ingress, corev1.LoadBalancerIngress{IP: addr.String()})
	}
	changed := !slices.EqualFunc(ingress, st.LoadBalancer.Ingress, func(x, y corev1.LoadBalancerIngress) bool {
		return x.IP == y.IP && x.Hostname == "" && y.Hostname == "" && len(y.Ports) == 0
	})
	st.LoadBalancer.Ingress = ingress
	cond := metav1.Condition{Type: ConditionSatisfied, Status: metav1.ConditionFalse, Reason: a.Reason, Message: a.Message,
		ObservedGeneration: svc.Generation, LastTransitionTime: now}
	if a.Satisfied {
		cond.Status = metav1.ConditionTrue
	}
	if cur := meta.FindStatusCondition(st.Conditions, ConditionSatisfied); cur == nil || cur.Status != cond.Status ||
		cur.Reason != cond.Reason || cur.Message != cond.Message || cur.ObservedGeneration != cond.ObservedGeneration {
		meta.SetStatusCondition(&st.Conditions, cond)
		changed = true
	}
	return st, changed
}

// ingressOrder orders the assignment's addresses as Cilium's
// handleUpsertService lists them: the addresses svc's ingress already
// lists keep their places (stripOrImportIngresses keeps them in order),
// and the others follow as Cilium would have given them, appended one by
// one: named ones in getSVCRequestedIPs' order (spec.loadBalancerIP
// first, then the annotation's), then any other in the store's order,
// IPv4 before IPv6 as satisfyGenericIPRequests asks them.
func ingressOrder(svc *corev1.Service, a alloc.VIPAssignment) []netip.Addr {
	rank := func(addr netip.Addr) int {
		if lb, err := netip.ParseAddr(strings.TrimSpace(svc.Spec.LoadBalancerIP)); err == nil && lb == addr {
			return 0
		}
		if i := slices.Index(a.Request.Addresses, addr); i >= 0 {
			return 1 + i
		}
		return 1 + len(a.Request.Addresses)
	}
	var out, rest []netip.Addr
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if addr, err := netip.ParseAddr(in.IP); err == nil && !slices.Contains(out, addr) &&
			slices.ContainsFunc(a.Addresses, func(v alloc.VIP) bool { return v.Addr == addr }) {
			out = append(out, addr)
		}
	}
	for _, v := range a.Addresses {
		if !slices.Contains(out, v.Addr) {
			rest = append(rest, v.Addr)
		}
	}
	slices.SortStableFunc(rest, func(x, y netip.Addr) int { return rank(x) - rank(y) })
	return append(out, rest...)
}

// clearedStatus is svc's status without what LB IPAM wrote: for a Service
// it no longer serves (its type or class changed).
func clearedStatus(svc *corev1.Service) (corev1.ServiceStatus, bool) {
	st := *svc.Status.DeepCopy()
	if meta.FindStatusCondition(st.Conditions, ConditionSatisfied) == nil {
		return st, false
	}
	meta.RemoveStatusCondition(&st.Conditions, ConditionSatisfied)
	st.LoadBalancer.Ingress = nil
	return st, true
}
