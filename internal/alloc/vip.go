// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// LoadBalancer VIPs given from VIP pools, with the rules of Cilium's LB
// IPAM (operator/pkg/lbipam): an owner (a Service, or anything a platform
// team names the same way) asks for one address per family or for given
// addresses; owners with one sharing key share an address when their
// terms are compatible. What an owner holds is never moved by a pool edit:
// an address no pool offers it any more is reported as stranded and moved
// only when the owner asks (Reassign).

// VIPOwner names who holds VIPs: a Service's namespace and name.
type VIPOwner struct {
	Namespace, Name string
}

func (o VIPOwner) String() string { return o.Namespace + "/" + o.Name }

// Validate checks the owner's names as Kubernetes names a Service.
func (o VIPOwner) Validate() error {
	if err := ValidateLabelName("namespace", o.Namespace); err != nil {
		return err
	}
	return ValidateLabelName("name", o.Name)
}

// SharingCrossNamespaceAll, in CrossNamespace, admits every namespace.
const SharingCrossNamespaceAll = "*"

// VIPSharing is what decides whether two owners may share an address
// (Cilium's lbipam.cilium.io/sharing-key and the compatibility check).
type VIPSharing struct {
	// Key: owners share only with owners of the same key; empty, never.
	Key string
	// CrossNamespace lists the other namespaces the owner shares with
	// ("*": all); both owners must admit each other's namespace.
	CrossNamespace []string
	// Ports the owner serves; two owners of one address never serve one
	// port and protocol.
	Ports []VIPPort
	// ExternalTrafficPolicy is "Cluster" or "Local"; owners of one
	// address have the same. With Local, both select the same Pods
	// (PodSelector, not empty) unless both permit different Pods.
	ExternalTrafficPolicy string
	PodSelector           map[string]string
	PermitDifferentPods   bool
}

// VIPPort is a port and its protocol (TCP, UDP, SCTP).
type VIPPort struct {
	Port     int32
	Protocol string
}

func (p VIPPort) String() string { return fmt.Sprintf("%s/%d", p.Protocol, p.Port) }

// Traffic policies of a Service.
const (
	TrafficPolicyCluster = "Cluster"
	TrafficPolicyLocal   = "Local"
)

// MaxVIPPorts bounds the ports of one owner (a Service has at most a few).
const MaxVIPPorts = 256

// Validate checks the sharing terms; field names them ("sharing").
func (s VIPSharing) Validate(field string) error {
	if len(s.Key) > 253 {
		return Invalid(field+".key", "%d characters; at most 253", len(s.Key))
	}
	for i, ns := range s.CrossNamespace {
		if ns == SharingCrossNamespaceAll {
			continue
		}
		if err := ValidateLabelName(fmt.Sprintf("%s.crossNamespace[%d]", field, i), ns); err != nil {
			return err
		}
	}
	if len(s.Ports) > MaxVIPPorts {
		return Invalid(field+".ports", "%d ports; at most %d", len(s.Ports), MaxVIPPorts)
	}
	for i, p := range s.Ports {
		f := fmt.Sprintf("%s.ports[%d]", field, i)
		if p.Port < 1 || p.Port > 65535 {
			return Invalid(f+".port", "%d is no port (1 to 65535)", p.Port)
		}
		switch p.Protocol {
		case "TCP", "UDP", "SCTP":
		default:
			return Invalid(f+".protocol", "%q: TCP, UDP or SCTP", p.Protocol)
		}
	}
	switch s.ExternalTrafficPolicy {
	case "", TrafficPolicyCluster, TrafficPolicyLocal:
	default:
		return Invalid(field+".externalTrafficPolicy", "%q: Cluster or Local", s.ExternalTrafficPolicy)
	}
	return ValidateLabels(field+".podSelector", s.PodSelector)
}

func (s VIPSharing) trafficPolicy() string {
	if s.ExternalTrafficPolicy == "" {
		return TrafficPolicyCluster
	}
	return s.ExternalTrafficPolicy
}

func (s VIPSharing) admits(namespace string) bool {
	return slices.Contains(s.CrossNamespace, namespace) || slices.Contains(s.CrossNamespace, SharingCrossNamespaceAll)
}

