// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package azure

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/azure/armfake"
	"github.com/ipam-dev/ipam/internal/testclock"
)

var subnetB = armfake.SubnetID("rg", "vnet", "pods")

// waitFor waits until cond holds, failing the test after a generous bound
// (a bound on a hang, not on speed).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s", what)
		}
	}
}

// TestLongRunningWrites: ARM's writes of a NIC and of a scale set
// instance's model take tens of seconds. The provider polls the operation
// until it ends and answers the addresses then; meanwhile the NIC shows
// Updating and a second write is not made (ARM would refuse it,
// AnotherOperationInProgress). A caller whose context ends stops waiting
// at once; the write goes on in ARM and what it added shows at the next
// reading.
func TestLongRunningWrites(t *testing.T) {
	for _, scaleSet := range []bool{false, true} {
		fake, p := newWorld(t, "10.50.0.0/24", -1)
		clock := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		fake.SetClock(clock.Now)
		fake.SetOperationDuration(40 * time.Second)
		var vm, nic string
		var err error
		if scaleSet {
			vm, nic, err = fake.AddScaleSetVM("rg", "pool1", "0", subnetA, false)
		} else {
			vm, nic, err = fake.AddVM("rg", "node-a", subnetA)
		}
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			got cloud.Assigned
			err error
		}
		done := make(chan result, 1)
		go func() {
			got, err := p.Assign(t.Context(), nic, 3, false)
			done <- result{got, err}
		}()
		waitFor(t, "the write", func() bool { return fake.PendingOperations() == 1 })
		// The operation has not ended: the NIC's new configurations are not
		// provisioned, and no second write goes out.
		inst, err := p.Instance(t.Context(), vm)
		if err != nil || len(inst.Interfaces[0].Addresses) != 0 {
			t.Fatalf("scale set %v: during the write: %+v, %v", scaleSet, inst, err)
		}
		puts := fake.Requests(http.MethodPut)
		var ce *cloud.Error
		if _, err := p.Assign(t.Context(), nic, 1, false); !errors.As(err, &ce) || ce.Code != "AnotherOperationInProgress" {
			t.Fatalf("scale set %v: a second write during the first: %v", scaleSet, err)
		}
		if fake.Requests(http.MethodPut) != puts {
			t.Fatalf("scale set %v: a write went out while one was under way", scaleSet)
		}
		select {
		case r := <-done:
			t.Fatalf("scale set %v: Assign answered %+v before the operation ended", scaleSet, r)
		default:
		}
		clock.Advance(40 * time.Second)
		r := <-done
		if r.err != nil || len(r.got.Addresses) != 3 {
			t.Fatalf("scale set %v: after the operation: %+v, %v", scaleSet, r.got, r.err)
		}

		// A caller that stops waiting.
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			got, err := p.Assign(ctx, nic, 2, false)
			done <- result{got, err}
		}()
		waitFor(t, "the second write", func() bool { return fake.PendingOperations() == 1 })
		cancel()
		if r := <-done; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("scale set %v: a cancelled wait answered %+v, %v", scaleSet, r.got, r.err)
		}
		clock.Advance(time.Minute)
		inst, err = p.Instance(t.Context(), vm)
		if err != nil || len(inst.Interfaces[0].Addresses) != 5 {
			t.Fatalf("scale set %v: the write nobody waited for: %+v, %v", scaleSet, inst, err)
		}
	}
}

// TestRetryAfterSurfaced: a 429 asking for more than the SDK waits (its
// MaxRetryDelay, 60 s by default) comes back at once, not retried, as
// KindThrottled with the cloud's Retry-After, for writes and reads alike,
// so that the workers can hold the node back that long.
func TestRetryAfterSurfaced(t *testing.T) {
	ctx := t.Context()
	// The SDK's defaults: 3 retries, at most 60 s apart.
	fake, p := newWorldRetry(t, "10.51.0.0/24", policy.RetryOptions{})
	vm, nic, err := fake.AddScaleSetVM("rg", "pool1", "0", subnetA, false)
	if err != nil {
		t.Fatal(err)
	}
	const wait = 300 * time.Second
	fake.SetFault(func(method, path string) *armfake.Error {
		if method == http.MethodPut {
			return armfake.ThrottledFor(wait)
		}
		return nil
	})
	_, err = p.Assign(ctx, nic, 2, false)
	if cloud.KindOf(err) != cloud.KindThrottled || cloud.RetryAfterOf(err) != wait {
		t.Fatalf("a write refused for 5 minutes: %v (retry after %v)", err, cloud.RetryAfterOf(err))
	}
	if n := fake.Requests(http.MethodPut); n != 1 {
		t.Fatalf("%d writes: the SDK retried a 429 asking for %v", n, wait)
	}
	fake.SetFault(func(method, path string) *armfake.Error {
		if method == http.MethodGet {
			return armfake.ThrottledFor(wait)
		}
		return nil
	})
	if _, err := p.Instance(ctx, vm); cloud.KindOf(err) != cloud.KindThrottled || cloud.RetryAfterOf(err) != wait {
		t.Fatalf("a read refused for 5 minutes: %v (retry after %v)", err, cloud.RetryAfterOf(err))
	}
	// The throttled write took nothing of the subnet's room.
	fake.SetFault(nil)
	if got, err := p.Assign(ctx, nic, 2, false); err != nil || len(got.Addresses) != 2 {
		t.Fatalf("after the throttling: %v, %v", got, err)
	}
}

