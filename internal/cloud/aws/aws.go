// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package aws is the cloud.Provider of AWS: a node's Pod addresses are
// secondary addresses or /28 prefixes of its instance's network
// interfaces, through the EC2 API (aws-sdk-go-v2).
package aws

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/ipam-dev/ipam/internal/cloud"
)

// EC2 is the part of the EC2 API the provider calls.
type EC2 interface {
	DescribeInstances(context.Context, *ec2.DescribeInstancesInput, ...func(*ec2.Options)) (*ec2.DescribeInstancesOutput, error)
	DescribeInstanceTypes(context.Context, *ec2.DescribeInstanceTypesInput, ...func(*ec2.Options)) (*ec2.DescribeInstanceTypesOutput, error)
	DescribeNetworkInterfaces(context.Context, *ec2.DescribeNetworkInterfacesInput, ...func(*ec2.Options)) (*ec2.DescribeNetworkInterfacesOutput, error)
	AssignPrivateIpAddresses(context.Context, *ec2.AssignPrivateIpAddressesInput, ...func(*ec2.Options)) (*ec2.AssignPrivateIpAddressesOutput, error)
	UnassignPrivateIpAddresses(context.Context, *ec2.UnassignPrivateIpAddressesInput, ...func(*ec2.Options)) (*ec2.UnassignPrivateIpAddressesOutput, error)
	DescribeSubnets(context.Context, *ec2.DescribeSubnetsInput, ...func(*ec2.Options)) (*ec2.DescribeSubnetsOutput, error)
	DescribeSecurityGroups(context.Context, *ec2.DescribeSecurityGroupsInput, ...func(*ec2.Options)) (*ec2.DescribeSecurityGroupsOutput, error)
	DescribeVpcs(context.Context, *ec2.DescribeVpcsInput, ...func(*ec2.Options)) (*ec2.DescribeVpcsOutput, error)
	CreateNetworkInterface(context.Context, *ec2.CreateNetworkInterfaceInput, ...func(*ec2.Options)) (*ec2.CreateNetworkInterfaceOutput, error)
	AttachNetworkInterface(context.Context, *ec2.AttachNetworkInterfaceInput, ...func(*ec2.Options)) (*ec2.AttachNetworkInterfaceOutput, error)
	ModifyNetworkInterfaceAttribute(context.Context, *ec2.ModifyNetworkInterfaceAttributeInput, ...func(*ec2.Options)) (*ec2.ModifyNetworkInterfaceAttributeOutput, error)
	DetachNetworkInterface(context.Context, *ec2.DetachNetworkInterfaceInput, ...func(*ec2.Options)) (*ec2.DetachNetworkInterfaceOutput, error)
	DeleteNetworkInterface(context.Context, *ec2.DeleteNetworkInterfaceInput, ...func(*ec2.Options)) (*ec2.DeleteNetworkInterfaceOutput, error)
	AssignIpv6Addresses(context.Context, *ec2.AssignIpv6AddressesInput, ...func(*ec2.Options)) (*ec2.AssignIpv6AddressesOutput, error)
}

var (
	_ EC2                    = (*ec2.Client)(nil)
	_ cloud.Provider         = (*Provider)(nil)
	_ cloud.InterfaceManager = (*Provider)(nil)
	_ cloud.Inventory        = (*Provider)(nil)
)

// Provider is the AWS cloud.Provider over one EC2 client (one region).
type Provider struct {
	ec2  EC2
	opts Options

	mu     sync.Mutex              // guards limits, cards, subnets, vpcs and groups
	limits map[string]cloud.Limits // by instance type: they never change
	// cards are the types' default network cards, by instance type.
	cards map[string]int
	// subnets and vpcs are the ranges of the subnets and the blocks of
	// the VPCs interfaces were met in, by id (withNetworks).
	subnets map[string]subnetInfo
	vpcs    map[string][]netip.Prefix
	// groups are SecurityGroups' answers, by groupsKey.
	groups map[string]groupsEntry
}

// Options are a Provider's clock and waits.
type Options struct {
	// Now is the clock of the creation tags; time.Now when nil.
	Now func() time.Time
	// Wait is how long to wait before try n (from 1) of a call that
	// named an interface EC2 does not show yet (it shows a new one only
	// after a while); n*500ms when nil.
	Wait func(n int) time.Duration
}

// eventualTries bounds the tries of a call that names a new interface,
// and of an attach that lost its device index to another.
const eventualTries = 5