// CompatibleWith reports whether owner a with terms s may share an
// address with owner b with terms t, and why not.
func (s VIPSharing) CompatibleWith(a VIPOwner, t VIPSharing, b VIPOwner) (bool, string) {
	switch {
	case s.Key == "" || s.Key != t.Key:
		return false, "different sharing key"
	case a.Namespace != b.Namespace && (!s.admits(b.Namespace) || !t.admits(a.Namespace)):
		return false, fmt.Sprintf("namespaces %s and %s do not both admit each other (sharing-cross-namespace)", a.Namespace, b.Namespace)
	}
	for _, p := range s.Ports {
		if slices.Contains(t.Ports, p) {
			return false, fmt.Sprintf("both serve %s", p)
		}
	}
	switch {
	case s.trafficPolicy() != t.trafficPolicy():
		return false, "different externalTrafficPolicy"
	case s.trafficPolicy() == TrafficPolicyLocal && !(s.PermitDifferentPods && t.PermitDifferentPods) &&
		(len(s.PodSelector) == 0 || !maps.Equal(s.PodSelector, t.PodSelector)):
		return false, "externalTrafficPolicy Local but not the same Pods (sharing-permit-different-pods on both lifts this)"
	}
	return true, ""
}

// VIPRequest is what an owner asks for. Families (one per wanted family,
// in order of preference) are asked for unless Addresses names the
// addresses wanted, which then decide the families.
type VIPRequest struct {
	Space string
	Owner VIPOwner
	// Labels are the owner's, matched by the pools' service selectors
	// with the synthetic namespace and name labels.
	Labels    map[string]string
	Families  []Family
	Addresses []netip.Addr
	// Adopt, when no address is named, are addresses the owner is seen
	// holding elsewhere (a Service's status.loadBalancer.ingress written
	// by the LB IPAM it replaces): a family it lacks takes the first of
	// them a pool gives it and no one else holds (or shares one on
	// compatible terms), before any other address. Those it cannot take
	// are passed over without a word, as Cilium's import passes them over.
	Adopt []netip.Addr
	// RequireAll: satisfied only with every family (a single family, or
	// RequireDualStack); otherwise one is enough (PreferDualStack).
	RequireAll bool
	Sharing    VIPSharing
	// Reassign moves stranded addresses: released, and new ones given.
	Reassign bool
	// Source is who speaks for the owner: VIPSourceKubernetes for the
	// LB IPAM controller's Services, which it releases once the Service
	// is gone; empty for the API's owners, which only the API releases.
	Source string
}

// VIPSourceKubernetes marks the owners the LB IPAM controller keeps.
const VIPSourceKubernetes = "kubernetes"

// MaxVIPAddresses bounds the addresses one request names.
const MaxVIPAddresses = 16

// Validate checks the request.
func (r VIPRequest) Validate() error {
	if err := r.Owner.Validate(); err != nil {
		return err
	}
	if err := ValidateLabels("labels", r.Labels); err != nil {
		return err
	}
	if len(r.Addresses) > MaxVIPAddresses {
		return Invalid("addresses", "%d addresses; at most %d", len(r.Addresses), MaxVIPAddresses)
	}
	for i, a := range r.Addresses {
		if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
			return Invalid(fmt.Sprintf("addresses[%d]", i), "%s is not a plain IPv4 or IPv6 address", a)
		}
		if slices.Contains(r.Addresses[:i], a) {
			return Invalid(fmt.Sprintf("addresses[%d]", i), "%s is named twice", a)
		}
	}
	if len(r.Adopt) > MaxVIPAddresses {
		return Invalid("adopt", "%d addresses; at most %d", len(r.Adopt), MaxVIPAddresses)
	}
	for i, a := range r.Adopt {
		if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
			return Invalid(fmt.Sprintf("adopt[%d]", i), "%s is not a plain IPv4 or IPv6 address", a)
		}
	}
	if len(r.Addresses) == 0 && len(r.Families) == 0 {
		return Invalid("families", "name a family or addresses")
	}
	for i, f := range r.Families {
		if f != IPv4 && f != IPv6 {
			return Invalid(fmt.Sprintf("families[%d]", i), "no such family")
		}
		if slices.Contains(r.Families[:i], f) {
			return Invalid(fmt.Sprintf("families[%d]", i), "%s is named twice", f)
		}
	}
	return r.Sharing.Validate("sharing")
}

