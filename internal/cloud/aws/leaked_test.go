package aws

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

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
