// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Cilium's crd mode: the service plays Cilium's operator for nodes whose
// agent allocates Pod IPs from single addresses the operator writes into
// the node's CiliumNode (spec.ipam.pool). Every such address is a lease row
// held by the node: StateReserved while no Pod uses it, StateActive with
// the Pod as owner while one does (as the agent reports in
// status.ipam.used). The primary key of leases (space, address) keeps an
// address out of two nodes' pools and away from every other lease.
//
// These rows are attachments of their own: network CiliumPoolNetwork (a
// name ValidateNetworkName refuses, so no CNI plugin or REST call can
// address them), container ID the address itself, interface
// CiliumPoolInterface. Only the operator's calls (the store's node-address
// methods) change them.
const (
	// CiliumPoolNetwork is the network of a node's single addresses.
	CiliumPoolNetwork = "cilium:crd"
	// CiliumPoolInterface is their interface.
	CiliumPoolInterface = "pool"
)

// StateReserved: the address is held by a node for Cilium's agent (crd
// mode) and no Pod uses it. It is neither free nor cooling: only the
// node's agent may hand it to a Pod, and only the operator's release
// handshake gives it back to the pool.
const StateReserved LeaseState = "reserved"

// ByNodeSelector is the rule that chose a node's pool by the pool's
// nodeSelector (SelectNodePool); ByDefault is the fallback there too.
const ByNodeSelector SelectedBy = "node-selector"

// MaxNodeReserve bounds how many addresses one ReserveNodeAddresses call
// may add (Cilium's max-allocate has no bound; no node runs this many
// Pods).
const MaxNodeReserve = 1 << 16

// HeldAddress is a single address a node holds for Cilium's agent: one
// entry of its CiliumNode's spec.ipam.pool (IPv4) or ipv6-pool.
type HeldAddress struct {
	Addr   netip.Addr
	Family Family
	// Pool and Block are where the address comes from (Cilium's
	// AllocationIP.Resource).
	Pool  string
	Block netip.Prefix
	// State is StateReserved or StateActive.
	State LeaseState
	// Owner is the Pod using the address (the agent's
	// AllocationIP.Owner, mapped by CiliumOwner); zero when reserved.
	Owner Owner
	// CoolUntil: a reserved address a Pod used until recently stays with
	// the node until then (the cooldown), so the agent's late view of it
	// never races its release; zero when it never carried one. It may lie
	// in the past.
	CoolUntil time.Time
	// Since is when the address entered its state (reserved or used by
	// this owner).
	Since time.Time
	// Generation numbers the holding (see fence.go): every change of state
	// or owner takes a new one.
	Generation int64
}

// Releasable reports whether the address may leave the node at now:
// reserved and out of its cooldown.
func (a HeldAddress) Releasable(now time.Time) bool {
	return a.State == StateReserved && !now.Before(a.CoolUntil)
}

// NodeUseChange is what recording a node's status.ipam.used changed.
type NodeUseChange struct {
	// Used: reserved addresses a Pod now uses (active, with its owner).
	Used []HeldAddress
	// Unused: addresses no Pod uses any more (reserved again, cooling).
	Unused []HeldAddress
	// OwnerChanged: addresses used by another Pod than before (a release
	// by the old owner and a lease by the new one in the history).
	OwnerChanged []HeldAddress
	// Unknown: addresses the agent reports that the node does not hold
	// (another node's, free, or released already); nothing was written for
	// them.
	Unknown []netip.Addr
}

// Empty reports that nothing changed and nothing was unknown.
func (c NodeUseChange) Empty() bool {
	return len(c.Used) == 0 && len(c.Unused) == 0 && len(c.OwnerChanged) == 0 && len(c.Unknown) == 0
}

// CiliumAgentNamespace is the owner namespace of the addresses Cilium's
// agent uses for itself (owners "router", "health", "ingress": no
// namespace) and of any owner that names no valid Pod.
const CiliumAgentNamespace = "cilium-agent"

// ciliumRestored is the suffix Cilium's agent appends to the owner of an
// address it re-claimed for a restored endpoint (daemon/cmd/endpoint_restore.go).
const ciliumRestored = " [restored]"

