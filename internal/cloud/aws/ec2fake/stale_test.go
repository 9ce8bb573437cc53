// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// TestStaleReads: every describe reading the past (rate 1), a change
// made now is not seen until the clock passes the window: an assign, an
// unassign, a new interface, a termination, a subnet's free count.
func TestStaleReads(t *testing.T) {
	fake, _, eni := world(t)
	inst, _, err := fake.AddInstance("t3.small", "subnet-a") // to terminate
	if err != nil {
		t.Fatal(err)
	}
	c := client(t, fake, 1)
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	fake.SetClock(func() time.Time { return now })
	fake.SetStaleReads(5*time.Second, 1, 3)
	out, err := assign(ctx, c, eni, 2)
	if err != nil {
		t.Fatal(err)
	}
	gone := sdkaws.ToString(out.AssignedPrivateIpAddresses[0].PrivateIpAddress)
	now = now.Add(10 * time.Second)
	free := fake.FreeAddresses("subnet-a")
	if _, err := c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: sdkaws.String(eni), PrivateIpAddresses: []string{gone}}); err != nil {
		t.Fatal(err)
	}
	created, err := c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: sdkaws.String("subnet-a")})
	if err != nil {
		t.Fatal(err)
	}
	fake.TerminateInstance(inst)

	// Within the window: the state before the changes.
	if got := addresses(t, c, eni); !slices.Contains(got, gone) || len(got) != 3 {
		t.Fatalf("stale read of %s: %v, want the primary and both addresses, %s included", eni, got, gone)
	}
	_, err = c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{sdkaws.ToString(created.NetworkInterface.NetworkInterfaceId)}})
	if apiCode(err) != "InvalidNetworkInterfaceID.NotFound" {
		t.Fatalf("stale read of a new interface: %v, want InvalidNetworkInterfaceID.NotFound", err)
	}
	if state := instanceState(t, c, inst); state != types.InstanceStateNameRunning {
		t.Fatalf("stale read of a terminated instance: %s, want running", state)
	}
	if got := subnetFree(t, c); got != free {
		t.Fatalf("stale subnet free count %d, want %d", got, free)
	}

	// Past the window: the state now.
	now = now.Add(6 * time.Second)
	if _, err := c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{}); err != nil {
		t.Fatal(err)
	}
	if got := addresses(t, c, eni); slices.Contains(got, gone) {
		t.Fatalf("read past the window: %v still holds %s", got, gone)
	}
	if state := instanceState(t, c, inst); state != types.InstanceStateNameTerminated {
		t.Fatalf("read past the window: %s, want terminated", state)
	}
	if got := subnetFree(t, c); got != fake.FreeAddresses("subnet-a") {
		t.Fatalf("subnet free count %d, want %d", got, fake.FreeAddresses("subnet-a"))
	}
	if n := fake.Faults(ec2fake.FaultStale); n != 8 {
		t.Fatalf("%d stale reads counted, want 8", n)
	}
}

// TestStaleReadsByRate: at rate 0.5 some reads in the window are stale
// and some fresh, the same ones for the same seed.
func TestStaleReadsByRate(t *testing.T) {
	run := func() []bool {
		fake, _, eni := world(t)
		c := client(t, fake, 1)
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		fake.SetClock(func() time.Time { return now })
		fake.SetStaleReads(5*time.Second, 0.5, 9)
		now = now.Add(time.Minute)
		if _, err := assign(context.Background(), c, eni, 1); err != nil {
			t.Fatal(err)
		}
		var fresh []bool
		for range 40 {
			fresh = append(fresh, len(addresses(t, c, eni)) == 2)
		}
		return fresh
	}
	a, b := run(), run()
	if !slices.Equal(a, b) || !slices.Contains(a, true) || !slices.Contains(a, false) {
		t.Fatalf("fresh reads %v then %v: want a mix, repeated", a, b)
	}
}

func addresses(t *testing.T, c *ec2.Client, eni string) []string {
	t.Helper()
	out, err := c.DescribeNetworkInterfaces(context.Background(), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eni}})
	if err != nil || len(out.NetworkInterfaces) != 1 {
		t.Fatalf("describe %s: %v", eni, err)
	}
	var got []string
	for _, a := range out.NetworkInterfaces[0].PrivateIpAddresses {
		got = append(got, sdkaws.ToString(a.PrivateIpAddress))
	}
	return got
}

