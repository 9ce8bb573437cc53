// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Owner is the Pod an address is leased to.
type Owner struct {
	Namespace, Name, UID string
}

// Attachment identifies one container interface on a node: the natural key
// of a lease, and what makes allocation idempotent. Network is the name of
// the CNI network configuration the interface was attached through, as the
// CNI specification keys attachments (network, container ID, interface);
// "" is the unnamed network of callers that name none. Attachments of
// different networks are distinct: each holds its own leases, and a
// reconcile of one network never touches another's.
type Attachment struct {
	Network, ContainerID, Interface string
}

// LeaseState is where a lease is in its life.
type LeaseState string

const (
	// StatePending: leased with expiry; released automatically unless confirmed.
	StatePending LeaseState = "pending"
	// StateActive: confirmed, or leased without expiry.
	StateActive LeaseState = "active"
	// StateCooling: released; the address is not leased again before its
	// cooldown ends.
	StateCooling LeaseState = "cooling"
)

// ParseLeaseState accepts the states by name: pending, active, cooling and
// reserved (StateReserved, nodepool.go).
func ParseLeaseState(s string) (LeaseState, error) {
	switch st := LeaseState(s); st {
	case StatePending, StateActive, StateCooling, StateReserved:
		return st, nil
	}
	return "", fmt.Errorf("unknown lease state %q", s)
}

// LeaseRequest asks for one address per family for an attachment.
type LeaseRequest struct {
	Space      string
	Node       string
	Owner      Owner
	Attachment Attachment
	// Where the addresses come from; see Select. Pools (per family) and
	// Pool name pools outright; Pod and Namespace carry the metadata the
	// annotation and selector rules read.
	Pools     map[Family]string
	Pool      string
	Families  []Family // empty means every family a pool can serve
	Pod       Metadata
	Namespace Metadata
	Expire    bool
	// Sticky binds the leased addresses to a workload identity that
	// outlives the Pod; nil for an ordinary lease.
	Sticky *StickyRequest
	// FromReserve hands the leases of a reserve attachment of the same
	// network over to Attachment instead of leasing new addresses; nil
	// for an ordinary lease.
	FromReserve *ReserveHandover
}

// ReserveHandover names the reserve attachment whose leases an allocation
// takes over: a CNI plugin leases a few addresses to the node in advance
// (each slot an ordinary attachment of its network), gives one to a Pod it
// starts while the service is unreachable, and later asks the service to
// bind that address to the Pod. Generation is the slot's leases'
// generation as the plugin recorded it, so a later lease of the slot is
// never taken.
type ReserveHandover struct {
	ContainerID, Interface string
	Generation             int64
}

// Selection is the request's input to Select, with the default pool's name.
func (r LeaseRequest) Selection(defaultPool string) Selection {
	return Selection{Pools: r.Pools, Pool: r.Pool, Families: r.Families, Namespace: r.Owner.Namespace,
		PodName: r.Owner.Name, Pod: r.Pod, NamespaceMeta: r.Namespace, DefaultPool: defaultPool}
}

// Validate checks the request and puts its families in lock order.
func (r *LeaseRequest) Validate() error {
	checks := []error{
		ValidateLabelName("space", r.Space),
		ValidateNodeName("node", r.Node),
		ValidateNetworkName("network", r.Attachment.Network),
		validateToken("containerID", r.Attachment.ContainerID, 256),
		validateToken("interface", r.Attachment.Interface, 64),
		ValidateLabelName("owner.namespace", r.Owner.Namespace),
		ValidateNodeName("owner.name", r.Owner.Name),
	}
	if r.Owner.UID != "" {
		checks = append(checks, validateToken("owner.uid", r.Owner.UID, 128))
	}
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	if err := r.Selection("").validate(); err != nil {
		return err
	}
	if r.Sticky != nil {
		if err := r.Sticky.Validate(); err != nil {
			return err
		}
	}
	if h := r.FromReserve; h != nil {
		if err := ValidateAttachment("fromReserve.", Attachment{Network: r.Attachment.Network, ContainerID: h.ContainerID, Interface: h.Interface}); err != nil {
			return err
		}
		if err := ValidateGeneration("fromReserve.generation", h.Generation); err != nil {
			return err
		}
		if r.Sticky != nil {
			return Invalid("fromReserve", "cannot be combined with sticky")
		}
		if h.ContainerID == r.Attachment.ContainerID && h.Interface == r.Attachment.Interface {
			return Invalid("fromReserve", "names the attachment itself")
		}
	}
	slices.Sort(r.Families) // IPv4 first: the lock order
	return nil
}

