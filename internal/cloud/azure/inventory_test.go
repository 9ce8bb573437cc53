// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package azure

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/azure/armfake"
)

// TestInstancesListsTheGroup: one listing describes every VM and scale
// set instance of the resource group exactly as Instance does each, in
// 2 + (scale sets) paged lists whatever the number of nodes; another
// group's VMs are not in it, and a set answering 404 is skipped.
func TestInstancesListsTheGroup(t *testing.T) {
	ctx := context.Background()
	fake, p := newWorld(t, "10.44.0.0/22", -1)
	fake.SetPageSize(2) // every list takes more than one page
	var ids []string
	for _, name := range []string{"vm-a", "vm-b", "vm-c"} {
		vm, nic, err := fake.AddVM("rg", name, subnetA)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Assign(ctx, nic, 2, false); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, vm)
	}
	for _, set := range []string{"pool1", "pool2"} {
		for _, i := range []string{"0", "1", "2"} {
			vm, _, err := fake.AddScaleSetVM("rg", set, i, subnetA, false)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, vm)
		}
	}
	other, _, err := fake.AddVM("rg-other", "vm-x", subnetA)
	if err != nil {
		t.Fatal(err)
	}
	group := "/subscriptions/" + armfake.Subscription + "/resourceGroups/rg"
	before := fake.Requests(http.MethodGet)
	got, err := p.Instances(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	// The group's NICs (3, 2 pages), its sets (2, 1 page), each set's NICs
	// (3 each, 2 pages): 7 reads, plus the subnet's and the network's
	// ranges, read once and cached.
	if calls := fake.Requests(http.MethodGet) - before; calls != 7+2 {
		t.Fatalf("%d reads for a listing of 9 instances", calls)
	}
	if len(got) != len(ids) {
		t.Fatalf("listed %d instances, want %d", len(got), len(ids))
	}
	for _, id := range ids {
		listed, ok := got[strings.ToLower(id)]
		if !ok {
			t.Fatalf("%s not listed", id)
		}
		alone, err := p.Instance(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(listed, alone) {
			t.Fatalf("%s listed as\n%+v\ndescribed as\n%+v", id, listed, alone)
		}
		if listed.VPC != group {
			t.Fatalf("%s: VPC %q, want its group %q", id, listed.VPC, group)
		}
	}
	if _, ok := got[strings.ToLower(other)]; ok {
		t.Fatalf("another group's VM %s was listed", other)
	}
	// More nodes cost no more calls but pages.
	for _, i := range []string{"3", "4", "5", "6", "7", "8"} {
		if _, _, err := fake.AddScaleSetVM("rg", "pool1", i, subnetA, false); err != nil {
			t.Fatal(err)
		}
	}
	before = fake.Requests(http.MethodGet)
	if got, err = p.Instances(ctx, group); err != nil || len(got) != len(ids)+6 {
		t.Fatalf("%d instances, %v", len(got), err)
	}
	if calls := fake.Requests(http.MethodGet) - before; calls != 2+1+5+2 {
		t.Fatalf("%d reads for 15 instances, want 10 (pages)", calls)
	}
	// A set whose NIC list is not found is skipped; a throttled one fails
	// the listing (the workers then describe its nodes one by one).
	fake.SetFault(func(method, path string) *armfake.Error {
		if strings.HasSuffix(strings.ToLower(path), "/virtualmachinescalesets/pool2/networkinterfaces") {
			return &armfake.Error{Status: http.StatusNotFound, Code: "NotFound", Message: "Flexible"}
		}
		return nil
	})
	if got, err = p.Instances(ctx, group); err != nil || len(got) != len(ids)+6-3 {
		t.Fatalf("with pool2 not found: %d instances, %v", len(got), err)
	}
	fake.SetFault(func(method, path string) *armfake.Error {
		if strings.HasSuffix(strings.ToLower(path), "/virtualmachinescalesets") {
			return armfake.Throttled()
		}
		return nil
	})
	if _, err := p.Instances(ctx, group); cloud.KindOf(err) != cloud.KindThrottled {
		t.Fatalf("throttled set list: %v, want %v", err, cloud.KindThrottled)
	}
	if _, err := p.Instances(ctx, "rg"); cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("a bare name: %v, want %v", err, cloud.KindInvalid)
	}
}
