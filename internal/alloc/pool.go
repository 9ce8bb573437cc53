// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"

	"go4.org/netipx"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxCIDRsPerFamily caps a pool family's CIDR list, as cilium.io/v2 does.
const MaxCIDRsPerFamily = 32

// MaxReservedRangesPerCIDR caps the reserved ranges of one pool CIDR.
const MaxReservedRangesPerCIDR = 32

// MaxPreAllocate caps a pool's pre-allocation (addresses per node and
// family kept available beyond demand).
const MaxPreAllocate = 1 << 16

// DefaultPreAllocate is the pre-allocation of the default pool when its
// spec sets none; other pools default to 0 (Cilium's
// --ipam-multi-pool-pre-allocation, empty meaning "default=8").
const DefaultPreAllocate = 8

// MaxBlocksPerNodeLimit bounds a pool's maxBlocksPerNode: a /8 in /32
// blocks has 2^24.
const MaxBlocksPerNodeLimit = 1 << 24

// DefaultNodeBlockAddresses sizes the default per-node block limit of a
// pool that sets no maxBlocksPerNode: as many blocks as hold this many
// leasable addresses, at least one. Kubernetes runs at most a few hundred
// Pods on a node (110 by default); four times 250 leaves room for
// cooldowns, sticky bindings and churn, while no node certificate can
// take a pool's every block. The unit is Cilium's max-allocate's
// (addresses per node); the limit is counted in blocks, the unit a node
// takes from a pool (see BlockLimit).
const DefaultNodeBlockAddresses = 1024

// BlockLimit is the most blocks of family f (node blocks of mask bits,
// laid out with allowFirst, allowLast and nl) one node may hold of a pool
// whose maxBlocksPerNode is maxBlocks (nil: the default, enough blocks for
// DefaultNodeBlockAddresses leasable addresses, at least one).
func BlockLimit(maxBlocks *int, f Family, mask int, allowFirst, allowLast bool, nl NodeLocal) int64 {
	if maxBlocks != nil {
		return int64(*maxBlocks)
	}
	base := netip.IPv4Unspecified()
	if f == IPv6 {
		base = netip.IPv6Unspecified()
	}
	c := BlockLayout(netip.PrefixFrom(base, mask), allowFirst, allowLast, nl).Capacity
	if c <= 0 {
		return 1
	}
	return max((DefaultNodeBlockAddresses+c-1)/c, 1)
}

// NodeCapacityLimit is the leasable addresses of the most blocks of family
// f one node may hold (BlockLimit blocks of the pool's layout).
func NodeCapacityLimit(maxBlocks *int, f Family, mask int, allowFirst, allowLast bool, nl NodeLocal) int64 {
	base := netip.IPv4Unspecified()
	if f == IPv6 {
		base = netip.IPv6Unspecified()
	}
	c := BlockLayout(netip.PrefixFrom(base, mask), allowFirst, allowLast, nl).Capacity
	return BlockLimit(maxBlocks, f, mask, allowFirst, allowLast, nl) * max(c, 0)
}

// BlockLimit is the pool's per-node block limit of family f (see the
// function BlockLimit); 0 when the pool lacks f.
func (s PoolSpec) BlockLimit(f Family) int64 {
	pf := s.Family(f)
	if pf == nil {
		return 0
	}
	return BlockLimit(s.MaxBlocksPerNode, f, pf.MaskSize, s.AllowFirstIP, s.AllowLastIP, s.NodeLocal)
}

// specialPurpose are the ranges no Pod pool CIDR, VIP pool block or CIDR
// group CIDR may overlap unless its object allows it
// (AllowSpecialPurpose): addresses that are not unicast addresses of a
// host on a network (RFC 6890 and its IPv6 registry). Migrations 00007
// (pools) and 00025 (VIP pools, CIDR groups) repeat the list in SQL.
var specialPurpose = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this network"
	netip.MustParsePrefix("127.0.0.0/8"),    // loopback
	netip.MustParsePrefix("169.254.0.0/16"), // link-local
	netip.MustParsePrefix("224.0.0.0/4"),    // multicast
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, and the limited broadcast 255.255.255.255
	netip.MustParsePrefix("::/128"),         // unspecified
	netip.MustParsePrefix("::1/128"),        // loopback
	netip.MustParsePrefix("::ffff:0:0/96"),  // IPv4-mapped: IPv4 addresses in IPv6 clothing
	netip.MustParsePrefix("fe80::/10"),      // link-local
	netip.MustParsePrefix("ff00::/8"),       // multicast
}

