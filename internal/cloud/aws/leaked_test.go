// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// TestCollectLeaked: of the cluster's interfaces, only those detached and
// older than the leak age go; one still attached (amazon-vpc-cni-k8s#1967:
// an in-use interface deleted), one still detaching (#608: the delete
// raced the asynchronous detach), a young one (its attach may be under
// way) and another cluster's all stay.
func TestCollectLeaked(t *testing.T) {
	ctx := context.Background()
	fake, inst, _ := world(t, "c5.xlarge", "10.50.0.0/24")
	inst2, _, err := fake.AddInstance("c5.xlarge", "subnet-a")
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, fake, 1)
	t0 := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	create := func(at time.Time, tags map[string]string) string {
		t.Helper()
		p.opts.Now = func() time.Time { return at }
		on := inst
		if tags[cloud.TagCluster] != "prod" {
			on = inst2
		}
		f, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: on, Subnet: "subnet-a", Addresses: 1, Tags: tags})
		if err != nil {
			t.Fatal(err)
		}
		return f.ID
	}
	staging := maps.Clone(tags)
	staging[cloud.TagCluster] = "staging"
	old := create(t0, tags)
	attached := create(t0, tags)
	detaching := create(t0, tags)
	other := create(t0, staging)
	// A young one, leaked by a create whose attach failed and whose
	// clean-up failed too.
	fake.SetFault(func(action string) *ec2fake.APIError {
		switch action {
		case "AttachNetworkInterface":
			return &ec2fake.APIError{Code: "InternalError", Message: "An internal error has occurred"}
		case "DeleteNetworkInterface":
			return &ec2fake.APIError{Code: "InternalError", Message: "An internal error has occurred"}
		}
		return nil
	})
	p.opts.Now = func() time.Time { return t0.Add(4 * time.Minute) }
	if _, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst2, Subnet: "subnet-a", Addresses: 1, Tags: tags}); cloud.KindOf(err) != cloud.KindUnknown {
		t.Fatalf("a create whose attach failed: %v", err)
	}
	fake.SetFault(nil)
	for _, id := range []string{old, other} {
		if err := p.DetachInterface(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	fake.FinishDetaches()
	if err := p.DetachInterface(ctx, detaching); err != nil {
		t.Fatal(err)
	}
	deleted, err := cloud.CollectLeaked(ctx, p, tags, cloud.DefaultLeakAge, t0.Add(6*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{old}) {
		t.Fatalf("deleted %v, want only %s", deleted, old)
	}
	left := map[string]string{}
	for _, f := range fake.Interfaces() {
		left[f.ID] = f.Status
	}
	// Two primary interfaces, and the young one.
	if left[attached] != "in-use" || left[detaching] != "detaching" || left[other] != "available" || len(left) != 6 {
		t.Fatalf("left %v", left)
	}
	// Four minutes on, the young one is old enough, and the detach
	// finished.
	fake.FinishDetaches()
	deleted, err = cloud.CollectLeaked(ctx, p, tags, cloud.DefaultLeakAge, t0.Add(10*time.Minute))
	if err != nil || len(deleted) != 2 || slices.Contains(deleted, other) || slices.Contains(deleted, attached) {
		t.Fatalf("second pass deleted %v, %v", deleted, err)
	}
	if _, err := cloud.CollectLeaked(ctx, p, nil, cloud.DefaultLeakAge, t0); err == nil {
		t.Fatal("a collection without the cluster's tags ran")
	}
}

func TestDetachInterface(t *testing.T) {
	ctx := context.Background()
	fake, inst, eni0 := world(t, "m5.large", "10.51.0.0/24")
	p := newProvider(t, fake, 1)
	if err := p.DetachInterface(ctx, eni0); cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("detaching the primary interface: %v", err)
	}
	f, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 1, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.DetachInterface(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	// The instance still shows it, at its device, as being detached.
	described, err := p.Instance(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	if len(described.Interfaces) != 2 || described.Interfaces[0].Detaching || !described.Interfaces[1].Detaching {
		t.Fatalf("while it detaches the instance shows %+v", described.Interfaces)
	}
	if got, _ := p.Detached(ctx, tags); len(got) != 0 {
		t.Fatalf("shown detached before the detach finished: %+v", got)
	}
	if err := p.DeleteInterface(ctx, f.ID); cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("deleting while detaching: %v", err)
	}
	fake.FinishDetaches()
	if err := p.DetachInterface(ctx, f.ID); cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("detaching a detached interface: %v", err)
	}
	if err := p.DeleteInterface(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
}

// TestCollectLeakedExactTags: clusters named prod-?, prod-* and prod-1
// side by side, each with a leaked interface. EC2 (and the fake) read *
// and ? in tag filter values as wildcards, so the filter for prod-?
// selects prod-1's interface too, and prod-*'s all three: each
// collection must delete its own cluster's interface and nothing else.
func TestCollectLeakedExactTags(t *testing.T) {
	ctx := context.Background()
	fake, inst, _ := world(t, "c5.xlarge", "10.52.0.0/24")
	p := newProvider(t, fake, 1)
	t0 := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	p.opts.Now = func() time.Time { return t0 }
	clusters := []string{"prod-?", "prod-*", "prod-1"}
	leaked := map[string]string{}
	for _, c := range clusters {
		f, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 1,
			Tags: map[string]string{cloud.TagCluster: c}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.DetachInterface(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
		leaked[c] = f.ID
	}
	fake.FinishDetaches()
	// The bug is there to be had: EC2's own answer for prod-* holds all
	// three.
	out, err := p.ec2.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: []types.Filter{
		{Name: sdkaws.String("tag:" + cloud.TagCluster), Values: []string{"prod-*"}}, {Name: sdkaws.String("status"), Values: []string{"available"}},
	}})
	if err != nil || len(out.NetworkInterfaces) != 3 {
		t.Fatalf("EC2's wildcard answer for prod-*: %d interfaces, %v; want all 3", len(out.NetworkInterfaces), err)
	}
	for _, c := range clusters {
		got, err := p.Detached(ctx, map[string]string{cloud.TagCluster: c})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].ID != leaked[c] {
			t.Errorf("cluster %s: detached %+v, want only %s", c, got, leaked[c])
		}
	}
	for _, c := range clusters {
		deleted, err := cloud.CollectLeaked(ctx, p, map[string]string{cloud.TagCluster: c}, cloud.DefaultLeakAge, t0.Add(time.Hour))
		if err != nil || !slices.Equal(deleted, []string{leaked[c]}) {
			t.Fatalf("collecting %s deleted %v (%v), want only %s", c, deleted, err, leaked[c])
		}
	}
}
