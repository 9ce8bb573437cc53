// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package crds

import "testing"

func TestCRDsAreCiliums(t *testing.T) {
	crds, err := CRDs()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ciliumnodes.cilium.io": "CiliumNode", "ciliumpodippools.cilium.io": "CiliumPodIPPool"}
	if len(crds) != len(want) {
		t.Fatalf("%d CRDs; want %d", len(crds), len(want))
	}
	for _, c := range crds {
		if want[c.Name] != c.Spec.Names.Kind {
			t.Errorf("CRD %s has kind %q; want %q", c.Name, c.Spec.Names.Kind, want[c.Name])
		}
		if len(c.Spec.Versions) == 0 || c.Spec.Versions[0].Schema == nil {
			t.Errorf("CRD %s has no schema", c.Name)
		}
	}
}

func TestLBIPAMCRDsAreCiliums(t *testing.T) {
	crds, err := LBIPAM()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ciliumloadbalancerippools.cilium.io": "CiliumLoadBalancerIPPool", "ciliumcidrgroups.cilium.io": "CiliumCIDRGroup"}
	if len(crds) != len(want) {
		t.Fatalf("%d CRDs; want %d", len(crds), len(want))
	}
	for _, c := range crds {
		if want[c.Name] != c.Spec.Names.Kind {
			t.Errorf("CRD %s has kind %q; want %q", c.Name, c.Spec.Names.Kind, want[c.Name])
		}
	}
}
