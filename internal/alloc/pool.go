package alloc

import (
	"fmt"
	"net/netip"
	"time"
)

// MaxCIDRsPerFamily caps a pool family's CIDR list, as cilium.io/v2 does.
const MaxCIDRsPerFamily = 32

// PoolFamily is one family of a pool: its CIDRs and the node block size.
type PoolFamily struct {
	CIDRs    []netip.Prefix
	MaskSize int
}

// PoolSpec is what a pool's owner asks for.
type PoolSpec struct {
	IPv4, IPv6   *PoolFamily
	AllowFirstIP bool
	AllowLastIP  bool
	NodeLocal    NodeLocal
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
	}
	return nil
}

func immutable(field, detail string) *Error {
	return &Error{Kind: KindImmutable, Field: field, Detail: detail}
}
