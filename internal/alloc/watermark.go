// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

// Watermarks are the per-node sizing knobs of Cilium's operator for the
// modes where it hands single addresses to a node (crd, eni, azure): the
// CiliumNode's spec.ipam.pre-allocate, min-allocate, max-allocate and
// max-above-watermark. The formulas below are those of Cilium's
// operator/pkg/ipam/nodemanager (calculateNeededIPs, calculateExcessIPs),
// so a node sized here behaves as it would under Cilium's own operator.
type Watermarks struct {
	// PreAllocate is how many unused addresses the node should hold;
	// 0 means DefaultPreAllocate (Cilium's
	// defaults.IPAMPreAllocation, also 8).
	PreAllocate int
	// MinAllocate is the least the node should hold once it has any.
	MinAllocate int
	// MaxAllocate caps what the node holds; 0 means no cap.
	MaxAllocate int
	// MaxAboveWatermark is how many more than needed an allocation may
	// take at once, and how many above the watermark are never excess.
	MaxAboveWatermark int
}

// preAllocate is w.PreAllocate with Cilium's default for 0.
func (w Watermarks) preAllocate() int {
	if w.PreAllocate != 0 {
		return w.PreAllocate
	}
	return DefaultPreAllocate
}

// Needed is how many addresses a node holding available addresses, used
// of them in use, lacks: enough for pre-allocate unused ones, at least
// min-allocate in all, never more than max-allocate in all.
func (w Watermarks) Needed(available, used int) int {
	needed := max(w.preAllocate()+used-available, w.MinAllocate-available)
	if w.MaxAllocate > 0 && available+needed > w.MaxAllocate {
		needed = w.MaxAllocate - available
	}
	return max(needed, 0)
}

// UsedFromRequested is how many addresses an agent of Cilium's multi-pool
// allocator (ipam.mode=eni since v1.20) uses, recovered from the demand
// it writes to spec.ipam.pools.requested: that demand is in use plus
// pre-allocate, so the use is requested - pre-allocate, as Cilium's
// operator reads it (nodemanager/node.go, cilium#45154). The addresses
// it lists in spec.ipam.pools.allocated are what it keeps, spare ones
// included, and are no measure of use.
func (w Watermarks) UsedFromRequested(requested int) int {
	return max(requested-w.preAllocate(), 0)
}

// ToAllocate is how many addresses one allocation round asks for: the
// need plus max-above-watermark plus the surge (Pods waiting on the node
// beyond the need), and nothing when nothing is needed. Cilium's operator
// adds max-above-watermark to every round; it asks only when the need is
// positive, which is what the zero here says.
func (w Watermarks) ToAllocate(available, used, pending int) int {
	needed := w.Needed(available, used)
	if needed == 0 {
		return 0
	}
	surge := max(pending-needed, 0)
	n := needed + w.MaxAboveWatermark + surge
	if w.MaxAllocate > 0 && available+n > w.MaxAllocate {
		n = w.MaxAllocate - available
	}
	return max(n, 0)
}

// Excess is how many of the node's unused addresses it may give back. While
// the node has not used up its initial min-allocate + max-above-watermark,
// only what lies beyond that initial allocation is excess; after that,
// whatever exceeds in-use + pre-allocate + max-above-watermark.
func (w Watermarks) Excess(available, used int) int {
	pre, floor := w.preAllocate(), w.MinAllocate+w.MaxAboveWatermark
	if used <= floor {
		if available <= floor {
			return 0
		}
		if used+pre <= floor {
			return available - floor
		}
	}
	return max(available-used-pre-w.MaxAboveWatermark, 0)
}
