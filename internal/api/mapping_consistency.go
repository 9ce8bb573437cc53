// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// ConsistencyReportToAPI is the report as the API and `ipam-server check`
// show it.
func ConsistencyReportToAPI(r alloc.ConsistencyReport) ipamv1.ConsistencyReport {
	out := ipamv1.ConsistencyReport{
		Consistent:      len(r.Findings) == 0,
		CheckedAt:       r.CheckedAt.UTC(),
		DurationSeconds: r.Took.Seconds(),
		Findings:        make([]ipamv1.ConsistencyFinding, len(r.Findings)),
		Truncated:       r.Truncated,
	}
	c := r.Counts
	out.Counts.Spaces, out.Counts.Pools, out.Counts.PoolCIDRs = c.Spaces, c.Pools, c.PoolCIDRs
	out.Counts.Nodes, out.Counts.Blocks, out.Counts.Leases = c.Nodes, c.Blocks, c.Leases
	for i, f := range r.Findings {
		out.Findings[i] = ipamv1.ConsistencyFinding{Kind: ipamv1.ConsistencyFindingKind(f.Kind), Space: f.Space,
			Detail: f.Detail, Objects: f.Objects}
	}
	return out
}