// VIP is one address an owner holds.
type VIP struct {
	Addr   netip.Addr
	Pool   string
	Family Family
	// Generation numbers this holding of the address: a new one each time
	// it is given anew (a share keeps the address's).
	Generation int64
	// Holders is how many owners hold the address, this one included.
	Holders int
	// Stranded: no pool that selects the owner offers the address any
	// more (a pool edit moved its blocks away, or its selector). It is
	// kept, and moved only by a request with Reassign.
	Stranded bool
}

// Reasons an owner's request is or is not satisfied, as Cilium's
// cilium.io/IPAMRequestSatisfied condition names them.
const (
	ReasonSatisfied            = "satisfied"
	ReasonNoPool               = "no_pool"
	ReasonOutOfIPs             = "out_of_ips"
	ReasonPoolSelectorMismatch = "pool_selector_mismatch"
	ReasonAlreadyAllocated     = "already_allocated"
	ReasonIncompatibleSharing  = "already_allocated_incompatible_service"
	ReasonStranded             = "stranded"
)

// VIPAssignment is what an owner holds after a request.
type VIPAssignment struct {
	Owner VIPOwner
	// Generation numbers the owner's lifetime: a release naming another
	// one is refused (KindStaleGeneration).
	Generation int64
	// Request is the owner's last request.
	Request   VIPRequest
	Addresses []VIP
	Satisfied bool
	// Reason and Message say why not, or "satisfied".
	Reason, Message string
}

// Satisfaction decides whether held satisfies r, and why not: every
// named address held; else every family (RequireAll) or one. A stranded
// address satisfies nothing, so its owner is reported.
func (r VIPRequest) Satisfaction(held []VIP) (ok bool, reason, message string) {
	var stranded []string
	has := map[Family]bool{}
	addrs := map[netip.Addr]bool{}
	for _, v := range held {
		if v.Stranded {
			stranded = append(stranded, v.Addr.String())
			continue
		}
		has[v.Family], addrs[v.Addr] = true, true
	}
	if len(stranded) > 0 {
		return false, ReasonStranded, fmt.Sprintf("%s no longer offered to this owner by an enabled pool; kept until reassigned", strings.Join(stranded, ", "))
	}
	if len(r.Addresses) > 0 {
		for _, a := range r.Addresses {
			if !addrs[a] {
				return false, "", ""
			}
		}
		return true, ReasonSatisfied, ""
	}
	n := 0
	for _, f := range r.Families {
		if has[f] {
			n++
		}
	}
	if n == len(r.Families) || (!r.RequireAll && n > 0) {
		return true, ReasonSatisfied, ""
	}
	return false, "", ""
}

// LBPoolOffer is a VIP pool as allocation sees it.
type LBPoolOffer struct {
	Name string
	Spec LBPoolSpec
	// Conflicting pools give nothing.
	Conflicting bool
}

// Gives reports whether the pool may give owner o (with labels) a new
// address: enabled, not conflicting, and selecting it.
func (p LBPoolOffer) Gives(o VIPOwner, labels map[string]string) bool {
	if p.Spec.Disabled || p.Conflicting {
		return false
	}
	ok, err := p.Spec.Selects(o.Namespace, o.Name, labels)
	return err == nil && ok
}

// Keeps reports whether an address held from any pool is still offered to
// the owner by this pool: in its ranges and selecting the owner, whether
// or not the pool is disabled or conflicting (those give nothing new but
// keep what was given).
func (p LBPoolOffer) Keeps(o VIPOwner, labels map[string]string, a netip.Addr) bool {
	ok, err := p.Spec.Selects(o.Namespace, o.Name, labels)
	return err == nil && ok && p.Spec.Offers(a)
}

// LBChange is one change of the store that can serve a LoadBalancer
// Service: Space is the space it concerns ("" for any); Owner, when set,
// is an owner that lost its addresses (its pool deleted) and must be
// looked at again, though nobody waited for it.
type LBChange struct {
	Space string
	Owner VIPOwner
}
