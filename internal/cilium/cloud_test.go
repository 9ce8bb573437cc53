// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"fmt"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	iputil "github.com/cilium/cilium/pkg/ip"
	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
	"github.com/ipam-dev/ipam/internal/cloud/capacity"
	"github.com/ipam-dev/ipam/internal/store"
)

// TestCRDCloudPoolENI: on a cloud pool, a CiliumNode known only by its
// spec.instance-id gets the addresses the capacity workers give its
// instance (EC2 fake, real SDK, real API server): the controller records
// its providerID, names the ENI as each pool entry's resource, and lists
// in status.eni.enis the ENI with what the agent routes by and exactly
// the pool's addresses. The use an agent in ipam.mode=eni states (its
// demand less the pre-allocation) becomes that many Pod leases, and the
// pool grows by it.
func TestCRDCloudPoolENI(t *testing.T) {
	x := newENIWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}}, time.Hour)
	e, fake, inst, eni0, served := x.e, x.fake, x.inst, x.eni0, x.served
	e.eventually(servedWithin, "the pre-allocation from the cloud", served(4))

	cn := e.get("node-a")
	held, _ := fake.Held(eni0)
	for ip, a := range cn.Spec.IPAM.Pool {
		if a.Resource != eni0 || !slices.Contains(held, netip.MustParseAddr(ip)) {
			t.Errorf("pool entry %s: resource %q; want %s, an address it holds (%v)", ip, a.Resource, eni0, held)
		}
	}
	eni := cn.Status.ENI.ENIs[eni0]
	if eni.ID != eni0 || eni.MAC == "" || eni.Number != 0 || eni.Subnet.ID != "subnet-0123456789abcdef0" ||
		eni.Subnet.CIDR.Prefix != netip.MustParsePrefix("10.90.0.0/24") || eni.VPC.ID != "vpc-1" ||
		eni.VPC.PrimaryCIDR.Prefix != netip.MustParsePrefix("10.90.0.0/16") || len(eni.VPC.CIDRs) != 2 || !eni.IP.IsValid() ||
		slices.Contains(eni.Addresses, eni.IP) || eni.AvailabilityZone != "eu-west-1a" {
		t.Fatalf("status.eni.enis[%s] = %+v", eni0, eni)
	}
	nodes, err := e.st.CloudNodes(e.ctx, alloc.DefaultSpace, "default")
	if err != nil || len(nodes) != 1 || nodes[0].ProviderID != "aws:///eu-west-1a/"+inst {
		t.Fatalf("cloud nodes %+v, %v", nodes, err)
	}

	// The agent (ipam.mode=eni, v1.20) takes two into use: it asks for 6
	// (2 used plus its pre-allocation of 4) and keeps the four it holds
	// in spec.ipam.pools.allocated; status.ipam.used stays empty. It names
	// no address in use: the lowest two it keeps are recorded as such.
	kept := specPool(cn)
	x.eniAgent(t, kept, 2+4)
	e.eventually(servedWithin, "the pool grown by the use", served(6))
	for _, a := range mustHeld(t, e, "node-a") {
		if want := slices.Contains(kept[:2], a.Addr.String()); (a.State == alloc.StateActive) != want {
			t.Errorf("%s: %s in the store; counted in use: %v", a.Addr, a.State, want)
		}
	}
	if held, _ := fake.Held(eni0); len(held) != 6 {
		t.Fatalf("the cloud holds %v, want 6: the 2 used and both pre-allocations counted once", held)
	}
	e.consistent()
}

// eniWorld is a CiliumNode node-a of instance inst (one m5.large in the
// EC2 fake, its first interface eni0) on the default pool, a cloud pool
// of spec, with the crd-mode operator (excess released after delay) and
// the capacity workers over the real SDK and API server.
type eniWorld struct {
	e          *crdEnv
	fake       *ec2fake.Server
	w          *capacity.Worker
	inst, eni0 string
	// served answers a condition: the workers have passed (every 200ms),
	// the node's pool holds want addresses and status.eni.enis lists
	// exactly them.
	served func(want int) func() (bool, string)
}

// servedWithin bounds a wait for the workers and the operator to serve a
// node: a worker's pass, then the operator's next round (at most
// retryUnserved later). About 5s on a quiet machine; CI's machine, running
// other packages' PostgreSQL clusters beside, once took over 20s.
const servedWithin = time.Minute

func newENIWorld(t *testing.T, spec alloc.CloudSpec, delay time.Duration) *eniWorld {
	t.Helper()
	return newENIWorldV6(t, spec, delay, netip.Prefix{})
}

