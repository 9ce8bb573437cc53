// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package lbipam

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The scenarios of Cilium v1.20.2's LB IPAM tests
// (operator/pkg/lbipam/lbipam_test.go), written afresh against a real API
// server and the store. Each subtest is named after the Cilium test it
// ports; docs/lbipam-cilium-tests.md maps every one of Cilium's tests to
// the test here or elsewhere that covers it. The expected outcomes are
// Cilium's: the addresses (the first free address of the pool, as both
// give them), and the reasons of cilium.io/IPAMRequestSatisfied.
//
// Where Cilium's fake clients accept what the API server refuses, the
// scenario does what a user can: LoadBalancer Services need ports (Cilium
// leaves them out; here Services meant to share take different ports, as
// Cilium's port-less Services share), and loadBalancerClass cannot be set
// on an existing LoadBalancer (the Service gets it with its type).

// on is e with t's failures: subtests share the parent's env.
func (e *env) on(t *testing.T) *env {
	c := *e
	c.t = t
	return &c
}

// only is spec giving addresses to the Services of the namespaces only,
// which match labels as well: each scenario keeps to its namespaces and
// its pools, so several run at once on one env.
func only(spec alloc.LBPoolSpec, labels map[string]string, namespaces ...string) alloc.LBPoolSpec {
	spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: labels, MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: alloc.LabelServiceNamespace, Operator: metav1.LabelSelectorOpIn, Values: namespaces}}}
	return spec
}

// update edits the Service, retrying when the controller's status write
// came in between.
func (e *env) update(ns, name string, edit func(*corev1.Service)) {
	e.t.Helper()
	svcs := e.kube.CoreV1().Services(ns)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := svcs.Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		edit(svc)
		_, err = svcs.Update(e.ctx, svc, metav1.UpdateOptions{})
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) remove(ns, name string) {
	e.t.Helper()
	if err := e.kube.CoreV1().Services(ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) updatePool(name string, spec alloc.LBPoolSpec) {
	e.t.Helper()
	if _, err := e.st.UpdateLBPool(e.ctx, alloc.DefaultSpace, name, nil, spec); err != nil {
		e.t.Fatal(err)
	}
}

// waitUsed waits until pool has n IPv4 addresses out (Cilium's IPsUsed).
func (e *env) waitUsed(pool string, n int64) {
	e.t.Helper()
	var got int64
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		p, err := e.st.GetLBPool(e.ctx, alloc.DefaultSpace, pool)
		if err != nil {
			e.t.Fatal(err)
		}
		if got = p.Status.Families[alloc.IPv4].Used; got == n {
			return
		}
	}
	e.t.Fatalf("pool %s: %d addresses used, want %d", pool, got, n)
}

// shared is a Service of sharing key key (under the deprecated
// annotation Cilium's tests mostly use, when old) serving TCP ports.
func shared(ns, name, key string, old bool, ports ...int32) *corev1.Service {
	svc := service(ns, name, ports...)
	if old {
		svc.Annotations[AnnotationSharingKeyDeprecated] = key
	} else {
		svc.Annotations[AnnotationSharingKey] = key
	}
	return svc
}