// PageSize is how many items a listing asks for a page: the most EC2
// answers. Every listing asks for pages: an unpaginated one fails on a
// large account (OperationNotPermitted), and the SDK's paginators send
// no MaxResults unless the input has one.
const PageSize = 1000

// New answers a provider calling EC2 through client.
func New(client EC2, opts Options) *Provider {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Wait == nil {
		opts.Wait = func(n int) time.Duration { return time.Duration(n) * 500 * time.Millisecond }
	}
	return &Provider{ec2: client, opts: opts, limits: map[string]cloud.Limits{}, cards: map[string]int{}, subnets: map[string]subnetInfo{}, vpcs: map[string][]netip.Prefix{},
		groups: map[string]groupsEntry{}}
}

// Instance describes instance id: its type's limits (asked of EC2 once per
// type) and its attached interfaces by device index, every page of them.
func (p *Provider) Instance(ctx context.Context, id string) (cloud.Instance, error) {
	out, err := p.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if err != nil {
		return cloud.Instance{}, classify(err)
	}
	var inst cloud.Instance
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if sdkaws.ToString(in.InstanceId) != id {
				continue
			}
			if in.State != nil && (in.State.Name == types.InstanceStateNameTerminated || in.State.Name == types.InstanceStateNameShuttingDown) {
				return cloud.Instance{}, &cloud.Error{Kind: cloud.KindNotFound, Code: "InvalidInstanceID.NotFound", Message: "instance " + id + " is " + string(in.State.Name), Ended: true}
			}
			inst = cloud.Instance{ID: id, Type: string(in.InstanceType), VPC: sdkaws.ToString(in.VpcId), SubnetID: sdkaws.ToString(in.SubnetId)}
			if in.Placement != nil {
				inst.Zone = sdkaws.ToString(in.Placement.AvailabilityZone)
			}
		}
	}
	if inst.ID == "" {
		return cloud.Instance{}, &cloud.Error{Kind: cloud.KindNotFound, Code: "InvalidInstanceID.NotFound", Message: "no instance " + id + " in the answer"}
	}
	limits, card, err := p.limitsOf(ctx, inst.Type)
	if err != nil {
		return cloud.Instance{}, err
	}
	inst.Limits, inst.NetworkCard = limits, card
	pages := ec2.NewDescribeNetworkInterfacesPaginator(p.ec2, &ec2.DescribeNetworkInterfacesInput{
		Filters:    []types.Filter{{Name: sdkaws.String("attachment.instance-id"), Values: []string{id}}},
		MaxResults: sdkaws.Int32(PageSize),
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return cloud.Instance{}, classify(err)
		}
		for _, ni := range page.NetworkInterfaces {
			f, err := interfaceOf(ni)
			if err != nil {
				return cloud.Instance{}, err
			}
			inst.Interfaces = append(inst.Interfaces, f)
		}
	}
	slices.SortFunc(inst.Interfaces, byDevice)
	markUnmanaged(&inst)
	if err := p.withNetworks(ctx, inst.Interfaces); err != nil {
		return cloud.Instance{}, err
	}
	return inst, nil
}

// Instances describes the running instances of vpc and their interfaces:
// every page of DescribeInstances and of DescribeNetworkInterfaces
// filtered by the VPC, the types' limits asked once each.
func (p *Provider) Instances(ctx context.Context, vpc string) (map[string]cloud.Instance, error) {
	byVPC := []types.Filter{{Name: sdkaws.String("vpc-id"), Values: []string{vpc}}}
	out := map[string]cloud.Instance{}
	pages := ec2.NewDescribeInstancesPaginator(p.ec2, &ec2.DescribeInstancesInput{Filters: byVPC, MaxResults: sdkaws.Int32(PageSize)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify(err)
		}
		for _, r := range page.Reservations {
			for _, in := range r.Instances {
				if in.State == nil || in.State.Name != types.InstanceStateNameRunning {
					continue
				}
				limits, card, err := p.limitsOf(ctx, string(in.InstanceType))
				if err != nil {
					return nil, err
				}
				inst := cloud.Instance{ID: sdkaws.ToString(in.InstanceId), Type: string(in.InstanceType), VPC: sdkaws.ToString(in.VpcId),
					SubnetID: sdkaws.ToString(in.SubnetId), Limits: limits, NetworkCard: card}
				if in.Placement != nil {
					inst.Zone = sdkaws.ToString(in.Placement.AvailabilityZone)
				}
				out[inst.ID] = inst
			}
		}
	}
	nics := ec2.NewDescribeNetworkInterfacesPaginator(p.ec2, &ec2.DescribeNetworkInterfacesInput{Filters: byVPC, MaxResults: sdkaws.Int32(PageSize)})
	for nics.HasMorePages() {
		page, err := nics.NextPage(ctx)
		if err != nil {
			return nil, classify(err)
		}
		for _, ni := range page.NetworkInterfaces {
			if ni.Attachment == nil {
				continue
			}
			inst, ok := out[sdkaws.ToString(ni.Attachment.InstanceId)]
			if !ok {
				continue
			}
			f, err := interfaceOf(ni)
			if err != nil {
				return nil, err
			}
			inst.Interfaces = append(inst.Interfaces, f)
			out[inst.ID] = inst
		}
	}
	var all []cloud.Interface
	for _, inst := range out {
		all = append(all, inst.Interfaces...)
	}
	// One reading of the subnets and VPCs all the interfaces miss.
	if err := p.withNetworks(ctx, all); err != nil {
		return nil, err
	}
	for id, inst := range out {
		if err := p.withNetworks(ctx, inst.Interfaces); err != nil {
			return nil, err
		}
		slices.SortFunc(inst.Interfaces, byDevice)
		markUnmanaged(&inst)
		out[id] = inst
	}
	return out, nil
}

