// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"regexp"
	"time"
)

// CloudProvider names the cloud of a cloud pool.
type CloudProvider string

// The clouds a pool can take its addresses from.
const (
	CloudAWS   CloudProvider = "aws"
	CloudAzure CloudProvider = "azure"
)

// DefaultCloudReleaseDelay is how long a cloud address stays excess
// before it goes back to the cloud (Cilium's excess-IP release delay).
const DefaultCloudReleaseDelay = 180 * time.Second

// Bounds of a cloud spec's lists and numbers.
const (
	MaxCloudSubnets        = 16
	MaxCloudSubnetTags     = 16
	MaxSecurityGroups      = 5 // EC2's limit per interface
	MaxFirstInterfaceIndex = 31
	MaxCloudTarget         = 4096
	MaxCloudReleaseDelay   = 24 * time.Hour
)

// CloudSpec makes a pool a cloud pool (spec.cloud): its addresses come
// from a cloud, assigned on the nodes' network interfaces by the capacity
// workers and recorded as the nodes' blocks (a /32 per address, a /28 per
// prefix). The service carves none of the pool's CIDRs: they are the
// cloud subnets' CIDRs, which the addresses must fall in.
type CloudSpec struct {
	Provider CloudProvider
	// Prefixes asks /28 prefixes instead of single addresses (AWS, on
	// Nitro instances).
	Prefixes bool
	// UsePrimaryAddress gives Pods the interfaces' primary addresses too.
	UsePrimaryAddress bool
	// FirstInterfaceIndex is the first interface (device index) holding
	// Pod addresses (AWS).
	FirstInterfaceIndex int
	// SubnetIDs, else SubnetTags, choose the subnets of new interfaces;
	// with neither, the node's own subnet first (AWS).
	SubnetIDs  []string
	SubnetTags map[string]string
	// SecurityGroups, else SecurityGroupTags (the VPC's groups carrying
	// every tag), are those of new interfaces; with neither, a copy of
	// the primary interface's (AWS).
	SecurityGroups    []string
	SecurityGroupTags map[string]string
	// Watermarks size the nodes as Cilium's operator does, or WarmTargets
	// as the VPC CNI does; at most one, Cilium's defaults when neither.
	Watermarks  *Watermarks
	WarmTargets *WarmTargets
	// ReleaseDelay is how long an address stays excess before it goes;
	// zero is DefaultCloudReleaseDelay.
	ReleaseDelay time.Duration
}

var (
	awsSubnetID      = regexp.MustCompile(`^subnet-[0-9a-f]{8,17}$`)
	awsSecurityGroup = regexp.MustCompile(`^sg-[0-9a-f]{8,17}$`)
)

// Validate checks c, a pool's spec.cloud; errors name the field under
// field.
func (c CloudSpec) Validate(field string) error {
	switch c.Provider {
	case CloudAWS, CloudAzure:
	default:
		return Invalid(field+".provider", "must be %q or %q", CloudAWS, CloudAzure)
	}
	// Each value on its own first, so a bad value is named even when the
	// spec also combines fields wrongly.
	if c.FirstInterfaceIndex < 0 || c.FirstInterfaceIndex > MaxFirstInterfaceIndex {
		return Invalid(field+".firstInterfaceIndex", "must be between 0 and %d", MaxFirstInterfaceIndex)
	}
	if err := c.validateLists(field); err != nil {
		return err
	}
	if w := c.Watermarks; w != nil {
		if err := checkTargets(field+".watermarks.", namedInt{"preAllocate", w.PreAllocate}, namedInt{"minAllocate", w.MinAllocate},
			namedInt{"maxAllocate", w.MaxAllocate}, namedInt{"maxAboveWatermark", w.MaxAboveWatermark}); err != nil {
			return err
		}
	}
	if t := c.WarmTargets; t != nil {
		if err := checkTargets(field+".warmTargets.", namedInt{"warmENI", t.WarmENI}, namedInt{"warmIP", t.WarmIP},
			namedInt{"minimumIP", t.MinimumIP}, namedInt{"warmPrefix", t.WarmPrefix}); err != nil {
			return err
		}
		// 0 is unset (the instance type's); a node runs one Pod at least.
		if t.MaxPods < 0 || t.MaxPods > MaxMaxPods {
			return Invalid(field+".warmTargets.maxPods", "must be between 1 and %d (or absent: the instance type's)", MaxMaxPods)
		}
	}
	if c.ReleaseDelay < 0 || c.ReleaseDelay > MaxCloudReleaseDelay {
		return Invalid(field+".releaseDelaySeconds", "must be between 0 (the default, %v) and %v", DefaultCloudReleaseDelay, MaxCloudReleaseDelay)
	}
	return c.validateCombination(field)
}