// TestCiliumScenarios runs Cilium's Service scenarios side by side on one
// API server and controller, each in its own namespaces with its own
// pools.
func TestCiliumScenarios(t *testing.T) {
	root := newEnv(t)
	sleep := 2 * time.Second // more than a resync: what did not happen by then will not

	for _, sc := range []struct {
		name string
		run  func(e *env)
	}{
		// Two Services of one key share; one that takes another key
		// moves to an address of its own.
		{"SharedServiceUpdatedSharingKey", func(e *env) {
			e.pool("upd-key", only(blocks("10.101.0.0/24"), nil, "upd-key"))
			e.create(shared("upd-key", "a", "key-1", true, 80))
			e.create(shared("upd-key", "b", "key-1", true, 81))
			e.wait("upd-key", "a", "10.101.0.0 satisfied")
			e.wait("upd-key", "b", "10.101.0.0 satisfied")
			e.update("upd-key", "b", func(s *corev1.Service) { s.Annotations[AnnotationSharingKeyDeprecated] = "key-2" })
			e.wait("upd-key", "b", "10.101.0.1 satisfied")
			e.wait("upd-key", "a", "10.101.0.0 satisfied")
		}},
		// A sharer whose port comes to clash with another's moves.
		{"SharedServiceUpdatedPorts", func(e *env) {
			e.pool("upd-ports", only(blocks("10.102.0.0/24"), nil, "upd-ports"))
			e.create(shared("upd-ports", "a", "key-1", true, 80))
			e.create(shared("upd-ports", "b", "key-1", true, 81))
			e.wait("upd-ports", "a", "10.102.0.0 satisfied")
			e.wait("upd-ports", "b", "10.102.0.0 satisfied")
			e.update("upd-ports", "b", func(s *corev1.Service) { s.Spec.Ports[0].Port = 80 })
			e.wait("upd-ports", "b", "10.102.0.1 satisfied")
			e.wait("upd-ports", "a", "10.102.0.0 satisfied")
		}},
		// One port number over TCP and over UDP does not clash.
		{"SharedServiceSamePortWithDifferentProtocols", func(e *env) {
			e.pool("protos", only(blocks("10.103.0.0/24"), nil, "protos"))
			e.create(shared("protos", "tcp", "key-1", true, 80))
			udp := shared("protos", "udp", "key-1", true, 80)
			udp.Spec.Ports[0].Protocol = corev1.ProtocolUDP
			e.create(udp)
			e.wait("protos", "tcp", "10.103.0.0 satisfied")
			e.wait("protos", "udp", "10.103.0.0 satisfied")
		}},
		// The key shares; another key with a clashing port does not; the
		// address goes back with its last holder only, and a new holder
		// of a key joins the key's compatible address.
		{"SharingKey", func(e *env) {
			e.pool("sharing", only(blocks("10.104.0.0/24"), nil, "sharing"))
			e.create(shared("sharing", "a", "key-a", true, 80))
			e.wait("sharing", "a", "10.104.0.0 satisfied")
			e.create(shared("sharing", "b", "key-a", true, 81))
			e.wait("sharing", "b", "10.104.0.0 satisfied")
			e.create(shared("sharing", "c", "key-b", true, 80))
			e.wait("sharing", "c", "10.104.0.1 satisfied")
			e.remove("sharing", "a")
			e.remove("sharing", "b")
			e.waitUsed("sharing", 1)
			// Port 80 of key-b is c's: a new address, .0 free again.
			e.create(shared("sharing", "a", "key-b", true, 80))
			e.wait("sharing", "a", "10.104.0.0 satisfied")
			e.create(shared("sharing", "b", "key-b", true, 81))
			e.wait("sharing", "b", "10.104.0.1 satisfied")
			e.remove("sharing", "c")
			e.waitUsed("sharing", 2) // b still holds .1
			e.wait("sharing", "b", "10.104.0.1 satisfied")
			e.remove("sharing", "b")
			e.waitUsed("sharing", 1)
		}},
		// A sharer deleted and created again shares again.
		{"RegressionSharedKeyReaddBug", func(e *env) {
			e.pool("readd", only(blocks("10.105.0.0/24"), nil, "readd"))
			e.create(shared("readd", "a", "key-a", true, 80))
			e.wait("readd", "a", "10.105.0.0 satisfied")
			e.create(shared("readd", "b", "key-a", true, 81))
			e.wait("readd", "b", "10.105.0.0 satisfied")
			e.remove("readd", "b")
			e.create(shared("readd", "b", "key-a", true, 81))
			e.wait("readd", "b", "10.105.0.0 satisfied")
			e.waitUsed("readd", 1)
		}},
		// Namespaces share a key's address when each admits the other
		// ("*" admits all); a third that admits none gets its own.
		{"SharingCrossNamespace", func(e *env) {
			e.pool("cross", only(blocks("10.106.0.0/24"), nil, "cross-a", "cross-b", "cross-c"))
			a := shared("cross-a", "a", "key-a", true, 80)
			a.Annotations[AnnotationSharingCrossNamespaceDeprecated] = "cross-b"
			e.create(a)
			e.wait("cross-a", "a", "10.106.0.0 satisfied")
			b := shared("cross-b", "b", "key-a", true, 81)
			b.Annotations[AnnotationSharingCrossNamespaceDeprecated] = "*"
			e.create(b)
			e.wait("cross-b", "b", "10.106.0.0 satisfied")
			e.create(shared("cross-c", "c", "key-a", true, 82))
			e.wait("cross-c", "c", "10.106.0.1 satisfied")
		}},
		// spec.loadBalancerIP and io.cilium/lb-ipam-ips together; an
		// address another Service holds is already_allocated.
		{"RequestIPs", func(e *env) {
			e.pool("requested", only(blocks("10.107.0.0/24"), nil, "requested"))
			a := service("requested", "a")
			a.Spec.LoadBalancerIP = "10.107.0.20"
			e.create(a)
			e.wait("requested", "a", "10.107.0.20 satisfied")
			b := service("requested", "b")
			b.Annotations[AnnotationIPsDeprecated] = "10.107.0.22,10.107.0.23"
			b.Spec.LoadBalancerIP = "10.107.0.21"
			e.create(b)
			e.wait("requested", "b", "10.107.0.21,10.107.0.22,10.107.0.23 satisfied")
			c := service("requested", "c")
			c.Spec.LoadBalancerIP = "10.107.0.21"
			e.create(c)
			e.wait("requested", "c", " "+alloc.ReasonAlreadyAllocated)
		}},
		// A Service naming another address under another key leaves the
		// first key's address and shares the second's.
		{"SharedServicesUpdateSharingKeyAndRequestedIP", func(e *env) {
			e.pool("keyip", only(blocks("10.108.0.0/24"), nil, "keyip"))
			named := func(name, key, ip string, port int32) {
				svc := shared("keyip", name, key, false, port)
				svc.Annotations[AnnotationIPs] = ip
				e.create(svc)
			}
			named("a", "key-1", "10.108.0.22", 80)
			named("b", "key-2", "10.108.0.33", 81)
			named("c", "key-2", "10.108.0.33", 82)
			e.wait("keyip", "a", "10.108.0.22 satisfied")
			e.wait("keyip", "b", "10.108.0.33 satisfied")
			e.wait("keyip", "c", "10.108.0.33 satisfied")
			e.update("keyip", "c", func(s *corev1.Service) {
				s.Annotations[AnnotationIPs], s.Annotations[AnnotationSharingKey] = "10.108.0.22", "key-1"
			})
			e.wait("keyip", "c", "10.108.0.22 satisfied")
			e.wait("keyip", "a", "10.108.0.22 satisfied")
			e.wait("keyip", "b", "10.108.0.33 satisfied")
		}},
		// A Service of the key naming no address joins the named one.
		{"SharedSpecificIPThenGenericService", func(e *env) {
			e.pool("specific", only(blocks("10.109.0.0/24"), nil, "specific"))
			a := shared("specific", "a", "key-1", false, 80)
			a.Annotations[AnnotationIPs] = "10.109.0.22"
			e.create(a)
			e.wait("specific", "a", "10.109.0.22 satisfied")
			e.create(shared("specific", "b", "key-1", false, 81))
			e.wait("specific", "b", "10.109.0.22 satisfied")
		}},
		// Four of one key, two pairs of clashing ports: two addresses.
		{"SharingClusters", func(e *env) {
			e.pool("clusters", only(blocks("10.110.0.0/24"), nil, "clusters"))
			for i, want := range []string{"10.110.0.0", "10.110.0.0", "10.110.0.1", "10.110.0.1"} {
				name := string(rune('a' + i))
				e.create(shared("clusters", name, "key-1", true, int32(80+i%2)))
				e.wait("clusters", name, want+" satisfied")
			}
			e.waitUsed("clusters", 2)
		}},
		// allowFirstLastIPs: Yes gives a /30's first address by name.
		{"AllowFirstLastIPs", func(e *env) {
			e.pool("first-yes", only(blocks("10.111.0.16/30"), nil, "first-yes"))
			a := service("first-yes", "a")
			a.Spec.LoadBalancerIP = "10.111.0.16"
			e.create(a)
			e.wait("first-yes", "a", "10.111.0.16 satisfied")
		}},
		// allowFirstLastIPs: No keeps it, as allocated; the pool edited to
		// Yes gives it to the waiting Service.
		{"UpdateAllowFirstAndLastIPs", func(e *env) {
			spec := only(blocks("10.112.0.16/30"), nil, "first-no")
			spec.ReserveFirstLast = true
			e.pool("first-no", spec)
			a := service("first-no", "a")
			a.Spec.LoadBalancerIP = "10.112.0.16"
			e.create(a)
			e.wait("first-no", "a", " "+alloc.ReasonAlreadyAllocated)
			spec.ReserveFirstLast = false
			e.updatePool("first-no", spec)
			e.wait("first-no", "a", "10.112.0.16 satisfied")
		}},
		// A pool of one namespace; a Service elsewhere wearing the
		// namespace's label is not selected.
		{"PoolSelectorNamespace", func(e *env) {
			spec := blocks("10.113.0.0/24")
			spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{alloc.LabelServiceNamespace: "tenant-one"}}
			e.pool("tenant-one", spec)
			e.create(service("tenant-one", "red"))
			e.wait("tenant-one", "red", "10.113.0.0 satisfied")
			blue := service("tenant-two", "blue")
			blue.Labels[alloc.LabelServiceNamespace] = "tenant-one"
			e.create(blue)
			e.wait("tenant-two", "blue", " "+alloc.ReasonNoPool)
		}},
		// A ClusterIP is left alone; as a LoadBalancer it is served; as a
		// NodePort its address and condition go.
		{"ChangeServiceType", func(e *env) {
			e.pool("types", only(blocks("10.114.0.0/24"), nil, "types"))
			svc := service("types", "a")
			svc.Spec.Type = corev1.ServiceTypeClusterIP
			e.create(svc)
			time.Sleep(sleep)
			e.wait("types", "a", " -")
			e.update("types", "a", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer })
			e.wait("types", "a", "10.114.0.0 satisfied")
			e.update("types", "a", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort })
			e.wait("types", "a", " -")
			e.waitUsed("types", 0)
		}},
		// An address no longer named goes back; the others stay.
		{"RemoveRequestedIP", func(e *env) {
			e.pool("unrequest", only(blocks("10.115.0.0/24"), nil, "unrequest"))
			svc := service("unrequest", "a")
			svc.Annotations[AnnotationIPsDeprecated] = "10.115.0.124,10.115.0.125"
			svc.Spec.LoadBalancerIP = "10.115.0.123"
			e.create(svc)
			e.wait("unrequest", "a", "10.115.0.123,10.115.0.124,10.115.0.125 satisfied")
			e.update("unrequest", "a", func(s *corev1.Service) { s.Annotations[AnnotationIPsDeprecated] = "10.115.0.124" })
			e.wait("unrequest", "a", "10.115.0.123,10.115.0.124 satisfied")
			e.waitUsed("unrequest", 2)
		}},
		// A named address no pool has waits (no_pool) until a pool with
		// it is created.
		{"AddPool", func(e *env) {
			e.pool("addpool-a", only(blocks("10.116.0.0/24"), nil, "addpool"))
			svc := service("addpool", "a")
			svc.Spec.LoadBalancerIP = "10.116.1.10"
			e.create(svc)
			e.wait("addpool", "a", " "+alloc.ReasonNoPool)
			e.pool("addpool-b", only(blocks("10.116.1.0/24"), nil, "addpool"))
			e.wait("addpool", "a", "10.116.1.10 satisfied")
		}},
		// ... or until a pool takes a block with it.
		{"AddRange", func(e *env) {
			spec := only(blocks("10.117.0.0/24"), nil, "addrange")
			e.pool("addrange", spec)
			svc := service("addrange", "a")
			svc.Spec.LoadBalancerIP = "10.117.1.10"
			e.create(svc)
			e.wait("addrange", "a", " "+alloc.ReasonNoPool)
			spec.Blocks = append(spec.Blocks, alloc.LBBlock{CIDR: netip.MustParsePrefix("10.117.1.0/24")})
			e.updatePool("addrange", spec)
			e.wait("addrange", "a", "10.117.1.10 satisfied")
		}},
		// A pool widened, then narrowed back with its selector widened:
		// the Service it gave to keeps its address, the one it now
		// selects is served.
		{"PoolUpdate", func(e *env) {
			spec := only(blocks("10.118.0.0/24"), map[string]string{"color": "blue"}, "poolupdate")
			e.pool("poolupdate", spec)
			blue, red := service("poolupdate", "blue"), service("poolupdate", "red")
			blue.Labels["color"], red.Labels["color"] = "blue", "red"
			e.create(blue)
			e.create(red)
			e.wait("poolupdate", "blue", "10.118.0.0 satisfied")
			e.wait("poolupdate", "red", " "+alloc.ReasonNoPool)
			spec.Blocks[0].CIDR = netip.MustParsePrefix("10.118.0.0/23")
			e.updatePool("poolupdate", spec)
			time.Sleep(sleep)
			e.wait("poolupdate", "blue", "10.118.0.0 satisfied")
			e.wait("poolupdate", "red", " "+alloc.ReasonNoPool)
			spec.Blocks[0].CIDR = netip.MustParsePrefix("10.118.0.0/24")
			spec.ServiceSelector.MatchLabels = nil
			spec.ServiceSelector.MatchExpressions = append(spec.ServiceSelector.MatchExpressions,
				metav1.LabelSelectorRequirement{Key: "color", Operator: metav1.LabelSelectorOpIn, Values: []string{"red", "blue"}})
			e.updatePool("poolupdate", spec)
			e.wait("poolupdate", "red", "10.118.0.1 satisfied")
			e.wait("poolupdate", "blue", "10.118.0.0 satisfied")
		}},
		// A full pool widened serves the waiting Services and moves none.
		{"PoolExtendWithPendingServices", func(e *env) {
			spec := only(blocks("10.119.0.0/31"), nil, "extend")
			e.pool("extend", spec)
			e.create(service("extend", "a"))
			e.wait("extend", "a", "10.119.0.0 satisfied")
			e.create(service("extend", "b"))
			e.wait("extend", "b", "10.119.0.1 satisfied")
			e.create(service("extend", "c"))
			e.create(service("extend", "d"))
			e.wait("extend", "c", " "+alloc.ReasonOutOfIPs)
			e.wait("extend", "d", " "+alloc.ReasonOutOfIPs)
			spec.Blocks[0].CIDR = netip.MustParsePrefix("10.119.0.0/29")
			e.updatePool("extend", spec)
			next := func(got string) bool { return got == "10.119.0.2 satisfied" || got == "10.119.0.3 satisfied" }
			if c, d := e.waitFor("extend", "c", ".2 or .3", next), e.waitFor("extend", "d", ".2 or .3", next); c == d {
				e.t.Fatalf("c and d both %s", c)
			}
			e.wait("extend", "a", "10.119.0.0 satisfied")
			e.wait("extend", "b", "10.119.0.1 satisfied")
		}},
		// Not one of Cilium's tests, but its handleUpsertService: the
		// ingress keeps the addresses already listed in their order and
		// appends new ones as they are given, spec.loadBalancerIP first,
		// then lbipam.cilium.io/ips in its order.
		{"IngressOrder", func(e *env) {
			e.pool("order", only(blocks("10.121.0.0/24"), nil, "order"))
			svc := service("order", "a")
			svc.Spec.LoadBalancerIP = "10.121.0.50"
			svc.Annotations[AnnotationIPs] = "10.121.0.40,10.121.0.30"
			e.create(svc)
			e.wait("order", "a", "10.121.0.50,10.121.0.40,10.121.0.30 satisfied")
			e.update("order", "a", func(s *corev1.Service) { s.Annotations[AnnotationIPs] = "10.121.0.20,10.121.0.30" })
			e.wait("order", "a", "10.121.0.50,10.121.0.30,10.121.0.20 satisfied")
		}},
		// Deliberately not Cilium's outcome (cilium/cilium#40358): a pool
		// edit never moves an address. Cilium strips the Service its
		// pool's selector no longer selects; here it keeps the address,
		// reported stranded, until it is moved by hand.
		{"ChangePoolSelector", func(e *env) {
			spec := only(blocks("10.120.0.0/24"), map[string]string{"color": "red"}, "selector-edit")
			e.pool("selector-edit", spec)
			svc := service("selector-edit", "a")
			svc.Labels["color"] = "red"
			e.create(svc)
			e.wait("selector-edit", "a", "10.120.0.0 satisfied")
			spec.ServiceSelector.MatchLabels = map[string]string{"color": "green"}
			e.updatePool("selector-edit", spec)
			e.wait("selector-edit", "a", "10.120.0.0 "+alloc.ReasonStranded)
		}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.run(root.on(t))
		})
	}
}