// limitsOf answers the limits of instance type typ and its default
// network card. On a type with several network cards the interfaces the
// workers attach go on the default card, so the limit is that card's
// MaximumNetworkInterfaces, not the instance's (the VPC CNI's ENI limit,
// scripts/gen_vpc_ip_limits.go): c6in.32xlarge takes 16 interfaces, 8 a
// card, and a ninth on card 0 is AttachmentLimitExceeded.
func (p *Provider) limitsOf(ctx context.Context, typ string) (cloud.Limits, int, error) {
	p.mu.Lock()
	l, ok := p.limits[typ]
	card := p.cards[typ]
	p.mu.Unlock()
	if ok {
		return l, card, nil
	}
	out, err := p.ec2.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{types.InstanceType(typ)}})
	if err != nil {
		return cloud.Limits{}, 0, classify(err)
	}
	for _, it := range out.InstanceTypes {
		if string(it.InstanceType) != typ || it.NetworkInfo == nil {
			continue
		}
		ni := it.NetworkInfo
		l = cloud.Limits{
			Interfaces:       int(sdkaws.ToInt32(ni.MaximumNetworkInterfaces)),
			IPv4PerInterface: int(sdkaws.ToInt32(ni.Ipv4AddressesPerInterface)),
			IPv6PerInterface: int(sdkaws.ToInt32(ni.Ipv6AddressesPerInterface)),
			// Prefixes are delegated to the interfaces of Nitro
			// instances, bare metal included (EC2 names no hypervisor
			// for those): the VPC CNI's IsPrefixDelegationSupported.
			Prefixes: it.Hypervisor == types.InstanceTypeHypervisorNitro || sdkaws.ToBool(it.BareMetal),
		}
		if it.VCpuInfo != nil {
			l.VCPUs = int(sdkaws.ToInt32(it.VCpuInfo.DefaultVCpus))
		}
		card = int(sdkaws.ToInt32(ni.DefaultNetworkCardIndex))
		if len(ni.NetworkCards) > 1 {
			for _, c := range ni.NetworkCards {
				if int(sdkaws.ToInt32(c.NetworkCardIndex)) == card {
					l.Interfaces = int(sdkaws.ToInt32(c.MaximumNetworkInterfaces))
				}
			}
		}
		p.mu.Lock()
		p.limits[typ], p.cards[typ] = l, card
		p.mu.Unlock()
		return l, card, nil
	}
	return cloud.Limits{}, 0, fmt.Errorf("EC2 described no network limits of instance type %q", typ)
}

func byDevice(a, b cloud.Interface) int {
	return cmp.Or(cmp.Compare(a.NetworkCard, b.NetworkCard), cmp.Compare(a.DeviceIndex, b.DeviceIndex))
}

