// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultSubnetCooldown is how long a subnet that ran out of addresses is
// skipped, for adds to its interfaces and for new interfaces (the VPC
// CNI's two minutes).
const DefaultSubnetCooldown = 2 * time.Minute

// DefaultSubnetRefresh is how long a reading of a zone's subnets serves
// the rounds (Cilium's operator reads them with its one-minute resync):
// what the rounds take meanwhile is counted off it, and a subnet that
// answers full cools down whatever it says.
const DefaultSubnetRefresh = time.Minute

// Reconciler carries out the rounds of PlanNode for the nodes of one
// cloud pool: the one call that adds addresses to a node, with the
// fallbacks the clouds need. Giving back is the caller's (it needs the
// release delay and the database's word that no Pod took the address).
// It is safe for concurrent rounds of different nodes.
type Reconciler struct {
	Provider Provider
	// Interfaces creates interfaces when a node's are full; nil for a
	// cloud that never creates one (Azure), whose nodes then stay full.
	Interfaces InterfaceManager
	// Subnets and SecurityGroups place new interfaces (ChooseSubnets,
	// SecurityGroupsFor); SecurityGroupTags, when SecurityGroups is
	// empty, name the groups by tags instead (resolved in the instance's
	// network by Interfaces.SecurityGroups); Tags go on them (the
	// cluster's, at least), with the node's name as TagNode.
	Subnets           SubnetSelector
	SecurityGroups    []string
	SecurityGroupTags map[string]string
	Tags              map[string]string
	// Now is the clock of the subnets' cooldown; time.Now when nil.
	Now func() time.Time
	// SubnetCooldown is DefaultSubnetCooldown when zero.
	SubnetCooldown time.Duration
	// SubnetRefresh is DefaultSubnetRefresh when zero.
	SubnetRefresh time.Duration

	mu      sync.Mutex           // guards cooling
	cooling map[string]time.Time // subnet -> until when it is skipped

	zonesMu sync.Mutex             // guards zones; held across a reading, so that rounds share it
	zones   map[string]zoneReading // "vpc zone" -> its subnets as last read
}

// zoneReading is a zone's subnets as read at a time, less what the rounds
// took since.
type zoneReading struct {
	at      time.Time
	subnets []Subnet
}

// Added is what one round got from the cloud.
type Added struct {
	// Interface is where it went; Created when it is a new interface,
	// described in full by NewInterface.
	Interface    string
	Created      bool
	NewInterface Interface
	Addresses    []netip.Addr
	Prefixes     []netip.Prefix
}

// Round plans a round for node in state s with options o (the pool's,
// with what the node says of its own interfaces; Plan) and makes its one
// add: to an interface whose subnet has room (a prefix request on a
// subnet without a free aligned /28 falls back to single addresses, and
// the subnet is asked no prefix for its cooldown), or to a new interface
// in the first subnet with room (a subnet that answers full cools down
// and the next is tried). An interface whose subnet answers full cools
// the subnet, and the same round falls through to the next interface or
// a new one elsewhere. A node whose every subnet is full or cooling gets
// no call: KindSubnetFull, with the plan's SubnetFull set. It answers the
// plan and what was added; with nothing to add, an empty Added.
func (r *Reconciler) Round(ctx context.Context, node string, s NodeState, o PlanOptions) (Plan, Added, error) {
	// Prefixes only where the type takes them, as PlanNode plans.
	o, _ = o.On(s.Instance.Limits)
	var refused []error
	// Each refusal cools one more subnet of the node's interfaces: the
	// rounds end.
	for range len(s.Instance.Interfaces) + 1 {
		plan, err := r.Plan(ctx, s, o)
		if err != nil {
			return plan, Added{}, err
		}
		switch {
		case plan.Assign != nil:
			subnet := subnetOf(s.Instance, plan.Assign.Interface)
			got, err := r.assign(ctx, o, plan.Assign, subnet)
			if KindOf(err) == KindSubnetFull && subnet != "" {
				// InsufficientFreeAddressesInSubnet: no call there for
				// the cooldown; the next interface, or a new one.
				r.Cool(subnet)
				refused = append(refused, fmt.Errorf("%s: %w", plan.Assign.Interface, err))
				continue
			}
			r.took(s.Instance, subnet, len(got.Addresses)+IPv4PrefixSize*len(got.Prefixes))
			return plan, Added{Interface: plan.Assign.Interface, Addresses: got.Addresses, Prefixes: got.Prefixes}, err
		case plan.Create != nil && r.Interfaces != nil:
			f, err := r.create(ctx, o, node, s.Instance, plan.Create)
			if err == nil {
				r.took(s.Instance, f.SubnetID, 1+len(f.Addresses)+IPv4PrefixSize*len(f.Prefixes))
			}
			return plan, Added{Interface: f.ID, Created: err == nil, NewInterface: f, Addresses: f.Addresses, Prefixes: f.Prefixes}, err
		case plan.SubnetFull:
			err := &Error{Kind: KindSubnetFull, Code: "NoSubnet", Message: fmt.Sprintf(
				"instance %s lacks addresses, and no subnet of %s in %s it may get them from has room: waiting", s.Instance.ID, s.Instance.VPC, s.Instance.Zone)}
			return plan, Added{}, errors.Join(append(refused, err)...)
		}
		return plan, Added{}, errors.Join(refused...)
	}
	return Plan{}, Added{}, errors.Join(refused...)
}

