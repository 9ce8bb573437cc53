package capacity

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azcloud "github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud/azure"
	"github.com/ipam-dev/ipam/internal/cloud/azure/armfake"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/testclock"
)

type staticToken struct{}

func (staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "token", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// TestPassAzure: a scale set instance's node, by its Azure providerID,
// gets its pre-allocation as IP configurations of its NIC, recorded as
// blocks it leases from.
func TestPassAzure(t *testing.T) {
	ctx := t.Context()
	clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	st, err := store.Open(ctx, pgtest.NewDatabase(t), store.Options{LeaseExpiry: time.Hour, Cooldown: time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	fake := armfake.New()
	subnet := armfake.SubnetID("rg", "vnet", "nodes")
	fake.AddSubnet(subnet, netip.MustParsePrefix("10.96.0.0/24"))
	vm, nic, err := fake.AddScaleSetVM("rg", "pool1", "0", subnet, true)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(fake)
	t.Cleanup(srv.Close)
	fake.SetBase(srv.URL)
	provider, err := azure.New(armfake.Subscription, staticToken{}, &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Cloud: azcloud.Configuration{ActiveDirectoryAuthorityHost: srv.URL, Services: map[azcloud.ServiceName]azcloud.ServiceConfiguration{
			azcloud.ResourceManager: {Endpoint: srv.URL, Audience: "https://management.core.windows.net/"},
		}},
		Transport: srv.Client(),
		Retry:     policy.RetryOptions{MaxRetries: -1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CreatePool(ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: "nics",
		Spec: alloc.PoolSpec{IPv4: &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/24")}, MaskSize: 28},
			NodeLocal: alloc.DefaultNodeLocal, Cloud: &alloc.CloudSpec{Provider: alloc.CloudAzure, Watermarks: &alloc.Watermarks{PreAllocate: 3}}}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.PutNode(ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "vmss-0", ProviderID: azure.ProviderIDPrefix + vm}); err != nil {
		t.Fatal(err)
	}
	w := &Worker{Store: st, Provider: alloc.CloudAzure, Cloud: provider, Now: clk.Now}
	if err := w.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	nodes, err := st.CloudNodes(ctx, alloc.DefaultSpace, "nics")
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || len(nodes[0].Blocks) != 3 || nodes[0].Blocks[0].Interface != nic {
		t.Fatalf("cloud nodes %+v", nodes)
	}
	given := map[netip.Addr]bool{}
	for _, a := range fake.Addresses(nic) {
		given[a] = true
	}
	a, err := st.Allocate(ctx, alloc.LeaseRequest{Space: alloc.DefaultSpace, Node: "vmss-0", Pool: "nics",
		Owner: alloc.Owner{Namespace: "ns", Name: "p"}, Attachment: alloc.Attachment{ContainerID: "c1", Interface: "eth0"}})
	if err != nil {
		t.Fatal(err)
	}
	if addr := a.Leases[0].Addr; !given[addr] || addr == netip.MustParseAddr("10.96.0.4") {
		t.Fatalf("leased %v: not a secondary address Azure gave (%v)", addr, given)
	}
}