// TestLostAnswers: ARM applies a write and then its answer is lost (a 5xx
// after the fact, or the connection cut). The SDK sends the write again,
// which ARM refuses as stale (412: the NIC changed, by the write itself);
// the provider reads the NIC again and finds its own configurations by
// name: nothing is written twice, and Assign answers what the one write
// added. A removal likewise is not written again.
func TestLostAnswers(t *testing.T) {
	for _, scaleSet := range []bool{false, true} {
		for _, lost := range []*armfake.After{{Err: &armfake.Error{Status: http.StatusInternalServerError, Code: "InternalServerError", Message: "An error occurred."}}, {}} {
			fake, p := newWorld(t, "10.52.0.0/24", 3)
			var nic string
			var err error
			if scaleSet {
				_, nic, err = fake.AddScaleSetVM("rg", "pool1", "0", subnetA, false)
			} else {
				_, nic, err = fake.AddVM("rg", "node-a", subnetA)
			}
			if err != nil {
				t.Fatal(err)
			}
			// The first write of each change (the 1st and the 3rd, after
			// the SDK's retry of the 1st) loses its answer.
			writes := 0
			fake.SetFaultAfter(func(method, path string) *armfake.After {
				if method != http.MethodPut {
					return nil
				}
				writes++
				if writes == 1 || writes == 3 {
					return lost
				}
				return nil
			})
			name := "cut"
			if lost.Err != nil {
				name = "500"
			}
			got, err := p.Assign(t.Context(), nic, 3, false)
			if err != nil || len(got.Addresses) != 3 {
				t.Fatalf("scale set %v, %s: %+v, %v", scaleSet, name, got, err)
			}
			if n := len(fake.Addresses(nic)); n != 1+3 {
				t.Fatalf("scale set %v, %s: the NIC holds %d configurations, want 4: the lost write was made again", scaleSet, name, n)
			}
			puts := fake.Requests(http.MethodPut)
			if err := p.Unassign(t.Context(), nic, got.Addresses[:1], nil); err != nil {
				t.Fatalf("scale set %v, %s: unassign: %v", scaleSet, name, err)
			}
			if n := len(fake.Addresses(nic)); n != 1+2 {
				t.Fatalf("scale set %v, %s: after the removal the NIC holds %d configurations", scaleSet, name, n)
			}
			// The removal and the SDK's retry of it, refused; no third.
			if n := fake.Requests(http.MethodPut) - puts; n != 2 {
				t.Fatalf("scale set %v, %s: %d writes for one removal whose answer was lost, want 2", scaleSet, name, n)
			}
		}
	}
}

