// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"context"
	"errors"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// newProvider serves fake over TLS and answers a provider whose real EC2
// client calls it, retrying up to attempts times without waiting.
func newProvider(t *testing.T, fake *ec2fake.Server, attempts int) *Provider {
	t.Helper()
	srv := httptest.NewTLSServer(fake)
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{
		Region:       "eu-west-1",
		BaseEndpoint: sdkaws.String(srv.URL),
		HTTPClient:   SafeBodies(srv.Client()),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = attempts
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		}),
	})
	return New(client, Options{Wait: func(int) time.Duration { return 0 }})
}

// world is one VPC subnet with an instance of typ in it.
func world(t *testing.T, typ string, subnet string) (*ec2fake.Server, string, string) {
	t.Helper()
	fake := ec2fake.New()
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-a", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix(subnet)})
	inst, eni, err := fake.AddInstance(typ, "subnet-a")
	if err != nil {
		t.Fatal(err)
	}
	return fake, inst, eni
}

func TestInstanceDescribesLimitsAndInterfaces(t *testing.T) {
	fake, inst, eni0 := world(t, "m5.large", "10.0.0.0/24")
	eni1, err := fake.AttachInterface(inst, "subnet-a", 1)
	if err != nil {
		t.Fatal(err)
	}
	eni2, err := fake.AttachInterface(inst, "subnet-a", 2)
	if err != nil {
		t.Fatal(err)
	}
	fake.SetPageSize(1) // three pages: the paginator must follow NextToken
	p := newProvider(t, fake, 1)
	ctx := context.Background()
	if _, err := p.Assign(ctx, eni1, 2, false); err != nil {
		t.Fatal(err)
	}
	got, err := p.Instance(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	want := cloud.Limits{Interfaces: 3, IPv4PerInterface: 10, IPv6PerInterface: 10, Prefixes: true, VCPUs: 2}
	if got.Type != "m5.large" || got.Limits != want {
		t.Fatalf("type %q limits %+v; want m5.large %+v", got.Type, got.Limits, want)
	}
	if len(got.Interfaces) != 3 {
		t.Fatalf("%d interfaces, want 3 (pages followed: %d calls)", len(got.Interfaces), fake.Calls("DescribeNetworkInterfaces"))
	}
	// The first four addresses of a subnet are reserved: the primary
	// addresses are .4, .5 and .6 in creation order, the secondaries next.
	for i, id := range []string{eni0, eni1, eni2} {
		f := got.Interfaces[i]
		if f.ID != id || f.DeviceIndex != i || f.SubnetID != "subnet-a" || f.Primary != netip.AddrFrom4([4]byte{10, 0, 0, byte(4 + i)}) {
			t.Errorf("interface %d: %+v", i, f)
		}
	}
	if a := got.Interfaces[1].Addresses; !slices.Equal(a, []netip.Addr{netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.0.8")}) {
		t.Errorf("secondary addresses %v", a)
	}
	if got.Interfaces[1].Slots() != 3 {
		t.Errorf("slots %d, want 3", got.Interfaces[1].Slots())
	}
	// The type's limits are asked once.
	if _, err := p.Instance(ctx, inst); err != nil {
		t.Fatal(err)
	}
	if n := fake.Calls("DescribeInstanceTypes"); n != 1 {
		t.Errorf("DescribeInstanceTypes called %d times, want 1", n)
	}
}

func TestInstanceNotFound(t *testing.T) {
	fake, _, _ := world(t, "t3.small", "10.0.0.0/24")
	p := newProvider(t, fake, 1)
	_, err := p.Instance(context.Background(), "i-0000000000000dead")
	if cloud.KindOf(err) != cloud.KindNotFound {
		t.Fatalf("err %v, want %v", err, cloud.KindNotFound)
	}
	var ce *cloud.Error
	if !errors.As(err, &ce) || ce.Code != "InvalidInstanceID.NotFound" {
		t.Fatalf("err %#v", err)
	}
}

// TestAssignAddressesUniqueInSubnet: two instances of one subnet get the
// lowest free addresses, never one address twice, and an address given
// back is handed out again.
func TestAssignAddressesUniqueInSubnet(t *testing.T) {
	fake, _, eniA := world(t, "c5.xlarge", "10.1.0.0/24")
	_, eniB, err := fake.AddInstance("c5.xlarge", "subnet-a")
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, fake, 1)
	ctx := context.Background()
	seen := map[netip.Addr]string{}
	for round := range 3 {
		for _, eni := range []string{eniA, eniB} {
			got, err := p.Assign(ctx, eni, 4, false)
			if err != nil {
				t.Fatalf("round %d %s: %v", round, eni, err)
			}
			if len(got.Addresses) != 4 || len(got.Prefixes) != 0 {
				t.Fatalf("assigned %+v", got)
			}
			for _, a := range got.Addresses {
				if other, dup := seen[a]; dup {
					t.Fatalf("%v assigned to %s and %s", a, other, eni)
				}
				seen[a] = eni
			}
		}
	}
	// Primaries .4 and .5; 24 secondaries from .6 to .29.
	for a := netip.MustParseAddr("10.1.0.6"); a.Compare(netip.MustParseAddr("10.1.0.29")) <= 0; a = a.Next() {
		if _, ok := seen[a]; !ok {
			t.Fatalf("%v skipped: the lowest free addresses go first", a)
		}
	}
	gone := netip.MustParseAddr("10.1.0.6")
	if err := p.Unassign(ctx, seen[gone], []netip.Addr{gone}, nil); err != nil {
		t.Fatal(err)
	}
	got, err := p.Assign(ctx, eniB, 1, false)
	if err != nil || len(got.Addresses) != 1 || got.Addresses[0] != gone {
		t.Fatalf("after the unassign: %+v, %v; want %v again", got, err, gone)
	}
}

func TestAssignRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("interface full", func(t *testing.T) {
		fake, _, eni := world(t, "t3.small", "10.2.0.0/24")
		p := newProvider(t, fake, 1)
		if _, err := p.Assign(ctx, eni, 3, false); err != nil {
			t.Fatal(err)
		}
		_, err := p.Assign(ctx, eni, 1, false)
		if cloud.KindOf(err) != cloud.KindInterfaceFull {
			t.Fatalf("err %v, want %v", err, cloud.KindInterfaceFull)
		}
	})
	t.Run("subnet full", func(t *testing.T) {
		// A /28 has 16 addresses, 5 reserved: the primary and 10 more.
		fake, _, eni := world(t, "c5.xlarge", "10.3.0.0/28")
		p := newProvider(t, fake, 1)
		_, err := p.Assign(ctx, eni, 11, false)
		if cloud.KindOf(err) != cloud.KindSubnetFull {
			t.Fatalf("err %v, want %v", err, cloud.KindSubnetFull)
		}
		if a, _ := fake.Held(eni); len(a) != 0 {
			t.Fatalf("a refused call assigned %v", a)
		}
		if got, err := p.Assign(ctx, eni, 10, false); err != nil || len(got.Addresses) != 10 {
			t.Fatalf("the last 10: %+v, %v", got, err)
		}
	})
	t.Run("unknown interface", func(t *testing.T) {
		fake, _, _ := world(t, "t3.small", "10.2.0.0/24")
		p := newProvider(t, fake, 1)
		if _, err := p.Assign(ctx, "eni-0000000000000dead", 1, false); cloud.KindOf(err) != cloud.KindNotFound {
			t.Fatalf("err %v, want %v", err, cloud.KindNotFound)
		}
	})
	t.Run("no count", func(t *testing.T) {
		fake, _, eni := world(t, "t3.small", "10.2.0.0/24")
		p := newProvider(t, fake, 1)
		if _, err := p.Assign(ctx, eni, 0, false); cloud.KindOf(err) != cloud.KindInvalid {
			t.Fatalf("err %v, want %v", err, cloud.KindInvalid)
		}
		if n := fake.Calls("AssignPrivateIpAddresses"); n != 0 {
			t.Fatalf("%d calls for nothing", n)
		}
	})
}

