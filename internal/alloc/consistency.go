// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import "time"

// FindingKind names the invariant a consistency finding breaks.
type FindingKind string

// What the consistency check looks for. Most are also constraints of the
// schema, so on a healthy database they find nothing; the check is there
// for the day a constraint was dropped, a row edited by hand, or a bug
// found a way around one.
const (
	// FindingDuplicateAddress: two lease rows hold one address of a space.
	FindingDuplicateAddress FindingKind = "duplicate-address"
	// FindingDuplicateAttachment: an attachment holds two pending or
	// active leases of one family.
	FindingDuplicateAttachment FindingKind = "duplicate-attachment"
	// FindingBlockOverlap: two blocks of a space overlap.
	FindingBlockOverlap FindingKind = "block-overlap"
	// FindingPoolCIDROverlap: two pool CIDRs of a space overlap.
	FindingPoolCIDROverlap FindingKind = "pool-cidr-overlap"
	// FindingBlockOutsidePool: a block lies outside its pool CIDR, or that
	// CIDR is missing or belongs to another pool, space or family.
	FindingBlockOutsidePool FindingKind = "block-outside-pool"
	// FindingLeaseOutsideBlock: a lease's address lies outside its block,
	// or its block is missing.
	FindingLeaseOutsideBlock FindingKind = "lease-outside-block"
	// FindingLeaseBlockMismatch: a lease's node, pool, family, space or
	// block CIDR differs from its block's.
	FindingLeaseBlockMismatch FindingKind = "lease-block-mismatch"
	// FindingLeaseReservedAddress: a lease holds an address its block
	// does not lease (network, broadcast, router, health, ingress).
	FindingLeaseReservedAddress FindingKind = "lease-reserved-address"
	// FindingBlockCounter: a block's allocated counter differs from the
	// number of its lease rows, or exceeds its capacity.
	FindingBlockCounter FindingKind = "block-counter"
	// FindingMissingNode: a lease or block of a node that does not exist.
	FindingMissingNode FindingKind = "missing-node"
	// FindingMissingPool: a lease or block of a pool that does not exist.
	FindingMissingPool FindingKind = "missing-pool"
	// FindingLeaseState: a lease whose state contradicts its timestamps
	// (a pending lease without expiry, a released one without cooldown...).
	FindingLeaseState FindingKind = "lease-state"
	// FindingPoolCIDRClaim: a Pod pool CIDR without its address range
	// (the claim that keeps VIP blocks off it), or with another range.
	FindingPoolCIDRClaim FindingKind = "pool-cidr-claim"
	// FindingAddressRangeOverlap: a VIP block overlaps a Pod pool CIDR,
	// or two VIP blocks of pools not marked conflicting overlap.
	FindingAddressRangeOverlap FindingKind = "address-range-overlap"
	// FindingVIPState: a VIP without a holder, or one inside a Pod pool
	// CIDR (where a Pod could be given it too).
	FindingVIPState FindingKind = "vip-state"
)

// Finding is one broken invariant and the rows concerned, named as a
// person would look them up ("lease 10.0.0.5", "block 10.0.0.0/24 (id 3)").
type Finding struct {
	Kind    FindingKind
	Space   string
	Detail  string
	Objects []string
}

// ConsistencyCounts are the rows a check read.
type ConsistencyCounts struct {
	Spaces, Pools, PoolCIDRs, Nodes, Blocks, Leases int64
}

// ConsistencyReport is what one consistency check found, in one snapshot
// of the database.
type ConsistencyReport struct {
	// CheckedAt is the service's clock when the snapshot was taken.
	CheckedAt time.Time
	Took      time.Duration
	Counts    ConsistencyCounts
	Findings  []Finding
	// Truncated reports that a check found more than it lists
	// (MaxFindingsPerCheck).
	Truncated bool
}

// MaxFindingsPerCheck bounds the findings a report lists per check, so a
// badly broken database answers a readable report in bounded memory.
const MaxFindingsPerCheck = 100
