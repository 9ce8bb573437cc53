// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

var (
	m5large  = Limits{Interfaces: 3, IPv4PerInterface: 10, IPv6PerInterface: 10, Prefixes: true}
	t3small  = Limits{Interfaces: 3, IPv4PerInterface: 4, IPv6PerInterface: 4, Prefixes: true}
	t2medium = Limits{Interfaces: 3, IPv4PerInterface: 6, IPv6PerInterface: 6}
	c5xlarge = Limits{Interfaces: 4, IPv4PerInterface: 15, IPv6PerInterface: 15, Prefixes: true}
)

// eni makes interface device of a test instance holding n secondary
// addresses from 10.0.<device>.10 on, and prefixes.
func eni(device, n int, prefixes ...string) Interface {
	f := Interface{ID: fmt.Sprintf("eni-%d", device), DeviceIndex: device, Primary: netip.AddrFrom4([4]byte{10, 0, byte(device), 4})}
	for i := range n {
		f.Addresses = append(f.Addresses, netip.AddrFrom4([4]byte{10, 0, byte(device), byte(10 + i)}))
	}
	for _, p := range prefixes {
		f.Prefixes = append(f.Prefixes, netip.MustParsePrefix(p))
	}
	return f
}

// in is f in subnet id.
func in(f Interface, id string) Interface {
	f.SubnetID = id
	return f
}

// tagged is f with tag k=v.
func tagged(f Interface, k, v string) Interface {
	f.Tags = map[string]string{k: v}
	return f
}

// ours is f as the workers create it: with the cluster tag.
func ours(f Interface) Interface { return tagged(f, TagCluster, "test") }

// withIPv6 is f holding the node's IPv6 /80.
func withIPv6(f Interface) Interface {
	f.IPv6Prefixes = []netip.Prefix{netip.MustParsePrefix("2600:1f18:aaaa:bb01:1::/80")}
	return f
}

// unmanaged is f as the provider marks one not the workers' to use.
func unmanaged(f Interface) Interface {
	f.Unmanaged = true
	return f
}

// uses marks the first n secondary addresses of f used.
func uses(used map[netip.Addr]bool, f Interface, n int) map[netip.Addr]bool {
	if used == nil {
		used = map[netip.Addr]bool{}
	}
	for _, a := range f.Addresses[:n] {
		used[a] = true
	}
	return used
}

func addrs(device int, from, to int) []netip.Addr {
	var out []netip.Addr
	for i := from; i >= to; i-- {
		out = append(out, netip.AddrFrom4([4]byte{10, 0, byte(device), byte(10 + i)}))
	}
	return out
}