// specialPurposeSet is specialPurpose as a set, for overlap tests.
var specialPurposeSet = func() *netipx.IPSet {
	var b netipx.IPSetBuilder
	for _, p := range specialPurpose {
		b.AddPrefix(p)
	}
	s, err := b.IPSet()
	if err != nil {
		panic(err)
	}
	return s
}()

// SpecialPurposeOverlap answers the first special-purpose range c
// overlaps (loopback, link-local, multicast, "this network", reserved,
// unspecified, IPv4-mapped), and false when it overlaps none.
func SpecialPurposeOverlap(c netip.Prefix) (netip.Prefix, bool) {
	return SpecialPurposeOverlapRange(netipx.RangeOfPrefix(c))
}

// SpecialPurposeOverlapRange is SpecialPurposeOverlap for an address
// range (a VIP pool's start/stop block), which may reach into a
// special-purpose range without being a prefix: 126.255.255.0 to
// 128.0.0.0 holds all of 127.0.0.0/8. An invalid range overlaps none.
func SpecialPurposeOverlapRange(r netipx.IPRange) (netip.Prefix, bool) {
	if !r.IsValid() || !specialPurposeSet.OverlapsRange(r) {
		return netip.Prefix{}, false
	}
	for _, p := range specialPurpose {
		if netipx.RangeOfPrefix(p).Overlaps(r) {
			return p, true
		}
	}
	return netip.Prefix{}, false // unreachable: the set is the list
}

// PoolFamily is one family of a pool: its CIDRs and the node block size.
type PoolFamily struct {
	CIDRs    []netip.Prefix
	MaskSize int
	// Reserved lists, per CIDR, address ranges no new block may overlap
	// (Cilium 1.21's pool[].reservedRanges): blocks already carved there
	// keep working, so a CIDR can be retired without orphans.
	Reserved []CIDRReservation
}

// CIDRReservation is the reserved ranges of one CIDR of a pool family.
type CIDRReservation struct {
	CIDR   netip.Prefix
	Ranges []AddrRange
}

// AddrRange is an inclusive range of addresses.
type AddrRange struct {
	Start, End netip.Addr
}

// Overlaps reports whether the range shares an address with p.
func (r AddrRange) Overlaps(p netip.Prefix) bool {
	first, last := p.Masked().Addr(), lastAddr(p)
	return r.Start.Compare(last) <= 0 && first.Compare(r.End) <= 0
}

// Covers reports whether every address of p is in the range.
func (r AddrRange) Covers(p netip.Prefix) bool {
	return r.Start.Compare(p.Masked().Addr()) <= 0 && lastAddr(p).Compare(r.End) <= 0
}

func lastAddr(p netip.Prefix) netip.Addr {
	return AddrAt(p.Masked(), BlockSize(FamilyOf(p.Addr()), p.Bits())-1)
}

// ReservedIn lists the reserved ranges of one CIDR of the family.
func (pf PoolFamily) ReservedIn(cidr netip.Prefix) []AddrRange {
	for _, r := range pf.Reserved {
		if r.CIDR == cidr {
			return r.Ranges
		}
	}
	return nil
}

// PoolMode says how a pool gives nodes blocks.
type PoolMode string

const (
	// ModeMultiPool carves blocks as the node's demand grows and releases
	// the free ones above it (Cilium multi-pool).
	ModeMultiPool PoolMode = "multi-pool"
	// ModeClusterPool gives each node one block per family that never
	// grows (Cilium cluster-pool and Kubernetes host scope).
	ModeClusterPool PoolMode = "cluster-pool"
)

