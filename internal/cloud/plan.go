// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Sizing is how a cloud pool sizes its nodes: Cilium's watermarks
// (pre-allocate, min-allocate, max-allocate, max-above-watermark), or the
// VPC CNI's warm targets when WarmTargets is set.
type Sizing struct {
	Watermarks  alloc.Watermarks
	WarmTargets *alloc.WarmTargets
}

// PlanOptions are a cloud pool's settings that shape a node's plan.
type PlanOptions struct {
	Sizing Sizing
	// Prefixes asks /28 prefixes instead of single addresses.
	Prefixes bool
	// UsePrimary gives Pods the interfaces' primary addresses too.
	UsePrimary bool
	// FirstDevice is the first interface (device index) holding Pod
	// addresses; those below it are left alone, and new interfaces are
	// attached from it on.
	FirstDevice int
	// ExcludeTags, when set, leave alone every interface carrying all of
	// these tags with these values, as those below FirstDevice (a
	// CiliumNode's spec.eni.exclude-interface-tags; Cilium's
	// ENI.IsExcludedBySpec).
	ExcludeTags map[string]string
	// MaxPods bounds the addresses the VPC CNI's sizing asks for: the
	// node's (its kubelet's) or the pool's; 0 is the instance type's
	// (Limits.DefaultMaxPods).
	MaxPods int
	// IPv6 gives each node an IPv6 prefix too (EC2's /80) on its first
	// interface for Pods. It is not sized: one holds more than any node
	// leases.
	IPv6 bool
}

// On is o for an instance of limits l: prefixes are asked only of a type
// that takes them. A prefix pool's node on a Xen type gets single
// addresses, as the VPC CNI falls back to secondary addresses there and
// Cilium's operator delegates no prefix to it (IsPrefixDelegated).
// FellBack reports that fallback.
func (o PlanOptions) On(l Limits) (out PlanOptions, fellBack bool) {
	if o.Prefixes && !l.Prefixes {
		o.Prefixes = false
		return o, true
	}
	return o, false
}

// ForPods says whether interface f holds Pod addresses under o: not
// Unmanaged (the VPC CNI's no_manage tag, a trunk or EFA, another network
// card, a user's), from FirstDevice on, not excluded by its tags, and not
// being detached. The others are neither counted, nor added to, nor given
// back from.
func (o PlanOptions) ForPods(f Interface) bool {
	return !f.Unmanaged && f.DeviceIndex >= o.FirstDevice && !o.Excludes(f) && !f.Detaching
}

// Excludes says whether f carries every one of o.ExcludeTags (none set
// excludes nothing).
func (o PlanOptions) Excludes(f Interface) bool {
	if len(o.ExcludeTags) == 0 {
		return false
	}
	for k, v := range o.ExcludeTags {
		if have, ok := f.Tags[k]; !ok || have != v {
			return false
		}
	}
	return true
}

// NodeState is what the workers know of a node when they plan for it.
type NodeState struct {
	Instance Instance
	// Used are the node's cloud addresses Pods hold (from the leases).
	Used map[netip.Addr]bool
	// Reserved are addresses the node holds for itself, used by no Pod
	// (a CiliumNode's pool, sized by the crd-mode controller): free for
	// the sizing, but never given back by a plan.
	Reserved map[netip.Addr]bool
	// Pending is how many Pods wait for an address on the node.
	Pending int
	// SubnetFree is how many addresses each subnet of the instance's
	// network and zone can still hand out, by subnet id, a subnet in
	// its cooldown at 0 (Reconciler.Plan fills it from
	// InterfaceManager.Subnets). An interface whose subnet has no room is
	// skipped for the next, then for a new interface, and an add is
	// bounded by its subnet's room, as Cilium's PrepareIPAllocation
	// does: otherwise a full subnet's interface is asked every round and
	// its node never served. nil, or a subnet missing from it, is not
	// known: room is assumed.
	SubnetFree map[string]int
}

