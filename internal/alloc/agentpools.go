// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"cmp"
	"maps"
	"math"
	"net/netip"
	"slices"
	"time"
)

// Agent pools: the blocks of nodes whose agent allocates inside them itself
// (Cilium's agent in its multi-pool and cluster-pool modes, served by
// internal/cilium). The store holds the blocks; the agent holds the
// addresses, so the store has no lease in them and learns the agent's
// demand only as the agent states it (CiliumNode spec.ipam.pools).

// CiliumBlockAddrs is how many addresses Cilium's agent can hand out of a
// multi-pool block: all but the first and the last, unless the pool allows
// them; a /31, /32, /127 or /128 keeps every address (addrsInPrefix in
// Cilium's operator, operator/pkg/ipam/allocator/multipool). Unlike
// Layout.Capacity it keeps no node-local address: the agent takes its
// router and health addresses from the block like a Pod's and counts them
// in its demand. It saturates at MaxInt64 (an IPv6 /64).
func CiliumBlockAddrs(p netip.Prefix, allowFirst, allowLast bool) int64 {
	host := p.Addr().BitLen() - p.Bits()
	if host >= 63 {
		return math.MaxInt64
	}
	n := int64(1) << host
	if n <= 2 {
		return n
	}
	if !allowFirst {
		n--
	}
	if !allowLast {
		n--
	}
	return n
}

// PoolRequest is what an agent asks of one pool: how many addresses of
// each family it wants its node's blocks of the pool to hold (Cilium's
// spec.ipam.pools.requested[].needed, which the agent computes with
// NeededIPCeil).
type PoolRequest struct {
	Pool       string
	IPv4, IPv6 int64
}

// Need is the request for family f.
func (r PoolRequest) Need(f Family) int64 {
	if f == IPv6 {
		return r.IPv6
	}
	return r.IPv4
}

// AgentPools is what a node's agent reports in multi-pool mode: the blocks
// it holds, by pool (spec.ipam.pools.allocated), and what it needs
// (spec.ipam.pools.requested).
type AgentPools struct {
	Allocated map[string][]netip.Prefix
	Requested []PoolRequest
}

// AgentBlock is a block of a pool a node holds for its agent.
type AgentBlock struct {
	Pool string
	CIDR netip.Prefix
	// ReturnedAt is when the agent gave the block back (stopped listing
	// it); zero while the agent holds it. A returned block stays the
	// node's for the hold-off, so a node whose Pods come back takes it
	// again instead of carving another, and no other node gets a CIDR
	// the routes of the cluster may still lead to this node for.
	ReturnedAt time.Time
}

// Returned reports whether the agent gave the block back.
func (b AgentBlock) Returned() bool { return !b.ReturnedAt.IsZero() }

// PoolCIDR is a CIDR an agent lists under a pool.
type PoolCIDR struct {
	Pool string
	CIDR netip.Prefix
}

// AgentBlocksDiff is how a node's blocks differ from what its agent lists.
type AgentBlocksDiff struct {
	// Return: blocks the agent held and no longer lists; it gave them
	// back.
	Return []AgentBlock
	// Retake: returned blocks the agent lists again (its update crossed
	// the return, or the operator gave the block back to it before).
	Retake []AgentBlock
	// Adopt: CIDRs the agent lists that the node does not hold (given by
	// an operator before this one, or restored from a backup of the
	// CiliumNode), in pool and CIDR order.
	Adopt []PoolCIDR
}

// DiffAgentBlocks compares the node's blocks with the agent's listing. A
// CIDR listed under another pool than the node holds it in counts as held:
// the block stays in its pool.
func DiffAgentBlocks(node []AgentBlock, allocated map[string][]netip.Prefix) AgentBlocksDiff {
	listed := map[netip.Prefix]bool{}
	for _, cidrs := range allocated {
		for _, c := range cidrs {
			listed[c.Masked()] = true
		}
	}
	held := map[netip.Prefix]bool{}
	var d AgentBlocksDiff
	for _, b := range node {
		held[b.CIDR] = true
		switch {
		case listed[b.CIDR] && b.Returned():
			d.Retake = append(d.Retake, b)
		case !listed[b.CIDR] && !b.Returned():
			d.Return = append(d.Return, b)
		}
	}
	// Pools in name order: a CIDR listed under two pools is adopted under
	// the first, the same one every round.
	for _, pool := range slices.Sorted(maps.Keys(allocated)) {
		for _, c := range allocated[pool] {
			if c = c.Masked(); !held[c] {
				held[c] = true // listed twice: adopt once
				d.Adopt = append(d.Adopt, PoolCIDR{Pool: pool, CIDR: c})
			}
		}
	}
	slices.SortFunc(d.Adopt, func(a, b PoolCIDR) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), a.CIDR.Addr().Compare(b.CIDR.Addr()))
	})
	return d
}

// BlocksToCover plans how a node's blocks of one pool family come to hold
// need addresses, as Cilium's operator does (the need minus the addresses
// of the node's blocks, then a block at a time until covered): held is
// what the blocks the agent holds give, returned the addresses each of its
// returned blocks would give back (in the order to take them), and
// newBlock what a block carved now gives. It answers how many returned
// blocks to take back, from the first, and how many to carve.
func BlocksToCover(need, held int64, returned []int64, newBlock int64) (retake int, carve int64) {
	deficit := need - held
	for retake < len(returned) && deficit > 0 {
		deficit -= returned[retake]
		retake++
	}
	if deficit <= 0 || newBlock <= 0 {
		return retake, 0
	}
	return retake, (deficit + newBlock - 1) / newBlock
}

// ReleaseDue reports whether a returned block has been back for the
// hold-off at now, and when it will have been.
func (b AgentBlock) ReleaseDue(now time.Time, holdOff time.Duration) (bool, time.Time) {
	at := b.ReturnedAt.Add(holdOff)
	return b.Returned() && !now.Before(at), at
}

// AgentPool is a pool's part of a node's blocks, as the agent is to list
// it (spec.ipam.pools.allocated).
type AgentPool struct {
	Pool                      string
	CIDRs                     []netip.Prefix // IPv4 first, each family in address order
	AllowFirstIP, AllowLastIP bool
}

// AgentPoolsState is a node's multi-pool blocks after a sync.
type AgentPoolsState struct {
	// Pools lists, by pool name, the pools the node holds blocks of that
	// the agent is to list (returned blocks are not).
	Pools []AgentPool
	// Errors are the needs not met and the CIDRs not adopted, each an
	// *Error naming Pool and Family: KindPoolExhausted (the pool has no
	// free block, is disabled or lacks the family), KindNodeBlockLimit,
	// KindNotFound (no such pool), KindOverlap (a listed CIDR another
	// node holds) or KindInvalid (a listed CIDR outside the pool).
	Errors []*Error
	// NextRelease is when the first returned block's hold-off ends (in
	// the past when one is due); zero when the node has none.
	NextRelease time.Time
}