// namedInt is a sizing value and its field name.
type namedInt struct {
	name string
	n    int
}

// checkTargets refuses the first value outside [0, MaxCloudTarget],
// naming it under prefix.
func checkTargets(prefix string, values ...namedInt) error {
	for _, v := range values {
		if v.n < 0 || v.n > MaxCloudTarget {
			return Invalid(prefix+v.name, "must be between 0 and %d", MaxCloudTarget)
		}
	}
	return nil
}

// validateCombination checks the fields against each other.
func (c CloudSpec) validateCombination(field string) error {
	if c.Provider == CloudAzure {
		// Azure adds IP configurations to the NICs a node has: nothing to
		// place, and no prefixes.
		switch {
		case c.Prefixes:
			return Invalid(field+".prefixes", "Azure NICs take no prefixes")
		case len(c.SubnetIDs) > 0, len(c.SubnetTags) > 0:
			return Invalid(field+".subnetIDs", "Azure adds addresses in the subnet of a NIC's primary configuration; no subnet is chosen")
		case len(c.SecurityGroups) > 0:
			return Invalid(field+".securityGroups", "Azure's new configurations carry their NIC's application security groups")
		case len(c.SecurityGroupTags) > 0:
			return Invalid(field+".securityGroupTags", "Azure's new configurations carry their NIC's application security groups")
		case c.FirstInterfaceIndex != 0:
			return Invalid(field+".firstInterfaceIndex", "Azure creates no interface")
		}
	}
	switch {
	case len(c.SubnetIDs) > 0 && len(c.SubnetTags) > 0:
		return Invalid(field+".subnetTags", "name subnets by ids or by tags, not both")
	case len(c.SecurityGroups) > 0 && len(c.SecurityGroupTags) > 0:
		return Invalid(field+".securityGroupTags", "name security groups by ids or by tags, not both")
	case c.Watermarks != nil && c.WarmTargets != nil:
		return Invalid(field+".warmTargets", "size the nodes by watermarks or by warm targets, not both")
	case c.Watermarks != nil && c.Watermarks.MaxAllocate > 0 && c.Watermarks.MaxAllocate < c.Watermarks.MinAllocate:
		return Invalid(field+".watermarks.maxAllocate", "is below minAllocate (%d)", c.Watermarks.MinAllocate)
	case c.WarmTargets != nil && c.WarmTargets.WarmPrefix > 0 && !c.Prefixes:
		return Invalid(field+".warmTargets.warmPrefix", "counts /28 prefixes: set prefixes")
	}
	return nil
}

func (c CloudSpec) validateLists(field string) error {
	if len(c.SubnetIDs) > MaxCloudSubnets {
		return Invalid(field+".subnetIDs", "lists %d subnets; at most %d", len(c.SubnetIDs), MaxCloudSubnets)
	}
	seen := map[string]bool{}
	for i, id := range c.SubnetIDs {
		f := fmt.Sprintf("%s.subnetIDs[%d]", field, i)
		switch {
		case !awsSubnetID.MatchString(id):
			return Invalid(f, "%q is no subnet id (subnet- and 8 to 17 hex digits)", id)
		case seen[id]:
			return Invalid(f, "%s is listed twice", id)
		}
		seen[id] = true
	}
	if len(c.SubnetTags) > MaxCloudSubnetTags {
		return Invalid(field+".subnetTags", "lists %d tags; at most %d", len(c.SubnetTags), MaxCloudSubnetTags)
	}
	for k, v := range c.SubnetTags {
		if k == "" || len(k) > 128 || len(v) > 256 {
			return Invalid(field+".subnetTags", "a tag key is 1 to 128 characters and its value at most 256 (%q)", k)
		}
	}
	if len(c.SecurityGroupTags) > MaxCloudSubnetTags {
		return Invalid(field+".securityGroupTags", "lists %d tags; at most %d", len(c.SecurityGroupTags), MaxCloudSubnetTags)
	}
	for k, v := range c.SecurityGroupTags {
		if k == "" || len(k) > 128 || len(v) > 256 {
			return Invalid(field+".securityGroupTags", "a tag key is 1 to 128 characters and its value at most 256 (%q)", k)
		}
	}
	if len(c.SecurityGroups) > MaxSecurityGroups {
		return Invalid(field+".securityGroups", "lists %d groups; an interface takes at most %d", len(c.SecurityGroups), MaxSecurityGroups)
	}
	for i, g := range c.SecurityGroups {
		if !awsSecurityGroup.MatchString(g) {
			return Invalid(fmt.Sprintf("%s.securityGroups[%d]", field, i), "%q is no security group id (sg- and 8 to 17 hex digits)", g)
		}
	}
	return nil
}