// Plan is PlanNode with the subnets' room, when the node lacks
// addresses: a subnet in its cooldown has none; with Interfaces, each
// subnet of the instance's network and zone has what it can still hand
// out (read at most every SubnetRefresh, less what the rounds took
// since), and a new interface goes to the subnets with room for it
// (ChooseSubnets, in Creation.Subnets), its count bounded by the freest
// when none has room for all. With no subnet for either, the plan adds
// nothing and says SubnetFull. The workers size a node's deficit by it,
// so that a node no subnet can serve does not come first.
func (r *Reconciler) Plan(ctx context.Context, s NodeState, o PlanOptions) (Plan, error) {
	plan, err := PlanNode(s, o)
	if err != nil || (plan.Assign == nil && plan.Create == nil) {
		return plan, err
	}
	free := maps.Clone(s.SubnetFree)
	if free == nil {
		free = map[string]int{}
	}
	var subnets []Subnet
	var rerr error
	if r.Interfaces != nil {
		subnets, rerr = r.zone(ctx, s.Instance.VPC, s.Instance.Zone)
		for _, sn := range subnets {
			if _, ok := free[sn.ID]; !ok {
				free[sn.ID] = sn.Free
			}
		}
	}
	// Cooling subnets have no room, read or not (an unread subnet has
	// room: its interface is asked, and answers). The keys with a space
	// are the callers' own (fragmented, ipv6Key), not subnets.
	r.mu.Lock()
	now := r.now()
	for id, until := range r.cooling {
		if now.Before(until) && !strings.Contains(id, " ") {
			free[id] = 0
		}
	}
	r.mu.Unlock()
	s.SubnetFree = free
	if plan, err = PlanNode(s, o); err != nil || plan.Create == nil || r.Interfaces == nil {
		return plan, err
	}
	if rerr != nil && len(subnets) == 0 {
		// No subnet to choose from, not even an older reading's.
		return plan, rerr
	}
	c := plan.Create
	unit := 1
	if o.Prefixes {
		unit = IPv4PrefixSize
	}
	c.Subnets = ChooseSubnets(subnets, s.Instance, r.Subnets, c.Count*unit, r.Cooling)
	if len(c.Subnets) == 0 {
		// None with room for all: as many as the freest has room for.
		some := ChooseSubnets(subnets, s.Instance, r.Subnets, unit, r.Cooling)
		if len(some) == 0 {
			plan.Create, plan.SubnetFull = nil, true
			return plan, nil
		}
		freest := slices.MaxFunc(some, func(a, b Subnet) int { return cmp.Compare(a.Free, b.Free) })
		c.Count = min(c.Count, (freest.Free-1)/unit)
		c.Fallback = min(c.Fallback, freest.Free-1)
		c.Subnets = ChooseSubnets(subnets, s.Instance, r.Subnets, c.Count*unit, r.Cooling)
	}
	return plan, nil
}

// zone answers the subnets of vpc in zone, read again once the last
// reading is SubnetRefresh old; a failed reading answers the last one,
// if any, with the failure.
func (r *Reconciler) zone(ctx context.Context, vpc, zone string) ([]Subnet, error) {
	every := r.SubnetRefresh
	if every == 0 {
		every = DefaultSubnetRefresh
	}
	key := vpc + " " + zone
	r.zonesMu.Lock()
	defer r.zonesMu.Unlock()
	was, ok := r.zones[key]
	if ok && r.now().Sub(was.at) < every {
		return slices.Clone(was.subnets), nil
	}
	got, err := r.Interfaces.Subnets(ctx, vpc, zone)
	if err != nil {
		return slices.Clone(was.subnets), fmt.Errorf("reading the subnets of %s in %s: %w", vpc, zone, err)
	}
	if r.zones == nil {
		r.zones = map[string]zoneReading{}
	}
	r.zones[key] = zoneReading{at: r.now(), subnets: slices.Clone(got)}
	return got, nil
}

// took counts n addresses a round took from subnet off its reading, so
// that the next rounds before the next reading do not count on them.
func (r *Reconciler) took(inst Instance, subnet string, n int) {
	if n == 0 || subnet == "" {
		return
	}
	r.zonesMu.Lock()
	defer r.zonesMu.Unlock()
	z, ok := r.zones[inst.VPC+" "+inst.Zone]
	if !ok {
		return
	}
	for i := range z.subnets {
		if z.subnets[i].ID == subnet {
			z.subnets[i].Free = max(z.subnets[i].Free-n, 0)
		}
	}
}

