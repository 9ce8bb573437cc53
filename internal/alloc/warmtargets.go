// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

// WarmTargets are the per-node pool sizing knobs of the AWS VPC CNI
// (aws-node's ipamd), for a cloud pool that sizes nodes the VPC CNI's way
// instead of Cilium's (Watermarks): WARM_ENI_TARGET, WARM_IP_TARGET,
// MINIMUM_IP_TARGET and, with prefix delegation, WARM_PREFIX_TARGET. The
// rules below are ipamd's (its datastore target state and its pool too low
// or too high checks), so a node sized here holds what aws-node would
// have it hold.
//
// Zero means unset, as it does to ipamd: with WARM_IP_TARGET and
// MINIMUM_IP_TARGET both unset the pool is sized in whole interfaces
// (WARM_ENI_TARGET, or in prefix mode WARM_PREFIX_TARGET); with either set
// it is sized in addresses and the other two are ignored (only
// MINIMUM_IP_TARGET set leaves WARM_IP_TARGET at 0: no spare once the
// floor is filled).
type WarmTargets struct {
	// WarmENI is how many interfaces' worth of unused addresses to keep
	// (WARM_ENI_TARGET); 0 is ipamd's default, DefaultWarmENI.
	WarmENI int
	// WarmIP is how many unused addresses to keep (WARM_IP_TARGET).
	WarmIP int
	// MinimumIP is the fewest addresses to hold (MINIMUM_IP_TARGET).
	MinimumIP int
	// WarmPrefix is how many unused /28 prefixes to keep in prefix mode
	// (WARM_PREFIX_TARGET); 0 keeps one only when none is left unused.
	WarmPrefix int
	// Prefixes is prefix delegation (ENABLE_PREFIX_DELEGATION): the node
	// gets /28 prefixes of PrefixSize addresses instead of single ones.
	Prefixes bool
	// MaxPods is the most Pods a node of the pool runs (its kubelet's
	// max-pods, which ipamd reads from the Node): the pool holds no more
	// addresses once it has that many. 0 is the instance type's as the
	// EKS AMI sets it (with prefixes: 110, or 250 above 30 vCPUs).
	MaxPods int
}

// MaxMaxPods bounds WarmTargets.MaxPods: above the most any EC2 type
// runs without prefixes (1514), well below what a kubelet can run.
const MaxMaxPods = 4096

// DefaultWarmENI is ipamd's WARM_ENI_TARGET when unset.
const DefaultWarmENI = 1

// PrefixSize is the number of addresses of an IPv4 prefix an interface is
// given with prefix delegation (a /28).
const PrefixSize = 16

// WarmPool is what a node holds in the cloud, as the warm targets count
// it. In prefix mode the addresses are those of the prefixes.
type WarmPool struct {
	// Total is the addresses the node holds for Pods (every interface's
	// secondary addresses, or the addresses of its prefixes); Used is how
	// many of them Pods hold.
	Total, Used int
	// Prefixes is the prefixes the node holds, FreePrefixes those of them
	// with no address in use (prefix mode only).
	Prefixes, FreePrefixes int
	// PerInterface is how many addresses one interface takes (prefix
	// mode: how many prefixes).
	PerInterface int
	// MaxPods is the most Pods the node runs: a pool holding that many
	// addresses is never too low.
	MaxPods int
}

// ipTargets reports whether the pool is sized in addresses
// (WARM_IP_TARGET or MINIMUM_IP_TARGET set).
func (t WarmTargets) ipTargets() bool { return t.WarmIP > 0 || t.MinimumIP > 0 }

func (t WarmTargets) warmENI() int {
	if t.WarmENI > 0 {
		return t.WarmENI
	}
	return DefaultWarmENI
}

