package api

// Every conversion between the wire types of package ipamv1 and the domain
// types of package alloc lives in this file. Parsers (…FromAPI, parse…) run
// once at the edge and return *alloc.Error of KindInvalid naming the request
// field at fault, as a JSON path of the body or a parameter name; formatters
// (…ToAPI) never fail.

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// ---- parameters ----

// parseSpace answers the space query parameter: alloc.DefaultSpace when the
// parameter is absent, otherwise a DNS label (an explicit empty value is an
// error, not the default).
func parseSpace(p *string) (string, error) {
	if p == nil {
		return alloc.DefaultSpace, nil
	}
	if err := alloc.ValidateLabelName("space", *p); err != nil {
		return "", err
	}
	return *p, nil
}

// parsePage answers the page of a list. An absent limit is the default
// (100); a present one must lie in 1..1000, so limit=0 is refused rather
// than read as the default.
func parsePage(limit *int, cont *string) (alloc.Page, error) {
	var p alloc.Page
	if limit != nil {
		if *limit == 0 {
			return alloc.Page{}, alloc.Invalid("limit", "must be between 1 and 1000")
		}
		p.Limit = *limit
	}
	if cont != nil {
		if err := checkLen("continue", *cont, maxContinueLen); err != nil {
			return alloc.Page{}, err
		}
		p.Continue = *cont
	}
	if err := p.Validate(); err != nil {
		return alloc.Page{}, err
	}
	return p, nil
}

// parseAttachment checks an attachment key taken from the path.
func parseAttachment(network, containerID, iface string) (alloc.Attachment, error) {
	if err := checkLen("network", network, maxNetworkLen); err != nil {
		return alloc.Attachment{}, err
	}
	a := alloc.Attachment{Network: network, ContainerID: containerID, Interface: iface}
	return a, alloc.ValidateAttachment("", a)
}

func parseFamily(field string, f ipamv1.Family) (alloc.Family, error) {
	fam, err := alloc.ParseFamily(string(f))
	if err != nil {
		return 0, alloc.Invalid(field, "%s", err)
	}
	return fam, nil
}

func parsePrefix(field, s string) (netip.Prefix, error) {
	if err := checkLen(field, s, maxAddressTextLen); err != nil {
		return netip.Prefix{}, err
	}
	p, err := alloc.ParseCanonicalPrefix(s)
	if err != nil {
		return netip.Prefix{}, alloc.Invalid(field, "%s", err)
	}
	return p, nil
}

func parseAddr(field, s string) (netip.Addr, error) {
	if err := checkLen(field, s, maxAddressTextLen); err != nil {
		return netip.Addr{}, err
	}
	a, err := alloc.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, alloc.Invalid(field, "%s", err)
	}
	return a, nil
}

// ---- labels and times ----

// labelsFromAPI validates labels; absent labels are an empty set.
func labelsFromAPI(field string, l *ipamv1.Labels) (map[string]string, error) {
	if l == nil || *l == nil {
		return map[string]string{}, nil
	}
	if err := alloc.ValidateLabels(field, *l); err != nil {
		return nil, err
	}
	return *l, nil
}

// labelsToAPI never answers null: a resource without labels has {}.
func labelsToAPI(l map[string]string) ipamv1.Labels {
	if l == nil {
		return ipamv1.Labels{}
	}
	return l
}

// optTime answers nil for the zero time, so optional times are omitted.
func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func optInt(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}

func optAddr(a netip.Addr) *string {
	if !a.IsValid() {
		return nil
	}
	s := a.String()
	return &s
}

func familyToAPI(f alloc.Family) ipamv1.Family { return ipamv1.Family(f.String()) }

// ---- spaces ----

func spaceToAPI(s alloc.Space) ipamv1.Space {
	return ipamv1.Space{Name: s.Name, CreatedAt: s.CreatedAt.UTC()}
}

func spaceListToAPI(items []alloc.Space, next string) ipamv1.SpaceList {
	l := ipamv1.SpaceList{Items: make([]ipamv1.Space, len(items)), Continue: optString(next)}
	for i, s := range items {
		l.Items[i] = spaceToAPI(s)
	}
	return l
}

// ---- pools ----

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
	}
}

func ptr[T any](v T) *T { return &v }

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

