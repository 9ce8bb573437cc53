// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import (
	"errors"
	"fmt"
	"time"
)

// Kind is the class of a cloud's refusal, which decides what the workers
// do next.
type Kind int

const (
	// KindUnknown is any other failure: logged, and the node tried again
	// at its next turn.
	KindUnknown Kind = iota
	// KindNotFound: the instance or interface does not exist, or not yet
	// (AWS answers so for a while right after a create).
	KindNotFound
	// KindInterfaceFull: the interface has no room for what was asked
	// (AWS PrivateIpAddressLimitExceeded): describe it again.
	KindInterfaceFull
	// KindSubnetFull: the subnet has no free address left for it (AWS
	// InsufficientFreeAddressesInSubnet): skip the subnet for a while.
	KindSubnetFull
	// KindNoContiguousPrefix: the subnet has free addresses but no free
	// aligned prefix (AWS InsufficientCidrBlocks, or InvalidParameterValue
	// "There aren't sufficient free Ipv4 addresses or prefixes"): ask for
	// single addresses instead.
	KindNoContiguousPrefix
	// KindAttachmentLimit: the instance takes no more interfaces.
	KindAttachmentLimit
	// KindThrottled: the cloud refused the call for its rate, after the
	// SDK's retries.
	KindThrottled
	// KindInvalid: the call itself was wrong (an address the interface
	// does not hold).
	KindInvalid
	// KindNoSecurityGroup: the pool's security group tags match no group
	// of the node's network, so no interface is created (rather than one
	// with the primary's groups, which would open the Pods to what the
	// node is open to): the pool's tags or the groups need fixing.
	KindNoSecurityGroup
)

var kindNames = [...]string{"unknown", "not found", "interface full", "subnet full", "no contiguous prefix",
	"attachment limit", "throttled", "invalid", "no security group"}

func (k Kind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return fmt.Sprintf("Kind(%d)", int(k))
	}
	return kindNames[k]
}

// Error is a cloud's refusal: its kind, and the cloud's own code and
// message for the logs.
type Error struct {
	Kind    Kind
	Code    string // the cloud's error code, e.g. PrivateIpAddressLimitExceeded
	Message string
	// RetryAfter is how long the cloud asked the caller to wait before
	// the next call (ARM's Retry-After, which can exceed the SDK's own
	// retry budget): the workers hold the node back that long, across
	// passes. 0 when the cloud said nothing.
	RetryAfter time.Duration
	// Ended, with KindNotFound, says the cloud confirms that the instance
	// ended (EC2: terminated or shutting down) rather than that it does
	// not know it, which it also answers for a while about a new one.
	Ended bool
	// Err is the SDK's error.
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.Kind, e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// KindOf answers the kind of err: KindUnknown unless err is or wraps an
// *Error.
func KindOf(err error) Kind {
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Kind
	}
	return KindUnknown
}

// RetryAfterOf answers how long err asks the caller to wait (an *Error's
// RetryAfter), 0 when it says nothing.
func RetryAfterOf(err error) time.Duration {
	var ce *Error
	if errors.As(err, &ce) {
		return ce.RetryAfter
	}
	return 0
}

// Ended reports whether err says the cloud confirms the instance ended
// (an *Error with Ended set).
func Ended(err error) bool {
	var ce *Error
	return errors.As(err, &ce) && ce.Kind == KindNotFound && ce.Ended
}