// ValidateAttachment checks an attachment key coming from a path or a list.
func ValidateAttachment(fieldPrefix string, a Attachment) error {
	if err := ValidateNetworkName(fieldPrefix+"network", a.Network); err != nil {
		return err
	}
	if err := validateToken(fieldPrefix+"containerID", a.ContainerID, 256); err != nil {
		return err
	}
	return validateToken(fieldPrefix+"interface", a.Interface, 64)
}

// Lease is one address held (or cooling) in a block of a node.
type Lease struct {
	Space      string
	Node       string
	Pool       string
	Family     Family
	Addr       netip.Addr
	Block      netip.Prefix
	Gateway    netip.Addr // the block's router address; zero when not reserved
	Attachment Attachment
	Owner      Owner
	State      LeaseState
	CreatedAt  time.Time
	// Optional times; zero when not applicable.
	ExpiresAt     time.Time
	ConfirmedAt   time.Time
	ReleasedAt    time.Time
	CooldownUntil time.Time
	// SkipMasquerade is the pool's flag: the datapath keeps the Pod's
	// source address.
	SkipMasquerade bool
	// SelectedBy is the rule that chose the pool ("" for leases made before
	// the service recorded it).
	SelectedBy SelectedBy
	// Generation numbers this lease's lifetime (see fence.go); the leases
	// of one allocation share it.
	Generation int64
	// Sticky is the address's binding to a workload identity; nil when
	// none.
	Sticky *Binding
}

// Prefix is the address with the block's prefix length, as CNI wants it.
func (l Lease) Prefix() netip.Prefix { return netip.PrefixFrom(l.Addr, l.Block.Bits()) }

// Allocation is the answer to a LeaseRequest: every lease of the attachment.
type Allocation struct {
	Node       string
	Attachment Attachment
	Owner      Owner
	State      LeaseState
	ExpiresAt  time.Time
	Leases     []Lease // one per family, IPv4 first
	// Created is false when the request was a retry answered from existing
	// leases.
	Created bool
	// Generation is the leases' generation: what release and confirm name
	// to be sure they act on these leases and no later ones.
	Generation int64
}

// Block is a prefix a node owns in a pool.
type Block struct {
	Space     string
	Node      string
	Pool      string
	Family    Family
	Layout    Layout
	Leased    int64
	Cooling   int64
	Source    string // "carved" or "adopted"
	CreatedAt time.Time
}

// NodeAddress is an address Kubernetes reports for a node.
type NodeAddress struct {
	Type    string // InternalIP or ExternalIP
	Address netip.Addr
}

// Node is a machine that owns blocks and leases.
type Node struct {
	Space      string
	Name       string
	Labels     map[string]string
	Addresses  []NodeAddress
	ProviderID string
	// PodCIDRs are CIDRs Kubernetes assigned the node, adopted as its
	// blocks at registration (input only).
	PodCIDRs  []netip.Prefix
	Blocks    int64
	Leases    int64
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Space is an address space: names and overlap rules hold within one.
type Space struct {
	Name      string
	CreatedAt time.Time
}

// Page asks for one page of a list.
type Page struct {
	Limit    int    // 1..1000
	Continue string // opaque token from the previous page; empty for the first
}

// Validate fills the default limit and bounds it.
func (p *Page) Validate() error {
	if p.Limit == 0 {
		p.Limit = 100
	}
	if p.Limit < 1 || p.Limit > 1000 {
		return Invalid("limit", "must be between 1 and 1000")
	}
	return nil
}

// LeaseFilter selects leases in List; empty fields match everything.
type LeaseFilter struct {
	Space          string
	Node           string
	Pool           string
	OwnerNamespace string
	OwnerName      string
	State          LeaseState
}