// CiliumOwner maps the owner Cilium's agent records for an address it uses
// (ipamtypes.AllocationIP.Owner in status.ipam.used) to a lease owner that
// passes the owner validation of a lease request:
//
//   - "namespace/pod" (the CNI plugin's owner, also with the " [restored]"
//     suffix of a restored endpoint) is that Pod, when the namespace is a
//     DNS label and the name a DNS subdomain;
//   - anything else, such as the agent's own "router", "health" and
//     "ingress", or a restored endpoint known only by its numeric id, is
//     owned by namespace CiliumAgentNamespace, named by the owner made into
//     a DNS subdomain (lower case, other characters '-'), or "unknown" when
//     nothing is left of it.
//
// The answer depends on owner alone: the same owner maps to the same Owner
// on every call, so an unchanged status records nothing.
func CiliumOwner(owner string) Owner {
	owner = strings.TrimSuffix(owner, ciliumRestored)
	if ns, name, ok := strings.Cut(owner, "/"); ok &&
		len(validation.IsDNS1123Label(ns)) == 0 && len(validation.IsDNS1123Subdomain(name)) == 0 {
		return Owner{Namespace: ns, Name: name}
	}
	return Owner{Namespace: CiliumAgentNamespace, Name: subdomainOf(owner)}
}

// subdomainOf makes s a DNS subdomain: lower case, characters other than
// letters, digits and '.' become '-', and each dot-separated label loses
// its leading and trailing '-' (empty labels go); "unknown" when nothing is
// left.
func subdomainOf(s string) string {
	var parts []string
	for _, label := range strings.Split(strings.ToLower(s), ".") {
		label = strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			return '-'
		}, label)
		if label = strings.Trim(label, "-"); label != "" {
			parts = append(parts, label)
		}
	}
	out := strings.Join(parts, ".")
	if len(out) > validation.DNS1123SubdomainMaxLength {
		out = strings.TrimRight(out[:validation.DNS1123SubdomainMaxLength], "-.")
	}
	if out == "" || len(validation.IsDNS1123Subdomain(out)) > 0 {
		return "unknown"
	}
	return out
}

// ValidateOwner checks an owner as a lease request does: the namespace a
// DNS label, the name a DNS subdomain, the UID (optional) a token; field
// prefixes the field names ("owner." for a request).
func ValidateOwner(field string, o Owner) error {
	if err := ValidateLabelName(field+"namespace", o.Namespace); err != nil {
		return err
	}
	if err := ValidateNodeName(field+"name", o.Name); err != nil {
		return err
	}
	if o.UID != "" {
		return validateToken(field+"uid", o.UID, 128)
	}
	return nil
}

// NodePoolCandidate is what node pool selection knows of a pool.
type NodePoolCandidate struct {
	Name     string
	Families []Family
	// NodeSelector is the pool's nodeSelector; nil when unset (the pool is
	// then chosen for a node only as the default pool).
	NodeSelector labels.Selector
}

func (c NodePoolCandidate) has(f Family) bool { return slices.Contains(c.Families, f) }

// SelectNodePool chooses the pool a node's single addresses of family f
// come from (crd mode), from the node's labels:
//
//  1. the pools whose nodeSelector matches the labels and that have f:
//     exactly one may match (several: a KindPoolMatch error naming them);
//  2. else the default pool (whatever its own nodeSelector says).
//
// ok is false, with no error, when the rule's pool lacks f (a node of an
// IPv4 pool has no IPv6 addresses to hold), and when the default pool does
// not exist but some pool matches the node for another family. A default
// pool that does not exist is otherwise a KindNotFound error. candidates
// lists the pools with a nodeSelector and the default pool (when it
// exists).
func SelectNodePool(node string, nodeLabels map[string]string, f Family, candidates []NodePoolCandidate, defaultPool string) (c Choice, ok bool, err error) {
	set := labels.Set(nodeLabels)
	var matched []string
	matchedOther := false
	var def *NodePoolCandidate
	for i, p := range candidates {
		if p.Name == defaultPool {
			def = &candidates[i]
		}
		if p.NodeSelector == nil || !p.NodeSelector.Matches(set) {
			continue
		}
		if p.has(f) {
			matched = append(matched, p.Name)
		} else {
			matchedOther = true
		}
	}
	slices.Sort(matched)
	matched = slices.Compact(matched)
	switch {
	case len(matched) > 1:
		return Choice{}, false, &Error{Kind: KindPoolMatch, Field: "labels",
			Detail: fmt.Sprintf("multiple pools match node %s for %s: %s", node, f, strings.Join(matched, ", "))}
	case len(matched) == 1:
		return Choice{Family: f, Pool: matched[0], By: ByNodeSelector}, true, nil
	case def != nil && def.has(f):
		return Choice{Family: f, Pool: defaultPool, By: ByDefault}, true, nil
	case def != nil || matchedOther:
		return Choice{}, false, nil
	}
	return Choice{}, false, NotFound("pool", "default pool", defaultPool)
}