// newENIWorldV6 is newENIWorld with IPv6: the pool takes v6 (the VPC's
// range) and the subnet has v6's first /64, when v6 is valid.
//
// These worlds run the operator with Cilium's --aws-release-excess-ips on,
// so that excess goes back after delay; newENIWorldWith sets the operator
// otherwise.
func newENIWorldV6(t *testing.T, spec alloc.CloudSpec, delay time.Duration, v6 netip.Prefix) *eniWorld {
	t.Helper()
	return newENIWorldWith(t, spec, v6, func(c *Config) { c.ExcessIPReleaseDelay, c.AWSReleaseExcessIPs = delay, true })
}

// newENIWorldWith is the world of one node on an AWS pool with IPv6 when
// v6 is valid, its operator set by tweak.
func newENIWorldWith(t *testing.T, spec alloc.CloudSpec, v6 netip.Prefix, tweak func(*Config)) *eniWorld {
	t.Helper()
	return newENIWorldOf(t, eniWorldOptions{spec: spec, v6: v6, operator: tweak})
}

// eniWorldOptions shape an eniWorld.
type eniWorldOptions struct {
	spec     alloc.CloudSpec
	v6       netip.Prefix
	operator func(*Config)
	// instanceType is node-a's instance's, m5.large when "".
	instanceType string
	// node, when set, makes node-a's CiliumNode what it should be before
	// its creation instead of pre-allocate 4; it may attach interfaces to
	// the instance first.
	node func(cn *ciliumv2.CiliumNode, fake *ec2fake.Server, inst string)
	// kubeMaxPods, when set, makes a Kubernetes Node node-a first, its
	// status.capacity.pods that.
	kubeMaxPods int64
}

func newENIWorldOf(t *testing.T, o eniWorldOptions) *eniWorld {
	t.Helper()
	spec, v6, tweak := o.spec, o.v6, o.operator
	if o.instanceType == "" {
		o.instanceType = "m5.large"
	}
	pool := alloc.PoolSpec{IPv4: v4(28, "10.90.0.0/24"), NodeLocal: alloc.DefaultNodeLocal, Cloud: &spec}
	if v6.IsValid() {
		pool.IPv6 = &alloc.PoolFamily{CIDRs: []netip.Prefix{v6}, MaskSize: 96}
	}
	e := newCRDEnv(t, pool)
	fake := ec2fake.New()
	fake.AddVPC("vpc-1", netip.MustParsePrefix("10.90.0.0/16"), netip.MustParsePrefix("100.64.0.0/16"))
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-0123456789abcdef0", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("10.90.0.0/24")})
	if v6.IsValid() {
		fake.AddSubnetIPv6("subnet-0123456789abcdef0", netip.PrefixFrom(v6.Addr(), 64))
	}
	inst, eni0, err := fake.AddInstance(o.instanceType, "subnet-0123456789abcdef0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(fake)
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{Region: "eu-west-1", BaseEndpoint: sdkaws.String(srv.URL), HTTPClient: aws.SafeBodies(srv.Client()),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		Retryer:     retry.NewStandard(func(o *retry.StandardOptions) { o.MaxAttempts = 1 })})
	provider := aws.New(client, aws.Options{Wait: func(int) time.Duration { return 0 }})
	w := &capacity.Worker{Store: e.st, Provider: alloc.CloudAWS, Cloud: provider, Interfaces: provider,
		Tags: map[string]string{cloud.TagCluster: "test"}}

	if o.kubeMaxPods > 0 {
		kc, err := kubernetes.NewForConfig(e.kc.Config())
		if err != nil {
			t.Fatal(err)
		}
		n, err := kc.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Capacity = corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(o.kubeMaxPods, resource.DecimalSI)}
		if _, err := kc.CoreV1().Nodes().UpdateStatus(e.ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.operator("op-1", tweak)
	cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	cn.Spec.InstanceID = inst
	cn.Spec.ENI.AvailabilityZone = "eu-west-1a"
	cn.Spec.IPAM.PreAllocate = 4
	if o.node != nil {
		cn.Spec.IPAM.PreAllocate = 0
		o.node(cn, fake, inst)
	}
	if _, err := e.client.CiliumV2().CiliumNodes().Create(e.ctx, cn, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The workers pass every 200ms here (every minute in the server).
	served := func(want int) func() (bool, string) {
		last := time.Time{}
		return func() (bool, string) {
			if time.Since(last) > 200*time.Millisecond {
				if err := w.Pass(e.ctx); err != nil {
					return false, err.Error()
				}
				last = time.Now()
			}
			cn := e.get("node-a")
			held, _ := fake.Held(eni0)
			eni, ok := cn.Status.ENI.ENIs[eni0]
			if len(cn.Spec.IPAM.Pool) != want || !ok {
				ci, _ := e.st.CloudInterfaces(e.ctx, alloc.DefaultSpace, "node-a")
				// The short facts first: CI cuts a failure's line at 400
				// characters.
				return false, fmt.Sprintf("pool %v, operator %q, the store's blocks %v, leases %v, the cloud holds %v, the reading %+v, status %+v",
					specPool(cn), cn.Status.IPAM.OperatorStatus.Error, e.blocksOf("node-a"), e.heldByStore("node-a"), held, ci.Interfaces, cn.Status.ENI)
			}
			var listed []string
			for _, a := range eni.Addresses {
				listed = append(listed, a.String())
			}
			slices.Sort(listed)
			return slices.Equal(listed, specPool(cn)), fmt.Sprintf("pool %v, status.eni.enis lists %v", specPool(cn), listed)
		}
	}
	return &eniWorld{e: e, fake: fake, w: w, inst: inst, eni0: eni0, served: served}
}

// TestCRDCloudPoolENIIPv6: on an AWS pool with IPv6, the CiliumNode's
// pool holds the pre-allocation of both families, the IPv6 addresses out
// of the /80 EC2 delegated to its ENI, and status.eni.enis lists them
// (as /128s the v1.20 agent allocates those alone).
func TestCRDCloudPoolENIIPv6(t *testing.T) {
	x := newENIWorldV6(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}}, time.Hour,
		netip.MustParsePrefix("2600:1f18:aaaa:bb00::/56"))
	e := x.e
	e.eventually(servedWithin, "both families' pre-allocation", x.served(8))
	delegated := netip.MustParsePrefix("2600:1f18:aaaa:bb00:1::/80")
	cn := e.get("node-a")
	v6 := 0
	for ip, a := range cn.Spec.IPAM.Pool {
		addr := netip.MustParseAddr(ip)
		if addr.Is6() {
			v6++
			if !delegated.Contains(addr) || a.Resource != x.eni0 {
				t.Errorf("pool entry %s (resource %q): not of %v on %s", ip, a.Resource, delegated, x.eni0)
			}
		}
	}
	if v6 != 4 {
		t.Fatalf("%d IPv6 pool entries, want 4: %v", v6, specPool(cn))
	}
	e.consistent()
}

