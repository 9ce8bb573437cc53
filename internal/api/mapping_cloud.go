// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// cloudSpecFromAPI converts a pool's spec.cloud; nil stays nil. The
// checks are CloudSpec.Validate's.
func cloudSpecFromAPI(c *ipamv1.CloudSpec) *alloc.CloudSpec {
	if c == nil {
		return nil
	}
	out := &alloc.CloudSpec{
		Provider:            alloc.CloudProvider(c.Provider),
		Prefixes:            deref(c.Prefixes, false),
		UsePrimaryAddress:   deref(c.UsePrimaryAddress, false),
		FirstInterfaceIndex: deref(c.FirstInterfaceIndex, 0),
		SubnetIDs:           deref(c.SubnetIDs, nil),
		SubnetTags:          deref(c.SubnetTags, nil),
		SecurityGroups:      deref(c.SecurityGroups, nil),
		SecurityGroupTags:   deref(c.SecurityGroupTags, nil),
		ReleaseDelay:        time.Duration(deref(c.ReleaseDelaySeconds, 0)) * time.Second,
	}
	if w := c.Watermarks; w != nil {
		out.Watermarks = &alloc.Watermarks{PreAllocate: deref(w.PreAllocate, 0), MinAllocate: deref(w.MinAllocate, 0),
			MaxAllocate: deref(w.MaxAllocate, 0), MaxAboveWatermark: deref(w.MaxAboveWatermark, 0)}
	}
	if t := c.WarmTargets; t != nil {
		out.WarmTargets = &alloc.WarmTargets{WarmENI: deref(t.WarmENI, 0), WarmIP: deref(t.WarmIP, 0),
			MinimumIP: deref(t.MinimumIP, 0), WarmPrefix: deref(t.WarmPrefix, 0), MaxPods: deref(t.MaxPods, 0)}
	}
	return out
}

// checkCloudAPI refuses what the API can say but alloc.CloudSpec cannot
// tell from absent: maxPods 0 (absent is the instance type's).
func checkCloudAPI(c *ipamv1.CloudSpec) error {
	if c == nil || c.WarmTargets == nil || c.WarmTargets.MaxPods == nil || *c.WarmTargets.MaxPods >= 1 {
		return nil
	}
	return alloc.Invalid("spec.cloud.warmTargets.maxPods", "must be between 1 and %d, or absent for the instance type's", alloc.MaxMaxPods)
}

// cloudSpecToAPI is the reverse; a zero release delay is shown as the
// default it means.
func cloudSpecToAPI(c *alloc.CloudSpec) *ipamv1.CloudSpec {
	if c == nil {
		return nil
	}
	delay := c.ReleaseDelay
	if delay == 0 {
		delay = alloc.DefaultCloudReleaseDelay
	}
	out := &ipamv1.CloudSpec{
		Provider:            ipamv1.CloudSpecProvider(c.Provider),
		Prefixes:            ptr(c.Prefixes),
		UsePrimaryAddress:   ptr(c.UsePrimaryAddress),
		FirstInterfaceIndex: ptr(c.FirstInterfaceIndex),
		ReleaseDelaySeconds: ptr(int(delay / time.Second)),
	}
	if len(c.SubnetIDs) > 0 {
		out.SubnetIDs = ptr(c.SubnetIDs)
	}
	if len(c.SubnetTags) > 0 {
		out.SubnetTags = ptr(c.SubnetTags)
	}
	if len(c.SecurityGroups) > 0 {
		out.SecurityGroups = ptr(c.SecurityGroups)
	}
	if len(c.SecurityGroupTags) > 0 {
		out.SecurityGroupTags = ptr(c.SecurityGroupTags)
	}
	if w := c.Watermarks; w != nil {
		out.Watermarks = &ipamv1.CloudWatermarks{PreAllocate: ptr(w.PreAllocate), MinAllocate: ptr(w.MinAllocate),
			MaxAllocate: ptr(w.MaxAllocate), MaxAboveWatermark: ptr(w.MaxAboveWatermark)}
	}
	if t := c.WarmTargets; t != nil {
		out.WarmTargets = &ipamv1.CloudWarmTargets{WarmENI: ptr(t.WarmENI), WarmIP: ptr(t.WarmIP),
			MinimumIP: ptr(t.MinimumIP), WarmPrefix: ptr(t.WarmPrefix)}
		if t.MaxPods > 0 {
			out.WarmTargets.MaxPods = ptr(t.MaxPods)
		}
	}
	return out
}