// PoolSpec is what a pool's owner asks for.
type PoolSpec struct {
	IPv4, IPv6   *PoolFamily
	AllowFirstIP bool
	AllowLastIP  bool
	NodeLocal    NodeLocal
	Mode         PoolMode // empty means ModeMultiPool
	// PreAllocate is the addresses per node and family kept available
	// beyond demand (multi-pool); nil means DefaultPreAllocate for the
	// default pool and 0 for others.
	PreAllocate *int
	// Selectors of the selector rule of Select; nil when unset.
	PodSelector, NamespaceSelector *metav1.LabelSelector
	// NodeSelector chooses the pool for the single addresses of the nodes
	// whose labels it matches (Cilium crd mode, SelectNodePool); nil when
	// unset. It plays no part in Select.
	NodeSelector *metav1.LabelSelector
	// Disabled pools carve no new block; leases of existing blocks go on.
	Disabled bool
	// SkipMasquerade is returned with each lease, for the datapath to keep
	// the Pod's source address (Cilium's ipam.cilium.io/skip-masquerade).
	SkipMasquerade bool
	// MaxBlocksPerNode bounds the blocks of each family one node may hold
	// of the pool (carved or adopted); nil means the default (BlockLimit).
	MaxBlocksPerNode *int
	// AllowSpecialPurpose lets the pool's CIDRs overlap special-purpose
	// ranges (SpecialPurposeOverlap), refused otherwise.
	AllowSpecialPurpose bool
	// Cloud, when set, makes this a cloud pool: its nodes' blocks are the
	// addresses and prefixes a cloud gave their interfaces, recorded by
	// the capacity workers, and none is carved (CloudSpec).
	Cloud *CloudSpec
}

// EffectiveMode is Mode with its default.
func (s PoolSpec) EffectiveMode() PoolMode {
	if s.Mode == "" {
		return ModeMultiPool
	}
	return s.Mode
}

// PreAllocation is the pool's effective pre-allocation; defaultPool is the
// server's default pool name.
func (s PoolSpec) PreAllocation(name, defaultPool string) int {
	switch {
	case s.EffectiveMode() == ModeClusterPool:
		return 0
	case s.PreAllocate != nil:
		return *s.PreAllocate
	case name == defaultPool:
		return DefaultPreAllocate
	}
	return 0
}

// Family returns the spec of f, or nil when the pool lacks it.
func (s PoolSpec) Family(f Family) *PoolFamily {
	if f == IPv4 {
		return s.IPv4
	}
	return s.IPv6
}

// Families lists the families the pool has, IPv4 first.
func (s PoolSpec) Families() []Family {
	var fs []Family
	for _, f := range Families {
		if s.Family(f) != nil {
			fs = append(fs, f)
		}
	}
	return fs
}

// Pool is a named set of Pod CIDRs in an address space.
type Pool struct {
	Space     string
	Name      string
	Labels    map[string]string
	Spec      PoolSpec
	CreatedAt time.Time
	UpdatedAt time.Time
	// Status is filled by reads; one entry per family of Spec.
	Status map[Family]PoolFamilyStatus
}

// PoolFamilyStatus counts one family of a pool.
type PoolFamilyStatus struct {
	BlocksPossible int64
	BlocksCarved   int64
	AddressesTotal int64 // leasable addresses in carved blocks
	Leased         int64 // pending + active + reserved (crd mode)
	Cooling        int64
}

// Free is what can still be leased without carving.
func (s PoolFamilyStatus) Free() int64 { return max(s.AddressesTotal-s.Leased-s.Cooling, 0) }

// BlocksPossible is the number of blocks of the family's mask its CIDRs
// hold, at most math.MaxInt64: a cloud pool's CIDRs (a VPC's IPv6 /56,
// blocks of /96) hold more than an int64 counts, as nothing is carved of
// them to bound it.
func (pf PoolFamily) BlocksPossible() int64 {
	var n int64
	for _, c := range pf.CIDRs {
		d := pf.MaskSize - c.Bits()
		if d >= 63 || n > math.MaxInt64-int64(1)<<d {
			return math.MaxInt64
		}
		n += int64(1) << d
	}
	return n
}