func TestPlanNode(t *testing.T) {
	full0, full1, full2 := eni(0, 9), eni(1, 9), eni(2, 9)
	busy1 := eni(1, 20)
	busy1.Addresses = busy1.Addresses[:9]
	half := eni(1, 9)
	leaving := func(f Interface) Interface { f.Detaching = true; return f }
	pre := func(n int) Sizing { return Sizing{Watermarks: alloc.Watermarks{PreAllocate: n}} }
	warm := func(t alloc.WarmTargets) Sizing { return Sizing{WarmTargets: &t} }
	for _, c := range []struct {
		name string
		s    NodeState
		o    PlanOptions
		want Plan
	}{
		{"a new node takes pre-allocate on its primary interface",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 0)}}},
			PlanOptions{Sizing: pre(8)}, Plan{Assign: &Assignment{Interface: "eni-0", Count: 8}}},
		{"Pods waiting beyond the need surge the round (need 8, 12 waiting)",
			NodeState{Instance: Instance{Limits: c5xlarge, Interfaces: []Interface{eni(0, 2)}}, Used: uses(nil, eni(0, 2), 2), Pending: 12},
			PlanOptions{Sizing: pre(8)}, Plan{Assign: &Assignment{Interface: "eni-0", Count: 12}}},
		{"a round is bounded by the interface's free slots",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 8)}}, Used: uses(nil, eni(0, 8), 4), Pending: 10},
			PlanOptions{Sizing: pre(8)}, Plan{Assign: &Assignment{Interface: "eni-0", Count: 1}}},
		{"a full interface: a new one, as large as the need",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{full0}}, Used: uses(nil, full0, 9)},
			PlanOptions{Sizing: pre(8)}, Plan{Create: &Creation{Count: 8}}},
		{"every interface full, none left to add",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{full0, full1, full2}}, Used: uses(uses(uses(nil, full0, 9), full1, 9), full2, 5)},
			PlanOptions{Sizing: pre(8)}, Plan{Full: true}},
		{"an interface being detached holds nothing for Pods: a new one",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{full0, leaving(eni(1, 9))}}, Used: uses(nil, full0, 9)},
			PlanOptions{Sizing: pre(8)}, Plan{Create: &Creation{Count: 8}}},
		{"interfaces being detached still count against the instance's",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{full0, leaving(eni(1, 9)), leaving(eni(2, 9))}}, Used: uses(nil, full0, 9)},
			PlanOptions{Sizing: pre(8)}, Plan{Full: true}},
		{"interfaces below the first device hold no Pod address",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 0)}}},
			PlanOptions{Sizing: pre(8), FirstDevice: 1}, Plan{Create: &Creation{Count: 8}}},
		{"an interface carrying the excluded tags is not counted: the need goes to the next",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 0), tagged(eni(1, 9), "cilium-exclude", "yes")}}},
			PlanOptions{Sizing: pre(4), ExcludeTags: map[string]string{"cilium-exclude": "yes"}}, Plan{Assign: &Assignment{Interface: "eni-0", Count: 4}}},
		{"an excluded interface is added to by no round, even with free slots",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{tagged(eni(0, 0), "role", "system"), full1}}, Used: uses(nil, full1, 9)},
			PlanOptions{Sizing: pre(4), ExcludeTags: map[string]string{"role": "system"}}, Plan{Create: &Creation{Count: 4}}},
		{"an excluded interface's unused addresses are never given back (9 held, 2 used, pre-allocate 4: 3 from eni-0)",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 9), tagged(eni(1, 9), "role", "system")}}, Used: uses(nil, eni(0, 9), 2)},
			PlanOptions{Sizing: pre(4), ExcludeTags: map[string]string{"role": "system"}}, Plan{Release: &Release{Interface: "eni-0", Addresses: addrs(0, 8, 6)}}},
		{"excluded interfaces still count against the instance's",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{full0, tagged(eni(1, 0), "role", "system"), full2}}, Used: uses(uses(nil, full0, 9), full2, 9)},
			PlanOptions{Sizing: pre(4), ExcludeTags: map[string]string{"role": "system"}}, Plan{Full: true}},
		{"only an interface carrying every excluded tag is excluded",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{tagged(eni(0, 4), "role", "system")}}},
			PlanOptions{Sizing: pre(4), ExcludeTags: map[string]string{"role": "system", "team": "net"}}, Plan{}},
		{"prefixes: the need in /28s",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 0)}}},
			PlanOptions{Sizing: pre(20), Prefixes: true}, Plan{Assign: &Assignment{Interface: "eni-0", Count: 2, Fallback: 9}}},
		{"prefixes on a full interface: the new one's fallback is the addresses lacking",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{full0}}, Used: uses(nil, full0, 9)},
			PlanOptions{Sizing: pre(5), Prefixes: true}, Plan{Create: &Creation{Count: 1, Fallback: 5}}},
		{"excess (11 held, 4 used, pre-allocate 4: 3): the interface with the most unused, highest first",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 2), half}}, Used: uses(uses(nil, eni(0, 2), 2), half, 2)},
			PlanOptions{Sizing: pre(4)}, Plan{Release: &Release{Interface: "eni-1", Addresses: addrs(1, 8, 6)}}},
		{"a used address is never given back, however high",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 9)}}, Used: map[netip.Addr]bool{netip.MustParseAddr("10.0.0.18"): true, netip.MustParseAddr("10.0.0.17"): true}},
			PlanOptions{Sizing: pre(4)}, Plan{Release: &Release{Interface: "eni-0", Addresses: addrs(0, 6, 4)}}},
		{"reserved addresses are free for the sizing (9 held, 2 used, 3 reserved, pre-allocate 4: 3 in excess) but never given back",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 9)}}, Used: uses(nil, eni(0, 9), 2),
				Reserved: map[netip.Addr]bool{netip.MustParseAddr("10.0.0.18"): true, netip.MustParseAddr("10.0.0.17"): true, netip.MustParseAddr("10.0.0.16"): true}},
			PlanOptions{Sizing: pre(4)}, Plan{Release: &Release{Interface: "eni-0", Addresses: addrs(0, 5, 3)}}},
		{"the primary address is never given back",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 3)}}},
			PlanOptions{Sizing: pre(1), UsePrimary: true}, Plan{Release: &Release{Interface: "eni-0", Addresses: addrs(0, 2, 0)}}},
		{"prefix interfaces give back only wholly unused prefixes",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 0, "10.9.0.16/28", "10.9.0.32/28", "10.9.0.48/28")}},
				Used: map[netip.Addr]bool{netip.MustParseAddr("10.9.0.20"): true}},
			PlanOptions{Sizing: pre(8), Prefixes: true}, Plan{Release: &Release{Interface: "eni-0", Prefixes: []netip.Prefix{netip.MustParsePrefix("10.9.0.48/28"), netip.MustParsePrefix("10.9.0.32/28")}}}},
		{"an interface whose subnet has no room gets nothing: a new interface",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{in(eni(0, 0), "full")}}, SubnetFree: map[string]int{"full": 0}},
			PlanOptions{Sizing: pre(8)}, Plan{Create: &Creation{Count: 8}}},
		{"the next interface whose subnet has room",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{in(eni(0, 0), "full"), in(eni(1, 0), "room")}}, SubnetFree: map[string]int{"full": 0, "room": 100}},
			PlanOptions{Sizing: pre(8)}, Plan{Assign: &Assignment{Interface: "eni-1", Count: 8}}},
		{"an add is bounded by its subnet's room",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{in(eni(0, 0), "low")}}, SubnetFree: map[string]int{"low": 3}},
			PlanOptions{Sizing: pre(8)}, Plan{Assign: &Assignment{Interface: "eni-0", Count: 3}}},
		{"a subnet not read has room",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{in(eni(0, 0), "unread")}}, SubnetFree: map[string]int{"full": 0}},
			PlanOptions{Sizing: pre(8)}, Plan{Assign: &Assignment{Interface: "eni-0", Count: 8}}},
		{"free slots only in full subnets, no interface left to add: waiting for room, not full",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{full0, in(eni(1, 2), "full"), in(eni(2, 0), "full")}}, Used: uses(uses(nil, full0, 9), eni(1, 2), 2),
				SubnetFree: map[string]int{"full": 0}},
			PlanOptions{Sizing: pre(8)}, Plan{SubnetFull: true}},
		{"prefixes: a subnet with fewer free than a /28 has no room",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{in(eni(0, 0), "low")}}, SubnetFree: map[string]int{"low": 15}},
			PlanOptions{Sizing: pre(20), Prefixes: true}, Plan{Create: &Creation{Count: 2, Fallback: 9}}},
		{"prefixes: as many /28s as the subnet has room for, the fallback within it",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{in(eni(0, 0), "low")}}, SubnetFree: map[string]int{"low": 20}},
			PlanOptions{Sizing: pre(40), Prefixes: true}, Plan{Assign: &Assignment{Interface: "eni-0", Count: 1, Fallback: 9}}},
		{"VPC CNI: a whole interface's worth on a new node",
			NodeState{Instance: Instance{Limits: t3small, Interfaces: []Interface{eni(0, 0)}}},
			PlanOptions{Sizing: warm(alloc.WarmTargets{})}, Plan{Assign: &Assignment{Interface: "eni-0", Count: 3}}},
		{"VPC CNI: an interface in surplus goes, the last with no Pod",
			NodeState{Instance: Instance{Limits: t3small, Interfaces: []Interface{eni(0, 3), ours(eni(1, 3)), ours(eni(2, 3))}}},
			PlanOptions{Sizing: warm(alloc.WarmTargets{})}, Plan{Detach: "eni-2"}},
		{"VPC CNI: a busy interface stays",
			NodeState{Instance: Instance{Limits: t3small, Interfaces: []Interface{eni(0, 3), ours(eni(1, 3)), ours(eni(2, 3))}}, Used: uses(nil, eni(2, 3), 1)},
			PlanOptions{Sizing: warm(alloc.WarmTargets{})}, Plan{Detach: "eni-1"}},
		{"VPC CNI: an interface the workers did not create is never detached",
			NodeState{Instance: Instance{Limits: t3small, Interfaces: []Interface{eni(0, 3), ours(eni(1, 3)), eni(2, 3)}}},
			PlanOptions{Sizing: warm(alloc.WarmTargets{})}, Plan{Detach: "eni-1"}},
		{"VPC CNI: the interface holding the node's IPv6 prefix is never detached",
			NodeState{Instance: Instance{Limits: t3small, Interfaces: []Interface{eni(0, 3), ours(eni(1, 3)), withIPv6(ours(eni(2, 3)))}}},
			PlanOptions{Sizing: warm(alloc.WarmTargets{})}, Plan{Detach: "eni-1"}},
		{"an unmanaged interface is neither counted nor added to",
			NodeState{Instance: Instance{Limits: c5xlarge, Interfaces: []Interface{eni(0, 0), unmanaged(eni(1, 3)), unmanaged(eni(2, 0))}}},
			PlanOptions{Sizing: pre(4), FirstDevice: 1}, Plan{Create: &Creation{Count: 4}}},
		{"VPC CNI: the primary interface is never detached",
			NodeState{Instance: Instance{Limits: t3small, Interfaces: []Interface{eni(0, 3), eni(1, 3), eni(2, 3)}}, Used: uses(uses(nil, eni(2, 3), 1), eni(1, 3), 1)},
			PlanOptions{Sizing: warm(alloc.WarmTargets{})}, Plan{}},
		{"VPC CNI: beyond the warm target, the minimum kept (9 held, 2 used: 4)",
			NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{eni(0, 9)}}, Used: uses(nil, eni(0, 9), 2)},
			PlanOptions{Sizing: warm(alloc.WarmTargets{WarmIP: 2, MinimumIP: 5})}, Plan{Release: &Release{Interface: "eni-0", Addresses: addrs(0, 8, 5)}}},
		{"VPC CNI: never past max Pods",
			NodeState{Instance: Instance{Limits: t2medium, Interfaces: []Interface{busy1}}, Used: uses(nil, busy1, 9)},
			PlanOptions{Sizing: warm(alloc.WarmTargets{WarmIP: 4}), MaxPods: 9}, Plan{}},
	} {
		got, err := PlanNode(c.s, c.o)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %s\nwant %s", c.name, show(got), show(c.want))
		}
	}
}