// eniAgent writes node-a's spec.ipam.pools as Cilium's v1.20 agent in
// ipam.mode=eni (its multi-pool manager) does: its demand (in use plus
// pre-allocate) in requested, the /32s it keeps, used and spare, in
// allocated.
func (x *eniWorld) eniAgent(t *testing.T, keep []string, requested int) {
	t.Helper()
	e := x.e
	var cidrs []iputil.Prefix
	for _, ip := range keep {
		cidrs = append(cidrs, iputil.PrefixFrom(netip.PrefixFrom(netip.MustParseAddr(ip), 32)))
	}
	e.eventually(10*time.Second, "the agent's write", func() (bool, string) {
		cn := e.get("node-a")
		cn.Spec.IPAM.Pools = ipamtypes.IPAMPoolSpec{
			Requested: []ipamtypes.IPAMPoolRequest{{Pool: "default", Needed: ipamtypes.IPAMPoolDemand{IPv4Addrs: requested}}},
			Allocated: []ipamtypes.IPAMPoolAllocation{{Pool: "default", CIDRs: cidrs}}}
		_, err := e.client.CiliumV2().CiliumNodes().Update(e.ctx, cn, metav1.UpdateOptions{})
		return err == nil, fmt.Sprint(err)
	})
}

// fourPods runs the eni agent of node-a (pre-allocate 4) up to four Pods:
// it keeps the eight addresses it then holds, and asks for 8. It answers
// them, sorted.
func (x *eniWorld) fourPods(t *testing.T) []string {
	t.Helper()
	e := x.e
	e.eventually(servedWithin, "the pre-allocation from the cloud", x.served(4))
	x.eniAgent(t, specPool(e.get("node-a")), 4+4)
	e.eventually(servedWithin, "the pool grown for four Pods", x.served(8))
	all := specPool(e.get("node-a"))
	x.eniAgent(t, all, 4+4)
	return all
}