// TestCiliumStartAndRestart ports Cilium's scenarios of a controller
// starting on Services that already have addresses, of one that serves
// only named classes, and of a restart on a full pool, on one API
// server: the Services are there before any controller starts.
func TestCiliumStartAndRestart(t *testing.T) {
	e := newIdleEnv(t)
	e.pool("init", only(blocks("10.130.0.0/24"), nil, "init"))
	e.pool("full", only(blocks("10.131.0.0/29"), nil, "full"))
	e.pool("classes", only(blocks("10.132.0.0/24"), nil, "classes"))
	// TestAllocOnInit: an address of a matching pool in the status is
	// kept, as is a named one.
	single := corev1.IPFamilyPolicySingleStack
	kept := service("init", "kept")
	kept.Spec.IPFamilyPolicy = &single
	e.createWithStatus(kept, "10.130.0.123")
	named := service("init", "named")
	named.Spec.LoadBalancerIP = "10.130.0.124"
	e.createWithStatus(named, "10.130.0.124")
	// TestReallocOnInit: an address no pool has is replaced by the first
	// free one.
	stray := service("init", "stray")
	stray.Spec.IPFamilyPolicy = &single
	e.createWithStatus(stray, "192.168.1.12")
	// TestAllocSharedOnInitPreservesExistingSharedIP: two of one key on
	// one port hold two addresses; a third of the key stays on the one
	// its status has, beside its holder, rather than joining the other.
	e.createWithStatus(shared("init", "sa", "key-1", false, 80), "10.130.0.60")
	e.createWithStatus(shared("init", "sb", "key-1", false, 80), "10.130.0.61")
	e.createWithStatus(shared("init", "sc", "key-1", false, 81, 82), "10.130.0.61")

	// TestRequiredLBClass (and the default IPAM none): a controller
	// serving only the BGP class leaves Services without a class alone,
	// those above included, and serves one that becomes a LoadBalancer of
	// the class. It has IPv6 alone enabled, which changes nothing for
	// these single-stack IPv4 Services (ipFamilies[0] is asked, enabled
	// or not); a PreferDualStack Service listing IPv4 alone asks nothing
	// then, and Cilium gives it nothing and writes no condition
	// (TestLBIPAM_serviceIPFamilyRequest's "PreferDual, IPv4 family,
	// IPv6" case, end to end).
	e.configure = func(c *Config) { c.DefaultIPAM, c.Classes, c.IPv4 = DefaultNone, []string{ClassBGP}, false }
	stop := e.controller("classes-only")
	e.create(service("classes", "plain"))
	bgp := ClassBGP
	classed := service("classes", "classed")
	classed.Spec.LoadBalancerClass = &bgp
	e.create(classed)
	e.wait("classes", "classed", "10.132.0.0 satisfied")
	later := service("classes", "later")
	later.Spec.Type = corev1.ServiceTypeClusterIP
	e.create(later)
	e.update("classes", "later", func(s *corev1.Service) {
		s.Spec.Type, s.Spec.LoadBalancerClass = corev1.ServiceTypeLoadBalancer, &bgp
	})
	e.wait("classes", "later", "10.132.0.1 satisfied")
	prefer := service("classes", "prefer")
	prefer.Spec.LoadBalancerClass = &bgp
	preferDual := corev1.IPFamilyPolicyPreferDualStack
	prefer.Spec.IPFamilyPolicy = &preferDual
	e.create(prefer)
	time.Sleep(2 * time.Second) // more than a resync
	e.wait("classes", "plain", " -")
	e.wait("classes", "prefer", " -")
	e.wait("init", "kept", "10.130.0.123 -")
	e.wait("init", "sc", "10.130.0.61 -")
	stop()

	e.configure = nil
	stop = e.controller("a")
	e.wait("init", "kept", "10.130.0.123 satisfied")
	e.wait("init", "named", "10.130.0.124 satisfied")
	e.wait("init", "stray", "10.130.0.0 satisfied")
	e.wait("init", "sa", "10.130.0.60 satisfied")
	e.wait("init", "sb", "10.130.0.61 satisfied")
	e.wait("init", "sc", "10.130.0.61 satisfied")

	// TestLBIPAMRestartOnFullPool: 16 Services on a pool of 8, one after
	// the other: the first 8 are served, the others wait; after a
	// restart the same 8 hold the same addresses and the others still
	// wait.
	want := map[string]string{}
	for i := range 16 {
		name := fmt.Sprintf("s%02d", i)
		want[name] = " " + alloc.ReasonOutOfIPs
		if i < 8 {
			want[name] = fmt.Sprintf("10.131.0.%d satisfied", i)
		}
		e.create(service("full", name))
		e.wait("full", name, want[name])
	}
	stop()
	e.controller("b")
	e.create(service("init", "probe")) // served once b leads
	e.wait("init", "probe", "10.130.0.1 satisfied")
	time.Sleep(2 * time.Second) // every Service looked at again
	for _, n := range slices.Sorted(maps.Keys(want)) {
		e.wait("full", n, want[n])
	}
	e.wait("init", "kept", "10.130.0.123 satisfied")
	e.wait("init", "sc", "10.130.0.61 satisfied")
}