// markUnmanaged marks the interfaces of inst that are not the workers'
// to use (cloud.Interface.Unmanaged), as the VPC CNI's ipamd leaves them
// alone (setUnmanagedENIs, filterUnmanagedENIs): one tagged
// cloud.TagNoManage=true; a trunk (its addresses serve branch
// interfaces), an EFA or any other type than a plain interface; one on
// another network card than the default (the VPC CNI without
// ENABLE_MULTI_NIC); and one a user attached: not the primary, without
// the cluster tag the workers put on theirs, and not opted in by a
// TagNoManage of another value than "true" (the VPC CNI with
// MANAGE_UNTAGGED_ENI=false; Cilium's operator would use it unless
// excluded by spec.eni, and detach nothing either way).
func markUnmanaged(inst *cloud.Instance) {
	for i := range inst.Interfaces {
		f := &inst.Interfaces[i]
		noManage, tagged := f.Tags[cloud.TagNoManage]
		primary := f.NetworkCard == 0 && f.DeviceIndex == 0
		f.Unmanaged = (tagged && noManage == "true") ||
			(f.Type != "" && f.Type != string(types.NetworkInterfaceTypeInterface)) ||
			(!primary && f.NetworkCard != inst.NetworkCard) ||
			(!primary && !f.Owned() && !tagged)
	}
}

// interfaceOf converts an EC2 interface; an address EC2 answers that is no
// address is an error, never skipped.
func interfaceOf(ni types.NetworkInterface) (cloud.Interface, error) {
	f := cloud.Interface{ID: sdkaws.ToString(ni.NetworkInterfaceId), MAC: sdkaws.ToString(ni.MacAddress), SubnetID: sdkaws.ToString(ni.SubnetId),
		Attached: ni.Attachment != nil && sdkaws.ToString(ni.Attachment.InstanceId) != ""}
	f.Type = string(ni.InterfaceType)
	if ni.Attachment != nil {
		f.DeviceIndex = int(sdkaws.ToInt32(ni.Attachment.DeviceIndex))
		f.NetworkCard = int(sdkaws.ToInt32(ni.Attachment.NetworkCardIndex))
		f.Detaching = ni.Attachment.Status == types.AttachmentStatusDetaching || ni.Attachment.Status == types.AttachmentStatusDetached
	}
	for _, g := range ni.Groups {
		f.SecurityGroups = append(f.SecurityGroups, sdkaws.ToString(g.GroupId))
	}
	if len(ni.TagSet) > 0 {
		f.Tags = map[string]string{}
		for _, t := range ni.TagSet {
			f.Tags[sdkaws.ToString(t.Key)] = sdkaws.ToString(t.Value)
		}
	}
	for _, a := range ni.PrivateIpAddresses {
		addr, err := netip.ParseAddr(sdkaws.ToString(a.PrivateIpAddress))
		if err != nil {
			return cloud.Interface{}, fmt.Errorf("interface %s: %w", f.ID, err)
		}
		if sdkaws.ToBool(a.Primary) {
			f.Primary = addr
		} else {
			f.Addresses = append(f.Addresses, addr)
		}
	}
	for _, p := range ni.Ipv4Prefixes {
		prefix, err := netip.ParsePrefix(sdkaws.ToString(p.Ipv4Prefix))
		if err != nil {
			return cloud.Interface{}, fmt.Errorf("interface %s: %w", f.ID, err)
		}
		f.Prefixes = append(f.Prefixes, prefix)
	}
	for _, p := range ni.Ipv6Prefixes {
		prefix, err := netip.ParsePrefix(sdkaws.ToString(p.Ipv6Prefix))
		if err != nil {
			return cloud.Interface{}, fmt.Errorf("interface %s: %w", f.ID, err)
		}
		f.IPv6Prefixes = append(f.IPv6Prefixes, prefix)
	}
	return f, nil
}

// Assign asks EC2 for n secondary addresses, or n /28 prefixes, of
// interface iface's subnet, EC2 choosing them.
func (p *Provider) Assign(ctx context.Context, iface string, n int, prefixes bool) (cloud.Assigned, error) {
	if n < 1 {
		return cloud.Assigned{}, &cloud.Error{Kind: cloud.KindInvalid, Code: "InvalidParameterValue", Message: fmt.Sprintf("assign %d addresses", n)}
	}
	in := &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: sdkaws.String(iface)}
	if prefixes {
		in.Ipv4PrefixCount = sdkaws.Int32(int32(n))
	} else {
		in.SecondaryPrivateIpAddressCount = sdkaws.Int32(int32(n))
	}
	out, err := p.ec2.AssignPrivateIpAddresses(ctx, in)
	if err != nil {
		return cloud.Assigned{}, classify(err)
	}
	var got cloud.Assigned
	for _, a := range out.AssignedPrivateIpAddresses {
		addr, err := netip.ParseAddr(sdkaws.ToString(a.PrivateIpAddress))
		if err != nil {
			return cloud.Assigned{}, fmt.Errorf("interface %s: assigned %w", iface, err)
		}
		got.Addresses = append(got.Addresses, addr)
	}
	for _, a := range out.AssignedIpv4Prefixes {
		prefix, err := netip.ParsePrefix(sdkaws.ToString(a.Ipv4Prefix))
		if err != nil {
			return cloud.Assigned{}, fmt.Errorf("interface %s: assigned %w", iface, err)
		}
		got.Prefixes = append(got.Prefixes, prefix)
	}
	return got, nil
}

