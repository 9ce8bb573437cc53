// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import "github.com/ipam-dev/ipam/internal/alloc"

// Limits are an instance type's limits on network interfaces and their
// addresses (EC2 DescribeInstanceTypes: MaximumNetworkInterfaces of the
// default network card, Ipv4AddressesPerInterface,
// Ipv6AddressesPerInterface; Azure: 256 IP configurations per NIC).
type Limits struct {
	// Interfaces is how many interfaces the instance takes.
	Interfaces int
	// IPv4PerInterface and IPv6PerInterface count every address slot of
	// an interface, its primary address included.
	IPv4PerInterface int
	IPv6PerInterface int
	// Prefixes reports whether interfaces take delegated prefixes (AWS:
	// Nitro instances only).
	Prefixes bool
}

// IPv4PrefixSize is the number of addresses of a delegated IPv4 prefix
// (a /28).
const IPv4PrefixSize = alloc.PrefixSize

// PodAddressesPerInterface is how many Pod addresses one interface can
// hold: its IPv4 slots but the primary address (the interface's own),
// that one too when the node gives Pods its primary address, and each
// slot a /28 of 16 addresses with prefixes. 0 when prefixes are asked of
// a type that takes none.
func (l Limits) PodAddressesPerInterface(prefixes, usePrimary bool) int {
	slots := l.IPv4PerInterface - 1
	if usePrimary {
		slots++
	}
	if slots < 0 {
		return 0
	}
	if prefixes {
		if !l.Prefixes {
			return 0
		}
		return slots * IPv4PrefixSize
	}
	return slots
}

// MaxPods is the VPC CNI's max Pods of a node without prefixes: every
// interface's addresses but its primary, plus 2 for the Pods on the host's
// network (the VPC CNI and kube-proxy).
func (l Limits) MaxPods() int {
	return l.Interfaces*(l.IPv4PerInterface-1) + 2
}

// MinimumPreAllocate is the pre-allocation Cilium's AWS operator gives a
// node whose spec.ipam.pre-allocate is unset (pkg/aws/ipam/node.go,
// GetMinimumAllocatableIPv4): alloc.DefaultPreAllocate, lowered to what
// the interfaces from firstInterface on can hold when that is less (a
// t3.nano holds 2), 0 when the type has no interface from firstInterface
// on. Without the lowering, a small type's node would ask for more than
// it can ever hold. Like Cilium, it counts single addresses, whatever
// the prefixes.
func (l Limits) MinimumPreAllocate(firstInterface int) int {
	if firstInterface >= l.Interfaces {
		return 0
	}
	return min(alloc.DefaultPreAllocate, (l.Interfaces-firstInterface)*max(l.IPv4PerInterface-1, 0))
}
