// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"net/netip"
	"slices"
	"time"

	"go4.org/netipx"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// LoadBalancer VIP pools, with the semantics of Cilium's LB IPAM
// (CiliumLoadBalancerIPPool, operator/pkg/lbipam): blocks of CIDRs or
// start/stop ranges, a service selector that also sees a Service's
// namespace and name, the first and last address of each CIDR block
// reserved on request, and a disabled pool that keeps what it gave.

// Synthetic labels every Service carries for a pool's serviceSelector,
// as in Cilium.
const (
	LabelServiceNamespace = "io.kubernetes.service.namespace"
	LabelServiceName      = "io.kubernetes.service.name"
)

// MaxLBBlocks bounds a VIP pool's blocks.
const MaxLBBlocks = 256

// LBPoolSpec is what a VIP pool is made of.
type LBPoolSpec struct {
	Blocks []LBBlock
	// ServiceSelector selects the Services the pool serves; nil selects
	// every Service.
	ServiceSelector *metav1.LabelSelector
	// ReserveFirstLast keeps the first and last address of each CIDR
	// block out (Cilium's allowFirstLastIPs: No); blocks of one or two
	// addresses keep theirs, which would otherwise be unusable.
	ReserveFirstLast bool
	// Disabled: no new addresses; those given stay.
	Disabled bool
	// ReservedGroups names CIDR groups of the space whose CIDRs the pool
	// never gives; Reserved are those CIDRs, filled in by the store when
	// it reads the pool.
	ReservedGroups []string
	Reserved       []netip.Prefix
	// AllowSpecialPurpose lets the blocks overlap special-purpose ranges
	// (SpecialPurposeOverlapRange), refused otherwise, as for Pod pools:
	// a VIP of 127.0.0.1 or 224.0.0.1 is never what an operator meant.
	AllowSpecialPurpose bool
}

// MaxLBReservedGroups bounds the CIDR groups a VIP pool names.
const MaxLBReservedGroups = 16

// LBBlock is one block: a CIDR, or the range from Start to Stop.
type LBBlock struct {
	CIDR        netip.Prefix
	Start, Stop netip.Addr
}

// ParseLBBlock reads a block as the API and Cilium write it: cidr, or
// start with an optional stop (none: start alone). field names the block
// in errors.
func ParseLBBlock(field, cidr, start, stop string) (LBBlock, error) {
	switch {
	case cidr != "" && (start != "" || stop != ""):
		return LBBlock{}, Invalid(field, "a block is a cidr or a start/stop range, not both")
	case cidr != "":
		p, err := ParseCanonicalPrefix(cidr)
		if err != nil {
			return LBBlock{}, Invalid(field+".cidr", "%s", err)
		}
		return LBBlock{CIDR: p}, nil
	case start == "":
		return LBBlock{}, Invalid(field, "a block needs a cidr or a start")
	}
	from, err := ParseAddr(start)
	if err != nil {
		return LBBlock{}, Invalid(field+".start", "%s", err)
	}
	to := from
	if stop != "" {
		if to, err = ParseAddr(stop); err != nil {
			return LBBlock{}, Invalid(field+".stop", "%s", err)
		}
	}
	return LBBlock{Start: from, Stop: to}, nil
}

// Range is every address of the block.
func (b LBBlock) Range() netipx.IPRange {
	if b.CIDR.IsValid() {
		return netipx.RangeOfPrefix(b.CIDR)
	}
	return netipx.IPRangeFrom(b.Start, b.Stop)
}

// specialPurpose answers the special-purpose range the block overlaps
// and the part of the block at fault, under field (the block's): its
// cidr; for a range, the start or else the stop when it lies in such a
// range, naming that range; else the block itself, a range passing over
// one from side to side.
func (b LBBlock) specialPurpose(field string) (string, netip.Prefix, bool) {
	if b.CIDR.IsValid() {
		r, ok := SpecialPurposeOverlap(b.CIDR)
		return field + ".cidr", r, ok
	}
	if r, ok := SpecialPurposeOverlap(netip.PrefixFrom(b.Start, b.Start.BitLen())); ok {
		return field + ".start", r, true
	}
	if r, ok := SpecialPurposeOverlap(netip.PrefixFrom(b.Stop, b.Stop.BitLen())); ok {
		return field + ".stop", r, true
	}
	r, ok := SpecialPurposeOverlapRange(b.Range())
	return field, r, ok
}