// SaturatingMul is a*b for a, b >= 0, math.MaxInt64 when that does not
// fit: what a pool's counts of blocks times addresses per block are.
func SaturatingMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

// Validate checks the spec alone (overlap with other pools is the store's
// job, since only the database sees them all). Errors name the field as a
// JSON path under "spec".
func (s PoolSpec) Validate() error {
	if s.IPv4 == nil && s.IPv6 == nil {
		return Invalid("spec", "a pool needs ipv4, ipv6 or both")
	}
	switch s.Mode {
	case "", ModeMultiPool, ModeClusterPool:
	default:
		return Invalid("spec.mode", "must be %q or %q", ModeMultiPool, ModeClusterPool)
	}
	if p := s.PreAllocate; p != nil && (*p < 0 || *p > MaxPreAllocate) {
		return Invalid("spec.preAllocate", "must be between 0 and %d", MaxPreAllocate)
	}
	if m := s.MaxBlocksPerNode; m != nil && (*m < 1 || *m > MaxBlocksPerNodeLimit) {
		return Invalid("spec.maxBlocksPerNode", "must be between 1 and %d", MaxBlocksPerNodeLimit)
	}
	if _, err := LabelSelector("spec.podSelector", s.PodSelector); err != nil {
		return err
	}
	if _, err := LabelSelector("spec.namespaceSelector", s.NamespaceSelector); err != nil {
		return err
	}
	if _, err := LabelSelector("spec.nodeSelector", s.NodeSelector); err != nil {
		return err
	}
	if c := s.Cloud; c != nil {
		if err := c.Validate("spec.cloud"); err != nil {
			return err
		}
		switch {
		case s.IPv6 != nil && c.Provider != CloudAWS:
			return Invalid("spec.ipv6", "only an AWS cloud pool takes IPv6 (EC2's delegated /80 prefixes); %s gives IPv4 addresses", c.Provider)
		case s.IPv4 == nil:
			return Invalid("spec.ipv4", "a cloud pool lists its subnets' IPv4 CIDRs (and, on AWS, their IPv6 ones in spec.ipv6)")
		case s.Mode == ModeClusterPool:
			return Invalid("spec.mode", "a cloud pool carves no block, so it is no cluster-pool pool")
		}
	}
	for _, f := range Families {
		pf := s.Family(f)
		if pf == nil {
			continue
		}
		if err := pf.validate(f, s); err != nil {
			return err
		}
	}
	return nil
}

func (pf PoolFamily) validate(f Family, s PoolSpec) error {
	base := "spec." + f.String()
	switch n := len(pf.CIDRs); {
	case n == 0:
		return Invalid(base+".cidrs", "must list at least one CIDR")
	case n > MaxCIDRsPerFamily:
		return Invalid(base+".cidrs", "lists %d CIDRs; at most %d are allowed", n, MaxCIDRsPerFamily)
	}
	for i, c := range pf.CIDRs {
		field := fmt.Sprintf("%s.cidrs[%d]", base, i)
		if FamilyOf(c.Addr()) != f {
			return Invalid(field, "%s is not an %s CIDR", c, f)
		}
		if r, ok := SpecialPurposeOverlap(c); ok && !s.AllowSpecialPurpose {
			return Invalid(field, "%s overlaps the special-purpose range %s; set spec.allowSpecialPurpose to lease from it", c, r)
		}
		for j := range i {
			if pf.CIDRs[j].Overlaps(c) {
				return &Error{Kind: KindOverlap, Field: field, Detail: fmt.Sprintf("%s overlaps %s in the same list", c, pf.CIDRs[j])}
			}
		}
		check := checkMask(c, pf.MaskSize, field, base+".maskSize")
		if s.Cloud != nil {
			// Nothing is carved of a cloud pool's CIDRs (a VPC's IPv6 /56,
			// say): only the block size bounds its mask.
			check = checkMaskBounds(c, pf.MaskSize, base+".maskSize")
		}
		if check != nil {
			return check
		}
	}
	l := BlockLayout(netip.PrefixFrom(pf.CIDRs[0].Addr(), pf.MaskSize), s.AllowFirstIP, s.AllowLastIP, s.NodeLocal)
	if l.Capacity < 1 {
		return Invalid(base+".maskSize", "a /%d block has no leasable address left after network, broadcast and %d node-local addresses", pf.MaskSize, s.NodeLocal.Count())
	}
	return pf.validateReserved(f, base+".pool")
}