// Short is how much the node lacks: addresses, or prefixes in prefix
// mode. With address targets, the warm addresses missing or, when more,
// the addresses below the minimum. Otherwise the pool is low while its
// unused addresses are fewer than WARM_ENI_TARGET interfaces' worth (in
// prefix mode WARM_PREFIX_TARGET prefixes' worth), or when a target of 0
// leaves none unused, and Short is what brings it back. Nothing once the
// node holds MaxPods addresses.
func (t WarmTargets) Short(p WarmPool) int {
	if p.MaxPods > 0 && p.Total >= p.MaxPods {
		return 0
	}
	avail := p.Total - p.Used
	if t.ipTargets() {
		short := max(t.WarmIP-avail, t.MinimumIP-p.Total, 0)
		if t.Prefixes {
			return PrefixesFor(short)
		}
		return short
	}
	warm, unit := t.warmENI(), p.PerInterface
	if t.Prefixes {
		warm, unit = t.WarmPrefix, PrefixSize
	}
	short := max(warm*unit-avail, 0)
	if warm == 0 && avail == 0 {
		short = unit
	}
	if t.Prefixes {
		return PrefixesFor(short)
	}
	return short
}

// ShortAddresses is Short counted in addresses, in prefix mode too: what
// a node whose subnet has no free aligned prefix asks as single addresses
// instead (the address targets' exact shortfall, else Short's prefixes'
// worth).
func (t WarmTargets) ShortAddresses(p WarmPool) int {
	switch {
	case !t.Prefixes:
		return t.Short(p)
	case t.ipTargets():
		u := t
		u.Prefixes = false
		return u.Short(p)
	}
	return t.Short(p) * PrefixSize
}

// Over is how much the node may give back: addresses, or prefixes in
// prefix mode. With address targets: the unused addresses beyond
// WARM_IP_TARGET, as long as the node keeps MINIMUM_IP_TARGET; in prefix
// mode only prefixes with no address in use go, as long as the node keeps
// the prefixes its used addresses plus WARM_IP_TARGET fill, and those
// MINIMUM_IP_TARGET fills. With WARM_PREFIX_TARGET: the unused prefixes
// beyond it. With WARM_ENI_TARGET the pool shrinks by whole interfaces
// (SurplusInterface) and Over is 0.
func (t WarmTargets) Over(p WarmPool) int {
	switch {
	case !t.ipTargets() && t.Prefixes:
		return max(p.FreePrefixes-t.WarmPrefix, 0)
	case !t.ipTargets():
		return 0
	case !t.Prefixes:
		return max(min(p.Total-p.Used-t.WarmIP, p.Total-t.MinimumIP), 0)
	}
	keep := max(PrefixesFor(p.Used+t.WarmIP), PrefixesFor(t.MinimumIP))
	return max(min(p.FreePrefixes, p.Prefixes-keep), 0)
}

// OverAddresses is Over counted in addresses, in prefix mode too: how
// many single addresses a prefix node (given them by a fallback) may give
// back. With address targets, those beyond WARM_IP_TARGET as long as the
// node keeps MINIMUM_IP_TARGET; with WARM_PREFIX_TARGET, the unused
// addresses beyond its prefixes' worth.
func (t WarmTargets) OverAddresses(p WarmPool) int {
	switch {
	case !t.Prefixes:
		return t.Over(p)
	case t.ipTargets():
		u := t
		u.Prefixes = false
		return u.Over(p)
	}
	return max(p.Total-p.Used-t.WarmPrefix*PrefixSize, 0)
}

// SurplusInterface reports whether, sized by WARM_ENI_TARGET (no address
// targets, no prefixes), the node holds an interface more than it needs:
// unused addresses for WARM_ENI_TARGET + 1 interfaces.
func (t WarmTargets) SurplusInterface(p WarmPool) bool {
	if t.ipTargets() || t.Prefixes || p.PerInterface <= 0 {
		return false
	}
	return p.Total-p.Used >= (t.warmENI()+1)*p.PerInterface
}

// PrefixesFor is how many prefixes hold n addresses (n >= 0).
func PrefixesFor(n int) int { return (n + PrefixSize - 1) / PrefixSize }
