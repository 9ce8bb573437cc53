// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// tags are the workers' tags of one node's interfaces.
var tags = map[string]string{cloud.TagCluster: "prod", cloud.TagNode: "node-a"}

func TestCreateInterface(t *testing.T) {
	ctx := context.Background()
	fake, inst, _ := world(t, "m5.large", "10.10.0.0/24")
	p := newProvider(t, fake, 1)
	now := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	p.opts.Now = func() time.Time { return now }
	f, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", SecurityGroups: []string{"sg-pods"}, Addresses: 4, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	if f.DeviceIndex != 1 || !f.Attached || len(f.Addresses) != 4 || !slices.Equal(f.SecurityGroups, []string{"sg-pods"}) {
		t.Fatalf("created %+v", f)
	}
	if f.Tags[cloud.TagCreatedAt] != "2026-12-02T01:00:00Z" || f.Tags[cloud.TagNode] != "node-a" {
		t.Fatalf("tags %v", f.Tags)
	}
	var got ec2fake.Interface
	for _, g := range fake.Interfaces() {
		if g.ID == f.ID {
			got = g
		}
	}
	if got.Status != "in-use" || got.Instance != inst || got.Device != 1 || !got.DeleteOnTermination {
		t.Fatalf("in EC2: %+v", got)
	}
	// The next one skips the taken index, from the first index asked.
	f2, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Prefixes: 2, FirstDevice: 2})
	if err != nil {
		t.Fatal(err)
	}
	if f2.DeviceIndex != 2 || len(f2.Prefixes) != 2 {
		t.Fatalf("created %+v", f2)
	}
	described, err := p.Instance(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	if len(described.Interfaces) != 3 || described.VPC != "vpc-1" || described.Zone != "eu-west-1a" || described.SubnetID != "subnet-a" {
		t.Fatalf("described %+v", described)
	}
}

// TestCreateInterfaceRefusedBeforeAnyCall: what cannot attach is not
// created (cilium#9730: an interface made with more addresses than the
// type allows; cilium#8830: the interface limit ignored).
func TestCreateInterfaceRefusedBeforeAnyCall(t *testing.T) {
	ctx := context.Background()
	fake, inst, _ := world(t, "t3.small", "10.11.0.0/24")
	p := newProvider(t, fake, 1)
	for _, c := range []struct {
		spec cloud.InterfaceSpec
		kind cloud.Kind
	}{
		{cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 4}, cloud.KindInvalid},
		{cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 1, Prefixes: 1}, cloud.KindInvalid},
		{cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: -1}, cloud.KindInvalid},
	} {
		if _, err := p.CreateInterface(ctx, c.spec); cloud.KindOf(err) != c.kind {
			t.Errorf("%+v: err %v, want %v", c.spec, err, c.kind)
		}
	}
	for range 2 {
		if _, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 3}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 1}); cloud.KindOf(err) != cloud.KindAttachmentLimit {
		t.Fatalf("a fourth interface on a t3.small: %v", err)
	}
	if n := fake.Calls("CreateNetworkInterface"); n != 2 {
		t.Fatalf("%d creates, want 2: refused specs must not reach EC2", n)
	}
	// Prefixes on Xen.
	fake2, inst2, _ := world(t, "t2.medium", "10.12.0.0/24")
	p2 := newProvider(t, fake2, 1)
	if _, err := p2.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst2, Subnet: "subnet-a", Prefixes: 1}); cloud.KindOf(err) != cloud.KindInvalid || fake2.Calls("CreateNetworkInterface") != 0 {
		t.Fatalf("prefixes on a t2.medium: %v", err)
	}
}

// TestCreateInterfaceEventualConsistency: EC2 does not show a new
// interface at once; the attach and the attribute change are tried again.
func TestCreateInterfaceEventualConsistency(t *testing.T) {
	fake, inst, _ := world(t, "m5.large", "10.13.0.0/24")
	fake.SetInvisibleAfterCreate(2)
	p := newProvider(t, fake, 1)
	f, err := p.CreateInterface(context.Background(), cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 2})
	if err != nil {
		t.Fatal(err)
	}
	if n := fake.Calls("AttachNetworkInterface"); n != 3 {
		t.Fatalf("%d attaches, want 3 (two answered NotFound)", n)
	}
	if !f.Attached {
		t.Fatalf("created %+v", f)
	}
}

// TestCreateInterfaceInstanceGone: an instance gone between the create
// and the attach leaves no interface behind (amazon-vpc-cni-k8s#69), and a
// terminated instance gets no create at all, so a worker cannot loop
// create, attach fails, delete against it (cilium#9533).
func TestCreateInterfaceInstanceGone(t *testing.T) {
	ctx := context.Background()
	fake, inst, eni0 := world(t, "m5.large", "10.14.0.0/24")
	p := newProvider(t, fake, 1)
	fake.SetFault(func(action string) *ec2fake.APIError {
		if action == "AttachNetworkInterface" {
			return &ec2fake.APIError{Code: "InvalidInstanceID.NotFound", Message: "The instance ID '" + inst + "' does not exist"}
		}
		return nil
	})
	_, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 2, Tags: tags})
	if cloud.KindOf(err) != cloud.KindNotFound {
		t.Fatalf("err %v, want %v", err, cloud.KindNotFound)
	}
	if all := fake.Interfaces(); len(all) != 1 || all[0].ID != eni0 {
		t.Fatalf("interfaces left: %+v", all)
	}
	if fake.Calls("DeleteNetworkInterface") != 1 {
		t.Fatalf("%d deletes", fake.Calls("DeleteNetworkInterface"))
	}
	fake.SetFault(nil)
	fake.TerminateInstance(inst)
	if _, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 2}); cloud.KindOf(err) != cloud.KindNotFound {
		t.Fatalf("on a terminated instance: %v", err)
	}
	if n := fake.Calls("CreateNetworkInterface"); n != 1 {
		t.Fatalf("%d creates, want 1", n)
	}
}