// validateReserved checks the reserved ranges: each entry names one of the
// family's CIDRs once, and each range lies inside that CIDR, start <= end.
func (pf PoolFamily) validateReserved(f Family, base string) error {
	for i, r := range pf.Reserved {
		field := fmt.Sprintf("%s[%d]", base, i)
		if !slices.Contains(pf.CIDRs, r.CIDR) {
			return Invalid(field+".cidr", "%s is not one of the family's cidrs", r.CIDR)
		}
		if slices.IndexFunc(pf.Reserved, func(o CIDRReservation) bool { return o.CIDR == r.CIDR }) != i {
			return Invalid(field+".cidr", "%s is listed twice", r.CIDR)
		}
		if len(r.Ranges) > MaxReservedRangesPerCIDR {
			return Invalid(field+".reservedRanges", "lists %d ranges; at most %d are allowed", len(r.Ranges), MaxReservedRangesPerCIDR)
		}
		for j, rg := range r.Ranges {
			rf := fmt.Sprintf("%s.reservedRanges[%d]", field, j)
			switch {
			case !rg.Start.IsValid() || FamilyOf(rg.Start) != f || !r.CIDR.Contains(rg.Start):
				return Invalid(rf+".start", "must be an %s address inside %s", f, r.CIDR)
			case !rg.End.IsValid() || FamilyOf(rg.End) != f || !r.CIDR.Contains(rg.End):
				return Invalid(rf+".end", "must be an %s address inside %s", f, r.CIDR)
			case rg.End.Less(rg.Start):
				return Invalid(rf+".end", "%s is before start %s", rg.End, rg.Start)
			}
		}
	}
	return nil
}

// ValidateUpdate checks that next changes no immutable field of prev: the
// mask sizes, allowFirstIP, allowLastIP and the node-local reservations, all
// of which shape blocks already carved.
func ValidateUpdate(prev, next PoolSpec) error {
	for _, f := range Families {
		p, n := prev.Family(f), next.Family(f)
		if p != nil && n != nil && p.MaskSize != n.MaskSize {
			return immutable("spec."+f.String()+".maskSize", fmt.Sprintf("maskSize is immutable (is %d)", p.MaskSize))
		}
	}
	switch {
	case prev.AllowFirstIP != next.AllowFirstIP:
		return immutable("spec.allowFirstIP", "allowFirstIP is immutable")
	case prev.AllowLastIP != next.AllowLastIP:
		return immutable("spec.allowLastIP", "allowLastIP is immutable")
	case prev.NodeLocal != next.NodeLocal:
		return immutable("spec.nodeLocal", "node-local reservations are immutable")
	case prev.EffectiveMode() == ModeMultiPool && next.EffectiveMode() == ModeClusterPool:
		return immutable("spec.mode", "a multi-pool pool cannot become cluster-pool (the migration is one-way)")
	case (prev.Cloud == nil) != (next.Cloud == nil):
		// A carving pool turned cloud pool would keep carved blocks among
		// the cloud's; a cloud pool turned carving would carve inside its
		// subnets.
		return immutable("spec.cloud", "whether a pool takes its addresses from a cloud is immutable")
	case prev.Cloud != nil && prev.Cloud.Provider != next.Cloud.Provider:
		return immutable("spec.cloud.provider", fmt.Sprintf("the provider is immutable (is %s)", prev.Cloud.Provider))
	}
	return nil
}

func immutable(field, detail string) *Error {
	return &Error{Kind: KindImmutable, Field: field, Detail: detail}
}
