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
	// Nitro instances, bare metal included; not Xen ones).
	Prefixes bool
	// VCPUs is the type's default vCPU count (AWS); 0 when unknown.
	VCPUs int
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

// The VPC CNI's ceilings of max Pods with prefixes (the EKS AMI's
// max-pods-calculator.sh): 110 on types of up to 30 vCPUs, 250 above.
const (
	MaxPodsCeilingLowCPU  = 110
	MaxPodsCeilingHighCPU = 250
	maxPodsHighCPUAbove   = 30
)

// DefaultMaxPods is the max Pods of a node whose kubelet says none, as
// the EKS AMI sets it with the VPC CNI: without prefixes MaxPods (m5.large:
// 29); with prefixes every interface's slots as /28s plus 2, capped at
// MaxPodsCeilingLowCPU, or MaxPodsCeilingHighCPU above 30 vCPUs (m5.large:
// 110). Without the cap a prefix node would stop at the secondary
// addresses' count, well below what its prefixes hold.
func (l Limits) DefaultMaxPods(prefixes bool) int {
	if !prefixes || !l.Prefixes {
		return l.MaxPods()
	}
	all := l.Interfaces*max(l.IPv4PerInterface-1, 0)*IPv4PrefixSize + 2
	if l.VCPUs > maxPodsHighCPUAbove {
		return min(all, MaxPodsCeilingHighCPU)
	}
	return min(all, MaxPodsCeilingLowCPU)
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
