// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"time"
)

// DefaultSubnetCooldown is how long a subnet that ran out of addresses is
// skipped for new interfaces (Cilium's and the VPC CNI's two minutes).
const DefaultSubnetCooldown = 2 * time.Minute

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

	mu      sync.Mutex           // guards cooling
	cooling map[string]time.Time // subnet -> until when it is skipped
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
// with what the node says of its own interfaces) and makes its one add: to an
// interface with room (a prefix request on a subnet without a free
// aligned /28 falls back to single addresses, and the subnet is asked no
// prefix for its cooldown), or to a new interface in the first subnet
// with room (a subnet that answers full cools down and the next is
// tried). It answers the plan and what was added; with nothing to add, an
// empty Added.
func (r *Reconciler) Round(ctx context.Context, node string, s NodeState, o PlanOptions) (Plan, Added, error) {
	// Prefixes only where the type takes them, as PlanNode plans.
	o, _ = o.On(s.Instance.Limits)
	plan, err := PlanNode(s, o)
	if err != nil {
		return plan, Added{}, err
	}
	switch {
	case plan.Assign != nil:
		got, err := r.assign(ctx, o, plan.Assign, subnetOf(s.Instance, plan.Assign.Interface))
		return plan, Added{Interface: plan.Assign.Interface, Addresses: got.Addresses, Prefixes: got.Prefixes}, err
	case plan.Create != nil && r.Interfaces != nil:
		f, err := r.create(ctx, o, node, s.Instance, plan.Create)
		return plan, Added{Interface: f.ID, Created: err == nil, NewInterface: f, Addresses: f.Addresses, Prefixes: f.Prefixes}, err
	}
	return plan, Added{}, nil
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

// create makes a new interface with n units for node, trying the chosen
// subnets in turn.
func (r *Reconciler) create(ctx context.Context, o PlanOptions, node string, inst Instance, c *Creation) (Interface, error) {
	n := c.Count
	subnets, err := r.Interfaces.Subnets(ctx, inst.VPC, inst.Zone)
	if err != nil {
		return Interface{}, err
	}
	need := n
	if o.Prefixes {
		need = n * IPv4PrefixSize
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
	for _, sn := range ChooseSubnets(subnets, inst, r.Subnets, need, r.Cooling) {
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
