// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/ipam-dev/ipam/internal/cloud"
)

// Subnets answers the subnets of vpc in zone, every page of them.
func (p *Provider) Subnets(ctx context.Context, vpc, zone string) ([]cloud.Subnet, error) {
	pages := ec2.NewDescribeSubnetsPaginator(p.ec2, &ec2.DescribeSubnetsInput{Filters: []types.Filter{
		{Name: sdkaws.String("vpc-id"), Values: []string{vpc}},
		{Name: sdkaws.String("availability-zone"), Values: []string{zone}},
	}, MaxResults: sdkaws.Int32(PageSize)})
	var out []cloud.Subnet
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify(err)
		}
		for _, sn := range page.Subnets {
			cidr, err := netip.ParsePrefix(sdkaws.ToString(sn.CidrBlock))
			if err != nil {
				return nil, fmt.Errorf("subnet %s: %w", sdkaws.ToString(sn.SubnetId), err)
			}
			s := cloud.Subnet{ID: sdkaws.ToString(sn.SubnetId), VPC: sdkaws.ToString(sn.VpcId), Zone: sdkaws.ToString(sn.AvailabilityZone),
				CIDR: cidr, Free: int(sdkaws.ToInt32(sn.AvailableIpAddressCount)), Tags: map[string]string{}}
			for _, t := range sn.Tags {
				s.Tags[sdkaws.ToString(t.Key)] = sdkaws.ToString(t.Value)
			}
			out = append(out, s)
		}
	}
	return out, nil
}

// CreateInterface creates the interface, attaches it on the type's
// default network card at the card's first free device index from
// spec.FirstDevice (describing the instance again and taking the next one
// when another attach took it first), marks it to be deleted with the
// instance, and deletes it when it could not be attached. A new interface
// is not visible to every EC2 call at once: calls naming it are tried
// again a few times while EC2 says it does not exist.
//
// The create carries a ClientToken of its own, which the SDK's retries of
// the call repeat: when an answer is lost after EC2 created the interface
// (a 5xx, a cut connection), the retry answers that interface instead of
// making a second one that nothing would attach.
func (p *Provider) CreateInterface(ctx context.Context, spec cloud.InterfaceSpec) (cloud.Interface, error) {
	inst, err := p.Instance(ctx, spec.Instance)
	if err != nil {
		return cloud.Interface{}, err
	}
	if err := checkSpec(spec, inst); err != nil {
		return cloud.Interface{}, err
	}
	tags := maps.Clone(spec.Tags)
	if tags == nil {
		tags = map[string]string{}
	}
	tags[cloud.TagCreatedAt] = p.opts.Now().UTC().Format(time.RFC3339)
	token, err := clientToken()
	if err != nil {
		return cloud.Interface{}, err
	}
	in := &ec2.CreateNetworkInterfaceInput{
		ClientToken:       sdkaws.String(token),
		SubnetId:          sdkaws.String(spec.Subnet),
		Groups:            spec.SecurityGroups,
		Description:       sdkaws.String("Pod addresses of " + spec.Instance),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface, Tags: ec2Tags(tags)}},
	}
	switch {
	case spec.Prefixes > 0:
		in.Ipv4PrefixCount = sdkaws.Int32(int32(spec.Prefixes))
	case spec.Addresses > 0:
		in.SecondaryPrivateIpAddressCount = sdkaws.Int32(int32(spec.Addresses))
	}
	out, err := p.ec2.CreateNetworkInterface(ctx, in)
	if err != nil {
		return cloud.Interface{}, classify(err)
	}
	f, err := interfaceOf(*out.NetworkInterface)
	if err != nil {
		return cloud.Interface{}, err
	}
	attachment, device, err := p.attach(ctx, f.ID, inst, spec.FirstDevice)
	if err != nil {
		// An interface attached to nothing is a leak: delete it now
		// (the garbage collection of Detached catches it when this
		// fails too).
		if derr := p.deleteNew(ctx, f.ID); derr != nil {
			return cloud.Interface{}, errors.Join(err, fmt.Errorf("deleting the unattached %s: %w", f.ID, derr))
		}
		return cloud.Interface{}, err
	}
	err = p.eventually(ctx, func() error {
		_, err := p.ec2.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
			NetworkInterfaceId: sdkaws.String(f.ID),
			Attachment:         &types.NetworkInterfaceAttachmentChanges{AttachmentId: sdkaws.String(attachment), DeleteOnTermination: sdkaws.Bool(true)},
		})
		return err
	})
	if err != nil {
		return cloud.Interface{}, fmt.Errorf("interface %s attached at device %d, but not marked for deletion with the instance: %w", f.ID, device, err)
	}
	f.DeviceIndex, f.NetworkCard, f.Attached = device, inst.NetworkCard, true
	created := []cloud.Interface{f}
	if err := p.withNetworks(ctx, created); err != nil {
		return cloud.Interface{}, fmt.Errorf("interface %s attached at device %d: %w", f.ID, device, err)
	}
	return created[0], nil
}

