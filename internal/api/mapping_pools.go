// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// poolFromAPI parses and validates a new pool of space.
func poolFromAPI(space string, b ipamv1.PoolRequest) (alloc.Pool, error) {
	if err := alloc.ValidateLabelName("name", b.Name); err != nil {
		return alloc.Pool{}, err
	}
	labels, spec, err := poolContentFromAPI(b.Labels, b.Spec)
	if err != nil {
		return alloc.Pool{}, err
	}
	return alloc.Pool{Space: space, Name: b.Name, Labels: labels, Spec: spec}, nil
}

// poolUpdateFromAPI parses and validates the new labels and spec of the
// pool named pool; absent labels are none. A name in the body must be the
// pool's: a pool cannot be renamed.
func poolUpdateFromAPI(pool string, b ipamv1.PoolUpdate) (map[string]string, alloc.PoolSpec, error) {
	if n := b.Name; n != nil && *n != pool {
		return nil, alloc.PoolSpec{}, alloc.Invalid("name", "must be the pool's name %q as in the path, or absent: a pool cannot be renamed", pool)
	}
	return poolContentFromAPI(b.Labels, b.Spec)
}

// poolContentFromAPI parses a pool's labels and spec, and validates the
// spec as a whole.
func poolContentFromAPI(l *ipamv1.Labels, s ipamv1.PoolSpec) (map[string]string, alloc.PoolSpec, error) {
	labels, err := labelsFromAPI("labels", l)
	if err != nil {
		return nil, alloc.PoolSpec{}, err
	}
	spec, err := poolSpecFromAPI(s)
	if err != nil {
		return nil, alloc.PoolSpec{}, err
	}
	if err := spec.Validate(); err != nil {
		return nil, alloc.PoolSpec{}, err
	}
	return labels, spec, nil
}

// poolSpecFromAPI parses every CIDR of s and fills the defaults: node-local
// router and health reserved, ingress not, first and last addresses not
// leased. It does not validate the spec as a whole: call Validate.
func poolSpecFromAPI(s ipamv1.PoolSpec) (alloc.PoolSpec, error) {
	var spec alloc.PoolSpec
	var err error
	if spec.IPv4, err = poolFamilyFromAPI("spec.ipv4", s.Ipv4); err != nil {
		return alloc.PoolSpec{}, err
	}
	if spec.IPv6, err = poolFamilyFromAPI("spec.ipv6", s.Ipv6); err != nil {
		return alloc.PoolSpec{}, err
	}
	spec.AllowFirstIP = deref(s.AllowFirstIP, false)
	spec.AllowLastIP = deref(s.AllowLastIP, false)
	spec.Mode = alloc.PoolMode(deref(s.Mode, ""))
	spec.PreAllocate = s.PreAllocate
	spec.Disabled = deref(s.Disabled, false)
	spec.SkipMasquerade = deref(s.SkipMasquerade, false)
	spec.MaxBlocksPerNode = s.MaxBlocksPerNode
	spec.AllowSpecialPurpose = deref(s.AllowSpecialPurpose, false)
	if err := checkCloudAPI(s.Cloud); err != nil {
		return alloc.PoolSpec{}, err
	}
	spec.Cloud = cloudSpecFromAPI(s.Cloud)
	if spec.PodSelector, err = selectorFromAPI("spec.podSelector", s.PodSelector); err != nil {
		return alloc.PoolSpec{}, err
	}
	if spec.NamespaceSelector, err = selectorFromAPI("spec.namespaceSelector", s.NamespaceSelector); err != nil {
		return alloc.PoolSpec{}, err
	}
	if spec.NodeSelector, err = selectorFromAPI("spec.nodeSelector", s.NodeSelector); err != nil {
		return alloc.PoolSpec{}, err
	}
	spec.NodeLocal = alloc.DefaultNodeLocal
	if nl := s.NodeLocal; nl != nil {
		spec.NodeLocal = alloc.NodeLocal{
			Router:  deref(nl.Router, alloc.DefaultNodeLocal.Router),
			Health:  deref(nl.Health, alloc.DefaultNodeLocal.Health),
			Ingress: deref(nl.Ingress, alloc.DefaultNodeLocal.Ingress),
		}
	}
	return spec, nil
}