// activeLeases counts node-a's addresses the store has as a Pod's.
func (x *eniWorld) activeLeases(t *testing.T) int {
	n := 0
	for _, a := range mustHeld(t, x.e, "node-a") {
		if a.State == alloc.StateActive {
			n++
		}
	}
	return n
}

// The eni worked example: pre-allocate 4, 2 Pods. Cilium's v1.20 agent
// asks for 6 (in use plus pre-allocate) and keeps every address it is
// given; Cilium's operator reads its use as requested - pre-allocate = 2
// (nodemanager/node.go, cilium#45154) and settles at 6 addresses on the
// node's interfaces. The 4 spare ones are the node's reserve, not Pod
// leases. Before, every kept address counted as used: 6 kept made the
// need 4 more, 10 kept 4 more again, and the pool never settled.
func TestCRDENIWorkedExample(t *testing.T) {
	x := newENIWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}, ReleaseDelay: time.Second}, 2*time.Second)
	e := x.e
	e.eventually(servedWithin, "the pre-allocation from the cloud", x.served(4))
	// Two Pods start: the agent keeps everything it holds and asks for 6.
	settled := x.served(6)
	e.eventually(30*time.Second, "six addresses", func() (bool, string) {
		x.eniAgent(t, specPool(e.get("node-a")), 2+4)
		return settled()
	})
	// Several more rounds of the same agent: nothing grows.
	for range 5 {
		x.eniAgent(t, specPool(e.get("node-a")), 2+4)
		time.Sleep(400 * time.Millisecond)
		if ok, why := settled(); !ok {
			t.Fatalf("after settling at 6: %s", why)
		}
	}
	if held, _ := x.fake.Held(x.eni0); len(held) != 6 {
		t.Errorf("the ENI holds %d addresses %v; want 6", len(held), held)
	}
	if n := x.activeLeases(t); n != 2 {
		t.Errorf("%d of node-a's addresses are Pod leases; the agent uses 2 (the other 4 are its reserve)", n)
	}
	e.consistent()
}

// TestCRDCloudPoolKeepsExcessByDefault: Cilium's operator gives an AWS
// node's excess back only with --aws-release-excess-ips, off by default
// (operator/pkg/ipam/aws.go; nodemanager's releaseExcessIPs gates both the
// handshake and handleMultiPoolCIDRRelease). With the default, the
// addresses an eni-mode agent leaves out of spec.ipam.pools.allocated stay
// in its pool and on its ENI long after the release delay; before the
// switch they went back after it (TestCRDCloudPoolENIGivesBack, switched
// on, still shows that path).
func TestCRDCloudPoolKeepsExcessByDefault(t *testing.T) {
	x := newENIWorldWith(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}, ReleaseDelay: time.Second},
		netip.Prefix{}, func(c *Config) { c.ExcessIPReleaseDelay = time.Second })
	e := x.e
	all := x.fourPods(t)
	// Two Pods go: the agent drops three of its eight.
	x.eniAgent(t, all[:5], 2+4)
	settled := x.served(8)
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		if ok, why := settled(); !ok {
			t.Fatalf("with aws-release-excess-ips off, the dropped addresses left: %s", why)
		}
	}
	if held, _ := x.fake.Held(x.eni0); len(held) != 8 {
		t.Errorf("the ENI holds %d addresses %v; want the 8 kept", len(held), held)
	}
	e.consistent()
}

// Which nodes give excess back, by their pool's cloud, as Cilium's
// operator: AWS only when switched on, Azure never, other pools always.
func TestExcessReleasedByCloud(t *testing.T) {
	for _, c := range []struct {
		provider alloc.CloudProvider
		awsOn    bool
		want     bool
	}{
		{alloc.CloudAWS, false, false},
		{alloc.CloudAWS, true, true},
		{alloc.CloudAzure, false, false},
		{alloc.CloudAzure, true, false},
		{"", false, true},
	} {
		o := &Operator{cfg: Config{AWSReleaseExcessIPs: c.awsOn}}
		if got := o.excessReleased(c.provider); got != c.want {
			t.Errorf("%q with aws-release-excess-ips %v: %v, want %v", c.provider, c.awsOn, got, c.want)
		}
	}
}