// Unassign removes addrs and prefixes from interface iface in one call.
func (p *Provider) Unassign(ctx context.Context, iface string, addrs []netip.Addr, prefixes []netip.Prefix) error {
	if len(addrs)+len(prefixes) == 0 {
		return nil
	}
	in := &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: sdkaws.String(iface)}
	for _, a := range addrs {
		in.PrivateIpAddresses = append(in.PrivateIpAddresses, a.String())
	}
	for _, pf := range prefixes {
		in.Ipv4Prefixes = append(in.Ipv4Prefixes, pf.String())
	}
	if _, err := p.ec2.UnassignPrivateIpAddresses(ctx, in); err != nil {
		return classify(err)
	}
	return nil
}

// AssignIPv6Prefix asks EC2 to delegate one IPv6 /80 of iface's subnet to
// iface.
func (p *Provider) AssignIPv6Prefix(ctx context.Context, iface string) (netip.Prefix, error) {
	out, err := p.ec2.AssignIpv6Addresses(ctx, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: sdkaws.String(iface), Ipv6PrefixCount: sdkaws.Int32(1)})
	if err != nil {
		return netip.Prefix{}, classify(err)
	}
	if len(out.AssignedIpv6Prefixes) != 1 {
		return netip.Prefix{}, fmt.Errorf("EC2 delegated %d IPv6 prefixes to %s, asked 1", len(out.AssignedIpv6Prefixes), iface)
	}
	got, err := netip.ParsePrefix(out.AssignedIpv6Prefixes[0])
	if err != nil || !got.Addr().Is6() {
		return netip.Prefix{}, fmt.Errorf("EC2 delegated %q to %s: no IPv6 prefix", out.AssignedIpv6Prefixes[0], iface)
	}
	return got, nil
}

// kinds are the EC2 error codes the workers act on.
var kinds = map[string]cloud.Kind{
	"InvalidInstanceID.NotFound":              cloud.KindNotFound,
	"InvalidInstanceID.Malformed":             cloud.KindInvalid,
	"InvalidNetworkInterfaceID.NotFound":      cloud.KindNotFound,
	"PrivateIpAddressLimitExceeded":           cloud.KindInterfaceFull,
	"Ipv6AddressLimitExceeded":                cloud.KindInterfaceFull,
	"InsufficientFreeAddressesInSubnet":       cloud.KindSubnetFull,
	"InsufficientCidrBlocks":                  cloud.KindNoContiguousPrefix,
	"AttachmentLimitExceeded":                 cloud.KindAttachmentLimit,
	"InvalidSubnetID.NotFound":                cloud.KindNotFound,
	"InvalidInterface.IpAddressLimitExceeded": cloud.KindInvalid,
	"InvalidNetworkInterface.InUse":           cloud.KindInvalid,
	"OperationNotPermitted":                   cloud.KindInvalid,
	"RequestLimitExceeded":                    cloud.KindThrottled,
	"InvalidParameterValue":                   cloud.KindInvalid,
	"InvalidParameterCombination":             cloud.KindInvalid,
}

// noPrefixMessage is how EC2 words an InvalidParameterValue for a prefix
// when a subnet's free space is too fragmented for one.
const noPrefixMessage = "There aren't sufficient free Ipv4 addresses or prefixes"

// errorCode is the EC2 error code of err, "" when it is no API error.
func errorCode(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode()
	}
	return ""
}

// classify makes an EC2 error a *cloud.Error of its kind; an error that is
// no API error (a cancelled context, a network failure) is returned as it
// is.
func classify(err error) error {
	var api smithy.APIError
	if !errors.As(err, &api) {
		return err
	}
	kind := kinds[api.ErrorCode()]
	if api.ErrorCode() == "InvalidParameterValue" && strings.Contains(strings.ToLower(api.ErrorMessage()), strings.ToLower(noPrefixMessage)) {
		kind = cloud.KindNoContiguousPrefix
	}
	return &cloud.Error{Kind: kind, Code: api.ErrorCode(), Message: api.ErrorMessage(), Err: err}
}