// assign makes a's add to an interface of subnet, falling back from
// prefixes to single addresses on a fragmented subnet.
func (r *Reconciler) assign(ctx context.Context, o PlanOptions, a *Assignment, subnet string) (Assigned, error) {
	if !o.Prefixes {
		return r.Provider.Assign(ctx, a.Interface, a.Count, false)
	}
	if !r.Cooling(fragmented(subnet)) {
		got, err := r.Provider.Assign(ctx, a.Interface, a.Count, true)
		if KindOf(err) != KindNoContiguousPrefix {
			return got, err
		}
		// Free addresses, but no free aligned /28: ask the subnet no
		// prefix for a while rather than twice a round.
		r.Cool(fragmented(subnet))
	}
	if a.Fallback <= 0 {
		return Assigned{}, nil
	}
	return r.Provider.Assign(ctx, a.Interface, a.Fallback, false)
}

// fragmented is the cooling key of a subnet that had no free aligned
// prefix.
func fragmented(subnet string) string { return "prefixes " + subnet }

// subnetOf is the subnet of inst's interface id.
func subnetOf(inst Instance, id string) string {
	for _, f := range inst.Interfaces {
		if f.ID == id {
			return f.SubnetID
		}
	}
	return ""
}

// create makes a new interface with c.Count units for node, trying the
// subnets Plan chose in turn.
func (r *Reconciler) create(ctx context.Context, o PlanOptions, node string, inst Instance, c *Creation) (Interface, error) {
	n := c.Count
	need := n
	if o.Prefixes {
		need = n * IPv4PrefixSize
	}
	if len(c.Subnets) == 0 {
		return Interface{}, &Error{Kind: KindSubnetFull, Code: "NoSubnet", Message: fmt.Sprintf("no subnet of %s in %s has room for %d addresses", inst.VPC, inst.Zone, need)}
	}
	explicit := r.SecurityGroups
	if len(explicit) == 0 && len(r.SecurityGroupTags) > 0 {
		byTags, err := r.Interfaces.SecurityGroups(ctx, inst.VPC, r.SecurityGroupTags)
		if err != nil {
			return Interface{}, err
		}
		if len(byTags) == 0 {
			return Interface{}, &Error{Kind: KindNoSecurityGroup, Code: "NoSecurityGroup",
				Message: fmt.Sprintf("no security group of %s carries the tags %v: no interface created for %s", inst.VPC, r.SecurityGroupTags, inst.ID)}
		}
		explicit = byTags
	}
	groups := SecurityGroupsFor(inst, explicit)
	if len(groups) == 0 {
		return Interface{}, fmt.Errorf("instance %s: no security group to give a new interface (none configured, and no primary interface to copy)", inst.ID)
	}
	tags := maps.Clone(r.Tags)
	if tags == nil {
		tags = map[string]string{}
	}
	tags[TagNode] = node
	var errs []error
	for _, sn := range c.Subnets {
		if r.Cooling(sn.ID) {
			continue // refused another round meanwhile
		}
		spec := InterfaceSpec{Instance: inst.ID, Subnet: sn.ID, SecurityGroups: groups, Tags: tags, FirstDevice: o.FirstDevice}
		if o.Prefixes && !r.Cooling(fragmented(sn.ID)) {
			spec.Prefixes = n
		} else if o.Prefixes {
			spec.Addresses = c.Fallback
		} else {
			spec.Addresses = n
		}
		f, err := r.Interfaces.CreateInterface(ctx, spec)
		if spec.Prefixes > 0 && KindOf(err) == KindNoContiguousPrefix && c.Fallback > 0 {
			// The same subnet, with single addresses (cilium#29634).
			r.Cool(fragmented(sn.ID))
			spec.Prefixes, spec.Addresses = 0, c.Fallback
			f, err = r.Interfaces.CreateInterface(ctx, spec)
		}
		switch KindOf(err) {
		case KindSubnetFull, KindNoContiguousPrefix:
			r.Cool(sn.ID)
			errs = append(errs, err)
			continue
		}
		return f, err
	}
	if len(errs) == 0 {
		return Interface{}, &Error{Kind: KindSubnetFull, Code: "NoSubnet", Message: fmt.Sprintf("no subnet of %s in %s has room for %d addresses", inst.VPC, inst.Zone, need)}
	}
	return Interface{}, errors.Join(errs...)
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Cooling reports whether key (a subnet id, or a key of the caller's
// making for it) is in its cooldown; Cool starts one. The workers cool a
// subnet that delegated no IPv6 prefix with them.
func (r *Reconciler) Cooling(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.now().Before(r.cooling[id])
}

// Cool starts id's cooldown (see Cooling).
func (r *Reconciler) Cool(id string) {
	d := r.SubnetCooldown
	if d == 0 {
		d = DefaultSubnetCooldown
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cooling == nil {
		r.cooling = map[string]time.Time{}
	}
	r.cooling[id] = r.now().Add(d)
}
