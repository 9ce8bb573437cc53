// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import "fmt"

// Fencing, after Calico's sequence numbers: every lease lifetime carries a
// generation, a number from one sequence that only grows. An allocation's
// leases share one; re-leasing an address takes a new one. A client that
// names the generation it was given when it releases or confirms can never
// act on a later lease of the same address or attachment: a delayed or
// duplicated DEL cannot free an address that was meanwhile leased again.
//
// A call that names the current generation is idempotent: releasing a
// released lease of that generation again answers what the first release
// did. A reconcile that names the highest generation its list accounts for
// never releases a later lease.

// ValidateGeneration checks a generation named by a client.
func ValidateGeneration(field string, g int64) error {
	if g < 1 {
		return Invalid(field, "must be a lease generation (1 or more), not %d", g)
	}
	return nil
}

// ValidateWatermark checks the generation a reconcile names: the high
// water mark the client read before listing its attachments. 0 is the mark
// of a database that has leased nothing yet: every lease is above it.
func ValidateWatermark(field string, g int64) error {
	if g < 0 {
		return Invalid(field, "must be a generation high water mark (0 or more), not %d", g)
	}
	return nil
}

// StaleGeneration is the error of a call that named generation want while
// what holds the address or attachment is generation have (in state).
func StaleGeneration(what string, want, have int64, state LeaseState) *Error {
	return &Error{Kind: KindStaleGeneration, Field: "generation",
		Detail: fmt.Sprintf("%s is at generation %d (%s), not %d; nothing was changed", what, have, state, want)}
}