// ---- nodes ----

// nodeFromAPI parses a node registration; absent labels and addresses are
// empty.
func nodeFromAPI(space, name string, s ipamv1.NodeSpec) (alloc.Node, error) {
	labels, err := labelsFromAPI("labels", s.Labels)
	if err != nil {
		return alloc.Node{}, err
	}
	n := alloc.Node{Space: space, Name: name, Labels: labels, ProviderID: deref(s.ProviderID, "")}
	for _, err := range []error{
		checkLen("providerID", n.ProviderID, maxProviderIDLen),
		checkCount("addresses", len(deref(s.Addresses, nil)), maxNodeAddresses),
		checkCount("podCIDRs", len(deref(s.PodCIDRs, nil)), maxNodePodCIDRs),
	} {
		if err != nil {
			return alloc.Node{}, err
		}
	}
	if s.Addresses != nil {
		n.Addresses = make([]alloc.NodeAddress, len(*s.Addresses))
		for i, a := range *s.Addresses {
			if !a.Type.Valid() {
				return alloc.Node{}, alloc.Invalid(fmt.Sprintf("addresses[%d].type", i), "%q is not InternalIP or ExternalIP", a.Type)
			}
			addr, err := parseAddr(fmt.Sprintf("addresses[%d].address", i), a.Address)
			if err != nil {
				return alloc.Node{}, err
			}
			n.Addresses[i] = alloc.NodeAddress{Type: string(a.Type), Address: addr}
		}
	}
	for i, c := range deref(s.PodCIDRs, nil) {
		p, err := parsePrefix(fmt.Sprintf("podCIDRs[%d]", i), c)
		if err != nil {
			return alloc.Node{}, err
		}
		n.PodCIDRs = append(n.PodCIDRs, p)
	}
	return n, nil
}

func nodeToAPI(n alloc.Node) ipamv1.Node {
	out := ipamv1.Node{
		Name:       n.Name,
		Space:      n.Space,
		Labels:     labelsToAPI(n.Labels),
		Addresses:  make([]ipamv1.NodeAddress, len(n.Addresses)),
		ProviderID: optString(n.ProviderID),
		Blocks:     int(n.Blocks),
		Leases:     int(n.Leases),
		CreatedAt:  n.CreatedAt.UTC(),
		UpdatedAt:  n.UpdatedAt.UTC(),
	}
	for i, a := range n.Addresses {
		out.Addresses[i] = ipamv1.NodeAddress{Type: ipamv1.NodeAddressType(a.Type), Address: a.Address.String()}
	}
	return out
}

func ciliumNodeToAPI(st alloc.CiliumNodeState) *ipamv1.CiliumNodeState {
	out := &ipamv1.CiliumNodeState{Mode: st.Mode, ResourceVersion: st.ResourceVersion,
		OperatorError: optString(st.OperatorError), Ipv4: ciliumFamilyToAPI(st.IPv4), Ipv6: ciliumFamilyToAPI(st.IPv6)}
	if len(st.PodCIDRs) > 0 {
		cidrs := prefixStrings(st.PodCIDRs)
		out.PodCIDRs = &cidrs
	}
	if len(st.Pools) > 0 {
		pools := make([]ipamv1.CiliumPoolState, len(st.Pools))
		for i, p := range st.Pools {
			pools[i] = ipamv1.CiliumPoolState{Pool: p.Pool, Allocated: prefixStrings(p.Allocated),
				NeededIPv4: optInt(p.NeededIPv4), NeededIPv6: optInt(p.NeededIPv6)}
		}
		out.Pools = &pools
	}
	return out
}

