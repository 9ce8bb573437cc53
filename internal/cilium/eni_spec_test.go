// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
	"github.com/ipam-dev/ipam/internal/store"
)

// TestCRDENISpecInterfacesForPods: the CiliumNode's own spec.eni steers
// the workers as it steers Cilium's AWS operator (pkg/aws/ipam/node.go,
// ENI.IsExcludedBySpec), whatever the pool's spec.cloud says. Its
// first-interface-index 1 leaves eni0 alone; its exclude-interface-tags
// leave alone eni1 (device 1, tagged, two addresses a user put there for
// something else). The pre-allocation goes on a new interface the
// workers attach at device 2; eni1's addresses are neither counted, nor
// reserved into spec.ipam.pool, nor given back (the operator releases
// excess here); status.eni.enis lists all three interfaces as Cilium's
// does, eni1 with what it holds. Before, the workers used the pool's
// first interface index alone: eni1's two addresses went into the pool
// and two more onto eni0.
func TestCRDENISpecInterfacesForPods(t *testing.T) {
	noPods := map[string]string{"example.com/no-pods": "true"}
	var eni1 string
	x := newENIWorldOf(t, eniWorldOptions{
		spec:     alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}, ReleaseDelay: time.Second},
		operator: func(c *Config) { c.ExcessIPReleaseDelay, c.AWSReleaseExcessIPs = time.Second, true },
		node: func(cn *ciliumv2.CiliumNode, fake *ec2fake.Server, inst string) {
			var err error
			if eni1, err = fake.AttachTaggedInterface(inst, "subnet-0123456789abcdef0", 1, noPods, 2); err != nil {
				t.Fatal(err)
			}
			first := 1
			cn.Spec.ENI.FirstInterfaceIndex = &first
			cn.Spec.ENI.ExcludeInterfaceTags = noPods
			cn.Spec.IPAM.PreAllocate = 4
		},
	})
	e, fake := x.e, x.fake
	userAddrs, _ := fake.Held(eni1)
	// The interface the workers attach for Pods, "" until they do.
	forPods := func() (string, int) {
		for _, f := range fake.Interfaces() {
			if f.Instance == x.inst && f.ID != x.eni0 && f.ID != eni1 {
				return f.ID, f.Device
			}
		}
		return "", -1
	}
	last := time.Time{}
	served := func() (bool, string) {
		if time.Since(last) > 200*time.Millisecond {
			if err := x.w.Pass(e.ctx); err != nil {
				return false, err.Error()
			}
			last = time.Now()
		}
		cn := e.get("node-a")
		id, device := forPods()
		held, _ := fake.Held(id)
		if id == "" || device != 2 || len(cn.Spec.IPAM.Pool) != 4 || len(held) != 4 {
			return false, fmt.Sprintf("interface for Pods %q at device %d holding %v; pool %v; operator %q; eni0 holds %v",
				id, device, held, specPool(cn), cn.Status.IPAM.OperatorStatus.Error, heldAddrs(fake, x.eni0))
		}
		for ip, a := range cn.Spec.IPAM.Pool {
			if a.Resource != id || !slices.Contains(held, netip.MustParseAddr(ip)) {
				return false, fmt.Sprintf("pool entry %s on %q, not on %s (%v)", ip, a.Resource, id, held)
			}
		}
		enis := cn.Status.ENI.ENIs
		if len(enis) != 3 || len(enis[x.eni0].Addresses) != 0 || enis[eni1].Number != 1 || len(enis[id].Addresses) != 4 {
			return false, fmt.Sprintf("status.eni.enis %+v", enis)
		}
		var listed []netip.Addr
		for _, a := range enis[eni1].Addresses {
			listed = append(listed, a.Addr)
		}
		if !slices.Equal(listed, userAddrs) {
			return false, fmt.Sprintf("status.eni.enis lists %v on %s; it holds %v", listed, eni1, userAddrs)
		}
		return true, ""
	}
	e.eventually(servedWithin, "the pre-allocation on a new interface at device 2", served)
	// Passes and rounds beyond the release delay change nothing: eni1's
	// addresses are nobody's excess, eni0 stays empty.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if ok, why := served(); !ok {
			t.Fatalf("after settling: %s", why)
		}
		if held := heldAddrs(fake, eni1); !slices.Equal(held, userAddrs) {
			t.Fatalf("%s, excluded, holds %v; it held %v", eni1, held, userAddrs)
		}
		if held := heldAddrs(fake, x.eni0); len(held) != 0 {
			t.Fatalf("eni0, below the first interface index, holds %v", held)
		}
	}
	cn := e.get("node-a")
	for _, a := range userAddrs {
		if _, ok := cn.Spec.IPAM.Pool[a.String()]; ok {
			t.Fatalf("%s of the excluded %s is in the pool %v", a, eni1, specPool(cn))
		}
	}
	e.consistent()
}