// String writes the block as its CIDR or as start-stop.
func (b LBBlock) String() string {
	if b.CIDR.IsValid() {
		return b.CIDR.String()
	}
	return b.Start.String() + "-" + b.Stop.String()
}

// Validate checks the spec alone; overlap with other pools (VIP or Pod)
// is the store's job. Errors name the field under "spec". Blocks that
// overlap one another are a KindOverlap: the REST API refuses them.
func (s LBPoolSpec) Validate() error {
	if err := s.ValidateApplied(); err != nil {
		return err
	}
	if i, j, ok := s.SelfOverlap(); ok {
		return &Error{Kind: KindOverlap, Field: fmt.Sprintf("spec.blocks[%d]", i),
			Detail: fmt.Sprintf("%s overlaps spec.blocks[%d] (%s)", s.Blocks[i], j, s.Blocks[j])}
	}
	return nil
}

// SelfOverlap answers the first block i that overlaps an earlier block j
// of the same spec.
func (s LBPoolSpec) SelfOverlap() (i, j int, ok bool) {
	ranges := make([]netipx.IPRange, len(s.Blocks))
	for i, b := range s.Blocks {
		ranges[i] = b.Range()
		for j := range i {
			if ranges[j].Overlaps(ranges[i]) {
				return i, j, true
			}
		}
	}
	return 0, 0, false
}

// ValidateApplied is Validate for a pool applied as a
// CiliumLoadBalancerIPPool: blocks overlapping one another are taken,
// and the pool is marked conflicting until they no longer do
// (SettleLBConflicts), as Cilium's operator takes them.
func (s LBPoolSpec) ValidateApplied() error {
	if len(s.Blocks) == 0 {
		return Invalid("spec.blocks", "a VIP pool needs at least one block")
	}
	if len(s.Blocks) > MaxLBBlocks {
		return Invalid("spec.blocks", "%d blocks; a VIP pool takes at most %d", len(s.Blocks), MaxLBBlocks)
	}
	for i, b := range s.Blocks {
		field := fmt.Sprintf("spec.blocks[%d]", i)
		switch {
		case b.CIDR.IsValid() && (b.Start.IsValid() || b.Stop.IsValid()):
			return Invalid(field, "a block is a cidr or a start/stop range, not both")
		case b.CIDR.IsValid():
			if b.CIDR.Masked() != b.CIDR {
				return Invalid(field+".cidr", "%s has host bits set; the network is %s", b.CIDR, b.CIDR.Masked())
			}
		case !b.Start.IsValid() || !b.Stop.IsValid():
			return Invalid(field, "a block needs a cidr or a start and a stop")
		case b.Start.Is4() != b.Stop.Is4():
			return Invalid(field+".stop", "%s and %s are of different families", b.Start, b.Stop)
		case b.Stop.Less(b.Start):
			return Invalid(field+".stop", "%s comes before start %s", b.Stop, b.Start)
		}
		if f, r, ok := b.specialPurpose(field); ok && !s.AllowSpecialPurpose {
			return Invalid(f, "%s overlaps the special-purpose range %s; set spec.allowSpecialPurpose to give addresses from it", b, r)
		}
	}
	if _, err := LabelSelector("spec.serviceSelector", s.ServiceSelector); err != nil {
		return err
	}
	if len(s.ReservedGroups) > MaxLBReservedGroups {
		return Invalid("spec.reservedCIDRGroups", "%d groups; a VIP pool names at most %d", len(s.ReservedGroups), MaxLBReservedGroups)
	}
	for i, g := range s.ReservedGroups {
		field := fmt.Sprintf("spec.reservedCIDRGroups[%d]", i)
		if err := ValidateLabelName(field, g); err != nil {
			return err
		}
		if slices.Contains(s.ReservedGroups[:i], g) {
			return Invalid(field, "%s is named twice", g)
		}
	}
	return nil
}