// TestServiceIPFamilyRequestAsCilium is every case of Cilium's
// TestLBIPAM_serviceIPFamilyRequest: the families asked for each policy,
// ipFamilies and enabled families. With none enabled (which Config
// refuses) the first listed family is still asked, as in Cilium.
func TestServiceIPFamilyRequestAsCilium(t *testing.T) {
	p := func(x corev1.IPFamilyPolicy) *corev1.IPFamilyPolicy { return &x }
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	for _, c := range []struct {
		name       string
		policy     *corev1.IPFamilyPolicy
		fams       []corev1.IPFamily
		enabled    families
		want4, w6  bool
		requireAll bool
	}{
		{"no policy, no families, IPv4", nil, nil, families{v4: true}, true, false, true},
		{"no policy, no families, IPv6", nil, nil, families{v6: true}, false, true, true},
		{"no policy, no families, both", nil, nil, families{true, true}, true, false, true},
		{"no policy, IPv6 family, IPv4 enabled", nil, []corev1.IPFamily{v6}, families{v4: true}, false, true, true},
		{"no policy, IPv4 family, IPv6 enabled", nil, []corev1.IPFamily{v4}, families{v6: true}, true, false, true},
		{"no policy, IPv4/IPv6 families, none enabled", nil, []corev1.IPFamily{v4, v6}, families{}, true, false, true},
		{"no policy, IPv6/IPv4 families, none enabled", nil, []corev1.IPFamily{v6, v4}, families{}, false, true, true},
		{"SingleStack, no families, both", p(corev1.IPFamilyPolicySingleStack), nil, families{true, true}, true, false, true},
		{"PreferDualStack, no families, both", p(corev1.IPFamilyPolicyPreferDualStack), nil, families{true, true}, true, true, false},
		{"PreferDualStack, IPv4 family, IPv6 enabled", p(corev1.IPFamilyPolicyPreferDualStack), []corev1.IPFamily{v4}, families{v6: true}, false, false, false},
		{"RequireDualStack, IPv4 family, IPv6 enabled", p(corev1.IPFamilyPolicyRequireDualStack), []corev1.IPFamily{v4}, families{v6: true}, false, true, true},
	} {
		got, all := familiesOf(corev1.ServiceSpec{IPFamilyPolicy: c.policy, IPFamilies: c.fams}, c.enabled)
		if slices.Contains(got, alloc.IPv4) != c.want4 || slices.Contains(got, alloc.IPv6) != c.w6 || all != c.requireAll {
			t.Errorf("%s: %v all %v, want IPv4 %v IPv6 %v all %v", c.name, got, all, c.want4, c.w6, c.requireAll)
		}
	}
}

