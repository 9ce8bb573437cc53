// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package cloud is the boundary between the capacity workers and the
// clouds that give a node its Pod addresses: AWS (secondary addresses and
// /28 prefixes of a node's network interfaces) and, behind the same
// interface, Azure (IP configurations of a node's NICs). A Provider
// describes an instance and changes what its interfaces hold; the workers
// decide what to ask for (internal/alloc's watermarks and warm targets)
// and record what they got as node blocks.
//
// Cilium's operator is the model (its AllocationImplementation, one per
// cloud): the workers call the cloud, nodes never do.
package cloud

import (
	"context"
	"net/netip"
)

// Provider is what the capacity workers need of a cloud. Every method may
// answer an *Error of one of this package's kinds (errors.go); a call
// that the cloud refused for its rate is KindThrottled after the SDK's own
// retries.
type Provider interface {
	// Instance describes instance id: its type's limits and its
	// interfaces with what each holds. KindNotFound when the cloud knows
	// no such instance (terminated, or not yet visible).
	Instance(ctx context.Context, id string) (Instance, error)
	// Assign adds n secondary addresses, or n prefixes when prefixes is
	// set, to interface iface, the cloud choosing them, and answers what
	// it added. KindInterfaceFull when the interface has no room for n,
	// KindSubnetFull when its subnet has no n free addresses,
	// KindNoContiguousPrefix when the subnet has free addresses but no
	// free aligned prefix (the caller may fall back to single
	// addresses), KindNotFound for an unknown interface.
	Assign(ctx context.Context, iface string, n int, prefixes bool) (Assigned, error)
	// Unassign removes secondary addresses and prefixes from interface
	// iface. Removing what the interface does not hold is KindInvalid and
	// removes nothing.
	Unassign(ctx context.Context, iface string, addrs []netip.Addr, prefixes []netip.Prefix) error
}

// Inventory describes every instance of a network at once: the workers'
// resync, a few paginated calls for a thousand nodes instead of two per
// node.
type Inventory interface {
	// Instances answers the running instances of network vpc (an
	// Instance's VPC: an EC2 VPC, an Azure resource group) by id, as
	// Provider.Instance describes each.
	Instances(ctx context.Context, vpc string) (map[string]Instance, error)
}

// InterfaceManager is what the workers need of a cloud whose nodes get
// more interfaces on demand (AWS; Azure only adds addresses to the NICs a
// node has).
type InterfaceManager interface {
	// Subnets answers the subnets of network vpc in zone, with their free
	// addresses and tags.
	Subnets(ctx context.Context, vpc, zone string) ([]Subnet, error)
	// CreateInterface creates an interface as spec says and attaches it
	// to spec.Instance at its first free device index from
	// spec.FirstDevice, to be deleted with the instance, and answers it.
	// An interface that could not be attached is deleted again:
	// KindNotFound when the instance is gone, KindAttachmentLimit when it
	// takes no more interfaces. A spec asking more addresses than one
	// interface of the instance's type holds is KindInvalid, before any
	// call.
	CreateInterface(ctx context.Context, spec InterfaceSpec) (Interface, error)
	// Detached answers the interfaces carrying every tag of tags that
	// are attached to nothing: left by an instance that terminated, or by
	// a worker that stopped between a create and its attach.
	Detached(ctx context.Context, tags map[string]string) ([]Interface, error)
	// DetachInterface starts detaching interface id from its instance;
	// the cloud detaches asynchronously, and the interface shows in
	// Detached (and can be deleted) only once it finished. The primary
	// interface cannot be detached.
	DetachInterface(ctx context.Context, id string) error
	// DeleteInterface deletes a detached interface; KindNotFound when it
	// is gone already.
	DeleteInterface(ctx context.Context, id string) error
	// SecurityGroups answers the ids of the security groups of network
	// vpc carrying every tag of tags with its exact value, sorted; none
	// (and no error) when no group matches.
	SecurityGroups(ctx context.Context, vpc string, tags map[string]string) ([]string, error)
	// AssignIPv6Prefix delegates one IPv6 prefix of its subnet (EC2's
	// /80) to interface iface and answers it: KindInvalid when the subnet
	// has no IPv6 range or the type takes no prefix, KindInterfaceFull
	// when the interface holds all it may.
	AssignIPv6Prefix(ctx context.Context, iface string) (netip.Prefix, error)
}

// Instance is a cloud instance as the workers see it.
type Instance struct {
	ID   string
	Type string
	// VPC, Zone and SubnetID are where the instance runs (its primary
	// interface's subnet). VPC is what Inventory lists it by: on Azure,
	// its resource group ("/subscriptions/<id>/resourceGroups/<name>").
	VPC, Zone, SubnetID string
	// Limits are those of the instance's type.
	Limits Limits
	// Interfaces are the attached interfaces, by device index.
	Interfaces []Interface
	// NetworkCard is the network card the workers attach interfaces to
	// (EC2's DefaultNetworkCardIndex of a multi-card type; 0 elsewhere):
	// Limits.Interfaces is that card's, and only the interfaces on it
	// count against it.
	NetworkCard int
}