// Plan is one round of cloud work for a node: at most one call that adds
// addresses (to an interface with room, or with a new interface), and
// what the node holds beyond its need.
type Plan struct {
	// Assign adds Count addresses (prefixes with PlanOptions.Prefixes)
	// to an existing interface.
	Assign *Assignment
	// Create makes a new interface with Count addresses (or prefixes).
	Create *Creation
	// Full reports that the node needs more but no interface has room
	// and the instance takes no more interfaces.
	Full bool
	// SubnetFull reports that the node needs more but every interface
	// with a free slot is in a subnet without room (or cooling), and no
	// subnet a new interface may go in has room either (Reconciler.Plan
	// decides the latter): the node waits for room, and no call is made.
	SubnetFull bool
	// Release are unused addresses and prefixes beyond the node's need.
	// They go back to the cloud only once excess for the pool's release
	// delay, and only if still unused then: the caller's part.
	Release *Release
	// Detach is an interface the node holds in surplus (the VPC CNI's
	// WARM_ENI_TARGET), with no address in use.
	Detach string
}

// Assignment adds Count addresses or prefixes to Interface.
type Assignment struct {
	Interface string
	Count     int
	// Fallback, with prefixes, is how many single addresses to ask
	// instead when the subnet has no free aligned /28 (cilium#29634): the
	// addresses the node lacks, within the slots Count fits in.
	Fallback int
}

// Creation makes an interface with Count addresses or prefixes.
type Creation struct {
	Count int
	// Fallback is Assignment's, for the new interface.
	Fallback int
	// Subnets are those to try in turn, when Reconciler.Plan chose them
	// (ChooseSubnets with room for Count).
	Subnets []Subnet
}

// Release gives back addresses and prefixes of one interface.
type Release struct {
	Interface string
	Addresses []netip.Addr
	Prefixes  []netip.Prefix
}