func ciliumFamilyToAPI(f *alloc.CiliumFamilyState) *ipamv1.CiliumFamilyState {
	if f == nil {
		return nil
	}
	out := &ipamv1.CiliumFamilyState{Pool: f.Pool, Used: f.Used}
	out.Releasing.MarkedForRelease = f.MarkedForRelease
	out.Releasing.ReadyForRelease = f.ReadyForRelease
	out.Releasing.DoNotRelease = f.DoNotRelease
	out.Releasing.Released = f.Released
	return out
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

func nodeListToAPI(items []alloc.Node, next string) ipamv1.NodeList {
	l := ipamv1.NodeList{Items: make([]ipamv1.Node, len(items)), Continue: optString(next)}
	for i, n := range items {
		l.Items[i] = nodeToAPI(n)
	}
	return l
}

// ---- blocks ----

func blockToAPI(b alloc.Block) ipamv1.Block {
	out := ipamv1.Block{
		Cidr:    b.Layout.Prefix.String(),
		Node:    b.Node,
		Pool:    b.Pool,
		Family:  familyToAPI(b.Family),
		Gateway: optAddr(b.Layout.Router),
		Reserved: ipamv1.ReservedAddresses{
			Router:  optAddr(b.Layout.Router),
			Health:  optAddr(b.Layout.Health),
			Ingress: optAddr(b.Layout.Ingress),
		},
		Capacity:  b.Layout.Capacity,
		Leased:    b.Leased,
		Cooling:   b.Cooling,
		CreatedAt: b.CreatedAt.UTC(),
	}
	if b.Source != "" {
		out.Source = ptr(ipamv1.BlockSource(b.Source))
	}
	return out
}

func blockListToAPI(items []alloc.Block) ipamv1.BlockList {
	l := ipamv1.BlockList{Items: make([]ipamv1.Block, len(items))}
	for i, b := range items {
		l.Items[i] = blockToAPI(b)
	}
	return l
}

// ---- capacity ----

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

func nodeUsageToAPI(node string, usage alloc.NodeUsage) ipamv1.NodeUsage {
	out := ipamv1.NodeUsage{Node: node, DefaultPool: usage.DefaultPool, Items: make([]ipamv1.NodePoolUsage, len(usage.Items))}
	for i, u := range usage.Items {
		out.Items[i] = ipamv1.NodePoolUsage{
			Pool: u.Pool, Family: familyToAPI(u.Family), Mode: ipamv1.PoolMode(u.Mode),
			Blocks: u.Blocks, Capacity: u.Capacity, Leased: u.Leased, Released: u.Released(),
			PreAllocate: u.PreAlloc, Needed: u.Needed(), Available: u.Available(), Deficit: u.Deficit(),
			AtCapacity: u.AtCapacity(), CanLease: u.CanLease,
		}
	}
	return out
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

// ---- leases ----

// leaseRequestFromAPI parses and validates an allocation request. Expire
// defaults to true; an absent pool is alloc.DefaultPool, an explicit empty
// one an error; absent or empty families mean every family of the pool.
func leaseRequestFromAPI(space, node string, b ipamv1.LeaseRequest) (alloc.LeaseRequest, error) {
	r := alloc.LeaseRequest{
		Space:      space,
		Node:       node,
		Owner:      ownerFromAPI(b.Owner),
		Attachment: alloc.Attachment{Network: deref(b.Network, ""), ContainerID: b.ContainerID, Interface: b.Interface},
		Expire:     deref(b.Expire, true),
	}
	if h := b.FromReserve; h != nil {
		r.FromReserve = &alloc.ReserveHandover{ContainerID: h.ContainerID, Interface: h.Interface, Generation: h.Generation}
	}
	if b.Pool != nil {
		if *b.Pool == "" {
			return alloc.LeaseRequest{}, alloc.Invalid("pool", "must not be empty; leave it out to let the selection rules choose")
		}
		r.Pool = *b.Pool
	}
	if ps := b.Pools; ps != nil {
		for f, name := range map[alloc.Family]*string{alloc.IPv4: ps.Ipv4, alloc.IPv6: ps.Ipv6} {
			if name == nil {
				continue
			}
			if *name == "" {
				return alloc.LeaseRequest{}, alloc.Invalid("pools."+f.String(), "must not be empty; leave it out to let the selection rules choose")
			}
			if r.Pools == nil {
				r.Pools = map[alloc.Family]string{}
			}
			r.Pools[f] = *name
		}
	}
	var err error
	if r.Pod, err = metadataFromAPI("pod", b.Pod); err != nil {
		return alloc.LeaseRequest{}, err
	}
	if r.Namespace, err = metadataFromAPI("namespace", b.Namespace); err != nil {
		return alloc.LeaseRequest{}, err
	}
	if b.Families != nil {
		if err := checkCount("families", len(*b.Families), maxFamilies); err != nil {
			return alloc.LeaseRequest{}, err
		}
		r.Families = make([]alloc.Family, len(*b.Families))
		for i, f := range *b.Families {
			fam, err := parseFamily(fmt.Sprintf("families[%d]", i), f)
			if err != nil {
				return alloc.LeaseRequest{}, err
			}
			r.Families[i] = fam
		}
	}
	if r.Sticky, err = stickyFromAPI(b.Sticky); err != nil {
		return alloc.LeaseRequest{}, err
	}
	if err := r.Validate(); err != nil {
		return alloc.LeaseRequest{}, err
	}
	return r, nil
}

// metadataFromAPI checks labels as Kubernetes does and bounds annotations.
func metadataFromAPI(field string, m *ipamv1.ObjectMetadata) (alloc.Metadata, error) {
	if m == nil {
		return alloc.Metadata{}, nil
	}
	labels, err := labelsFromAPI(field+".labels", m.Labels)
	if err != nil {
		return alloc.Metadata{}, err
	}
	ann := map[string]string(deref(m.Annotations, nil))
	if err := alloc.ValidateAnnotations(field+".annotations", ann); err != nil {
		return alloc.Metadata{}, err
	}
	return alloc.Metadata{Labels: labels, Annotations: ann}, nil
}

func ownerFromAPI(o ipamv1.Owner) alloc.Owner {
	return alloc.Owner{Namespace: o.Namespace, Name: o.Name, UID: deref(o.Uid, "")}
}

func ownerToAPI(o alloc.Owner) ipamv1.Owner {
	return ipamv1.Owner{Namespace: o.Namespace, Name: o.Name, Uid: optString(o.UID)}
}

func allocationToAPI(a alloc.Allocation) ipamv1.Allocation {
	out := ipamv1.Allocation{
		Node:        a.Node,
		Network:     optString(a.Attachment.Network),
		ContainerID: a.Attachment.ContainerID,
		Interface:   a.Attachment.Interface,
		Owner:       ownerToAPI(a.Owner),
		State:       ipamv1.LeaseState(a.State),
		ExpiresAt:   optTime(a.ExpiresAt),
		Addresses:   make([]ipamv1.LeaseAddress, len(a.Leases)),
		Generation:  a.Generation,
	}
	for i, l := range a.Leases {
		out.Addresses[i] = ipamv1.LeaseAddress{
			Family:  familyToAPI(l.Family),
			Address: l.Prefix().String(),
			Gateway: optAddr(l.Gateway),
			Pool:    l.Pool,
			Block:   l.Block.String(),

			SkipMasquerade: l.SkipMasquerade,
			Generation:     &l.Generation,
			Sticky:         stickyToAPI(l.Sticky),
		}
		if l.SelectedBy != "" {
			out.Addresses[i].SelectedBy = ptr(ipamv1.LeaseAddressSelectedBy(l.SelectedBy))
		}
	}
	return out
}

func leaseToAPI(l alloc.Lease) ipamv1.Lease {
	out := ipamv1.Lease{
		Address:        l.Prefix().String(),
		Family:         familyToAPI(l.Family),
		Node:           l.Node,
		Pool:           l.Pool,
		Block:          l.Block.String(),
		Gateway:        optAddr(l.Gateway),
		Network:        optString(l.Attachment.Network),
		ContainerID:    l.Attachment.ContainerID,
		Interface:      l.Attachment.Interface,
		State:          ipamv1.LeaseState(l.State),
		CreatedAt:      l.CreatedAt.UTC(),
		ExpiresAt:      optTime(l.ExpiresAt),
		ConfirmedAt:    optTime(l.ConfirmedAt),
		ReleasedAt:     optTime(l.ReleasedAt),
		CooldownUntil:  optTime(l.CooldownUntil),
		SkipMasquerade: &l.SkipMasquerade,
		Generation:     l.Generation,
		Sticky:         stickyToAPI(l.Sticky),
	}
	if l.SelectedBy != "" {
		out.SelectedBy = ptr(ipamv1.LeaseSelectedBy(l.SelectedBy))
	}
	// A node's reserved address (crd mode) has no owner.
	if l.Owner != (alloc.Owner{}) {
		out.Owner = ptr(ownerToAPI(l.Owner))
	}
	return out
}

func leasesToAPI(items []alloc.Lease) []ipamv1.Lease {
	out := make([]ipamv1.Lease, len(items))
	for i, l := range items {
		out[i] = leaseToAPI(l)
	}
	return out
}

// leaseFilterFromAPI parses the filters of a lease list; absent filters
// match everything, present ones must be well-formed names or a state.
func leaseFilterFromAPI(p ipamv1.ListLeasesParams) (alloc.LeaseFilter, error) {
	space, err := parseSpace(p.Space)
	if err != nil {
		return alloc.LeaseFilter{}, err
	}
	f := alloc.LeaseFilter{Space: space}
	checks := []struct {
		v     *string
		dst   *string
		check func(field, s string) error
		field string
	}{
		{p.Node, &f.Node, alloc.ValidateNodeName, "node"},
		{p.Pool, &f.Pool, alloc.ValidateLabelName, "pool"},
		{p.OwnerNamespace, &f.OwnerNamespace, alloc.ValidateLabelName, "ownerNamespace"},
		{p.OwnerName, &f.OwnerName, alloc.ValidateNodeName, "ownerName"},
	}
	for _, c := range checks {
		if c.v == nil {
			continue
		}
		if err := c.check(c.field, *c.v); err != nil {
			return alloc.LeaseFilter{}, err
		}
		*c.dst = *c.v
	}
	if p.State != nil {
		st, err := alloc.ParseLeaseState(string(*p.State))
		if err != nil {
			return alloc.LeaseFilter{}, alloc.Invalid("state", "%s (want pending, active or cooling)", err)
		}
		f.State = st
	}
	return f, nil
}

// attachmentsFromAPI parses a reconcile list. The list is required: a body
// without it must not read as "nothing is valid" and release every lease of
// the node; an explicit [] does that.
func attachmentsFromAPI(b ipamv1.ReconcileRequest) ([]alloc.Attachment, error) {
	if b.Attachments == nil {
		return nil, alloc.Invalid("attachments", "is required; send [] to release every lease of the node")
	}
	if err := checkCount("attachments", len(b.Attachments), maxAttachments); err != nil {
		return nil, err
	}
	network := deref(b.Network, "")
	if err := checkLen("network", network, maxNetworkLen); err != nil {
		return nil, err
	}
	out := make([]alloc.Attachment, len(b.Attachments))
	for i, a := range b.Attachments {
		out[i] = alloc.Attachment{Network: network, ContainerID: a.ContainerID, Interface: a.Interface}
		if err := alloc.ValidateAttachment(fmt.Sprintf("attachments[%d].", i), out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ---- sizing ----

func sizingFromAPI(p ipamv1.GetSizingParams) (alloc.Sizing, error) {
	cidr, err := parsePrefix("cidr", p.Cidr)
	if err != nil {
		return alloc.Sizing{}, err
	}
	o := alloc.SizingOptions{
		AllowFirstIP: deref(p.AllowFirstIP, false),
		AllowLastIP:  deref(p.AllowLastIP, false),
		NodeLocal: alloc.NodeLocal{
			Router:  deref(p.Router, alloc.DefaultNodeLocal.Router),
			Health:  deref(p.Health, alloc.DefaultNodeLocal.Health),
			Ingress: deref(p.Ingress, alloc.DefaultNodeLocal.Ingress),
		},
	}
	return alloc.ComputeSizing(cidr, p.MaskSize, o, "cidr", "maskSize")
}

func sizingToAPI(s alloc.Sizing) ipamv1.Sizing {
	return ipamv1.Sizing{
		Cidr:             s.CIDR.String(),
		Family:           familyToAPI(alloc.FamilyOf(s.CIDR.Addr())),
		MaskSize:         s.MaskSize,
		Nodes:            s.Nodes,
		AddressesPerNode: s.AddressesPerNode,
		ReservedPerNode:  s.ReservedPerNode,
		UsablePerNode:    s.UsablePerNode,
	}
}

// ---- problems ----

func problemFamily(f alloc.Family) *ipamv1.Family {
	if f != alloc.IPv4 && f != alloc.IPv6 {
		return nil
	}
	af := familyToAPI(f)
	return &af
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