// TestAssignPrefixes: /28s come aligned from free space; on a fragmented
// subnet the refusal says so, and single addresses still come.
func TestAssignPrefixes(t *testing.T) {
	ctx := context.Background()
	fake, _, eni := world(t, "m5.large", "10.4.0.0/26")
	p := newProvider(t, fake, 1)
	got, err := p.Assign(ctx, eni, 2, true)
	if err != nil {
		t.Fatal(err)
	}
	// 10.4.0.0/28 holds the reserved addresses and the primary (.4).
	want := []netip.Prefix{netip.MustParsePrefix("10.4.0.16/28"), netip.MustParsePrefix("10.4.0.32/28")}
	if !slices.Equal(got.Prefixes, want) || len(got.Addresses) != 0 {
		t.Fatalf("assigned %+v; want %v", got, want)
	}
	// The last /28 holds the broadcast address: no aligned /28 is left,
	// though 25 addresses are free.
	fake.Take("subnet-a", netip.MustParseAddr("10.4.0.5"))
	_, err = p.Assign(ctx, eni, 1, true)
	if cloud.KindOf(err) != cloud.KindNoContiguousPrefix {
		t.Fatalf("err %v, want %v", err, cloud.KindNoContiguousPrefix)
	}
	fallback, err := p.Assign(ctx, eni, 3, false)
	if err != nil || len(fallback.Addresses) != 3 {
		t.Fatalf("fallback to single addresses: %+v, %v", fallback, err)
	}
	if err := p.Unassign(ctx, eni, nil, want[:1]); err != nil {
		t.Fatal(err)
	}
	if _, prefixes := fake.Held(eni); !slices.Equal(prefixes, want[1:]) {
		t.Fatalf("after unassigning %v: %v", want[0], prefixes)
	}
	// Prefixes only on Nitro.
	fake2, _, eni2 := world(t, "t2.medium", "10.5.0.0/24")
	p2 := newProvider(t, fake2, 1)
	if _, err := p2.Assign(ctx, eni2, 1, true); cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("a prefix on a Xen instance: %v", err)
	}
	i2, err := p2.Instance(ctx, mustInstance(t, fake2))
	if err != nil || i2.Limits.Prefixes {
		t.Fatalf("t2.medium limits %+v, %v", i2.Limits, err)
	}
}