// TestCreateInterfaceDeviceTaken: another attach took the index first; the
// provider looks again and takes the next free one.
func TestCreateInterfaceDeviceTaken(t *testing.T) {
	fake, inst, _ := world(t, "m5.large", "10.15.0.0/24")
	p := newProvider(t, fake, 1)
	refused := false
	fake.SetFault(func(action string) *ec2fake.APIError {
		if action == "AttachNetworkInterface" && !refused {
			refused = true
			return &ec2fake.APIError{Code: "InvalidParameterValue", Message: "Instance '" + inst + "' already has an interface attached at device index '1'."}
		}
		return nil
	})
	f, err := p.CreateInterface(context.Background(), cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 1})
	if err != nil || !f.Attached {
		t.Fatalf("%+v, %v", f, err)
	}
	if n := fake.Calls("AttachNetworkInterface"); n != 2 {
		t.Fatalf("%d attaches, want 2", n)
	}
}

// TestDetachedAndDelete: interfaces an instance left behind are found by
// their tags once available, and deleted; one still attached or still
// detaching is refused (amazon-vpc-cni-k8s#608: the delete raced the
// asynchronous detach).
func TestDetachedAndDelete(t *testing.T) {
	ctx := context.Background()
	fake, inst, _ := world(t, "m5.large", "10.16.0.0/24")
	p := newProvider(t, fake, 1)
	fake.SetFault(func(action string) *ec2fake.APIError {
		if action == "ModifyNetworkInterfaceAttribute" {
			return &ec2fake.APIError{Code: "InternalError", Message: "An internal error has occurred"}
		}
		return nil
	})
	_, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 2, Tags: tags})
	if err == nil {
		t.Fatal("a create whose attribute change failed succeeded")
	}
	fake.SetFault(nil)
	leaked, err := p.Detached(ctx, tags)
	if err != nil || len(leaked) != 0 {
		t.Fatalf("detached while attached: %+v, %v", leaked, err)
	}
	var id string
	for _, f := range fake.Interfaces() {
		if f.Tags[cloud.TagNode] == "node-a" {
			id = f.ID
		}
	}
	if err := p.DeleteInterface(ctx, id); cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("deleting an attached interface: %v", err)
	}
	// The instance terminates: the interface not marked for deletion
	// stays, available, with its addresses.
	fake.TerminateInstance(inst)
	leaked, err = p.Detached(ctx, tags)
	if err != nil || len(leaked) != 1 || leaked[0].ID != id || leaked[0].Attached || len(leaked[0].Addresses) != 2 {
		t.Fatalf("detached %+v, %v", leaked, err)
	}
	if other, _ := p.Detached(ctx, map[string]string{cloud.TagCluster: "staging"}); len(other) != 0 {
		t.Fatalf("another cluster's tags matched %+v", other)
	}
	free := fake.FreeAddresses("subnet-a")
	if err := p.DeleteInterface(ctx, id); err != nil {
		t.Fatal(err)
	}
	if fake.FreeAddresses("subnet-a") != free+3 {
		t.Fatalf("deleting freed %d addresses, want 3", fake.FreeAddresses("subnet-a")-free)
	}
	if err := p.DeleteInterface(ctx, id); cloud.KindOf(err) != cloud.KindNotFound {
		t.Fatalf("deleting it again: %v", err)
	}
}

func TestSubnets(t *testing.T) {
	fake := ec2fake.New()
	for _, sn := range []ec2fake.Subnet{
		{ID: "subnet-a", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("10.20.0.0/24"), Tags: map[string]string{"kubernetes.io/role/cni": "1"}},
		{ID: "subnet-b", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("10.20.1.0/26")},
		{ID: "subnet-c", VPC: "vpc-1", Zone: "eu-west-1b", CIDR: netip.MustParsePrefix("10.20.2.0/24")},
		{ID: "subnet-d", VPC: "vpc-2", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("10.30.0.0/24")},
	} {
		fake.AddSubnet(sn)
	}
	fake.SetPageSize(1)
	p := newProvider(t, fake, 1)
	got, err := p.Subnets(context.Background(), "vpc-1", "eu-west-1a")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != "subnet-a" || got[1].ID != "subnet-b" {
		t.Fatalf("subnets %+v", got)
	}
	// 256 - 5 reserved; 64 - 5.
	if got[0].Free != 251 || got[1].Free != 59 || got[0].Tags["kubernetes.io/role/cni"] != "1" || got[1].CIDR != netip.MustParsePrefix("10.20.1.0/26") {
		t.Fatalf("subnets %+v", got)
	}
}
