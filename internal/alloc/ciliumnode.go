// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import "net/netip"

// CiliumNodeState is what a node's CiliumNode says of its IPAM, read by
// the Cilium operator role: what Cilium's agent was given and what it
// reports. The database stays the record of addresses and blocks.
type CiliumNodeState struct {
	Mode            string // crd, multi-pool or cluster-pool
	ResourceVersion string
	// IPv4 and IPv6: crd mode's single addresses; nil in the block modes.
	IPv4, IPv6 *CiliumFamilyState
	// PodCIDRs: cluster-pool's blocks (spec.ipam.podCIDRs).
	PodCIDRs []netip.Prefix
	// Pools: multi-pool's blocks and needs, per pool.
	Pools         []CiliumPoolState
	OperatorError string
}

// CiliumFamilyState is one family of a crd-mode node.
type CiliumFamilyState struct {
	Pool, Used int // spec.ipam.pool and status.ipam.used sizes
	// Releasing counts the release handshakes in flight by state.
	MarkedForRelease, ReadyForRelease, DoNotRelease, Released int
}

// CiliumPoolState is one pool of a multi-pool node.
type CiliumPoolState struct {
	Pool                   string
	Allocated              []netip.Prefix
	NeededIPv4, NeededIPv6 int
}
