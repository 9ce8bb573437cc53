// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

// NeededIPCeil is the number of addresses a node should have available in a
// multi-pool pool for a demand of numIP addresses with pre-allocation
// preAlloc, exactly as Cilium's agent computes it (neededIPCeil in
// pkg/ipam/multipool_manager.go): the demand rounded up to the next-but-one
// multiple of preAlloc, so at least one unit of pre-allocation is always
// free. With preAlloc P: a demand of 0 asks P, 1 to P ask 2P, P+1 asks 3P.
// Without pre-allocation the need is the demand itself.
//
// Cilium's documentation writes roundUp(inUse + pending + preAlloc,
// preAlloc), which is the same function of the demand; applying
// NeededIPCeil to demand + preAlloc would count the pre-allocation twice
// (a demand of 0 would ask 2P, not P).
func NeededIPCeil(numIP, preAlloc int64) int64 {
	if preAlloc <= 0 {
		return numIP
	}
	q, rem := numIP/preAlloc, numIP%preAlloc
	if rem > 0 {
		return (q + 2) * preAlloc
	}
	return (q + 1) * preAlloc
}

// NodePoolDemand is one node's use of one family of a pool.
type NodePoolDemand struct {
	InUse    int64 // active leases
	Pending  int64 // pending leases
	Cooling  int64 // released addresses still in cooldown: not available either
	Capacity int64 // leasable addresses in the node's blocks
	PreAlloc int64
	// MaxCapacity is the capacity of the most blocks the pool lets one
	// node hold (NodeCapacityLimit); 0 means no limit.
	MaxCapacity int64
	// Expected is what allocations are expected to lease on the node
	// before the capacity is looked at again (the store's top-up sizes a
	// busy node for its recent rate); 0 otherwise. The need covers it on
	// top of the demand.
	Expected int64
}

// Demand is the addresses the node uses and cannot hand out again now.
func (d NodePoolDemand) Demand() int64 { return d.InUse + d.Pending + d.Cooling }

// Needed is the capacity the node should have: NeededIPCeil of its demand
// (and of what it is Expected to lease), at most MaxCapacity, as Cilium
// clamps the needed addresses to max-allocate: a node at its limit is not
// short of what it may not have.
func (d NodePoolDemand) Needed() int64 {
	n := NeededIPCeil(d.Demand()+d.Expected, d.PreAlloc)
	if d.MaxCapacity > 0 {
		n = min(n, d.MaxCapacity)
	}
	return n
}

// Deficit is how many addresses of capacity the node lacks (0 when none).
func (d NodePoolDemand) Deficit() int64 { return max(d.Needed()-d.Capacity, 0) }

// BlocksToCarve is how many blocks of blockCapacity addresses cover the
// deficit.
func (d NodePoolDemand) BlocksToCarve(blockCapacity int64) int64 {
	if blockCapacity <= 0 {
		return 0
	}
	return (d.Deficit() + blockCapacity - 1) / blockCapacity
}

// Releasable picks, among the node's completely free blocks (their
// capacities, in release order), those that can go back to the pool while
// the remaining capacity still meets the need: the agent "removes blocks
// that are completely free and above demand". It answers their indexes.
func (d NodePoolDemand) Releasable(freeBlocks []int64) []int {
	need, capacity := d.Needed(), d.Capacity
	var out []int
	for i, c := range freeBlocks {
		if capacity-c >= need {
			capacity -= c
			out = append(out, i)
		}
	}
	return out
}

// NodePoolUsage is one node's use of one family of a pool, with what the
// pre-allocation rule asks of it (multi-pool pools only: a cluster-pool
// block is fixed, so its PreAlloc is 0 and its need is its demand).
type NodePoolUsage struct {
	Node, Pool string
	Mode       PoolMode
	Family     Family
	Blocks     int64
	// Leased counts pending, active and reserved (crd mode) leases; the
	// demand (InUse) is every lease row of the blocks, released rows not
	// yet purged included.
	Leased int64
	NodePoolDemand
	// CanLease says a lease of the node from the pool family would find an
	// address now: a free or cooled one in its blocks, or a block the pool
	// can still carve for it.
	CanLease bool
}

// UsageFilter narrows NodeUsage to named pools. The zero value lists every
// pool the node holds blocks of or pre-allocates from.
type UsageFilter struct {
	// Pools are listed, every family of each, blocks or not.
	Pools []string
	// Default adds the default pool.
	Default bool
}

// IsZero reports the filter that lists the node's own pools.
func (f UsageFilter) IsZero() bool { return len(f.Pools) == 0 && !f.Default }

// NodeUsage is one node's use of the pools NodeUsage lists, with the name
// of the default pool.
type NodeUsage struct {
	DefaultPool string
	Items       []NodePoolUsage
}

// Released is the demand that is not leased: released addresses in
// cooldown or awaiting the purge.
func (u NodePoolUsage) Released() int64 { return max(u.Demand()-u.Leased, 0) }

// Available is how many addresses the node can still lease from the pool
// family's blocks.
func (u NodePoolUsage) Available() int64 { return max(u.Capacity-u.Demand(), 0) }

// AtCapacity says the node holds blocks of the pool family and none has a
// free address.
func (u NodePoolUsage) AtCapacity() bool { return u.Blocks > 0 && u.Available() == 0 }
