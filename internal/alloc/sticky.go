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
	// Moves, when not nil, restricts taking the identity from another
	// node: the request is a node certificate's, and a node may not strip
	// another node's workload of its address. Nil (an operator's request)
	// moves it freely. The API sets it; it is never read from a request
	// body.
	Moves *StickyMoves
}

// StickyMoves says which bindings on other nodes a restricted request may
// take over. A binding there whose retention has ended moves anyway (the
// address is free for anyone by then); any other is refused with a
// KindForbidden error whose detail says Why and when the binding ends.
//
// The API decides From before the store's transaction (Kubernetes says
// where the Pods are; see TakeoverRefusal), from the bindings it read
// then. The store holds the bound row's lock when ChooseSticky compares,
// so a binding that changed in between (leased and released again, moved
// elsewhere) matches no entry and is refused: the check fails safe, and
// the caller's retry decides again on what is current.
type StickyMoves struct {
	// From lists the bound leases on other nodes the request may take.
	From []BoundLease
	// Why says why the request may take no other binding on another node,
	// for the refusal's detail; it never names what another node holds.
	Why string
}

// BoundLease names one family's bound lease row on a node as it was when
// read: a re-lease gives the row a new generation.
type BoundLease struct {
	Family     Family
	Node       string
	Generation int64
}

// allows reports whether m lets bound, of family f, move to another node.
func (m *StickyMoves) allows(bound *BoundAddress, f Family) bool {
	for _, b := range m.From {
		if b.Family == f && b.Node == bound.Node && b.Generation == bound.Generation {
			return true
		}
	}
	return false
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
	// RetainedUntil is, for a released address, when its binding ends:
	// its release plus the longer of the cooldown and the retention.
	// After it the address is free for anyone, and the binding only
	// waits to be cleared; zero while Held.
	RetainedUntil time.Time
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

// ChooseSticky decides, for one family, whether a request r for node
// whose selection chose pool gets the address bound to r.Identity back.
// bound is nil when nothing is bound. A bound address still held by
// another attachment is a KindLeaseConflict (one workload identity is one
// workload at a time); one on another node or pool is a
// KindStickyUnavailable when r.Require, else a fresh address with a
// reason. A restricted request (r.Moves) is refused the move from another
// node, KindForbidden, unless r.Moves allows that binding or its retention
// ended by now.
//
// What another node holds (its name, its block, the address, attachment
// and generation) is for callers that may read every node: when the
// bound address is on another node, Detail and Reason only say so, and
// OperatorDetail and OperatorReason carry the rest. Facts of the
// requesting node itself are in both.
func ChooseSticky(r StickyRequest, bound *BoundAddress, node, pool string, f Family, now time.Time) (StickyChoice, error) {
	if bound == nil {
		return StickyChoice{}, nil
	}
	identity := r.Identity
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
	if r.Require {
		// Nothing moves: the same answer whoever asks.
		e := &Error{Kind: KindStickyUnavailable, Field: "sticky.identity",
			Detail: fmt.Sprintf("the address bound to %q cannot be leased here: %s", identity, why)}
		if operatorWhy != "" {
			e.OperatorDetail = fmt.Sprintf("the address bound to %q cannot be leased here: %s", identity, operatorWhy)
		}
		return StickyChoice{}, e
	}
	if elsewhere && r.Moves != nil && now.Before(bound.RetainedUntil) && !r.Moves.allows(bound, f) {
		return StickyChoice{}, r.Moves.refusal(identity, bound.RetainedUntil)
	}
	return StickyChoice{Reason: why, OperatorReason: operatorWhy}, nil
}

// refusal is the KindForbidden error of a move m does not allow, of a
// binding that ends at until. The only fact of the other node it gives is
// that time: the node needs it to know how long its workload waits.
func (m *StickyMoves) refusal(identity string, until time.Time) *Error {
	why := m.Why
	if why == "" {
		// From was decided on a binding that has changed since.
		why = "its binding changed while this request was checked; retry"
	}
	return &Error{Kind: KindForbidden, Field: "sticky.identity",
		Detail: fmt.Sprintf("identity %q is bound to an address on another node, which a node certificate may not take over: %s. "+
			"The binding ends at %s (its retention); until then an operator can end it (DELETE /v1/sticky-bindings) or lease the identity here",
			identity, why, until.UTC().Format(time.RFC3339))}
}