func poolFamilyFromAPI(base string, f *ipamv1.PoolFamilySpec) (*alloc.PoolFamily, error) {
	if f == nil {
		return nil, nil
	}
	pf := &alloc.PoolFamily{CIDRs: make([]netip.Prefix, len(f.Cidrs)), MaskSize: f.MaskSize}
	for i, c := range f.Cidrs {
		p, err := parsePrefix(fmt.Sprintf("%s.cidrs[%d]", base, i), c)
		if err != nil {
			return nil, err
		}
		pf.CIDRs[i] = p
	}
	if err := checkCount(base+".pool", len(deref(f.Pool, nil)), maxCIDRConfigs); err != nil {
		return nil, err
	}
	for i, c := range deref(f.Pool, nil) {
		field := fmt.Sprintf("%s.pool[%d]", base, i)
		cidr, err := parsePrefix(field+".cidr", c.Cidr)
		if err != nil {
			return nil, err
		}
		r := alloc.CIDRReservation{CIDR: cidr}
		for j, rg := range deref(c.ReservedRanges, nil) {
			rf := fmt.Sprintf("%s.reservedRanges[%d]", field, j)
			start, err := parseAddr(rf+".start", rg.Start)
			if err != nil {
				return nil, err
			}
			end, err := parseAddr(rf+".end", rg.End)
			if err != nil {
				return nil, err
			}
			r.Ranges = append(r.Ranges, alloc.AddrRange{Start: start, End: end})
		}
		pf.Reserved = append(pf.Reserved, r)
	}
	return pf, nil
}