func show(p Plan) string {
	s := fmt.Sprintf("full=%v subnetFull=%v detach=%q", p.Full, p.SubnetFull, p.Detach)
	if p.Assign != nil {
		s += fmt.Sprintf(" assign=%+v", *p.Assign)
	}
	if p.Create != nil {
		s += fmt.Sprintf(" create=%+v", *p.Create)
	}
	if p.Release != nil {
		s += fmt.Sprintf(" release=%+v", *p.Release)
	}
	return s
}

// TestPlanNodeFallsBackOnXen: a prefix pool's node on a Xen type is
// planned single addresses, as the VPC CNI and Cilium fall back, sized as
// a secondary-address node (WARM_ENI_TARGET's 5 addresses of a t2.medium
// interface, not WARM_PREFIX_TARGET's /28).
func TestPlanNodeFallsBackOnXen(t *testing.T) {
	o := PlanOptions{Prefixes: true, Sizing: Sizing{WarmTargets: &alloc.WarmTargets{WarmPrefix: 1}}}
	plan, err := PlanNode(NodeState{Instance: Instance{Type: "t2.medium", Limits: t2medium, Interfaces: []Interface{eni(0, 0)}}}, o)
	if err != nil || plan.Assign == nil || plan.Assign.Count != 5 || plan.Assign.Fallback != 0 {
		t.Fatalf("plan %s (%v); want 5 single addresses on eni-0", show(plan), err)
	}
	if got, fell := o.On(t2medium); got.Prefixes || !fell {
		t.Fatalf("On(t2.medium) = %+v, %v", got, fell)
	}
	if got, fell := o.On(m5large); !got.Prefixes || fell {
		t.Fatalf("On(m5.large) = %+v, %v", got, fell)
	}
}