// Ranges are the addresses the pool may give, block by block in order:
// a CIDR block of more than two addresses loses its first and last when
// ReserveFirstLast, and every block loses the Reserved CIDRs.
func (s LBPoolSpec) Ranges() []netipx.IPRange {
	out := make([]netipx.IPRange, 0, len(s.Blocks))
	for _, b := range s.Blocks {
		r := b.Range()
		if s.ReserveFirstLast && b.CIDR.IsValid() && b.CIDR.Addr().BitLen()-b.CIDR.Bits() > 1 {
			r = netipx.IPRangeFrom(r.From().Next(), r.To().Prev())
		}
		out = append(out, withoutReserved(r, s.Reserved)...)
	}
	return out
}

// withoutReserved is r less the reserved prefixes, as ranges in order.
func withoutReserved(r netipx.IPRange, reserved []netip.Prefix) []netipx.IPRange {
	if !slices.ContainsFunc(reserved, func(p netip.Prefix) bool { return r.Overlaps(netipx.RangeOfPrefix(p)) }) {
		return []netipx.IPRange{r}
	}
	var b netipx.IPSetBuilder
	b.AddRange(r)
	for _, p := range reserved {
		b.RemovePrefix(p)
	}
	set, err := b.IPSet()
	if err != nil {
		return nil // only for invalid input, which Validate refuses
	}
	return set.Ranges()
}

// Offers reports whether a is an address the pool may give (in a block,
// and not a reserved first or last).
func (s LBPoolSpec) Offers(a netip.Addr) bool {
	return slices.ContainsFunc(s.Ranges(), func(r netipx.IPRange) bool { return r.Contains(a) })
}

// Selects reports whether the pool serves the Service namespace/name
// with labels: its selector sees them with the synthetic namespace and
// name labels added. A nil selector selects every Service.
func (s LBPoolSpec) Selects(namespace, name string, svcLabels map[string]string) (bool, error) {
	sel, err := LabelSelector("spec.serviceSelector", s.ServiceSelector)
	if err != nil || sel == nil {
		return err == nil, err
	}
	set := make(labels.Set, len(svcLabels)+2)
	for k, v := range svcLabels {
		set[k] = v
	}
	set[LabelServiceNamespace], set[LabelServiceName] = namespace, name
	return sel.Matches(set), nil
}

// LBPool is a named VIP pool of an address space.
type LBPool struct {
	Space  string
	Name   string
	Labels map[string]string
	Spec   LBPoolSpec
	// Origin owns the pool: the database, or the
	// CiliumLoadBalancerIPPool it was imported from.
	Origin    Origin
	CreatedAt time.Time
	UpdatedAt time.Time
	// Status is filled by reads.
	Status LBPoolStatus
}

// LBPoolStatus is what a read finds.
type LBPoolStatus struct {
	// Conflict says why the pool gives nothing: a block overlaps one of
	// an older pool (Cilium's cilium.io/PoolConflict). Empty: it gives.
	Conflict string
	// Families counts each family the pool's blocks hold.
	Families map[Family]LBFamilyStatus
}

// Conflicting reports whether the pool is marked conflicting.
func (s LBPoolStatus) Conflicting() bool { return s.Conflict != "" }

// LBFamilyStatus counts one family of a VIP pool, at most math.MaxInt64
// (an IPv6 /64 block holds more).
type LBFamilyStatus struct {
	Total int64 // addresses the pool may give (Ranges)
	Used  int64 // addresses given
}

// Available is what the pool may still give.
func (s LBFamilyStatus) Available() int64 { return max(s.Total-s.Used, 0) }

