// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"net/netip"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// TestCloudInterfaces: a reading replaces the node's interfaces as a
// whole (one gone from the cloud goes from the record), round-trips every
// field, and goes with its node.
func TestCloudInterfaces(t *testing.T) {
	f := cloudFixture(t)
	got, err := f.s.CloudInterfaces(f.ctx, alloc.DefaultSpace, "n1")
	if err != nil || got.Instance != "" || len(got.Interfaces) != 0 || !got.ReadAt.IsZero() {
		t.Fatalf("before any reading: %+v, %v", got, err)
	}
	if _, err := f.s.CloudInterfaces(f.ctx, alloc.DefaultSpace, "nobody"); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("an unknown node answered %v", err)
	}
	eni1 := CloudInterface{ID: "eni-1", MAC: "0a:00:00:00:00:01", DeviceIndex: 1, SubnetID: "subnet-1",
		SubnetCIDR: netip.MustParsePrefix("10.75.0.0/16"), VPC: "vpc-1", VPCCIDRs: []netip.Prefix{netip.MustParsePrefix("10.75.0.0/16")},
		Zone: "eu-west-1a", Primary: netip.MustParseAddr("10.75.0.4"), Addresses: []netip.Addr{netip.MustParseAddr("10.75.0.5")},
		Prefixes: []netip.Prefix{netip.MustParsePrefix("10.75.1.16/28")}, SecurityGroups: []string{"sg-1"}, Tags: map[string]string{"k": "v"}}
	eni0 := CloudInterface{ID: "eni-0", DeviceIndex: 0, Primary: netip.MustParseAddr("10.75.0.3")}
	at := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	if err := f.s.SetCloudInterfaces(f.ctx, alloc.DefaultSpace, "n1", "i-0123456789abcdef0", InstanceLimits{}, []CloudInterface{eni1, eni0}, at); err != nil {
		t.Fatal(err)
	}
	got, err = f.s.CloudInterfaces(f.ctx, alloc.DefaultSpace, "n1")
	if err != nil || got.Instance != "i-0123456789abcdef0" || !got.ReadAt.Equal(at) || len(got.Interfaces) != 2 {
		t.Fatalf("after a reading: %+v, %v", got, err)
	}
	if g := got.Interfaces[1]; g.ID != "eni-1" || g.MAC != eni1.MAC || g.SubnetCIDR != eni1.SubnetCIDR || g.VPCCIDRs[0] != eni1.VPCCIDRs[0] ||
		g.Addresses[0] != eni1.Addresses[0] || g.Prefixes[0] != eni1.Prefixes[0] || g.Tags["k"] != "v" || g.Zone != eni1.Zone || g.Primary != eni1.Primary {
		t.Fatalf("eni-1 read back as %+v", g)
	}
	if got.Interfaces[0].ID != "eni-0" {
		t.Fatalf("not by device index: %+v", got.Interfaces)
	}
	if got.Limits.Known() {
		t.Fatalf("limits of a reading without them: %+v", got.Limits)
	}
	// The next reading lacks eni-1: it goes. It knows the type's limits.
	t3nano := InstanceLimits{Type: "t3.nano", Interfaces: 2, IPv4PerInterface: 2}
	if err := f.s.SetCloudInterfaces(f.ctx, alloc.DefaultSpace, "n1", "i-0123456789abcdef0", t3nano, []CloudInterface{eni0}, at.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, _ = f.s.CloudInterfaces(f.ctx, alloc.DefaultSpace, "n1"); len(got.Interfaces) != 1 || got.Interfaces[0].ID != "eni-0" || got.Limits != t3nano {
		t.Fatalf("after the second reading: %+v, limits %+v", got.Interfaces, got.Limits)
	}
	if err := f.s.SetCloudInterfaces(f.ctx, alloc.DefaultSpace, "n1", "", InstanceLimits{}, nil, at); !alloc.IsKind(err, alloc.KindInvalid) {
		t.Fatalf("a reading without its instance: %v", err)
	}
	if err := f.s.SetCloudInterfaces(f.ctx, alloc.DefaultSpace, "n1", "i-1", InstanceLimits{}, []CloudInterface{{}}, at); !alloc.IsKind(err, alloc.KindInvalid) {
		t.Fatalf("an interface without its id: %v", err)
	}
	if err := f.s.DeleteNode(f.ctx, alloc.DefaultSpace, "n1", true); err != nil {
		t.Fatal(err)
	}
	if n := f.count(`SELECT count(*) FROM cloud_interfaces`); n != 0 {
		t.Fatalf("%d interfaces outlived their node", n)
	}
}