// checkSpec refuses a spec the instance's type cannot take, before any
// call: an interface created with more addresses than the type allows
// fails its attach.
func checkSpec(spec cloud.InterfaceSpec, inst cloud.Instance) error {
	invalid := func(format string, args ...any) error {
		return &cloud.Error{Kind: cloud.KindInvalid, Code: "InvalidParameterValue", Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case spec.Addresses < 0 || spec.Prefixes < 0 || (spec.Addresses > 0 && spec.Prefixes > 0):
		return invalid("an interface takes addresses or prefixes, not %d and %d", spec.Addresses, spec.Prefixes)
	case spec.Prefixes > 0 && !inst.Limits.Prefixes:
		return invalid("instance type %s takes no prefixes", inst.Type)
	case 1+spec.Addresses+spec.Prefixes > inst.Limits.IPv4PerInterface:
		return invalid("an interface of %s holds %d addresses, the primary included; asked %d more", inst.Type, inst.Limits.IPv4PerInterface, spec.Addresses+spec.Prefixes)
	case onCard(inst) >= inst.Limits.Interfaces:
		return &cloud.Error{Kind: cloud.KindAttachmentLimit, Code: "AttachmentLimitExceeded",
			Message: fmt.Sprintf("%s holds its %d interfaces on network card %d", inst.ID, inst.Limits.Interfaces, inst.NetworkCard)}
	}
	return nil
}

// onCard counts the interfaces of inst on the network card the workers
// attach to: Limits.Interfaces is that card's.
func onCard(inst cloud.Instance) int {
	n := 0
	for _, f := range inst.Interfaces {
		if f.NetworkCard == inst.NetworkCard {
			n++
		}
	}
	return n
}

// clientToken is a create's idempotency token: 32 random hex digits (EC2
// takes up to 64 ASCII characters).
func clientToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("an idempotency token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// attach attaches interface id to inst on its default network card at
// the card's first free device index from first, and answers the
// attachment and the index.
func (p *Provider) attach(ctx context.Context, id string, inst cloud.Instance, first int) (string, int, error) {
	for try := 1; ; try++ {
		device := freeDevice(inst, first)
		var out *ec2.AttachNetworkInterfaceOutput
		err := p.eventually(ctx, func() error {
			var err error
			out, err = p.ec2.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{
				NetworkInterfaceId: sdkaws.String(id), InstanceId: sdkaws.String(inst.ID), DeviceIndex: sdkaws.Int32(int32(device)),
				NetworkCardIndex: sdkaws.Int32(int32(inst.NetworkCard)),
			})
			return err
		})
		if err == nil {
			return sdkaws.ToString(out.AttachmentId), device, nil
		}
		cerr := classify(err)
		var ce *cloud.Error
		if !errors.As(cerr, &ce) || ce.Code != "InvalidParameterValue" || !strings.Contains(ce.Message, "attached at device") || try == eventualTries {
			return "", 0, cerr
		}
		// Another attach took the index: look again.
		if inst, err = p.Instance(ctx, inst.ID); err != nil {
			return "", 0, err
		}
	}
}

// freeDevice is the lowest device index from first that no interface of
// inst takes on its default network card (each card counts its own,
// as the VPC CNI's awsGetFreeDeviceNumber reads them).
func freeDevice(inst cloud.Instance, first int) int {
	used := map[int]bool{}
	for _, f := range inst.Interfaces {
		if f.NetworkCard == inst.NetworkCard {
			used[f.DeviceIndex] = true
		}
	}
	d := max(first, 0)
	for used[d] {
		d++
	}
	return d
}

// deleteNew deletes an interface just created, trying again while EC2
// does not show it yet.
func (p *Provider) deleteNew(ctx context.Context, id string) error {
	err := p.eventually(ctx, func() error {
		_, err := p.ec2.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: sdkaws.String(id)})
		return err
	})
	return classifyOrNil(err)
}

