// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"errors"
	"fmt"
	"time"
)

// Kind classifies an Error; each kind maps to one HTTP problem type in the
// API layer, so the set is part of the contract and only grows.
type Kind string

const (
	// KindInvalid: the input is malformed or breaks a rule; Field names it.
	KindInvalid Kind = "invalid-input"
	// KindNotFound: the named space, pool, node, block or lease does not exist.
	KindNotFound Kind = "not-found"
	// KindConflict: the object already exists.
	KindConflict Kind = "conflict"
	// KindOverlap: a CIDR overlaps one already present in the space.
	KindOverlap Kind = "overlap"
	// KindImmutable: an update tried to change an immutable field.
	KindImmutable Kind = "immutable-field"
	// KindInUse: the object still holds leases or blocks.
	KindInUse Kind = "in-use"
	// KindLeaseConflict: the attachment key is held by another owner or with
	// other families or pool.
	KindLeaseConflict Kind = "lease-conflict"
	// KindPoolExhausted: the pool has no room for another block of the
	// node's family ("allocator full" in Cilium).
	KindPoolExhausted Kind = "pool-exhausted"
	// KindPoolMatch: pool selection found more than one pool for a family,
	// or none while the Pod or namespace requires a match.
	KindPoolMatch Kind = "pool-match"
	// KindStaleGeneration: a release or confirm named a lease generation
	// that is not the current one of the address or attachment; nothing
	// was changed.
	KindStaleGeneration Kind = "stale-generation"
	// KindStickyUnavailable: the request requires the address bound to its
	// workload identity, and that address cannot be leased on this node or
	// pool; Detail says why.
	KindStickyUnavailable Kind = "sticky-unavailable"
	// KindNodeBlockLimit: the node holds as many blocks of the pool's
	// family as the pool lets one node hold (maxBlocksPerNode); Pool and
	// Family are set.
	KindNodeBlockLimit Kind = "node-block-limit"
	// KindForbidden: the caller may not do this. The API's gate raises it
	// for an operation beyond the caller's role; the domain raises it for
	// a node certificate's request that acts for a Pod not bound to its
	// node, or takes a sticky identity from another node without cause
	// (see StickyMoves). Field names what is refused.
	KindForbidden Kind = "forbidden"
)

// Error is the one error type of the domain. Handlers map Kind to an HTTP
// status and problem type; Detail is safe to show to clients.
type Error struct {
	Kind   Kind
	Field  string // request field at fault, as a JSON path or parameter name
	Detail string
	// OperatorDetail, when set, is the Detail for callers that may read
	// every node (operators, viewers, admins): it names what another node
	// holds (an address, attachment or generation), which Detail leaves
	// out for a node certificate.
	OperatorDetail string
	Pool           string // set for KindPoolExhausted
	Family         Family // set for KindPoolExhausted
	// Nodes names the nodes that keep a KindInUse object in use (at most a
	// few; Detail says how many more).
	Nodes []string
	// RetryAfter, when positive, is how long until the refusal may end:
	// for KindPoolExhausted, until the first of the node's released
	// addresses ends its cooldown (Detail says how many there are).
	// The API sends it as Retry-After.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", e.Kind, e.Field, e.Detail)
	}
	return fmt.Sprintf("%s: %s", e.Kind, e.Detail)
}

// Invalid returns a KindInvalid error for field.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Kind: KindInvalid, Field: field, Detail: fmt.Sprintf(format, args...)}
}

// NotFound returns a KindNotFound error; what is e.g. "pool", field the
// request field that named it.
func NotFound(field, what, name string) *Error {
	return &Error{Kind: KindNotFound, Field: field, Detail: fmt.Sprintf("%s %q not found", what, name)}
}

// Exhausted returns the KindPoolExhausted error for pool and family.
func Exhausted(pool string, f Family) *Error {
	return &Error{Kind: KindPoolExhausted, Pool: pool, Family: f, Field: "pool",
		Detail: fmt.Sprintf("allocator full: pool %q has no free %s block for this node", pool, f)}
}

// IsKind reports whether err is an *Error of kind k.
func IsKind(err error, k Kind) bool {
	var e *Error
	return errors.As(err, &e) && e.Kind == k
}
