// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// CIDRGroup is a named set of CIDRs of an address space (Cilium's
// CiliumCIDRGroup, spec.externalCIDRs): nothing is allocated from it, so
// it may overlap pools and other groups. Network policies name it, and
// the API answers which groups hold an address.
type CIDRGroup struct {
	Space  string
	Name   string
	Labels map[string]string
	CIDRs  []netip.Prefix
	// Origin owns the group: the database, or the CiliumCIDRGroup it was
	// imported from.
	Origin    Origin
	CreatedAt time.Time
	UpdatedAt time.Time

	// AllowSpecialPurpose lets the CIDRs overlap special-purpose ranges
	// (SpecialPurposeOverlap), refused otherwise, as for pools. Nothing
	// is allocated from a group, but network policies name it: a group
	// reaching link-local addresses (the cloud metadata service at
	// 169.254.169.254), loopback or multicast ones, as 0.0.0.0/0 does,
	// should be meant, and the flag says it is.
	AllowSpecialPurpose bool
}

// MaxCIDRGroupCIDRs bounds a group's CIDRs.
const MaxCIDRGroupCIDRs = 1024

// Validate checks the group's name, labels and CIDRs (canonical, each
// once, at most MaxCIDRGroupCIDRs, none overlapping a special-purpose
// range unless AllowSpecialPurpose; none is allowed: an empty group).
func (g CIDRGroup) Validate() error {
	if err := ValidateLabelName("name", g.Name); err != nil {
		return err
	}
	if err := ValidateLabels("labels", g.Labels); err != nil {
		return err
	}
	if len(g.CIDRs) > MaxCIDRGroupCIDRs {
		return Invalid("externalCIDRs", "%d CIDRs; a group holds at most %d", len(g.CIDRs), MaxCIDRGroupCIDRs)
	}
	for i, c := range g.CIDRs {
		field := fmt.Sprintf("externalCIDRs[%d]", i)
		if !c.IsValid() || c.Masked() != c {
			return Invalid(field, "%s is not a canonical CIDR (the network is %s)", c, c.Masked())
		}
		if r, ok := SpecialPurposeOverlap(c); ok && !g.AllowSpecialPurpose {
			return Invalid(field, "%s overlaps the special-purpose range %s; set allowSpecialPurpose to hold it in a group", c, r)
		}
		if slices.Contains(g.CIDRs[:i], c) {
			return Invalid(field, "%s is listed twice", c)
		}
	}
	return nil
}

// CIDRGroupMatch is a group holding an address, and its CIDR that does
// (the longest, when several do).
type CIDRGroupMatch struct {
	Group string
	CIDR  netip.Prefix
}
