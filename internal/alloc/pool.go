package alloc

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

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
	// Disabled pools carve no new block; leases of existing blocks go on.
	Disabled bool
	// SkipMasquerade is returned with each lease, for the datapath to keep
	// the Pod's source address (Cilium's ipam.cilium.io/skip-masquerade).
	SkipMasquerade bool
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
	Leased         int64 // pending + active
	Cooling        int64
}

// Free is what can still be leased without carving.
func (s PoolFamilyStatus) Free() int64 { return max(s.AddressesTotal-s.Leased-s.Cooling, 0) }

// BlocksPossible is the number of blocks of the family's mask its CIDRs hold.
func (pf PoolFamily) BlocksPossible() int64 {
	var n int64
	for _, c := range pf.CIDRs {
		n += int64(1) << (pf.MaskSize - c.Bits())
	}
	return n
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
	if _, err := LabelSelector("spec.podSelector", s.PodSelector); err != nil {
		return err
	}
	if _, err := LabelSelector("spec.namespaceSelector", s.NamespaceSelector); err != nil {
		return err
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
		for j := range i {
			if pf.CIDRs[j].Overlaps(c) {
				return &Error{Kind: KindOverlap, Field: field, Detail: fmt.Sprintf("%s overlaps %s in the same list", c, pf.CIDRs[j])}
			}
		}
		if err := checkMask(c, pf.MaskSize, field, base+".maskSize"); err != nil {
			return err
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
	}
	return nil
}

func immutable(field, detail string) *Error {
	return &Error{Kind: KindImmutable, Field: field, Detail: detail}
}
