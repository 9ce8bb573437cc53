// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package lbipam

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// TestFamiliesOf is Cilium's serviceIPFamilyRequest, case by case.
func TestFamiliesOf(t *testing.T) {
	v4, v6 := alloc.IPv4, alloc.IPv6
	p := func(x corev1.IPFamilyPolicy) *corev1.IPFamilyPolicy { return &x }
	both, only4, only6 := families{true, true}, families{true, false}, families{false, true}
	for _, c := range []struct {
		name    string
		policy  *corev1.IPFamilyPolicy
		fams    []corev1.IPFamily
		enabled families
		want    []alloc.Family
		all     bool
	}{
		{"no policy, no families: the first enabled", nil, nil, both, []alloc.Family{v4}, true},
		{"no policy, IPv6 only enabled", nil, nil, only6, []alloc.Family{v6}, true},
		{"no policy, ipFamilies[0]", nil, []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}, both, []alloc.Family{v6}, true},
		{"SingleStack", p(corev1.IPFamilyPolicySingleStack), []corev1.IPFamily{corev1.IPv4Protocol}, both, []alloc.Family{v4}, true},
		{"PreferDualStack, none listed", p(corev1.IPFamilyPolicyPreferDualStack), nil, both, []alloc.Family{v4, v6}, false},
		{"PreferDualStack, IPv4 only enabled", p(corev1.IPFamilyPolicyPreferDualStack), nil, only4, []alloc.Family{v4}, false},
		{"PreferDualStack, listed order", p(corev1.IPFamilyPolicyPreferDualStack), []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}, both,
			[]alloc.Family{v6, v4}, false},
		{"RequireDualStack, both enabled", p(corev1.IPFamilyPolicyRequireDualStack), nil, both, []alloc.Family{v4, v6}, true},
		{"RequireDualStack, IPv4 only enabled: IPv4 alone", p(corev1.IPFamilyPolicyRequireDualStack), nil, only4, []alloc.Family{v4}, true},
		{"RequireDualStack, IPv6 only enabled: IPv6 alone", p(corev1.IPFamilyPolicyRequireDualStack), []corev1.IPFamily{corev1.IPv4Protocol}, only6,
			[]alloc.Family{v6}, true},
	} {
		got, all := familiesOf(corev1.ServiceSpec{IPFamilyPolicy: c.policy, IPFamilies: c.fams}, c.enabled)
		if !slices.Equal(got, c.want) || all != c.all {
			t.Errorf("%s: %v all %v, want %v all %v", c.name, got, all, c.want, c.all)
		}
	}
}

// TestRequestOf: annotations and spec become the store's request.
func TestRequestOf(t *testing.T) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Labels: map[string]string{"color": "blue"}, Annotations: map[string]string{
			AnnotationIPs: "10.0.10.5, fd00::5,10.0.10.5", AnnotationSharingKey: "front", AnnotationSharingCrossNamespace: "blog, *",
			AnnotationSharingPermitDifferentP: "true"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, LoadBalancerIP: "10.0.10.6", Selector: map[string]string{"app": "web"},
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []corev1.ServicePort{{Port: 80}, {Port: 53, Protocol: corev1.ProtocolUDP}}},
	}
	r, dropped := requestOf("default", svc, families{true, true})
	if len(dropped) > 0 {
		t.Errorf("dropped %v", dropped)
	}
	want := []netip.Addr{netip.MustParseAddr("10.0.10.5"), netip.MustParseAddr("fd00::5"), netip.MustParseAddr("10.0.10.6")}
	if !slices.Equal(r.Addresses, want) || r.Sharing.Key != "front" || !slices.Equal(r.Sharing.CrossNamespace, []string{"blog", "*"}) ||
		!r.Sharing.PermitDifferentPods || r.Sharing.ExternalTrafficPolicy != alloc.TrafficPolicyLocal || r.Sharing.PodSelector["app"] != "web" ||
		!slices.Equal(r.Sharing.Ports, []alloc.VIPPort{{Port: 80, Protocol: "TCP"}, {Port: 53, Protocol: "UDP"}}) ||
		r.Source != alloc.VIPSourceKubernetes || r.Labels["color"] != "blue" || r.Validate() != nil {
		t.Fatalf("request %+v (%v)", r, r.Validate())
	}
	// An entry that is no address is left out, the rest served, as
	// Cilium does; the spec's field too.
	svc.Annotations[AnnotationIPs] = "10.0.10.300, fd00::5,nonsense"
	svc.Spec.LoadBalancerIP = "10.0.10"
	r, dropped = requestOf("default", svc, families{true, true})
	if !slices.Equal(r.Addresses, want[1:2]) || !slices.Equal(dropped, []string{"10.0.10.300", "nonsense", "10.0.10"}) || r.Validate() != nil {
		t.Errorf("bad entries: %v, dropped %v (%v)", r.Addresses, dropped, r.Validate())
	}
}

// TestRequestOfDeprecatedAnnotations: the io.cilium/lb-ipam-* spellings
// Cilium v1.20 still reads, each used when its lbipam.cilium.io/
// successor is absent, and ignored when it is present (even empty).
func TestRequestOfDeprecatedAnnotations(t *testing.T) {
	old := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Annotations: map[string]string{
		AnnotationIPsDeprecated: "10.0.10.5", AnnotationSharingKeyDeprecated: "front", AnnotationSharingCrossNamespaceDeprecated: "blog"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
	r, _ := requestOf("default", old, families{true, true})
	if !slices.Equal(r.Addresses, []netip.Addr{netip.MustParseAddr("10.0.10.5")}) || r.Sharing.Key != "front" ||
		!slices.Equal(r.Sharing.CrossNamespace, []string{"blog"}) {
		t.Errorf("deprecated alone: %+v", r)
	}
	both := old.DeepCopy()
	both.Annotations[AnnotationIPs], both.Annotations[AnnotationSharingKey], both.Annotations[AnnotationSharingCrossNamespace] = "10.0.10.6", "", "shop"
	r, _ = requestOf("default", both, families{true, true})
	if !slices.Equal(r.Addresses, []netip.Addr{netip.MustParseAddr("10.0.10.6")}) || r.Sharing.Key != "" ||
		!slices.Equal(r.Sharing.CrossNamespace, []string{"shop"}) {
		t.Errorf("both spellings: %+v", r)
	}
}
