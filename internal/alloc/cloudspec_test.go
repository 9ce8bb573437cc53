// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestCloudSpecValidate(t *testing.T) {
	ok := func(c CloudSpec) CloudSpec { return c }
	for _, c := range []struct {
		name  string
		spec  CloudSpec
		field string // "" when valid
	}{
		{"aws, defaults", CloudSpec{Provider: CloudAWS}, ""},
		{"aws, everything", ok(CloudSpec{Provider: CloudAWS, Prefixes: true, UsePrimaryAddress: true, FirstInterfaceIndex: 1,
			SubnetIDs: []string{"subnet-0123456789abcdef0", "subnet-89abcdef"}, SecurityGroups: []string{"sg-0123456789abcdef0"},
			WarmTargets: &WarmTargets{WarmPrefix: 1, MaxPods: 110}, ReleaseDelay: time.Minute}), ""},
		{"max Pods at its bound", CloudSpec{Provider: CloudAWS, WarmTargets: &WarmTargets{MaxPods: MaxMaxPods}}, ""},
		{"azure, watermarks", CloudSpec{Provider: CloudAzure, Watermarks: &Watermarks{PreAllocate: 16, MinAllocate: 10}}, ""},
		{"no provider", CloudSpec{}, "spec.cloud.provider"},
		{"an unknown provider", CloudSpec{Provider: "gcp"}, "spec.cloud.provider"},
		{"azure with prefixes", CloudSpec{Provider: CloudAzure, Prefixes: true}, "spec.cloud.prefixes"},
		{"azure with subnets", CloudSpec{Provider: CloudAzure, SubnetTags: map[string]string{"a": "b"}}, "spec.cloud.subnetIDs"},
		{"azure with groups", CloudSpec{Provider: CloudAzure, SecurityGroups: []string{"sg-01234567"}}, "spec.cloud.securityGroups"},
		{"azure with a first interface", CloudSpec{Provider: CloudAzure, FirstInterfaceIndex: 1}, "spec.cloud.firstInterfaceIndex"},
		{"a negative first interface", CloudSpec{Provider: CloudAWS, FirstInterfaceIndex: -1}, "spec.cloud.firstInterfaceIndex"},
		{"subnets by ids and tags", CloudSpec{Provider: CloudAWS, SubnetIDs: []string{"subnet-01234567"}, SubnetTags: map[string]string{"a": "b"}}, "spec.cloud.subnetTags"},
		{"a malformed subnet", CloudSpec{Provider: CloudAWS, SubnetIDs: []string{"subnet-01234567", "vpc-01234567"}}, "spec.cloud.subnetIDs[1]"},
		{"a subnet twice", CloudSpec{Provider: CloudAWS, SubnetIDs: []string{"subnet-01234567", "subnet-01234567"}}, "spec.cloud.subnetIDs[1]"},
		{"an empty tag key", CloudSpec{Provider: CloudAWS, SubnetTags: map[string]string{"": "1"}}, "spec.cloud.subnetTags"},
		{"groups by ids and tags", CloudSpec{Provider: CloudAWS, SecurityGroups: []string{"sg-01234567"}, SecurityGroupTags: map[string]string{"a": "b"}}, "spec.cloud.securityGroupTags"},
		{"an empty group tag key", CloudSpec{Provider: CloudAWS, SecurityGroupTags: map[string]string{"": "1"}}, "spec.cloud.securityGroupTags"},
		{"a group tag value too long", CloudSpec{Provider: CloudAWS, SecurityGroupTags: map[string]string{"k": strings.Repeat("v", 257)}}, "spec.cloud.securityGroupTags"},
		{"group tags on Azure", CloudSpec{Provider: CloudAzure, SecurityGroupTags: map[string]string{"a": "b"}}, "spec.cloud.securityGroupTags"},
		{"six groups", CloudSpec{Provider: CloudAWS, SecurityGroups: []string{"sg-01234561", "sg-01234562", "sg-01234563", "sg-01234564", "sg-01234565", "sg-01234566"}}, "spec.cloud.securityGroups"},
		{"a malformed group", CloudSpec{Provider: CloudAWS, SecurityGroups: []string{"default"}}, "spec.cloud.securityGroups[0]"},
		{"both sizings", CloudSpec{Provider: CloudAWS, Watermarks: &Watermarks{}, WarmTargets: &WarmTargets{}}, "spec.cloud.warmTargets"},
		{"a negative watermark", CloudSpec{Provider: CloudAWS, Watermarks: &Watermarks{MaxAboveWatermark: -1}}, "spec.cloud.watermarks.maxAboveWatermark"},
		{"max below min", CloudSpec{Provider: CloudAWS, Watermarks: &Watermarks{MinAllocate: 10, MaxAllocate: 5}}, "spec.cloud.watermarks.maxAllocate"},
		{"a huge warm target", CloudSpec{Provider: CloudAWS, WarmTargets: &WarmTargets{WarmIP: MaxCloudTarget + 1}}, "spec.cloud.warmTargets.warmIP"},
		{"negative max Pods", CloudSpec{Provider: CloudAWS, WarmTargets: &WarmTargets{MaxPods: -1}}, "spec.cloud.warmTargets.maxPods"},
		{"max Pods past its bound", CloudSpec{Provider: CloudAWS, WarmTargets: &WarmTargets{MaxPods: MaxMaxPods + 1}}, "spec.cloud.warmTargets.maxPods"},
		{"warm prefixes without prefixes", CloudSpec{Provider: CloudAWS, WarmTargets: &WarmTargets{WarmPrefix: 1}}, "spec.cloud.warmTargets.warmPrefix"},
		{"a negative release delay", CloudSpec{Provider: CloudAWS, ReleaseDelay: -time.Second}, "spec.cloud.releaseDelaySeconds"},
		{"a release delay past a day", CloudSpec{Provider: CloudAWS, ReleaseDelay: 25 * time.Hour}, "spec.cloud.releaseDelaySeconds"},
	} {
		err := c.spec.Validate("spec.cloud")
		if c.field == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		var ae *Error
		if !errors.As(err, &ae) || ae.Kind != KindInvalid || ae.Field != c.field || strings.TrimSpace(ae.Detail) == "" {
			t.Errorf("%s: %v (%#v), want invalid %s", c.name, err, ae, c.field)
		}
	}
}