func instanceState(t *testing.T, c *ec2.Client, inst string) types.InstanceStateName {
	t.Helper()
	out, err := c.DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{InstanceIds: []string{inst}})
	if err != nil || len(out.Reservations) != 1 {
		t.Fatalf("describe %s: %v", inst, err)
	}
	return out.Reservations[0].Instances[0].State.Name
}

func subnetFree(t *testing.T, c *ec2.Client) int {
	t.Helper()
	out, err := c.DescribeSubnets(context.Background(), &ec2.DescribeSubnetsInput{SubnetIds: []string{"subnet-a"}})
	if err != nil || len(out.Subnets) != 1 {
		t.Fatalf("describe subnet-a: %v", err)
	}
	return int(sdkaws.ToInt32(out.Subnets[0].AvailableIpAddressCount))
}

// TestRandomAddresses: drawn at random, addresses and aligned /28s are
// free, unique, not the lowest, and the same for the same seed.
func TestRandomAddresses(t *testing.T) {
	run := func() ([]string, []string) {
		fake := ec2fake.New()
		fake.AddSubnet(ec2fake.Subnet{ID: "subnet-a", VPC: "vpc-1", Zone: "z", CIDR: netip.MustParsePrefix("10.0.0.0/20")})
		fake.SetRandomAddresses(5)
		_, eni, err := fake.AddInstance("m5.large", "subnet-a")
		if err != nil {
			t.Fatal(err)
		}
		eni2, err := fake.AttachInterface(fake.Interfaces()[0].Instance, "subnet-a", 1)
		if err != nil {
			t.Fatal(err)
		}
		c := client(t, fake, 1)
		out, err := assign(context.Background(), c, eni, 5)
		if err != nil {
			t.Fatal(err)
		}
		pout, err := c.AssignPrivateIpAddresses(context.Background(), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: sdkaws.String(eni2), Ipv4PrefixCount: sdkaws.Int32(2)})
		if err != nil {
			t.Fatal(err)
		}
		var addrs, prefixes []string
		for _, a := range out.AssignedPrivateIpAddresses {
			addrs = append(addrs, sdkaws.ToString(a.PrivateIpAddress))
		}
		for _, p := range pout.AssignedIpv4Prefixes {
			pr := netip.MustParsePrefix(sdkaws.ToString(p.Ipv4Prefix))
			if pr.Bits() != 28 || pr.Masked() != pr {
				t.Fatalf("prefix %s not an aligned /28", pr)
			}
			prefixes = append(prefixes, pr.String())
		}
		if free := fake.FreeAddresses("subnet-a"); free != 4096-5-2-5-32 {
			t.Fatalf("%d free, want every draw taken once", free)
		}
		return addrs, prefixes
	}
	addrs, prefixes := run()
	again, againP := run()
	if !slices.Equal(addrs, again) || !slices.Equal(prefixes, againP) {
		t.Fatalf("seed 5 drew %v %v, then %v %v", addrs, prefixes, again, againP)
	}
	lowest := []string{"10.0.0.6", "10.0.0.7", "10.0.0.8", "10.0.0.9", "10.0.0.10"}
	if slices.Equal(addrs, lowest) || slices.Equal(prefixes, []string{"10.0.0.16/28", "10.0.0.32/28"}) {
		t.Fatalf("drew the lowest: %v %v", addrs, prefixes)
	}
	if s := slices.Compact(slices.Sorted(slices.Values(addrs))); len(s) != 5 {
		t.Fatalf("addresses drawn twice: %v", addrs)
	}
}

