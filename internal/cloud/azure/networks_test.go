// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package azure

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/ipam-dev/ipam/internal/cloud/azure/armfake"
)

// TestInstanceDescribesNetworks: a VM's and a scale set instance's NICs
// carry their name, their MAC written as the agent reads it, their
// subnet's range and gateway (base + 1) and the virtual network's address
// space; the subnet and the network are read once, then cached.
func TestInstanceDescribesNetworks(t *testing.T) {
	ctx := context.Background()
	fake, p := newWorld(t, "10.40.0.0/24", -1)
	space := []netip.Prefix{netip.MustParsePrefix("10.40.0.0/16"), netip.MustParsePrefix("172.16.0.0/20")}
	fake.AddVirtualNetwork(armfake.VirtualNetworkID("rg", "vnet"), space...)
	vm, nic, err := fake.AddVM("rg", "node-a", subnetA)
	if err != nil {
		t.Fatal(err)
	}
	setVM, setNIC, err := fake.AddScaleSetVM("rg", "pool", "0", subnetA, false)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		id, nic, name, mac string
	}{
		{vm, nic, "node-a-nic", "00:0d:3a:00:00:01"},
		{setVM, setNIC, "pool-nic", "00:0d:3a:00:00:02"},
	}
	for _, c := range cases {
		inst, err := p.Instance(ctx, ProviderIDPrefix+c.id)
		if err != nil {
			t.Fatal(err)
		}
		if len(inst.Interfaces) != 1 {
			t.Fatalf("%s: %d interfaces", c.id, len(inst.Interfaces))
		}
		f := inst.Interfaces[0]
		if f.ID != c.nic || f.Name != c.name || f.MAC != c.mac || f.SubnetCIDR != netip.MustParsePrefix("10.40.0.0/24") ||
			f.Gateway != netip.MustParseAddr("10.40.0.1") || !slices.Equal(f.VPCCIDRs, space) {
			t.Errorf("%s: %+v", c.id, f)
		}
	}
	if s, v := fake.Calls("GET", "subnets/nodes"), fake.Calls("GET", "virtualNetworks/vnet"); s != 1 || v != 1 {
		t.Errorf("two readings of NICs in one subnet: %d subnet and %d network reads, want 1 and 1", s, v)
	}
}