func TestPoolSpecValidateCloud(t *testing.T) {
	v4 := &PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}, MaskSize: 28}
	// A VPC's IPv6 /56: nothing is carved of it, so Cilium's bound on
	// carving (mask - CIDR <= 16) does not apply.
	v6 := &PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("2600:1f18:aaaa:bb00::/56")}, MaskSize: 96}
	cloud := &CloudSpec{Provider: CloudAWS, Prefixes: true}
	for _, c := range []struct {
		name  string
		spec  PoolSpec
		field string
	}{
		{"an AWS pool of its subnets' CIDRs", PoolSpec{IPv4: v4, Cloud: cloud}, ""},
		{"AWS, IPv6 too: its subnets' delegated /80s", PoolSpec{IPv4: v4, IPv6: v6, Cloud: cloud}, ""},
		{"Azure, IPv6 too", PoolSpec{IPv4: v4, IPv6: v6, Cloud: &CloudSpec{Provider: CloudAzure}}, "spec.ipv6"},
		{"IPv6 only", PoolSpec{IPv6: v6, Cloud: cloud}, "spec.ipv4"},
		{"cluster-pool", PoolSpec{IPv4: v4, Cloud: cloud, Mode: ModeClusterPool}, "spec.mode"},
		{"a bad cloud spec", PoolSpec{IPv4: v4, Cloud: &CloudSpec{Provider: "gcp"}}, "spec.cloud.provider"},
	} {
		err := c.spec.Validate()
		if c.field == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		var ae *Error
		if !errors.As(err, &ae) || ae.Field != c.field {
			t.Errorf("%s: %v, want a problem with %s", c.name, err, c.field)
		}
	}
}