// TestSubnetCapacity: Assign asks no more than the subnet's free
// addresses (its size, less Azure's 5, less its IP configurations), and
// writes nothing to a full subnet: the subnet is read once a minute, not
// once a write. When other writers took the room since the reading, ARM
// refuses the write whole (SubnetIsFull) and the subnet counts as full
// until the next reading.
func TestSubnetCapacity(t *testing.T) {
	ctx := t.Context()
	clock := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	// A /29: 8 addresses, 5 reserved, one the primary's: 2 free.
	fake, p := newWorld(t, "10.53.0.0/29", -1)
	p.Now = clock.Now
	_, nic, err := fake.AddVM("rg", "node-a", subnetA)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Assign(ctx, nic, 3, false)
	if err != nil || len(got.Addresses) != 2 {
		t.Fatalf("3 asked of 2 free: %v, %v", got, err)
	}
	puts := fake.Requests(http.MethodPut)
	if _, err := p.Assign(ctx, nic, 1, false); cloud.KindOf(err) != cloud.KindSubnetFull {
		t.Fatalf("a full subnet: %v", err)
	}
	if fake.Requests(http.MethodPut) != puts {
		t.Fatal("a write to a full subnet")
	}
	if err := p.Unassign(ctx, nic, got.Addresses[:1], nil); err != nil {
		t.Fatal(err)
	}
	if again, err := p.Assign(ctx, nic, 3, false); err != nil || !slices.Equal(again.Addresses, got.Addresses[:1]) {
		t.Fatalf("the freed one: %v, %v", again, err)
	}
	if n := fake.Calls("GET", "subnets/nodes"); n != 1 {
		t.Fatalf("the subnet read %d times within a minute, want 1", n)
	}

	// Another writer takes the room after the reading.
	fake2, p2 := newWorld(t, "10.54.0.0/28", -1)
	p2.Now = clock.Now
	_, nic2, err := fake2.AddVM("rg", "node-b", subnetA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Assign(ctx, nic2, 1, false); err != nil {
		t.Fatal(err)
	}
	for a := netip.MustParseAddr("10.54.0.4"); a != netip.MustParseAddr("10.54.0.15"); a = a.Next() {
		fake2.Take(subnetA, a)
	}
	_, err = p2.Assign(ctx, nic2, 5, false)
	var ce *cloud.Error
	if !errors.As(err, &ce) || ce.Kind != cloud.KindSubnetFull || !strings.Contains(ce.Err.Error(), "does not have enough capacity for 5 IP addresses") {
		t.Fatalf("ARM's refusal: %v", err)
	}
	if n := len(fake2.Addresses(nic2)); n != 2 {
		t.Fatalf("a refused write left %d configurations", n)
	}
	puts = fake2.Requests(http.MethodPut)
	if _, err := p2.Assign(ctx, nic2, 1, false); cloud.KindOf(err) != cloud.KindSubnetFull || fake2.Requests(http.MethodPut) != puts {
		t.Fatalf("after ARM's SubnetIsFull: %v, %d writes", err, fake2.Requests(http.MethodPut)-puts)
	}
	clock.Advance(time.Minute)
	if _, err := p2.Assign(ctx, nic2, 1, false); cloud.KindOf(err) != cloud.KindSubnetFull || fake2.Requests(http.MethodPut) != puts {
		t.Fatalf("a minute later, still full: %v, %d writes", err, fake2.Requests(http.MethodPut)-puts)
	}
	if n := fake2.Calls("GET", "subnets/nodes"); n != 2 {
		t.Fatalf("the subnet read %d times, want 2 (once a minute)", n)
	}
}

// TestScaleSetSeveralNICs: a scale set instance with two NICs in two
// subnets, the second primary: the primary is device 0, each NIC carries
// its own subnet, and an add to the other NIC writes the model once,
// leaving the primary's configurations as they were.
func TestScaleSetSeveralNICs(t *testing.T) {
	ctx := t.Context()
	fake, p := newWorld(t, "10.55.0.0/24", -1)
	fake.AddSubnet(subnetB, netip.MustParsePrefix("10.56.0.0/24"))
	vm, nics, err := fake.AddScaleSetVMWithNICs("rg", "pool1", "0", false, 1, subnetB, subnetA)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := p.Instance(ctx, vm)
	if err != nil {
		t.Fatal(err)
	}
	if len(inst.Interfaces) != 2 || inst.Interfaces[0].ID != nics[1] || inst.Interfaces[0].SubnetID != subnetA ||
		inst.Interfaces[1].ID != nics[0] || inst.Interfaces[1].SubnetID != subnetB || inst.Limits.Interfaces != 2 {
		t.Fatalf("instance %+v", inst)
	}
	got, err := p.Assign(ctx, nics[0], 2, false)
	if err != nil || len(got.Addresses) != 2 || !netip.MustParsePrefix("10.56.0.0/24").Contains(got.Addresses[0]) {
		t.Fatalf("assigned %v, %v", got, err)
	}
	if n := fake.Calls("PUT", "virtualMachines/0"); n != 1 {
		t.Fatalf("%d model writes, want 1", n)
	}
	if a, b := len(fake.Addresses(nics[0])), len(fake.Addresses(nics[1])); a != 3 || b != 1 {
		t.Fatalf("the NICs hold %d and %d configurations, want 3 and 1", a, b)
	}
	listed, err := p.Instances(ctx, "/subscriptions/"+armfake.Subscription+"/resourceGroups/rg")
	if err != nil {
		t.Fatal(err)
	}
	l := listed[strings.ToLower(vm)]
	if len(l.Interfaces) != 2 || l.Interfaces[0].ID != nics[1] || !slices.Equal(l.Interfaces[1].Addresses, got.Addresses) {
		t.Fatalf("listed %+v", l)
	}
	if err := p.Unassign(ctx, nics[0], got.Addresses, nil); err != nil {
		t.Fatal(err)
	}
	if a := len(fake.Addresses(nics[0])); a != 1 {
		t.Fatalf("after the removal the NIC holds %d", a)
	}
}