// PlanNode decides one round for a node: how many addresses it lacks or
// holds in excess by the pool's sizing, counted over the interfaces for
// Pods (PlanOptions.ForPods), and where to add or what to give back. It adds to the
// first interface (by device index) with a free slot whose subnet has
// room (NodeState.SubnetFree), at most that room, else to a new
// interface while the instance takes one, as Cilium's operator does; it
// gives back the unused addresses of the interface with the most of them,
// never a primary address, and prefixes only when wholly unused.
func PlanNode(s NodeState, o PlanOptions) (Plan, error) {
	l := s.Instance.Limits
	o, _ = o.On(l)
	ifaces := slices.Clone(s.Instance.Interfaces)
	// Interfaces below FirstDevice, excluded by their tags, or being
	// detached hold no Pod address; they still count against the
	// instance's interfaces.
	ifaces = slices.DeleteFunc(ifaces, func(f Interface) bool { return !o.ForPods(f) })
	slices.SortFunc(ifaces, func(a, b Interface) int { return cmp.Compare(a.DeviceIndex, b.DeviceIndex) })

	var held, used, prefixes, freePrefixes int
	for _, f := range ifaces {
		addrs := f.Addresses
		if o.UsePrimary {
			addrs = append([]netip.Addr{f.Primary}, addrs...)
		}
		held += len(addrs)
		for _, a := range addrs {
			if s.Used[a] {
				used++
			}
		}
		for _, p := range f.Prefixes {
			held += IPv4PrefixSize
			prefixes++
			n := usedIn(p, s.Used)
			used += n
			if n == 0 {
				freePrefixes++
			}
		}
	}

	var plan Plan
	var add, give int // in addresses, or prefixes with o.Prefixes
	var short int     // the addresses the node lacks, for a fallback
	// singles, with prefixes, are how many of the single addresses a
	// fallback gave (cilium#29634) the node may give back: they go first,
	// a /28 only once none is left.
	var singles int
	surplus := false
	if o.Sizing.WarmTargets != nil {
		// Prefix mode is the pool's (o.Prefixes), whatever the targets say.
		t := *o.Sizing.WarmTargets
		t.Prefixes = o.Prefixes
		maxPods := o.MaxPods
		if maxPods == 0 {
			maxPods = l.DefaultMaxPods(o.Prefixes)
		}
		per := l.PodAddressesPerInterface(o.Prefixes, o.UsePrimary)
		if o.Prefixes {
			per /= IPv4PrefixSize
		}
		pool := alloc.WarmPool{Total: held, Used: used, Prefixes: prefixes, FreePrefixes: freePrefixes, PerInterface: per, MaxPods: maxPods}
		add, give, surplus = t.Short(pool), t.Over(pool), t.SurplusInterface(pool)
		short = t.ShortAddresses(pool)
		if o.Prefixes {
			singles = t.OverAddresses(pool)
		}
	} else {
		w := o.Sizing.Watermarks
		add, give = w.ToAllocate(held, used, s.Pending), w.Excess(held, used)
		short = add
		if o.Prefixes {
			singles = give
			add, give = alloc.PrefixesFor(add), give/IPv4PrefixSize
		}
	}

	if add > 0 {
		unit := 1
		if o.Prefixes {
			unit = IPv4PrefixSize
		}
		plan.Assign, plan.Create, plan.Full, plan.SubnetFull = placeAdd(ifaces, s.Instance, add, s.SubnetFree, unit)
		if o.Prefixes && plan.Assign != nil {
			plan.Assign.Fallback = min(short, s.Instance.Limits.IPv4PerInterface-slotsOf(ifaces, plan.Assign.Interface))
			if free, ok := subnetRoom(s.SubnetFree, subnetOf(s.Instance, plan.Assign.Interface)); ok {
				plan.Assign.Fallback = min(plan.Assign.Fallback, free)
			}
		}
		if o.Prefixes && plan.Create != nil {
			plan.Create.Fallback = min(short, s.Instance.Limits.IPv4PerInterface-1)
		}
	}
	if singles > 0 && add == 0 {
		plan.Release = pickSingles(ifaces, kept(s), singles)
	}
	if give > 0 && add == 0 && plan.Release == nil {
		plan.Release = pickRelease(ifaces, kept(s), give, o.Prefixes)
	}
	if surplus && add == 0 {
		plan.Detach = pickDetach(ifaces, kept(s))
	}
	return plan, nil
}

// placeAdd puts n addresses (or prefixes, unit addresses each) on the
// first interface with free slots whose subnet has room for one, at most
// that room, else on a new interface while the instance takes one. It
// answers full when no interface has a free slot and none can be added,
// subnetFull when some interface had free slots but its subnet no room.
func placeAdd(ifaces []Interface, inst Instance, n int, subnetFree map[string]int, unit int) (a *Assignment, c *Creation, full, subnetFull bool) {
	slots := inst.Limits.IPv4PerInterface
	for _, f := range ifaces {
		room := slots - f.Slots()
		if room <= 0 {
			continue
		}
		if free, ok := subnetRoom(subnetFree, f.SubnetID); ok && free < unit {
			subnetFull = true
			continue
		} else if ok {
			room = min(room, free/unit)
		}
		return &Assignment{Interface: f.ID, Count: min(n, room)}, nil, false, false
	}
	if len(inst.Interfaces) < inst.Limits.Interfaces && slots > 1 {
		return nil, &Creation{Count: min(n, slots-1)}, false, false
	}
	return nil, nil, !subnetFull, subnetFull
}

// subnetRoom is how many addresses subnet id can still hand out by
// free, and whether that is known.
func subnetRoom(free map[string]int, id string) (int, bool) {
	n, ok := free[id]
	return max(n, 0), ok && id != ""
}