// selectorFromAPI converts a label selector through its JSON form, which
// the API shares with Kubernetes; the conversion to a labels.Selector
// checks operators, keys and values.
func selectorFromAPI(field string, s *ipamv1.LabelSelector) (*metav1.LabelSelector, error) {
	if s == nil {
		return nil, nil
	}
	exprs := deref(s.MatchExpressions, nil)
	if err := checkCount(field+".matchExpressions", len(exprs), maxMatchExprs); err != nil {
		return nil, err
	}
	for i, e := range exprs {
		if err := checkCount(fmt.Sprintf("%s.matchExpressions[%d].values", field, i), len(deref(e.Values, nil)), maxMatchValues); err != nil {
			return nil, err
		}
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var out metav1.LabelSelector
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, alloc.Invalid(field, "%s", err)
	}
	if _, err := alloc.LabelSelector(field, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func selectorToAPI(s *metav1.LabelSelector) *ipamv1.LabelSelector {
	if s == nil {
		return nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil
	}
	var out ipamv1.LabelSelector
	if json.Unmarshal(b, &out) != nil {
		return nil
	}
	return &out
}

func poolSpecToAPI(s alloc.PoolSpec) ipamv1.PoolSpec {
	return ipamv1.PoolSpec{
		Ipv4:         poolFamilyToAPI(s.IPv4),
		Ipv6:         poolFamilyToAPI(s.IPv6),
		AllowFirstIP: &s.AllowFirstIP,
		AllowLastIP:  &s.AllowLastIP,
		NodeLocal: &ipamv1.NodeLocalAddresses{
			Router:  &s.NodeLocal.Router,
			Health:  &s.NodeLocal.Health,
			Ingress: &s.NodeLocal.Ingress,
		},
		Mode:                ptr(ipamv1.PoolMode(s.EffectiveMode())),
		PreAllocate:         s.PreAllocate,
		PodSelector:         selectorToAPI(s.PodSelector),
		NamespaceSelector:   selectorToAPI(s.NamespaceSelector),
		NodeSelector:        selectorToAPI(s.NodeSelector),
		Disabled:            &s.Disabled,
		SkipMasquerade:      &s.SkipMasquerade,
		MaxBlocksPerNode:    s.MaxBlocksPerNode,
		AllowSpecialPurpose: &s.AllowSpecialPurpose,
		Cloud:               cloudSpecToAPI(s.Cloud),
	}
}

func poolFamilyToAPI(f *alloc.PoolFamily) *ipamv1.PoolFamilySpec {
	if f == nil {
		return nil
	}
	out := &ipamv1.PoolFamilySpec{Cidrs: make([]string, len(f.CIDRs)), MaskSize: f.MaskSize}
	for i, c := range f.CIDRs {
		out.Cidrs[i] = c.String()
	}
	var pool []ipamv1.PoolCIDRConfig
	for _, r := range f.Reserved {
		c := ipamv1.PoolCIDRConfig{Cidr: r.CIDR.String()}
		ranges := make([]ipamv1.AddressRange, len(r.Ranges))
		for i, rg := range r.Ranges {
			ranges[i] = ipamv1.AddressRange{Start: rg.Start.String(), End: rg.End.String()}
		}
		c.ReservedRanges = &ranges
		pool = append(pool, c)
	}
	if pool != nil {
		out.Pool = &pool
	}
	return out
}

func poolToAPI(p alloc.Pool) ipamv1.Pool {
	out := ipamv1.Pool{
		Name:      p.Name,
		Space:     p.Space,
		Labels:    labelsToAPI(p.Labels),
		Spec:      poolSpecToAPI(p.Spec),
		CreatedAt: p.CreatedAt.UTC(),
		UpdatedAt: p.UpdatedAt.UTC(),
	}
	if st, ok := p.Status[alloc.IPv4]; ok {
		out.Status.Ipv4 = poolFamilyStatusToAPI(st)
	}
	if st, ok := p.Status[alloc.IPv6]; ok {
		out.Status.Ipv6 = poolFamilyStatusToAPI(st)
	}
	return out
}

func poolFamilyStatusToAPI(s alloc.PoolFamilyStatus) *ipamv1.PoolFamilyStatus {
	return &ipamv1.PoolFamilyStatus{
		BlocksPossible: s.BlocksPossible,
		BlocksCarved:   s.BlocksCarved,
		AddressesTotal: s.AddressesTotal,
		Leased:         s.Leased,
		Cooling:        s.Cooling,
		Free:           s.Free(),
	}
}

func poolListToAPI(items []alloc.Pool, next string) ipamv1.PoolList {
	l := ipamv1.PoolList{Items: make([]ipamv1.Pool, len(items)), Continue: optString(next)}
	for i, p := range items {
		l.Items[i] = poolToAPI(p)
	}
	return l
}

// Forecast windows: at least a few samples, at most the samples kept.
const (
	minWindow     = 5 * time.Minute
	maxWindow     = 24 * time.Hour
	defaultWindow = time.Hour
)

func parseWindow(w *string) (time.Duration, error) {
	if w == nil {
		return defaultWindow, nil
	}
	if err := checkLen("window", *w, maxDurationTextLen); err != nil {
		return 0, err
	}
	d, err := time.ParseDuration(*w)
	if err != nil || d < minWindow || d > maxWindow {
		return 0, alloc.Invalid("window", "%q is not a duration from %s to %s", *w, minWindow, maxWindow)
	}
	return d, nil
}

func poolCapacityToAPI(pool string, window time.Duration, c map[alloc.Family]alloc.FamilyCapacity) ipamv1.PoolCapacity {
	out := ipamv1.PoolCapacity{Pool: pool, Window: window.String()}
	for f, fc := range c {
		v := familyCapacityToAPI(fc)
		if f == alloc.IPv4 {
			out.Ipv4 = &v
		} else {
			out.Ipv6 = &v
		}
	}
	return out
}

func familyCapacityToAPI(c alloc.FamilyCapacity) ipamv1.FamilyCapacity {
	out := ipamv1.FamilyCapacity{
		BlocksPossible: c.BlocksPossible, BlocksCarved: c.BlocksCarved, FreeBlocks: c.FreeBlocks,
		AddressesPossible: c.AddressesPossible, AddressesInBlocks: c.AddressesInBlocks,
		Leased: c.Leased, Cooling: c.Cooling, Free: c.Free(),
		NodesWithBlocks: c.NodesWithBlocks, NodesAtCapacity: c.NodesAtCapacity, NodesInDeficit: c.NodesInDeficit,
		Forecast: ipamv1.Forecast{RatePerHour: c.Forecast.RatePerHour, Samples: c.Forecast.Samples},
	}
	if c.LargestFreeBlock.IsValid() {
		out.LargestFreeBlock = ptr(c.LargestFreeBlock.String())
	}
	switch h := c.Forecast.HoursToFull; {
	case h != nil:
		out.Forecast.HoursToFull = ptr(*h)
		out.Forecast.Summary = fmt.Sprintf("at this rate the pool is full in %.1f hours", *h)
	case c.Forecast.Samples < 2:
		out.Forecast.Summary = "not enough usage samples yet for a forecast"
	default:
		out.Forecast.Summary = "use is not growing: no exhaustion forecast"
	}
	return out
}
