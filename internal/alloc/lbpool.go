package alloc

import (
	"fmt"
	"net/netip"
	"slices"

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
}

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

// String writes the block as its CIDR or as start-stop.
func (b LBBlock) String() string {
	if b.CIDR.IsValid() {
		return b.CIDR.String()
	}
	return b.Start.String() + "-" + b.Stop.String()
}

// Validate checks the spec alone; overlap with other pools (VIP or Pod)
// is the store's job. Errors name the field under "spec".
func (s LBPoolSpec) Validate() error {
	if len(s.Blocks) == 0 {
		return Invalid("spec.blocks", "a VIP pool needs at least one block")
	}
	if len(s.Blocks) > MaxLBBlocks {
		return Invalid("spec.blocks", "%d blocks; a VIP pool takes at most %d", len(s.Blocks), MaxLBBlocks)
	}
	ranges := make([]netipx.IPRange, len(s.Blocks))
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
		ranges[i] = b.Range()
		for j := range i {
			if ranges[j].Overlaps(ranges[i]) {
				return &Error{Kind: KindOverlap, Field: field, Detail: fmt.Sprintf("%s overlaps spec.blocks[%d] (%s)", b, j, s.Blocks[j])}
			}
		}
	}
	if _, err := LabelSelector("spec.serviceSelector", s.ServiceSelector); err != nil {
		return err
	}
	return nil
}

// Ranges are the addresses the pool may give, block by block in order:
// a CIDR block of more than two addresses loses its first and last when
// ReserveFirstLast.
func (s LBPoolSpec) Ranges() []netipx.IPRange {
	out := make([]netipx.IPRange, 0, len(s.Blocks))
	for _, b := range s.Blocks {
		r := b.Range()
		if s.ReserveFirstLast && b.CIDR.IsValid() && b.CIDR.Addr().BitLen()-b.CIDR.Bits() > 1 {
			r = netipx.IPRangeFrom(r.From().Next(), r.To().Prev())
		}
		out = append(out, r)
	}
	return out
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