// TestRangeFromPrefixAsCilium is Cilium's TestRangeFromPrefix for the
// CIDRs a pool takes: a block's range runs from its first address to its
// last. (Cilium's "offset prefix", 10.0.0.12/24 read as 10.0.0.0/24, is
// refused here as a CIDR with host bits: see the table.)
func TestRangeFromPrefixAsCilium(t *testing.T) {
	for _, c := range []struct{ prefix, from, to string }{
		{"10.0.0.0/24", "10.0.0.0", "10.0.0.255"},
		{"10.0.0.0/25", "10.0.0.0", "10.0.0.127"},
		{"::/112", "::", "::ffff"},
	} {
		b := alloc.LBBlock{CIDR: netip.MustParsePrefix(c.prefix)}
		if err := (alloc.LBPoolSpec{Blocks: []alloc.LBBlock{b}, AllowSpecialPurpose: true}).Validate(); err != nil {
			t.Errorf("%s: %v", c.prefix, err)
		}
		if r := b.Range(); r.From() != netip.MustParseAddr(c.from) || r.To() != netip.MustParseAddr(c.to) {
			t.Errorf("%s: %s, want %s-%s", c.prefix, r, c.from, c.to)
		}
	}
}

// TestIntersectsAsCilium is Cilium's TestIntersects as pool conflicts:
// two pools whose ranges touch at one address conflict, pools one
// address apart do not, whichever side they lie on.
func TestIntersectsAsCilium(t *testing.T) {
	rng := func(name, from, to string) alloc.LBPoolBlocks {
		return alloc.LBPoolBlocks{Name: name, Blocks: []alloc.LBBlock{{Start: netip.MustParseAddr(from), Stop: netip.MustParseAddr(to)}}}
	}
	for _, c := range []struct {
		name                   string
		from1, to1, from2, to2 string
		overlap                bool
	}{
		{"no overlap right", "10.0.0.0", "10.0.0.10", "10.0.0.11", "10.0.0.20", false},
		{"right edge overlap", "10.0.0.0", "10.0.0.10", "10.0.0.10", "10.0.0.20", true},
		{"right overlap", "10.0.0.0", "10.0.0.10", "10.0.0.5", "10.0.0.20", true},
		{"full overlap", "10.0.0.0", "10.0.0.10", "10.0.0.0", "10.0.0.10", true},
		{"left overlap", "10.0.0.5", "10.0.0.20", "10.0.0.0", "10.0.0.10", true},
		{"left edge overlap", "10.0.0.10", "10.0.0.20", "10.0.0.0", "10.0.0.10", true},
		{"no overlap left", "10.0.0.11", "10.0.0.20", "10.0.0.0", "10.0.0.10", false},
	} {
		marks := alloc.SettleLBConflicts([]alloc.LBPoolBlocks{rng("one", c.from1, c.to1), rng("two", c.from2, c.to2)})
		if marks[0] != "" || (marks[1] != "") != c.overlap {
			t.Errorf("%s: marks %q, want the newer marked: %v", c.name, marks, c.overlap)
		}
		if c.overlap && !strings.Contains(marks[1], `of pool "one"`) {
			t.Errorf("%s: %q does not name the older pool", c.name, marks[1])
		}
	}
}