// eventually calls call until it succeeds, fails otherwise than with an
// interface EC2 does not show (yet), or has been tried eventualTries
// times.
func (p *Provider) eventually(ctx context.Context, call func() error) error {
	for try := 1; ; try++ {
		err := call()
		if err == nil || try == eventualTries || errorCode(err) != "InvalidNetworkInterfaceID.NotFound" {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(p.opts.Wait(try)):
		}
	}
}

// Detached answers the available interfaces carrying every tag of tags,
// each value exactly. EC2 reads * and ? in a filter value as wildcards
// (a cluster named prod-? would select prod-1's interfaces, and the
// collector delete them): the tag filters only narrow what EC2 answers,
// and every interface answered is checked against tags again here.
func (p *Provider) Detached(ctx context.Context, tags map[string]string) ([]cloud.Interface, error) {
	filters := []types.Filter{{Name: sdkaws.String("status"), Values: []string{string(types.NetworkInterfaceStatusAvailable)}}}
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		filters = append(filters, types.Filter{Name: sdkaws.String("tag:" + k), Values: []string{tags[k]}})
	}
	pages := ec2.NewDescribeNetworkInterfacesPaginator(p.ec2, &ec2.DescribeNetworkInterfacesInput{Filters: filters, MaxResults: sdkaws.Int32(PageSize)})
	var out []cloud.Interface
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify(err)
		}
		for _, ni := range page.NetworkInterfaces {
			f, err := interfaceOf(ni)
			if err != nil {
				return nil, err
			}
			if !carries(f.Tags, tags) {
				continue
			}
			out = append(out, f)
		}
	}
	return out, nil
}

// carries reports whether have holds every tag of want with its exact
// value.
func carries(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// DetachInterface detaches interface id: its attachment, read from EC2,
// is detached (asynchronously: EC2 shows it available later). An
// interface without the cluster tag is not the workers' (a user's, a
// trunk, an EFA): refused before the detach, as the IAM policy refuses
// it.
func (p *Provider) DetachInterface(ctx context.Context, id string) error {
	out, err := p.ec2.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{id}})
	if err != nil {
		return classify(err)
	}
	if len(out.NetworkInterfaces) != 1 || out.NetworkInterfaces[0].Attachment == nil || out.NetworkInterfaces[0].Attachment.AttachmentId == nil {
		return &cloud.Error{Kind: cloud.KindInvalid, Code: "NotAttached", Message: "interface " + id + " is attached to nothing"}
	}
	if f, err := interfaceOf(out.NetworkInterfaces[0]); err != nil || !f.Owned() {
		return &cloud.Error{Kind: cloud.KindInvalid, Code: "NotOwned", Message: "interface " + id + " does not carry " + cloud.TagCluster + ": the workers did not create it"}
	}
	_, err = p.ec2.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: out.NetworkInterfaces[0].Attachment.AttachmentId})
	return classifyOrNil(err)
}

// DeleteInterface deletes interface id.
func (p *Provider) DeleteInterface(ctx context.Context, id string) error {
	_, err := p.ec2.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: sdkaws.String(id)})
	return classifyOrNil(err)
}

func classifyOrNil(err error) error {
	if err == nil {
		return nil
	}
	return classify(err)
}

func ec2Tags(tags map[string]string) []types.Tag {
	var out []types.Tag
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		out = append(out, types.Tag{Key: sdkaws.String(k), Value: sdkaws.String(tags[k])})
	}
	return out
}