// TestCRDCloudPoolENIGivesBack: an agent in ipam.mode=eni (v1.20's
// multi-pool allocator: spec.ipam.pools.requested set, status.ipam.used
// empty) answers no release handshake; it releases an address by leaving
// it out of spec.ipam.pools.allocated. After the release delay the
// controller gives such an address back whatever the count (no
// release-ips written), and the capacity workers then unassign it from
// the ENI, as Cilium's operator does (operator/pkg/ipam/nodemanager
// trackMultiPoolAllocatedLocked, handleMultiPoolCIDRRelease). An address
// back in allocated before the delay stays.
func TestCRDCloudPoolENIGivesBack(t *testing.T) {
	x := newENIWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}, ReleaseDelay: time.Second}, 2*time.Second)
	e := x.e
	all := x.fourPods(t)
	// Two Pods go: the agent drops three of its eight, and re-keeps one
	// of them just before the delay.
	x.eniAgent(t, all[:5], 2+4)
	time.Sleep(time.Second)
	x.eniAgent(t, all[:6], 2+4)
	e.eventually(servedWithin, "the dropped addresses given back", x.served(6))
	cn := e.get("node-a")
	for _, ip := range all[:6] {
		if _, ok := cn.Spec.IPAM.Pool[ip]; !ok {
			t.Fatalf("%s, kept by the agent, left the pool %v", ip, specPool(cn))
		}
	}
	if len(cn.Status.IPAM.ReleaseIPs) != 0 {
		t.Fatalf("release-ips %v written for a multi-pool agent", cn.Status.IPAM.ReleaseIPs)
	}
	// The workers unassign the two from the ENI after the pool's delay.
	e.eventually(20*time.Second, "the ENI gives them back", func() (bool, string) {
		if err := x.w.Pass(e.ctx); err != nil {
			return false, err.Error()
		}
		held, _ := x.fake.Held(x.eni0)
		return len(held) == 6, fmt.Sprintf("the cloud holds %v", held)
	})
	held, _ := x.fake.Held(x.eni0)
	for _, ip := range specPool(e.get("node-a")) {
		if !slices.Contains(held, netip.MustParseAddr(ip)) {
			t.Fatalf("%s is in the pool, not on the ENI (%v)", ip, held)
		}
	}
	if n := x.activeLeases(t); n != 2 {
		t.Errorf("%d of node-a's addresses are Pod leases; the agent uses 2", n)
	}
	e.consistent()
}

func mustHeld(t *testing.T, e *crdEnv, node string) []alloc.HeldAddress {
	t.Helper()
	as, err := e.st.NodeAddresses(e.ctx, alloc.DefaultSpace, node)
	if err != nil {
		t.Fatal(err)
	}
	return as
}

// TestCloudStatusAndProviderID: the providerID made of a CiliumNode's
// instance id, and status.azure.interfaces with what Cilium's agent
// routes by (crd.go looks the interface up by the pool entry's resource
// and needs its MAC, gateway and subnet range).
func TestCloudStatusAndProviderID(t *testing.T) {
	o := &Operator{}
	for _, c := range []struct{ instance, zone, want string }{
		{"i-0123456789abcdef0", "eu-west-1a", "aws:///eu-west-1a/i-0123456789abcdef0"},
		{"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool1/virtualMachines/0", "",
			"azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool1/virtualMachines/0"},
		{"node-a", "", ""},
		{"", "", ""},
	} {
		cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
		cn.Spec.InstanceID, cn.Spec.ENI.AvailabilityZone = c.instance, c.zone
		if got := o.providerID("n", cn); got != c.want {
			t.Errorf("instance %q: providerID %q, want %q", c.instance, got, c.want)
		}
	}
	nic := store.CloudInterface{ID: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/nic0", Name: "nic0",
		MAC: "00:0d:3a:00:00:01", SubnetID: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/nodes",
		SubnetCIDR: netip.MustParsePrefix("10.96.0.0/24"), Gateway: netip.MustParseAddr("10.96.0.1"), Primary: netip.MustParseAddr("10.96.0.4"),
		Addresses: []netip.Addr{netip.MustParseAddr("10.96.0.5"), netip.MustParseAddr("10.96.0.6")}}
	got := azureStatus([]store.CloudInterface{nic}, map[string][]netip.Addr{nic.ID: {netip.MustParseAddr("10.96.0.6"), netip.MustParseAddr("10.96.0.5")}})
	if len(got) != 1 {
		t.Fatalf("interfaces %+v", got)
	}
	ai := got[0]
	if ai.ID != nic.ID || ai.Name != "nic0" || ai.MAC != nic.MAC || ai.Gateway.Addr != nic.Gateway || ai.Subnet.CIDR.Prefix != nic.SubnetCIDR ||
		ai.Subnet.ID != nic.SubnetID || ai.State != "Succeeded" || ai.IP.Addr != nic.Primary ||
		len(ai.Addresses) != 2 || ai.Addresses[0].IP.Addr != netip.MustParseAddr("10.96.0.5") || ai.Addresses[0].State != "Succeeded" {
		t.Fatalf("status.azure.interfaces[0] = %+v", ai)
	}
}