// pickRelease chooses up to n unused secondary addresses (highest first)
// of the interface holding the most unused ones (by id on a tie), or with
// prefixes up to n wholly unused prefixes of the interface holding the
// most of them.
func pickRelease(ifaces []Interface, used map[netip.Addr]bool, n int, prefixes bool) *Release {
	var best *Release
	for _, f := range slices.SortedFunc(slices.Values(ifaces), func(a, b Interface) int { return cmp.Compare(a.ID, b.ID) }) {
		r := &Release{Interface: f.ID}
		if prefixes {
			for _, p := range f.Prefixes {
				if usedIn(p, used) == 0 {
					r.Prefixes = append(r.Prefixes, p)
				}
			}
		} else if len(f.Prefixes) == 0 {
			for _, a := range f.Addresses {
				if !used[a] {
					r.Addresses = append(r.Addresses, a)
				}
			}
		}
		if count(r) > 0 && (best == nil || count(r) > count(best)) {
			best = r
		}
	}
	if best == nil {
		return nil
	}
	slices.SortFunc(best.Addresses, func(a, b netip.Addr) int { return b.Compare(a) })
	slices.SortFunc(best.Prefixes, func(a, b netip.Prefix) int { return b.Addr().Compare(a.Addr()) })
	best.Addresses = best.Addresses[:min(n, len(best.Addresses))]
	best.Prefixes = best.Prefixes[:min(n, len(best.Prefixes))]
	return best
}

// pickSingles chooses, in prefix mode, up to n unused secondary addresses
// (highest first) of the interface holding the most of them (by id on a
// tie): what fallbacks gave a node of a prefix pool, which would
// otherwise stay for good, as pickRelease gives back only whole prefixes
// there.
func pickSingles(ifaces []Interface, used map[netip.Addr]bool, n int) *Release {
	var best *Release
	for _, f := range slices.SortedFunc(slices.Values(ifaces), func(a, b Interface) int { return cmp.Compare(a.ID, b.ID) }) {
		r := &Release{Interface: f.ID}
		for _, a := range f.Addresses {
			if !used[a] {
				r.Addresses = append(r.Addresses, a)
			}
		}
		if len(r.Addresses) > 0 && (best == nil || len(r.Addresses) > len(best.Addresses)) {
			best = r
		}
	}
	if best == nil {
		return nil
	}
	slices.SortFunc(best.Addresses, func(a, b netip.Addr) int { return b.Compare(a) })
	best.Addresses = best.Addresses[:min(n, len(best.Addresses))]
	return best
}

// kept is what a plan never gives back: the used and reserved addresses.
func kept(s NodeState) map[netip.Addr]bool {
	if len(s.Reserved) == 0 {
		return s.Used
	}
	out := maps.Clone(s.Used)
	if out == nil {
		out = map[netip.Addr]bool{}
	}
	maps.Copy(out, s.Reserved)
	return out
}

// slotsOf is how many slots interface id takes.
func slotsOf(ifaces []Interface, id string) int {
	for _, f := range ifaces {
		if f.ID == id {
			return f.Slots()
		}
	}
	return 0
}

func count(r *Release) int { return len(r.Addresses) + len(r.Prefixes) }

// pickDetach chooses the interface (highest device index) whose addresses
// no Pod uses; "" when every one has a user. Never the primary, never one
// the workers did not create (Interface.Owned: the IAM policy refuses
// them the detach anyway), and never one holding the node's IPv6 prefix
// (its Pods' IPv6 addresses would go with it).
func pickDetach(ifaces []Interface, used map[netip.Addr]bool) string {
	for i := len(ifaces) - 1; i >= 0; i-- {
		f := ifaces[i]
		if f.DeviceIndex == 0 || f.Unmanaged || !f.Owned() || len(f.IPv6Prefixes) > 0 {
			continue
		}
		busy := used[f.Primary]
		for _, a := range f.Addresses {
			busy = busy || used[a]
		}
		for _, p := range f.Prefixes {
			busy = busy || usedIn(p, used) > 0
		}
		if !busy {
			return f.ID
		}
	}
	return ""
}

// usedIn counts the used addresses inside p (a /28: 16 lookups).
func usedIn(p netip.Prefix, used map[netip.Addr]bool) int {
	n := 0
	for a := p.Addr(); p.Contains(a); a = a.Next() {
		if used[a] {
			n++
		}
	}
	return n
}