// Interface is a network interface attached to an instance, and the
// addresses it holds.
type Interface struct {
	ID string
	// Name is the interface's name where the cloud has one besides its
	// ID (Azure's NIC name); MAC its hardware address.
	Name, MAC   string
	SubnetID    string
	DeviceIndex int
	// SubnetCIDR is its subnet's range, Gateway the subnet's gateway
	// (Azure's: the subnet's first usable address), VPCCIDRs the ranges
	// of its network (AWS: the VPC's CIDR blocks; Azure: the virtual
	// network's address space). A provider fills them from cached reads
	// of the subnet and network; Cilium's agent routes with them.
	SubnetCIDR netip.Prefix
	Gateway    netip.Addr
	VPCCIDRs   []netip.Prefix
	// Primary is the interface's own address (never a Pod's unless
	// the node uses the primary address).
	Primary netip.Addr
	// Addresses are its secondary addresses, Prefixes its delegated
	// prefixes (/28 for IPv4).
	Addresses []netip.Addr
	Prefixes  []netip.Prefix
	// IPv6Prefixes are its delegated IPv6 prefixes (AWS's /80s).
	IPv6Prefixes []netip.Prefix
	// SecurityGroups are the interface's security group ids, Tags its
	// tags.
	SecurityGroups []string
	Tags           map[string]string
	// Attached reports whether it is attached to an instance.
	Attached bool
	// Detaching reports that the cloud is detaching it (the workers gave
	// it back): it still takes its device index and counts against the
	// instance's interfaces, but nothing on it is for Pods any more.
	Detaching bool
	// Type is the interface's kind where the cloud has several (EC2's
	// InterfaceType: interface, trunk, efa, efa-only, branch); "" or
	// "interface" is a plain one.
	Type string
	// NetworkCard is the network card it is attached on (EC2's
	// NetworkCardIndex on multi-card types, 0 elsewhere); device indexes
	// count per card.
	NetworkCard int
	// Unmanaged reports that the interface is not the workers' to use,
	// whatever a pool says (the provider decides; on AWS as the VPC CNI
	// with MANAGE_UNTAGGED_ENI=false): tagged TagNoManage=true, of a type
	// other than a plain interface (a trunk's addresses are its branches',
	// an EFA's its fabric's), on another network card than the one the
	// workers attach to, or attached by someone else than the workers
	// (not the primary, without TagCluster, and not opted in by a
	// TagNoManage of another value). It gets no Pod address, none of its
	// addresses is counted or given back, and it is never detached.
	Unmanaged bool
}

// Owned reports whether the workers created f: every interface they
// create carries TagCluster, and the IAM policy (deploy/cloud) lets them
// detach and delete only those.
func (f Interface) Owned() bool {
	_, ok := f.Tags[TagCluster]
	return ok
}

// Slots is how many of the interface's address slots are taken: the
// primary address, each secondary address and each prefix take one.
func (i Interface) Slots() int { return 1 + len(i.Addresses) + len(i.Prefixes) }

// Subnet is a subnet interfaces can be created in.
type Subnet struct {
	ID, VPC, Zone string
	CIDR          netip.Prefix
	// Free is how many addresses the subnet can still hand out.
	Free int
	Tags map[string]string
}

// InterfaceSpec is an interface to create and attach.
type InterfaceSpec struct {
	Instance       string
	Subnet         string
	SecurityGroups []string
	// Addresses secondary addresses, or Prefixes /28 prefixes, are
	// assigned with the interface (at most one of the two).
	Addresses, Prefixes int
	// Tags are set on the interface; the provider adds TagCreatedAt.
	Tags map[string]string
	// FirstDevice is the lowest device index the interface may take.
	FirstDevice int
}

// The tags of the interfaces the workers create: the cluster and node
// they belong to, and when they were made (RFC 3339), which tells a leaked
// interface's age.
const (
	TagCluster   = "ipam-dev.io/cluster"
	TagNode      = "ipam-dev.io/node"
	TagCreatedAt = "ipam-dev.io/created-at"
)

// TagNoManage is the VPC CNI's tag that keeps an interface out of Pod
// addressing when "true" (node.k8s.amazonaws.com/no_manage); any other
// value opts an interface a user attached in.
const TagNoManage = "node.k8s.amazonaws.com/no_manage"

// Assigned is what one Assign added.
type Assigned struct {
	Addresses []netip.Addr
	Prefixes  []netip.Prefix
}
