// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"net/netip"
	"time"
)

// Sticky addresses: a lease may be bound to a workload identity that
// outlives its Pod (a StatefulSet name and ordinal, a VM name). When the
// lease is released the address stays bound for a retention, leased to no
// one else; a new lease request with that identity gets the same address
// back when the address is in a block of the requesting node and in the
// pool its selection chose. Otherwise the request gets a fresh address,
// the identity is bound to it instead and the answer says why the old one
// could not be reused, or, when the request requires the old address, it
// fails saying why.

// MaxStickyRetention bounds how long a released address stays bound.
const MaxStickyRetention = 30 * 24 * time.Hour

// DefaultStickyRetention is the retention of a binding whose request names
// none and whose server sets no other default.
const DefaultStickyRetention = 24 * time.Hour

// maxIdentityLen bounds a workload identity: a DNS subdomain's length.
const maxIdentityLen = 253

// StickyRequest asks for the leases of a request to be bound to Identity.
type StickyRequest struct {
	// Identity names the workload, e.g. "statefulset/ns/web/0".
	Identity string
	// Retention is how long a released address stays bound; 0 means the
	// server's default.
	Retention time.Duration
	// Require makes the request fail (KindStickyUnavailable) when the
	// address bound to Identity cannot be leased, instead of leasing a
	// fresh one.
	Require bool
}

// Validate checks the identity's length and characters and the retention's
// range.
func (r StickyRequest) Validate() error {
	if err := ValidateIdentity("sticky.identity", r.Identity); err != nil {
		return err
	}
	if r.Retention < 0 || r.Retention > MaxStickyRetention {
		return Invalid("sticky.retention", "must be from 1s to %s, not %s", MaxStickyRetention, r.Retention)
	}
	if r.Retention != 0 && r.Retention < time.Second {
		return Invalid("sticky.retention", "must be from 1s to %s, not %s", MaxStickyRetention, r.Retention)
	}
	return nil
}

// ValidateIdentity checks a workload identity: 1 to 253 characters of
// letters, digits and . _ : / -, starting and ending with a letter or digit
// (the database checks the same).
func ValidateIdentity(field, id string) error {
	if id == "" {
		return Invalid(field, "must not be empty")
	}
	if len(id) > maxIdentityLen {
		return Invalid(field, "longer than %d characters", maxIdentityLen)
	}
	for i, c := range []byte(id) {
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if alnum {
			continue
		}
		if i == 0 || i == len(id)-1 {
			return Invalid(field, "must start and end with a letter or digit")
		}
		switch c {
		case '.', '_', ':', '/', '-':
		default:
			return Invalid(field, "contains %q; only letters, digits and . _ : / - are allowed", rune(c))
		}
	}
	return nil
}

// Binding is an address's binding to a workload identity.
type Binding struct {
	Identity  string
	Retention time.Duration
	// Decided is set in the answer of the allocation that bound the
	// address only; then Reused says whether the identity got its address
	// back, and if not, Reason says why (empty when it had none).
	Decided bool
	Reused  bool
	Reason  string
	// OperatorReason, when set, is the Reason for callers that may read
	// every node: Reason does not say where another node holds the
	// address (see StickyChoice).
	OperatorReason string
}

// BoundAddress is what a lease request finds bound to its identity, for
// one family.
type BoundAddress struct {
	Addr       netip.Addr
	Block      netip.Prefix
	Node       string // the node owning Block
	Pool       string
	Held       bool // pending or active: a Pod still holds it
	Attachment Attachment
	Generation int64
}

// StickyChoice is what to do with the address bound to an identity.
type StickyChoice struct {
	// Reuse: lease Bound again. Otherwise lease a fresh address, and
	// Reason (when not empty) says why the bound one could not be.
	Reuse  bool
	Reason string
	// OperatorReason, when set, is Reason with what another node holds
	// (its name, block and the address), for callers that may read every
	// node; Reason then says only that the address is on another node.
	OperatorReason string
}

// ChooseSticky decides, for one family, whether a request for node whose
// selection chose pool gets the address bound to identity back. bound is
// nil when nothing is bound. A bound address still held by another
// attachment is a KindLeaseConflict (one workload identity is one
// workload at a time); one on another node or pool is a
// KindStickyUnavailable when require, else a fresh address with a reason.
//
// What another node holds (its name, its block, the address, attachment
// and generation there) is for callers that may read every node: when the
// bound address is on another node, Detail and Reason only say so, and
// OperatorDetail and OperatorReason carry the rest. Facts of the
// requesting node itself are in both.
func ChooseSticky(identity string, bound *BoundAddress, node, pool string, f Family, require bool) (StickyChoice, error) {
	if bound == nil {
		return StickyChoice{}, nil
	}
	elsewhere := bound.Node != node
	if bound.Held {
		full := fmt.Sprintf("identity %q holds %s through attachment %s/%s on node %s (generation %d); release it first",
			identity, bound.Addr, bound.Attachment.ContainerID, bound.Attachment.Interface, bound.Node, bound.Generation)
		if !elsewhere {
			return StickyChoice{}, &Error{Kind: KindLeaseConflict, Field: "sticky.identity", Detail: full}
		}
		return StickyChoice{}, &Error{Kind: KindLeaseConflict, Field: "sticky.identity",
			Detail:         fmt.Sprintf("identity %q is held by a lease on another node; release it first", identity),
			OperatorDetail: full}
	}
	var why, operatorWhy string
	switch {
	case elsewhere:
		why = "the address bound to it is on another node"
		operatorWhy = fmt.Sprintf("%s is in block %s of node %s, not of %s", bound.Addr, bound.Block, bound.Node, node)
	case bound.Pool != pool:
		why = fmt.Sprintf("%s is in pool %q, but this request's %s pool is %q", bound.Addr, bound.Pool, f, pool)
	default:
		return StickyChoice{Reuse: true}, nil
	}
	if require {
		e := &Error{Kind: KindStickyUnavailable, Field: "sticky.identity",
			Detail: fmt.Sprintf("the address bound to %q cannot be leased here: %s", identity, why)}
		if operatorWhy != "" {
			e.OperatorDetail = fmt.Sprintf("the address bound to %q cannot be leased here: %s", identity, operatorWhy)
		}
		return StickyChoice{}, e
	}
	return StickyChoice{Reason: why, OperatorReason: operatorWhy}, nil
}