// TestPlanNodePrefixMaxPods: sized by warm prefixes, an m5.large in
// prefix mode grows past the secondary addresses' 29 max Pods up to the
// VPC CNI's 110 (7 /28s), and no further; a pool's max Pods wins.
func TestPlanNodePrefixMaxPods(t *testing.T) {
	wt := Sizing{WarmTargets: &alloc.WarmTargets{WarmPrefix: 1}}
	prefixes := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("10.0.%d.0/28", i))
		}
		return out
	}
	for _, c := range []struct {
		held, maxPods, want int
	}{
		{2, 0, 1}, // 32 held, all used: the 33rd Pod needs a third /28
		{6, 0, 1}, // 96 < 110
		{7, 0, 0}, // 112 >= 110
		{2, 40, 1},
		{3, 40, 0}, // 48 >= the pool's 40
	} {
		f := eni(0, 0, prefixes(c.held)...)
		used := map[netip.Addr]bool{}
		for _, p := range f.Prefixes {
			for a := p.Addr(); p.Contains(a); a = a.Next() {
				used[a] = true
			}
		}
		plan, err := PlanNode(NodeState{Instance: Instance{Limits: m5large, Interfaces: []Interface{f}}, Used: used},
			PlanOptions{Prefixes: true, Sizing: wt, MaxPods: c.maxPods})
		got := 0
		if plan.Assign != nil {
			got = plan.Assign.Count
		}
		if err != nil || got != c.want {
			t.Errorf("%d /28s held, all used, max Pods %d: plan %s (%v); want %d more", c.held, c.maxPods, show(plan), err, c.want)
		}
	}
}

