// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package azure

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azcloud "github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/azure/armfake"
)

// staticToken is a credential whose token the fake does not check.
type staticToken struct{}

func (staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "token", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

var subnetA = armfake.SubnetID("rg", "vnet", "nodes")

// newWorld serves a fake with one subnet over TLS and answers a provider
// of the real SDK pointed at it, retrying up to retries times.
func newWorld(t *testing.T, cidr string, retries int32) (*armfake.Server, *Provider) {
	t.Helper()
	return newWorldVia(t, cidr, retries, nil)
}

// newWorldRetry is newWorld with the SDK's retry options retry.
func newWorldRetry(t *testing.T, cidr string, retry policy.RetryOptions) (*armfake.Server, *Provider) {
	t.Helper()
	return newWorldOpts(t, cidr, retry, nil)
}

// newWorldVia is newWorld with every request passed through via (when
// not nil) before the fake.
func newWorldVia(t *testing.T, cidr string, retries int32, via func(fake *armfake.Server, next http.Handler) http.Handler) (*armfake.Server, *Provider) {
	t.Helper()
	return newWorldOpts(t, cidr, policy.RetryOptions{MaxRetries: retries, RetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond}, via)
}

func newWorldOpts(t *testing.T, cidr string, retry policy.RetryOptions, via func(fake *armfake.Server, next http.Handler) http.Handler) (*armfake.Server, *Provider) {
	t.Helper()
	fake := armfake.New()
	fake.AddSubnet(subnetA, netip.MustParsePrefix(cidr))
	var h http.Handler = fake
	if via != nil {
		h = via(fake, fake)
	}
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	fake.SetBase(srv.URL)
	p, err := New(armfake.Subscription, staticToken{}, &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Cloud: azcloud.Configuration{ActiveDirectoryAuthorityHost: srv.URL, Services: map[azcloud.ServiceName]azcloud.ServiceConfiguration{
			azcloud.ResourceManager: {Endpoint: srv.URL, Audience: "https://management.core.windows.net/"},
		}},
		Transport: srv.Client(),
		Retry:     retry,
	}})
	if err != nil {
		t.Fatal(err)
	}
	return fake, p
}

func TestVMAddresses(t *testing.T) {
	ctx := context.Background()
	fake, p := newWorld(t, "10.40.0.0/24", -1)
	vm, nic, err := fake.AddVM("rg", "node-a", subnetA)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Assign(ctx, nic, 3, false)
	if err != nil {
		t.Fatal(err)
	}
	// .4 is the primary address; the lowest free ones follow.
	want := []netip.Addr{netip.MustParseAddr("10.40.0.5"), netip.MustParseAddr("10.40.0.6"), netip.MustParseAddr("10.40.0.7")}
	if !slices.Equal(got.Addresses, want) {
		t.Fatalf("assigned %v, want %v", got.Addresses, want)
	}
	for name := range fake.Addresses(nic) {
		if name != "ipconfig1" && (!strings.HasPrefix(name, "Cilium-") || len(name) != len("Cilium-")+8) {
			t.Errorf("IP configuration named %q", name)
		}
	}
	inst, err := p.Instance(ctx, ProviderIDPrefix+vm)
	if err != nil {
		t.Fatal(err)
	}
	if len(inst.Interfaces) != 1 || inst.Limits != (cloud.Limits{Interfaces: 1, IPv4PerInterface: 256}) {
		t.Fatalf("instance %+v", inst)
	}
	f := inst.Interfaces[0]
	if f.ID != nic || f.Primary != netip.MustParseAddr("10.40.0.4") || !slices.Equal(f.Addresses, want) || f.SubnetID != subnetA || len(f.SecurityGroups) != 1 {
		t.Fatalf("interface %+v", f)
	}
	if err := p.Unassign(ctx, nic, want[1:2], nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Unassign(ctx, nic, []netip.Addr{netip.MustParseAddr("10.40.0.4")}, nil); cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("unassigning the primary address: %v", err)
	}
	inst, err = p.Instance(ctx, vm)
	if err != nil || !slices.Equal(inst.Interfaces[0].Addresses, []netip.Addr{want[0], want[2]}) {
		t.Fatalf("after the unassign: %+v, %v", inst, err)
	}
	// The freed address is handed out again.
	again, err := p.Assign(ctx, nic, 1, false)
	if err != nil || !slices.Equal(again.Addresses, want[1:2]) {
		t.Fatalf("assigned %v, %v; want %v", again.Addresses, err, want[1:2])
	}
}

