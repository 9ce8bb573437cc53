// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
)

// TestSecurityGroupsExactTags: groups are chosen by exact tags in the
// VPC, though EC2 reads the filter prod-? as a wildcard; the answer is
// cached for a while, then read again.
func TestSecurityGroupsExactTags(t *testing.T) {
	ctx := context.Background()
	fake, _, _ := world(t, "m5.large", "10.70.0.0/24")
	fake.AddSecurityGroup("sg-0000000000000000a", "vpc-1", map[string]string{"pods": "prod-?"})
	fake.AddSecurityGroup("sg-0000000000000000b", "vpc-1", map[string]string{"pods": "prod-1"})
	fake.AddSecurityGroup("sg-0000000000000000c", "vpc-1", map[string]string{"pods": "prod-1", "extra": "x"})
	fake.AddSecurityGroup("sg-0000000000000000d", "vpc-2", map[string]string{"pods": "prod-1"})
	p := newProvider(t, fake, 1)
	now := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	p.opts.Now = func() time.Time { return now }
	cases := []struct {
		tags map[string]string
		want []string
	}{
		{map[string]string{"pods": "prod-?"}, []string{"sg-0000000000000000a"}},
		{map[string]string{"pods": "prod-1"}, []string{"sg-0000000000000000b", "sg-0000000000000000c"}},
		{map[string]string{"pods": "prod-*"}, nil},
		{map[string]string{"pods": "prod-1", "extra": "x"}, []string{"sg-0000000000000000c"}},
	}
	for _, c := range cases {
		got, err := p.SecurityGroups(ctx, "vpc-1", c.tags)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("tags %v: %v, %v; want %v", c.tags, got, err, c.want)
		}
	}
	calls := fake.Calls("DescribeSecurityGroups")
	if _, err := p.SecurityGroups(ctx, "vpc-1", map[string]string{"pods": "prod-1"}); err != nil || fake.Calls("DescribeSecurityGroups") != calls {
		t.Errorf("a repeated question called EC2 again (%v)", err)
	}
	now = now.Add(groupsTTL)
	if _, err := p.SecurityGroups(ctx, "vpc-1", map[string]string{"pods": "prod-1"}); err != nil || fake.Calls("DescribeSecurityGroups") != calls+1 {
		t.Errorf("after %v the answer was not read again (%v)", groupsTTL, err)
	}
}

// TestReconcilerSecurityGroupTags: a new interface gets the groups the
// pool's tags name, not the primary's; tags that name no group create
// nothing and say so.
func TestReconcilerSecurityGroupTags(t *testing.T) {
	ctx := context.Background()
	fake, inst, eni0 := world(t, "t3.small", "10.71.0.0/24")
	fake.AddSecurityGroup("sg-00000000000000001", "vpc-1", map[string]string{"role": "pods"})
	p := newProvider(t, fake, 1)
	if _, err := p.Assign(ctx, eni0, 3, false); err != nil {
		t.Fatal(err)
	}
	described, err := p.Instance(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	used := map[netip.Addr]bool{}
	for _, a := range described.Interfaces[0].Addresses {
		used[a] = true
	}
	state := cloud.NodeState{Instance: described, Used: used}
	opts := cloud.PlanOptions{Sizing: cloud.Sizing{Watermarks: alloc.Watermarks{PreAllocate: 4}}}
	rec := &cloud.Reconciler{Provider: p, Interfaces: p, Tags: map[string]string{cloud.TagCluster: "prod"},
		SecurityGroupTags: map[string]string{"role": "nodes"}}
	if _, _, err := rec.Round(ctx, "node", state, opts); cloud.KindOf(err) != cloud.KindNoSecurityGroup {
		t.Fatalf("tags naming no group: %v, want %v", err, cloud.KindNoSecurityGroup)
	}
	if n := fake.Calls("CreateNetworkInterface"); n != 0 {
		t.Fatalf("%d creates with no group named", n)
	}
	rec.SecurityGroupTags = map[string]string{"role": "pods"}
	_, added, err := rec.Round(ctx, "node", state, opts)
	if err != nil || !added.Created {
		t.Fatalf("added %+v, %v", added, err)
	}
	for _, f := range fake.Interfaces() {
		if f.ID == added.Interface && !slices.Equal(f.Groups, []string{"sg-00000000000000001"}) {
			t.Fatalf("new interface's groups %v, want the tagged one (not the primary's sg-node)", f.Groups)
		}
	}
}