func TestChooseSubnets(t *testing.T) {
	inst := Instance{VPC: "vpc-1", Zone: "a", SubnetID: "own"}
	subnets := []Subnet{
		{ID: "own", VPC: "vpc-1", Zone: "a", Free: 20},
		{ID: "big", VPC: "vpc-1", Zone: "a", Free: 500, Tags: map[string]string{"kubernetes.io/role/cni": "1"}},
		{ID: "mid", VPC: "vpc-1", Zone: "a", Free: 100, Tags: map[string]string{"kubernetes.io/role/cni": "1"}},
		{ID: "tiny", VPC: "vpc-1", Zone: "a", Free: 3},
		{ID: "other-zone", VPC: "vpc-1", Zone: "b", Free: 1000},
		{ID: "other-vpc", VPC: "vpc-2", Zone: "a", Free: 1000},
	}
	ids := func(ss []Subnet) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.ID)
		}
		return out
	}
	for _, c := range []struct {
		name    string
		sel     SubnetSelector
		need    int
		cooling func(string) bool
		want    []string
	}{
		{"the node's own subnet first, then the most free", SubnetSelector{}, 8, nil, []string{"own", "big", "mid"}},
		{"the own subnet without room is left out", SubnetSelector{}, 20, nil, []string{"big", "mid"}},
		{"by tags, most free first", SubnetSelector{Tags: map[string]string{"kubernetes.io/role/cni": "1"}}, 8, nil, []string{"big", "mid"}},
		{"by ids, never across zones", SubnetSelector{IDs: []string{"tiny", "mid", "other-zone"}}, 2, nil, []string{"mid", "tiny"}},
		{"a cooling subnet is skipped", SubnetSelector{}, 8, func(id string) bool { return id == "big" }, []string{"own", "mid"}},
	} {
		if got := ids(ChooseSubnets(subnets, inst, c.sel, c.need, c.cooling)); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestSecurityGroupsFor(t *testing.T) {
	inst := Instance{Interfaces: []Interface{{DeviceIndex: 1, SecurityGroups: []string{"sg-pods"}}, {DeviceIndex: 0, SecurityGroups: []string{"sg-node", "sg-ssh"}}}}
	if got := SecurityGroupsFor(inst, nil); !reflect.DeepEqual(got, []string{"sg-node", "sg-ssh"}) {
		t.Errorf("copied %v, want the primary interface's", got)
	}
	if got := SecurityGroupsFor(inst, []string{"sg-x"}); !reflect.DeepEqual(got, []string{"sg-x"}) {
		t.Errorf("explicit %v", got)
	}
	if got := SecurityGroupsFor(Instance{}, nil); got != nil {
		t.Errorf("no primary interface: %v", got)
	}
}