func heldAddrs(fake *ec2fake.Server, id string) []netip.Addr {
	held, _ := fake.Held(id)
	return held
}

// TestCRDENIPreAllocateSeededFromLimits: a CiliumNode without
// spec.ipam.pre-allocate on a t3.nano (2 interfaces of 2 addresses, one
// of each the primary) gets the pre-allocation Cilium's AWS operator
// writes (GetMinimumAllocatableIPv4): min(8, 2 x (2 - 1)) = 2, written
// into its spec, and it is sized with it: two addresses, and no
// "allocator full". Before, the node was sized with the default 8 it can
// never hold: spec.ipam.pre-allocate stayed 0 and its operator status
// said the allocator was full.
func TestCRDENIPreAllocateSeededFromLimits(t *testing.T) {
	x := newENIWorldOf(t, eniWorldOptions{
		spec:         alloc.CloudSpec{Provider: alloc.CloudAWS},
		operator:     func(c *Config) { c.ExcessIPReleaseDelay = time.Hour },
		instanceType: "t3.nano",
		node: func(cn *ciliumv2.CiliumNode, _ *ec2fake.Server, _ string) {
			first := 0
			cn.Spec.ENI.FirstInterfaceIndex = &first
			cn.Spec.ENI.InstanceType = "t3.nano"
		},
	})
	e := x.e
	last := time.Time{}
	seeded := func() (bool, string) {
		if time.Since(last) > 200*time.Millisecond {
			if err := x.w.Pass(e.ctx); err != nil {
				return false, err.Error()
			}
			last = time.Now()
		}
		cn := e.get("node-a")
		return cn.Spec.IPAM.PreAllocate == 2 && len(cn.Spec.IPAM.Pool) == 2 && cn.Status.IPAM.OperatorStatus.Error == "",
			fmt.Sprintf("pre-allocate %d, pool %v, operator %q", cn.Spec.IPAM.PreAllocate, specPool(cn), cn.Status.IPAM.OperatorStatus.Error)
	}
	e.eventually(servedWithin, "pre-allocate 2 written and served", seeded)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if ok, why := seeded(); !ok {
			t.Fatalf("after settling: %s", why)
		}
	}
	e.consistent()
}

// The pre-allocation written into a CiliumNode without one, as Cilium's
// operator writes it (GetMinimumAllocatableIPv4 of pkg/aws/ipam and
// pkg/azure/ipam), and when.
func TestPreAllocateSeed(t *testing.T) {
	t3nano := store.InstanceLimits{Type: "t3.nano", Interfaces: 2, IPv4PerInterface: 2}
	t3small := store.InstanceLimits{Type: "t3.small", Interfaces: 3, IPv4PerInterface: 4}
	index := func(i int) *int { return &i }
	for _, c := range []struct {
		name      string
		p         alloc.CloudProvider
		pre       int
		first     *int
		limits    store.InstanceLimits
		want      int
		wantWrite bool
	}{
		{"AWS t3.nano", alloc.CloudAWS, 0, index(0), t3nano, 2, true},
		{"AWS t3.small from interface 1", alloc.CloudAWS, 0, index(1), t3small, 6, true},
		{"AWS t3.small: the default 8", alloc.CloudAWS, 0, index(0), t3small, 8, true},
		{"AWS, no first interface index: the default 8", alloc.CloudAWS, 0, nil, t3nano, 8, true},
		{"AWS, the index past the interfaces: 0, nothing to write", alloc.CloudAWS, 0, index(2), t3nano, 0, false},
		{"AWS, limits not read yet: wait for them", alloc.CloudAWS, 0, index(0), store.InstanceLimits{}, 0, false},
		{"AWS, pre-allocate set: kept", alloc.CloudAWS, 3, index(0), t3nano, 0, false},
		{"Azure: the default 8", alloc.CloudAzure, 0, nil, store.InstanceLimits{}, 8, true},
		{"Azure, pre-allocate set: kept", alloc.CloudAzure, 3, nil, store.InstanceLimits{}, 0, false},
		{"no cloud: nothing", "", 0, nil, store.InstanceLimits{}, 0, false},
	} {
		cn := &ciliumv2.CiliumNode{}
		cn.Spec.IPAM.PreAllocate, cn.Spec.ENI.FirstInterfaceIndex = c.pre, c.first
		got, write := preAllocateSeed(c.p, cn, c.limits)
		if got != c.want || write != c.wantWrite {
			t.Errorf("%s: %d (write %v), want %d (write %v)", c.name, got, write, c.want, c.wantWrite)
		}
	}
}
