// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"net/netip"
	"strings"
	"time"
)

// EventKind is what happened to an address, a block or a pool.
type EventKind string

// The kinds of the address history. Lease events carry the address, its
// owner and attachment; block events the block and node; pool events the
// pool.
const (
	// EventLease: the address was leased (pending or active); Reason is the
	// rule that chose the pool.
	EventLease EventKind = "lease"
	// EventConfirm: a pending lease became active.
	EventConfirm EventKind = "confirm"
	// EventRelease: the holder let go (Reason says how: attachment,
	// address, reconcile, node-deleted); the address cools down.
	EventRelease EventKind = "release"
	// EventExpire: a pending lease was never confirmed and was released.
	EventExpire EventKind = "expire"
	// EventCooldownEnd: the address became free (Reason: purged, reused,
	// or the deletion that freed it early).
	EventCooldownEnd  EventKind = "cooldown-end"
	EventBlockCarve   EventKind = "block-carve"
	EventBlockAdopt   EventKind = "block-adopt"
	EventBlockRelease EventKind = "block-release"
	EventPoolCreate   EventKind = "pool-create"
	EventPoolUpdate   EventKind = "pool-update"
	EventPoolDelete   EventKind = "pool-delete"
	// VIP pool events; a change of a pool's conflict mark is an update
	// whose Reason says "conflict: ..." or "conflict resolved".
	EventLBPoolCreate EventKind = "lbpool-create"
	EventLBPoolUpdate EventKind = "lbpool-update"
	EventLBPoolDelete EventKind = "lbpool-delete"
	// VIP events carry the address, the pool it came from and the owner
	// (Namespace, Name of Owner): given or shared, then let go.
	EventVIPAssign  EventKind = "vip-assign"
	EventVIPRelease EventKind = "vip-release"
	// EventVIPStranded: a pool or CIDR group edit left the address
	// offered to its owner by no pool (kept, reported); EventVIPOffered:
	// a later change offers it again.
	EventVIPStranded EventKind = "vip-stranded"
	EventVIPOffered  EventKind = "vip-offered"
)

// Ends reports whether the event ends a holding of the address.
func (k EventKind) Ends() bool {
	return k == EventRelease || k == EventExpire || k == EventCooldownEnd
}

// Event is one entry of the address history. Fields that do not apply to
// its kind are zero.
type Event struct {
	ID         int64
	At         time.Time
	Kind       EventKind
	Space      string
	Family     Family
	Address    netip.Addr
	Block      netip.Prefix
	Pool, Node string
	// State is the lease's state after the event: pending, active,
	// reserved (held by a node for Cilium, crd mode), cooling, or free.
	State      string
	Owner      Owner
	Attachment Attachment
	// Actor is who asked: "node:NAME", "cert:CN", "system", "anonymous",
	// or "db:USER" for a change made in the database directly.
	Actor  string
	Reason string
	// Generation is the lease's generation, 0 when unknown.
	Generation int64
}

// HistoryFilter selects events of one address, one owner or one node of a
// space, in the time range [From, To) (a zero bound is open).
type HistoryFilter struct {
	Space   string
	Address netip.Addr
	// OwnerNamespace and OwnerName select one owner; both are set or
	// neither.
	OwnerNamespace, OwnerName string
	Node                      string
	From, To                  time.Time
}

// Validate checks that exactly one subject is set and the range is ordered.
func (f HistoryFilter) Validate() error {
	n := 0
	if f.Address.IsValid() {
		n++
	}
	if f.OwnerName != "" || f.OwnerNamespace != "" {
		if f.OwnerName == "" || f.OwnerNamespace == "" {
			return Invalid("owner", "must be NAMESPACE/NAME")
		}
		n++
	}
	if f.Node != "" {
		n++
	}
	switch {
	case n == 0:
		return Invalid("owner", "give an owner (NAMESPACE/NAME) or a node")
	case n > 1:
		return Invalid("node", "give an owner or a node, not both")
	case !f.From.IsZero() && !f.To.IsZero() && !f.From.Before(f.To):
		return Invalid("to", "must be after from")
	}
	return nil
}

// ParseOwner reads NAMESPACE/NAME.
func ParseOwner(field, s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", Invalid(field, "%q is not NAMESPACE/NAME", s)
	}
	// The rules of a lease request's owner: no other owner has a history.
	if err := ValidateLabelName(field, namespace); err != nil {
		return "", "", err
	}
	if err := ValidateNodeName(field, name); err != nil {
		return "", "", err
	}
	return namespace, name, nil
}

// Holding is one holder's interval of an address: from its lease to the
// event that ended it (zero To: held still, or the end is not recorded).
// A node holding a single address for Cilium's agent (crd mode) with no Pod
// using it is a holding too, without owner: from the address's lease to
// the node (or the release by the Pod that last used it) to the next Pod's
// lease or the address's release.
type Holding struct {
	Space      string
	Address    netip.Addr
	Node, Pool string
	Owner      Owner
	Attachment Attachment
	From, To   time.Time
	// Events are the holding's events in order: its lease, any
	// confirmation, and the event that ended it.
	Events []Event
}