// A reading of the interfaces that lags (the clouds' reads are eventually
// consistent) can leave out an address a Pod uses. Its pool entry keeps
// the interface it was listed on, and status.eni.enis lists it there:
// Cilium's ENI agent configures no device while an entry names an
// interface the status lacks or one that does not list the address
// (pkg/ipam/eni.go, validateENIConfig). Before, the entry fell back to
// its pool and block ("default/10.90.0.0/28"), which no status lists.
func TestCRDCloudPoolStaleReadingKeepsInterface(t *testing.T) {
	x := newENIWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}}, time.Hour)
	e := x.e
	e.eventually(servedWithin, "the pre-allocation from the cloud", x.served(4))
	pool := specPool(e.get("node-a"))
	report := func(ips ...string) {
		t.Helper()
		e.eventually(10*time.Second, "the agent's status", func() (bool, string) {
			cn := e.get("node-a")
			cn.Status.IPAM.Used = ipamtypes.AllocationMap{}
			for i, ip := range ips {
				cn.Status.IPAM.Used[ip] = ipamtypes.AllocationIP{Owner: fmt.Sprintf("default/web-%d", i)}
			}
			_, err := e.client.CiliumV2().CiliumNodes().UpdateStatus(e.ctx, cn, metav1.UpdateOptions{})
			return err == nil, fmt.Sprint(err)
		})
	}
	active := func(ip string) func() (bool, string) {
		return func() (bool, string) {
			l, err := e.st.GetAddress(e.ctx, alloc.DefaultSpace, netip.MustParseAddr(ip))
			return err == nil && l.State == alloc.StateActive, fmt.Sprintf("%+v %v", l, err)
		}
	}
	report(pool[0])
	e.eventually(10*time.Second, "the use recorded", active(pool[0]))

	// The reading now lacks pool[0] (the workers do not pass again).
	r, err := e.st.CloudInterfaces(e.ctx, alloc.DefaultSpace, "node-a")
	if err != nil || len(r.Interfaces) == 0 {
		t.Fatalf("reading %+v, %v", r, err)
	}
	ifaces := slices.Clone(r.Interfaces)
	ifaces[0].Addresses = slices.DeleteFunc(slices.Clone(ifaces[0].Addresses), func(a netip.Addr) bool { return a.String() == pool[0] })
	if err := e.st.SetCloudInterfaces(e.ctx, alloc.DefaultSpace, "node-a", r.Instance, r.Limits, ifaces, time.Now()); err != nil {
		t.Fatal(err)
	}
	// A round after the stale reading: the agent reports a second Pod.
	report(pool[0], pool[1])
	e.eventually(10*time.Second, "the second use recorded", active(pool[1]))
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		cn := e.get("node-a")
		if got := cn.Spec.IPAM.Pool[pool[0]].Resource; got != x.eni0 {
			t.Fatalf("pool entry %s: resource %q; want %s, the interface it was listed on", pool[0], got, x.eni0)
		}
		eni := cn.Status.ENI.ENIs[x.eni0]
		if !slices.ContainsFunc(eni.Addresses, func(a iputil.Addr) bool { return a.String() == pool[0] }) {
			t.Fatalf("status.eni.enis[%s] lists %v, not %s", x.eni0, eni.Addresses, pool[0])
		}
	}
}

// TestCRDCloudPoolNodeMaxPods: the Kubernetes Node's status.capacity.pods
// (what the VPC CNI's ipamd reads) is recorded with the node's
// providerID, for the workers to bound the node by when its pool sets no
// maxPods.
func TestCRDCloudPoolNodeMaxPods(t *testing.T) {
	x := newENIWorldOf(t, eniWorldOptions{spec: alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}},
		kubeMaxPods: 40})
	x.e.eventually(10*time.Second, "the Node's max Pods recorded", func() (bool, string) {
		nodes, err := x.e.st.CloudNodes(x.e.ctx, alloc.DefaultSpace, "default")
		if err != nil || len(nodes) != 1 {
			return false, fmt.Sprint(nodes, err)
		}
		return nodes[0].PodInterfaces.MaxPods == 40, fmt.Sprintf("%+v", nodes[0].PodInterfaces)
	})
}
