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