// TestScaleSetAddresses: a scale set instance's NIC changes through its VM
// model, written without the image reference (a Compute Gallery image
// refuses it otherwise).
func TestScaleSetAddresses(t *testing.T) {
	ctx := context.Background()
	fake, p := newWorld(t, "10.41.0.0/24", -1)
	vm, nic, err := fake.AddScaleSetVM("rg", "pool1", "0", subnetA, true)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := p.Instance(ctx, ProviderIDPrefix+vm)
	if err != nil {
		t.Fatal(err)
	}
	if len(inst.Interfaces) != 1 || inst.Interfaces[0].ID != nic {
		t.Fatalf("instance %+v, NIC %s", inst, nic)
	}
	got, err := p.Assign(ctx, nic, 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Addresses) != 2 || got.Addresses[0] != netip.MustParseAddr("10.41.0.5") {
		t.Fatalf("assigned %v", got.Addresses)
	}
	if n := fake.Calls("PUT", "virtualMachines/0"); n != 1 {
		t.Fatalf("%d model writes, want 1", n)
	}
	if err := p.Unassign(ctx, nic, got.Addresses, nil); err != nil {
		t.Fatal(err)
	}
	if a := fake.Addresses(nic); len(a) != 1 {
		t.Fatalf("left %v", a)
	}
}

func TestAssignRefusals(t *testing.T) {
	ctx := context.Background()
	t.Run("256 per NIC, checked before the call", func(t *testing.T) {
		fake, p := newWorld(t, "10.43.0.0/16", -1)
		_, nic, err := fake.AddVM("rg", "node-a", subnetA)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Assign(ctx, nic, 255, false); err != nil {
			t.Fatal(err)
		}
		puts := fake.Calls("PUT", "networkInterfaces/node-a-nic")
		if _, err := p.Assign(ctx, nic, 1, false); cloud.KindOf(err) != cloud.KindInterfaceFull {
			t.Fatalf("the 257th: %v", err)
		}
		if fake.Calls("PUT", "networkInterfaces/node-a-nic") != puts {
			t.Fatal("a write past the limit reached ARM")
		}
	})
	t.Run("only provisioned configurations count", func(t *testing.T) {
		fake, p := newWorld(t, "10.44.0.0/24", -1)
		vm, nic, err := fake.AddVM("rg", "node-a", subnetA)
		if err != nil {
			t.Fatal(err)
		}
		fake.FailNextProvisioning(1)
		got, err := p.Assign(ctx, nic, 2, false)
		if err != nil || len(got.Addresses) != 1 {
			t.Fatalf("one of two provisioned: %v, %v", got, err)
		}
		inst, err := p.Instance(ctx, vm)
		if err != nil || len(inst.Interfaces[0].Addresses) != 1 {
			t.Fatalf("instance %+v, %v", inst, err)
		}
	})
	t.Run("no prefixes", func(t *testing.T) {
		fake, p := newWorld(t, "10.45.0.0/24", -1)
		_, nic, err := fake.AddVM("rg", "node-a", subnetA)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Assign(ctx, nic, 1, true); cloud.KindOf(err) != cloud.KindInvalid {
			t.Fatalf("a prefix: %v", err)
		}
	})
	t.Run("a VM gone is not found", func(t *testing.T) {
		_, p := newWorld(t, "10.46.0.0/24", -1)
		_, err := p.Instance(ctx, "/subscriptions/"+armfake.Subscription+"/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/gone")
		if cloud.KindOf(err) != cloud.KindNotFound {
			t.Fatalf("err %v, want %v", err, cloud.KindNotFound)
		}
		_, err = p.Instance(ctx, "/subscriptions/"+armfake.Subscription+"/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/s/virtualMachines/9")
		if cloud.KindOf(err) != cloud.KindNotFound {
			t.Fatalf("an instance out of its scale set: %v", err)
		}
		if _, err := p.Instance(ctx, "not-a-resource-id"); cloud.KindOf(err) != cloud.KindInvalid {
			t.Fatalf("a malformed id: %v", err)
		}
	})
}

// TestThrottling: ARM's 429 is retried by the SDK as it says
// (Retry-After-Ms); when every try is refused the error says throttled
// (cilium#19695: storms of scale set updates).
func TestThrottling(t *testing.T) {
	ctx := context.Background()
	fake, p := newWorld(t, "10.47.0.0/24", 3)
	_, nic, err := fake.AddScaleSetVM("rg", "pool1", "0", subnetA, false)
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	fake.SetFault(func(method, path string) *armfake.Error {
		if method == http.MethodPut && refused < 2 {
			refused++
			return armfake.Throttled()
		}
		return nil
	})
	if got, err := p.Assign(ctx, nic, 1, false); err != nil || len(got.Addresses) != 1 {
		t.Fatalf("two 429s then an answer: %v, %v", got, err)
	}
	if n := fake.Calls("PUT", "virtualMachines/0"); n != 3 {
		t.Fatalf("%d writes, want 3", n)
	}
	fake.SetFault(func(string, string) *armfake.Error { return armfake.Throttled() })
	if _, err := p.Assign(ctx, nic, 1, false); cloud.KindOf(err) != cloud.KindThrottled {
		t.Fatalf("err %v, want %v", err, cloud.KindThrottled)
	}
}