// Totals counts the addresses of Ranges per family.
func (s LBPoolSpec) Totals() map[Family]int64 {
	out := map[Family]int64{}
	for _, r := range s.Ranges() {
		f := FamilyOf(r.From())
		out[f] = SaturatingAdd(out[f], RangeSize(r))
	}
	return out
}

// RangeSize is the number of addresses of r, at most math.MaxInt64.
func RangeSize(r netipx.IPRange) int64 {
	if !r.IsValid() {
		return 0
	}
	a, b := r.From().As16(), r.To().As16()
	hiA, loA := binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:])
	hiB, loB := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
	lo, borrow := bits.Sub64(loB, loA, 0)
	hi, _ := bits.Sub64(hiB, hiA, borrow)
	if hi != 0 || lo >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo) + 1
}

// SaturatingAdd is a+b of non-negative counts, at most math.MaxInt64.
func SaturatingAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// LBPoolBlocks is one VIP pool as the conflict settlement sees it.
type LBPoolBlocks struct {
	Name   string
	Blocks []LBBlock
	// Conflict is the pool's mark before the settlement; empty: none.
	Conflict string
}

// SettleLBConflicts answers each pool's mark after a change, for pools
// in creation order (oldest first), as Cilium's operator settles them
// (operator/pkg/lbipam settleConflicts), with marks sticky:
//   - a pool not marked that overlaps another pool not marked: the newer
//     of the two is marked, naming the blocks and the older pool;
//   - a pool whose own blocks overlap (one applied with kubectl) is
//     marked until they no longer do;
//   - a marked pool is unmarked once it overlaps no pool left unmarked,
//     oldest first; a mark that stays names the overlap that keeps it.
//
// Cilium unmarks a pool only when it overlaps no pool at all, so two
// marked pools that overlap only each other (both newer than a pool since
// deleted) stay marked and give nothing for ever; here the older of them
// comes back. Either way the unmarked pools never overlap one another,
// which is what the database's exclusion constraint holds.
func SettleLBConflicts(pools []LBPoolBlocks) []string {
	ranges := make([][]netipx.IPRange, len(pools))
	marks := make([]string, len(pools))
	for i, p := range pools {
		marks[i] = p.Conflict
		for _, b := range p.Blocks {
			ranges[i] = append(ranges[i], b.Range())
		}
	}
	// overlap answers the first block of pool i overlapping a block of
	// pool j, as a mark for i.
	overlap := func(i, j int) (string, bool) {
		for bi, ri := range ranges[i] {
			for bj, rj := range ranges[j] {
				if ri.Overlaps(rj) {
					return fmt.Sprintf("block %s overlaps block %s of pool %q", pools[i].Blocks[bi], pools[j].Blocks[bj], pools[j].Name), true
				}
			}
		}
		return "", false
	}
	// self answers a mark for a pool whose own blocks overlap: it stays
	// marked until they no longer do, as in Cilium.
	self := func(i int) (string, bool) {
		bi, bj, ok := LBPoolSpec{Blocks: pools[i].Blocks}.SelfOverlap()
		if !ok {
			return "", false
		}
		return fmt.Sprintf("block %s overlaps block %s of pool %q", pools[i].Blocks[bi], pools[i].Blocks[bj], pools[i].Name), true
	}
	for i := range pools {
		if m, ok := self(i); ok && marks[i] == "" {
			marks[i] = m
		}
		for j := range i {
			if marks[i] != "" {
				break
			}
			if marks[j] != "" {
				continue
			}
			if m, ok := overlap(i, j); ok {
				marks[i] = m
			}
		}
	}
	for i := range pools {
		if marks[i] == "" {
			continue
		}
		// A mark that stays names the overlap that keeps it.
		mark, _ := self(i)
		for j := range pools {
			if mark != "" {
				break
			}
			if j == i || marks[j] != "" {
				continue
			}
			if m, ok := overlap(i, j); ok {
				mark = m
				break
			}
		}
		marks[i] = mark
	}
	return marks
}
