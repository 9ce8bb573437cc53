// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package lbipam

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeIngressAsCilium: Node IPAM publishes the addresses as the Nodes
// write them, sorted as strings and without repeats, as Cilium's
// getNodeLoadBalancerIngresses: a cluster moving over finds each
// Service's status as Cilium left it.
func TestNodeIngressAsCilium(t *testing.T) {
	node := func(name string, addrs ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, a := range addrs {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
		}
		return n
	}
	nodes := []*corev1.Node{node("a", "10.1.0.9", "FD01::A"), node("b", "10.1.0.10", "fd01::b"), node("c", "10.1.0.9")}
	svc := &corev1.Service{Spec: corev1.ServiceSpec{IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}}}
	got, err := nodeIngress(svc, nodes, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.1.0.10", "10.1.0.9", "FD01::A", "fd01::b"}; !slices.Equal(got, want) {
		t.Errorf("ingress %q, want %q", got, want)
	}
}