// TestUnpaginatedRefused: past the limit, an unpaginated listing is
// refused OperationNotPermitted; MaxResults, ids or (as documented) a
// vpc-id filter get through; with no filter exempt, vpc-id does not.
func TestUnpaginatedRefused(t *testing.T) {
	fake, inst, _ := world(t)
	for d := 1; d <= 2; d++ {
		if _, err := fake.AttachInterface(inst, "subnet-a", d); err != nil {
			t.Fatal(err)
		}
	}
	c := client(t, fake, 1)
	ctx := context.Background()
	byVPC := []types.Filter{{Name: sdkaws.String("vpc-id"), Values: []string{"vpc-1"}}}
	fake.SetUnpaginatedLimit("DescribeNetworkInterfaces", 2, ec2fake.UnpaginatedFilters...)
	if _, err := c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{}); apiCode(err) != "OperationNotPermitted" {
		t.Fatalf("unpaginated listing of 3: %v, want OperationNotPermitted", err)
	}
	if _, err := c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: byVPC}); err != nil {
		t.Fatalf("filtered by vpc-id: %v", err)
	}
	pages := ec2.NewDescribeNetworkInterfacesPaginator(c, &ec2.DescribeNetworkInterfacesInput{MaxResults: sdkaws.Int32(5)})
	n := 0
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			t.Fatalf("paginated: %v", err)
		}
		n += len(page.NetworkInterfaces)
	}
	if n != 3 {
		t.Fatalf("paginated listing: %d interfaces, want 3", n)
	}
	fake.SetUnpaginatedLimit("DescribeNetworkInterfaces", 2)
	if _, err := c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: byVPC}); apiCode(err) != "OperationNotPermitted" {
		t.Fatalf("filtered, none exempt: %v, want OperationNotPermitted", err)
	}
	fake.SetUnpaginatedLimit("DescribeInstances", 0)
	if _, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: byVPC}); apiCode(err) != "OperationNotPermitted" {
		t.Fatalf("unpaginated instances: %v, want OperationNotPermitted", err)
	}
	if _, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{inst}}); err != nil {
		t.Fatalf("instances by id: %v", err)
	}
	if _, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{inst}, MaxResults: sdkaws.Int32(5)}); apiCode(err) != "InvalidParameterCombination" {
		t.Fatalf("ids with MaxResults: %v, want InvalidParameterCombination", err)
	}
}

// TestPagesNeitherSkipNorRepeat: items that go between a listing's pages
// take none of the next page's items out of the listing, and none comes
// twice: the tokens are cursors, as EC2's opaque ones behave (an offset
// skipped as many instances and interfaces as had gone before it).
func TestPagesNeitherSkipNorRepeat(t *testing.T) {
	fake, first, _ := world(t)
	for range 5 {
		if _, _, err := fake.AddInstance("m5.large", "subnet-a"); err != nil {
			t.Fatal(err)
		}
	}
	c := client(t, fake, 1)
	ctx := context.Background()
	byVPC := []types.Filter{{Name: sdkaws.String("vpc-id"), Values: []string{"vpc-1"}}}
	fake.SetPageSize(2)
	p1, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: byVPC, MaxResults: sdkaws.Int32(5)})
	if err != nil || p1.NextToken == nil {
		t.Fatalf("first page: %v", err)
	}
	n1, err := c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: byVPC, MaxResults: sdkaws.Int32(5)})
	if err != nil || n1.NextToken == nil {
		t.Fatalf("first page of interfaces: %v", err)
	}
	// The first instance ends (its interface deleted with it) between
	// the pages.
	fake.TerminateInstance(first)
	seen := map[string]int{}
	for _, r := range p1.Reservations {
		seen[*r.Instances[0].InstanceId]++
	}
	pages := ec2.NewDescribeInstancesPaginator(c, &ec2.DescribeInstancesInput{Filters: byVPC, MaxResults: sdkaws.Int32(5), NextToken: p1.NextToken})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Reservations {
			seen[*r.Instances[0].InstanceId]++
		}
	}
	if len(seen) != 6 {
		t.Fatalf("instances listed: %v, want all 6 (the first ended after its page)", seen)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("instance %s listed %d times", id, n)
		}
	}
	ifaces := len(n1.NetworkInterfaces)
	nics := ec2.NewDescribeNetworkInterfacesPaginator(c, &ec2.DescribeNetworkInterfacesInput{Filters: byVPC, MaxResults: sdkaws.Int32(5), NextToken: n1.NextToken})
	for nics.HasMorePages() {
		page, err := nics.NextPage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ifaces += len(page.NetworkInterfaces)
	}
	if ifaces != 6 {
		t.Fatalf("%d interfaces listed, want 6 (one deleted after its page)", ifaces)
	}
	if _, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: byVPC, MaxResults: sdkaws.Int32(5), NextToken: sdkaws.String("2")}); apiCode(err) != "InvalidPaginationToken" {
		t.Fatalf("a token the fake never gave: %v, want InvalidPaginationToken", err)
	}
}