// TestBareMetalTakesPrefixes: EC2 names no hypervisor for a bare-metal
// type, which is Nitro-class all the same (the VPC CNI's
// IsPrefixDelegationSupported): its limits say it takes prefixes, and it
// does.
func TestBareMetalTakesPrefixes(t *testing.T) {
	fake, inst, eni := world(t, "m5.metal", "10.6.0.0/24")
	p := newProvider(t, fake, 1)
	ctx := context.Background()
	got, err := p.Instance(ctx, inst)
	want := cloud.Limits{Interfaces: 15, IPv4PerInterface: 50, IPv6PerInterface: 50, Prefixes: true, VCPUs: 96}
	if err != nil || got.Limits != want {
		t.Fatalf("m5.metal limits %+v (%v); want %+v", got.Limits, err, want)
	}
	if a, err := p.Assign(ctx, eni, 1, true); err != nil || len(a.Prefixes) != 1 {
		t.Fatalf("a prefix on a bare-metal instance: %+v, %v", a, err)
	}
}

func mustInstance(t *testing.T, fake *ec2fake.Server) string {
	t.Helper()
	id, _, err := fake.AddInstance("t2.medium", "subnet-a")
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestUnassignNotHeld: naming an address the interface does not hold
// removes nothing, not even the held ones named with it.
func TestUnassignNotHeld(t *testing.T) {
	ctx := context.Background()
	fake, _, eni := world(t, "m5.large", "10.6.0.0/24")
	p := newProvider(t, fake, 1)
	got, err := p.Assign(ctx, eni, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	err = p.Unassign(ctx, eni, []netip.Addr{got.Addresses[0], netip.MustParseAddr("10.6.0.200")}, nil)
	if cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("err %v, want %v", err, cloud.KindInvalid)
	}
	if held, _ := fake.Held(eni); !slices.Equal(held, got.Addresses) {
		t.Fatalf("held %v after a refused unassign; want %v", held, got.Addresses)
	}
	if err := p.Unassign(ctx, eni, nil, nil); err != nil || fake.Calls("UnassignPrivateIpAddresses") != 1 {
		t.Fatalf("unassigning nothing: %v, %d calls", err, fake.Calls("UnassignPrivateIpAddresses"))
	}
}

// TestThrottling: the SDK's retries absorb a refusal for the rate; when
// every attempt is refused the error says throttled.
func TestThrottling(t *testing.T) {
	ctx := context.Background()
	fake, _, eni := world(t, "m5.large", "10.7.0.0/24")
	p := newProvider(t, fake, 3)
	var refused atomic.Int32
	fake.SetFault(func(action string) *ec2fake.APIError {
		if action == "AssignPrivateIpAddresses" && refused.Add(1) <= 2 {
			return ec2fake.Throttled()
		}
		return nil
	})
	got, err := p.Assign(ctx, eni, 1, false)
	if err != nil || len(got.Addresses) != 1 {
		t.Fatalf("two refusals then an answer: %+v, %v", got, err)
	}
	if n := fake.Calls("AssignPrivateIpAddresses"); n != 3 {
		t.Fatalf("%d calls, want 3", n)
	}
	fake.SetFault(func(string) *ec2fake.APIError { return ec2fake.Throttled() })
	_, err = p.Assign(ctx, eni, 1, false)
	if cloud.KindOf(err) != cloud.KindThrottled {
		t.Fatalf("err %v, want %v", err, cloud.KindThrottled)
	}
	if held, _ := fake.Held(eni); len(held) != 1 {
		t.Fatalf("held %v: a refused call assigned", held)
	}
}

func TestClassifyPrefixMessage(t *testing.T) {
	fake, _, eni := world(t, "m5.large", "10.8.0.0/24")
	p := newProvider(t, fake, 1)
	fake.SetFault(func(string) *ec2fake.APIError {
		return &ec2fake.APIError{Code: "InvalidParameterValue", Message: "There aren't sufficient free Ipv4 addresses or prefixes"}
	})
	if _, err := p.Assign(context.Background(), eni, 1, true); cloud.KindOf(err) != cloud.KindNoContiguousPrefix {
		t.Fatalf("err %v, want %v", err, cloud.KindNoContiguousPrefix)
	}
	if err := classify(context.Canceled); !errors.Is(err, context.Canceled) || cloud.KindOf(err) != cloud.KindUnknown {
		t.Fatalf("a cancelled context: %v", err)
	}
}

// TestAssignIPv6Prefix: EC2 delegates the lowest free /80 of the subnet's
// /64 past the first, unique per subnet; a subnet without IPv6, a Xen
// instance and an interface at its limit are refused with the kinds the
// workers act on.
func TestAssignIPv6Prefix(t *testing.T) {
	ctx := context.Background()
	fake, inst, eni := world(t, "t3.small", "10.7.0.0/24")
	p := newProvider(t, fake, 1)
	if _, err := p.AssignIPv6Prefix(ctx, eni); cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("a subnet without IPv6: %v, want %v", err, cloud.KindInvalid)
	}
	fake.AddSubnetIPv6("subnet-a", netip.MustParsePrefix("2600:1f18:aaaa:bb01::/64"))
	got, err := p.AssignIPv6Prefix(ctx, eni)
	if want := netip.MustParsePrefix("2600:1f18:aaaa:bb01:1::/80"); err != nil || got != want {
		t.Fatalf("delegated %v, %v; want %v", got, err, want)
	}
	eni1, err := fake.AttachInterface(inst, "subnet-a", 1)
	if err != nil {
		t.Fatal(err)
	}
	other, err := p.AssignIPv6Prefix(ctx, eni1)
	if want := netip.MustParsePrefix("2600:1f18:aaaa:bb01:2::/80"); err != nil || other != want {
		t.Fatalf("second interface got %v, %v; want %v", other, err, want)
	}
	// t3.small: 4 IPv6 addresses per interface, a prefix counting as one.
	for range 3 {
		if _, err := p.AssignIPv6Prefix(ctx, eni); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.AssignIPv6Prefix(ctx, eni); cloud.KindOf(err) != cloud.KindInterfaceFull {
		t.Fatalf("a fifth prefix: %v, want %v", err, cloud.KindInterfaceFull)
	}
	i, err := p.Instance(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range i.Interfaces {
		if f.ID == eni1 && !slices.Equal(f.IPv6Prefixes, []netip.Prefix{other}) {
			t.Fatalf("%s describes IPv6 prefixes %v, want [%v]", eni1, f.IPv6Prefixes, other)
		}
	}
	fake2, _, eni2 := world(t, "t2.medium", "10.8.0.0/24")
	fake2.AddSubnetIPv6("subnet-a", netip.MustParsePrefix("2600:1f18:aaaa:bb02::/64"))
	if _, err := newProvider(t, fake2, 1).AssignIPv6Prefix(ctx, eni2); cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("an IPv6 prefix on a Xen instance: %v, want %v", err, cloud.KindInvalid)
	}
}
