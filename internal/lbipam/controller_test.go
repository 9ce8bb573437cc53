// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package lbipam

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cilium/crds"
	"github.com/ipam-dev/ipam/internal/kubetest"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Migrate) }

// The store announces its changes: a signature drifting apart would turn
// the controller's type assertion false and event-driven serving off.
var _ ChangeListener = (*store.Store)(nil)

// env is a real API server, a store on its own database and one
// controller (IPv4 and IPv6 enabled, Services without a class served by
// LB IPAM, Node IPAM on).
type env struct {
	t    *testing.T
	ctx  context.Context
	kc   *kubetest.Cluster
	kube kubernetes.Interface
	st   *store.Store
	// mirror turns the controllers' mirror on (Cilium's LB IPAM CRDs are
	// installed for it).
	mirror bool
	// resync is the controllers' (a second unless set before they
	// start); store, when set, is what they use instead of st.
	resync time.Duration
	store  Store
	// configure, when set, edits the configuration of the controllers
	// started after it is set.
	configure func(*Config)
}

func newEnv(t *testing.T, opts ...kubetest.Option) *env { return start(t, false, false, opts...) }

// newMirrorEnv is newEnv with Cilium's LB IPAM CRDs and the mirror on.
func newMirrorEnv(t *testing.T) *env { return start(t, true, false) }

// newIdleEnv is newEnv with no controller started: the test sets the
// env up, then starts them.
func newIdleEnv(t *testing.T) *env { return start(t, false, true) }

func start(t *testing.T, mirror, noController bool, opts ...kubetest.Option) *env {
	t.Helper()
	kc := kubetest.Start(t, opts...)
	if mirror {
		defs, err := crds.LBIPAM()
		if err != nil {
			t.Fatal(err)
		}
		kc.InstallCRDs(t, defs...)
	}
	st, err := store.Open(t.Context(), pgtest.NewDatabase(t), store.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	kube, err := kubernetes.NewForConfig(kc.Config())
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: t.Context(), kc: kc, kube: kube, st: st, mirror: mirror, resync: time.Second}
	if !noController {
		e.controller("a")
	}
	return e
}

// controller starts a replica until the returned stop is called or the
// test ends.
func (e *env) controller(identity string) (stop func()) {
	e.t.Helper()
	var st Store = e.st
	if e.store != nil {
		st = e.store
	}
	cfg := Config{Kube: e.kc.Config(), NodeIPAM: true, Mirror: e.mirror, IPv4: true, IPv6: true, Resync: e.resync, Workers: 16,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if e.configure != nil {
		e.configure(&cfg)
	}
	c, err := New(cfg, st)
	if err != nil {
		e.t.Fatal(err)
	}
	c.cfg.Election.LeaseNamespace, c.cfg.Election.Identity = "default", identity
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx); err != nil {
			e.t.Errorf("controller: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	e.t.Cleanup(stop)
	return stop
}

func (e *env) pool(name string, spec alloc.LBPoolSpec) {
	e.t.Helper()
	if _, err := e.st.CreateLBPool(e.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: name, Spec: spec}); err != nil {
		e.t.Fatal(err)
	}
}

func blocks(bs ...string) alloc.LBPoolSpec {
	var s alloc.LBPoolSpec
	for _, b := range bs {
		if from, to, ok := strings.Cut(b, "-"); ok {
			s.Blocks = append(s.Blocks, alloc.LBBlock{Start: netip.MustParseAddr(from), Stop: netip.MustParseAddr(to)})
		} else {
			s.Blocks = append(s.Blocks, alloc.LBBlock{CIDR: netip.MustParsePrefix(b)})
		}
	}
	return s
}

// service is a LoadBalancer Service serving TCP ports.
func service(ns, name string, ports ...int32) *corev1.Service {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}, Annotations: map[string]string{}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name}}}
	if len(ports) == 0 {
		ports = []int32{80}
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: fmt.Sprint("p", p), Port: p, Protocol: corev1.ProtocolTCP})
	}
	return svc
}

func (e *env) create(svc *corev1.Service) {
	e.t.Helper()
	if err := e.tryCreate(svc); err != nil {
		e.t.Fatal(err)
	}
}

// createWithStatus creates svc and writes ips as its load balancer
// ingress, as the LB IPAM this one replaces left them.
func (e *env) createWithStatus(svc *corev1.Service, ips ...string) {
	e.t.Helper()
	e.create(svc)
	got, err := e.kube.CoreV1().Services(svc.Namespace).Get(e.ctx, svc.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, ip := range ips {
		got.Status.LoadBalancer.Ingress = append(got.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	if _, err := e.kube.CoreV1().Services(svc.Namespace).UpdateStatus(e.ctx, got, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// tryCreate creates svc, and its namespace when missing; it may run on
// any goroutine.
func (e *env) tryCreate(svc *corev1.Service) error {
	_, err := e.kube.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: svc.Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	_, err = e.kube.CoreV1().Services(svc.Namespace).Create(e.ctx, svc, metav1.CreateOptions{})
	return err
}

// outcome is a Service's ingress addresses and condition, as "addr,addr
// reason" (condition absent: "-").
func outcome(svc *corev1.Service) string {
	var ips []string
	for _, in := range svc.Status.LoadBalancer.Ingress {
		ips = append(ips, in.IP)
	}
	reason := "-"
	if c := meta.FindStatusCondition(svc.Status.Conditions, ConditionSatisfied); c != nil {
		reason = c.Reason
		if (c.Status == metav1.ConditionTrue) != (c.Reason == alloc.ReasonSatisfied) {
			reason += "(status " + string(c.Status) + ")"
		}
	}
	return strings.Join(ips, ",") + " " + reason
}

// wait waits until the Service's outcome is want, or fails the test.
func (e *env) wait(ns, name, want string) {
	e.t.Helper()
	e.waitFor(ns, name, want, func(got string) bool { return got == want })
}

// waitFor waits until ok holds for the Service's outcome, or fails the
// test saying it wanted what.
func (e *env) waitFor(ns, name, what string, ok func(string) bool) string {
	e.t.Helper()
	var got string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		svc, err := e.kube.CoreV1().Services(ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		if got = outcome(svc); ok(got) {
			return got
		}
	}
	e.t.Fatalf("%s/%s: %q, want %s", ns, name, got, what)
	return got
}

// TestLab4 is the seed's Lab 4 against a real API server: a pool with a
// start/stop block and a selector; a matching Service gets an address of
// the block, and the condition says satisfied; a second, overlapping pool
// is conflicting and gives nothing; once the first pool is disabled, a
// new Service gets nothing while the first keeps its address. A Service
// of another class is left alone; a deleted Service's address goes back.
func TestLab4(t *testing.T) {
	e := newEnv(t)
	spec := blocks("10.0.20.100-10.0.20.200")
	spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"color": "blue"}}
	e.pool("blue", spec)
	web := service("shop", "web")
	web.Labels["color"] = "blue"
	e.create(web)
	e.wait("shop", "web", "10.0.20.100 satisfied")
	p, _ := e.st.GetLBPool(e.ctx, alloc.DefaultSpace, "blue")
	if st := p.Status.Families[alloc.IPv4]; st.Used != 1 || st.Available() != 100 {
		t.Fatalf("blue: %+v", st)
	}

	e.pool("red", blocks("10.0.20.150-10.0.20.160"))
	if p, _ := e.st.GetLBPool(e.ctx, alloc.DefaultSpace, "red"); !p.Status.Conflicting() {
		t.Fatalf("red does not conflict: %+v", p.Status)
	}
	other := service("shop", "other")
	e.create(other)
	e.wait("shop", "other", " no_pool")

	spec.Disabled = true
	if _, err := e.st.UpdateLBPool(e.ctx, alloc.DefaultSpace, "blue", nil, spec); err != nil {
		t.Fatal(err)
	}
	late := service("shop", "late")
	late.Labels["color"] = "blue"
	e.create(late)
	e.wait("shop", "late", " no_pool")
	e.wait("shop", "web", "10.0.20.100 satisfied")

	class := "example.com/other-lb"
	foreign := service("shop", "foreign")
	foreign.Spec.LoadBalancerClass = &class
	e.create(foreign)
	time.Sleep(2 * time.Second) // more than a resync
	e.wait("shop", "foreign", " -")

	// A Service that becomes a ClusterIP lets its address go.
	spec.Disabled = false
	if _, err := e.st.UpdateLBPool(e.ctx, alloc.DefaultSpace, "blue", nil, spec); err != nil {
		t.Fatal(err)
	}
	e.wait("shop", "late", "10.0.20.101 satisfied")
	lateSvc, err := e.kube.CoreV1().Services("shop").Get(e.ctx, "late", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lateSvc.Spec.Type = corev1.ServiceTypeClusterIP
	lateSvc.Spec.Ports[0].NodePort = 0
	if _, err := e.kube.CoreV1().Services("shop").Update(e.ctx, lateSvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.wait("shop", "late", " -")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := e.st.GetVIPs(e.ctx, alloc.DefaultSpace, alloc.VIPOwner{Namespace: "shop", Name: "late"}); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ClusterIP Service still holds its VIP")
		}
	}

	if err := e.kube.CoreV1().Services("shop").Delete(e.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if p, _ := e.st.GetLBPool(e.ctx, alloc.DefaultSpace, "blue"); p.Status.Families[alloc.IPv4].Used == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the deleted Service's address is still held")
		}
	}
}

// TestRequestedAndShared: lbipam.cilium.io/ips inside and outside the
// selector and on a first address kept out; the sharing matrix over real
// Services (one key and other ports share, the same port does not, other
// namespaces share only when both admit, Local with other Pods does not).
func TestRequestedAndShared(t *testing.T) {
	e := newEnv(t)
	spec := blocks("10.0.10.0/24")
	spec.ReserveFirstLast = true
	spec.ServiceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: alloc.LabelServiceNamespace, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"outsiders"}}}}
	e.pool("vips", spec)

	named := service("a", "named")
	named.Annotations[AnnotationIPs] = "10.0.10.50"
	e.create(named)
	e.wait("a", "named", "10.0.10.50 satisfied")
	legacy := service("a", "legacy")
	legacy.Spec.LoadBalancerIP = "10.0.10.51"
	e.create(legacy)
	e.wait("a", "legacy", "10.0.10.51 satisfied")
	first := service("a", "first")
	first.Annotations[AnnotationIPs] = "10.0.10.0"
	e.create(first)
	e.wait("a", "first", " already_allocated") // Cilium marks first and last allocated
	out := service("outsiders", "named")
	out.Annotations[AnnotationIPs] = "10.0.10.60"
	e.create(out)
	e.wait("outsiders", "named", " pool_selector_mismatch")
	nowhere := service("a", "nowhere")
	nowhere.Annotations[AnnotationIPs] = "10.99.0.1"
	e.create(nowhere)
	e.wait("a", "nowhere", " no_pool")
	// Entries that are no address are left out, as Cilium does: with a
	// good one the Service gets that, with none any address of a pool.
	partly := service("a", "partly")
	partly.Annotations[AnnotationIPs] = "10.0.10.300,10.0.10.52"
	e.create(partly)
	e.wait("a", "partly", "10.0.10.52 satisfied")
	bad := service("a", "bad")
	bad.Annotations[AnnotationIPs] = "10.0.10.300"
	e.create(bad)
	e.wait("a", "bad", "10.0.10.1 satisfied") // the first free address (.0 is kept out)
	deprecated := service("a", "deprecated")
	deprecated.Annotations[AnnotationIPsDeprecated] = "10.0.10.53"
	e.create(deprecated)
	e.wait("a", "deprecated", "10.0.10.53 satisfied")

	shared := func(ns, name, key string, port int32, cross string) {
		svc := service(ns, name, port)
		svc.Annotations[AnnotationSharingKey] = key
		if cross != "" {
			svc.Annotations[AnnotationSharingCrossNamespace] = cross
		}
		e.create(svc)
	}
	// 10.0.10.2 is the first free address now.
	shared("a", "http", "web", 80, "")
	e.wait("a", "http", "10.0.10.2 satisfied")
	shared("a", "https", "web", 443, "")
	e.wait("a", "https", "10.0.10.2 satisfied")
	shared("a", "http-too", "web", 80, "")
	e.wait("a", "http-too", "10.0.10.3 satisfied")
	shared("b", "admitted", "web", 8080, "a")
	e.wait("b", "admitted", "10.0.10.4 satisfied") // a's Services do not admit b
	shared("c", "one", "cross", 80, "d")
	e.wait("c", "one", "10.0.10.5 satisfied")
	shared("d", "two", "cross", 81, "c")
	e.wait("d", "two", "10.0.10.5 satisfied")
	local := func(name string, pods string, permit bool) {
		svc := service("l", name, int32(len(name)))
		svc.Annotations[AnnotationSharingKey] = "local"
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		svc.Spec.Selector = map[string]string{"app": pods}
		if permit {
			svc.Annotations[AnnotationSharingPermitDifferentP] = "true"
		}
		e.create(svc)
	}
	local("l1", "web", false)
	e.wait("l", "l1", "10.0.10.6 satisfied")
	local("l22", "web", false)
	e.wait("l", "l22", "10.0.10.6 satisfied")
	local("l333", "db", false)
	e.wait("l", "l333", "10.0.10.7 satisfied")
}

// TestFamilies: dual-stack policies with an IPv4 pool only, then with an
// IPv6 pool too.
func TestFamilies(t *testing.T) {
	e := newEnv(t, kubetest.WithAPIServerFlags("--service-cluster-ip-range=10.96.0.0/24,fd00:96::/112"))
	e.pool("v4", blocks("10.0.10.0/24"))
	policy := func(name string, p corev1.IPFamilyPolicy, fams ...corev1.IPFamily) {
		svc := service("f", name)
		svc.Spec.IPFamilyPolicy = &p
		svc.Spec.IPFamilies = fams
		e.create(svc)
	}
	policy("single", corev1.IPFamilyPolicySingleStack)
	e.wait("f", "single", "10.0.10.0 satisfied")
	policy("prefer", corev1.IPFamilyPolicyPreferDualStack)
	e.wait("f", "prefer", "10.0.10.1 satisfied")
	policy("require", corev1.IPFamilyPolicyRequireDualStack)
	e.wait("f", "require", "10.0.10.2 no_pool")
	e.pool("v6", blocks("fd00:10::/120"))
	// The new pool reaches both at the next look, in either order.
	dual := func(v4 string) func(string) bool {
		return func(got string) bool {
			return strings.HasPrefix(got, v4+",fd00:10::") && strings.HasSuffix(got, " satisfied")
		}
	}
	r := e.waitFor("f", "require", "10.0.10.2 and an IPv6 address", dual("10.0.10.2"))
	p := e.waitFor("f", "prefer", "10.0.10.1 and an IPv6 address", dual("10.0.10.1"))
	if r == strings.Replace(p, "10.0.10.1", "10.0.10.2", 1) {
		t.Fatalf("require and prefer share an IPv6 address: %s, %s", r, p)
	}
	e.wait("f", "single", "10.0.10.0 satisfied")
}

// TestPoolEditsNeverMoveServices is cilium/cilium#40358 with real
// Services: 100 Services keep their addresses through pool edits; an edit
// that takes away the block three of them hold strands those three,
// reported on their condition, their addresses kept. A controller that
// takes over from another finds the same state.
func TestPoolEditsNeverMoveServices(t *testing.T) {
	e := newEnv(t)
	spec := blocks("10.0.10.0/25", "10.0.10.128/25")
	e.pool("p", spec)
	var names []string
	for i := range 103 {
		names = append(names, fmt.Sprintf("s%03d", i))
	}
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Go(func() {
			if err := e.tryCreate(service("edits", n)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	before := map[string]string{}
	for _, n := range names {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			svc, err := e.kube.CoreV1().Services("edits").Get(e.ctx, n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if o := outcome(svc); strings.HasSuffix(o, " satisfied") {
				before[n] = o
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never satisfied", n)
			}
		}
	}
	seen := map[string]string{}
	for n, o := range before {
		if other, dup := seen[o]; dup {
			t.Fatalf("%s and %s both hold %s", n, other, o)
		}
		seen[o] = n
	}
	spec.Blocks = append(spec.Blocks, alloc.LBBlock{CIDR: netip.MustParsePrefix("10.0.11.0/24")})
	spec.ServiceSelector = &metav1.LabelSelector{}
	if _, err := e.st.UpdateLBPool(e.ctx, alloc.DefaultSpace, "p", map[string]string{"edited": "yes"}, spec); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // every Service looked at again
	for _, n := range names {
		e.wait("edits", n, before[n])
	}
	// The three highest addresses of the first /25 go: .100 to .127.
	var held []string
	for n, o := range before {
		ip := netip.MustParseAddr(strings.Fields(o)[0])
		if ip.Compare(netip.MustParseAddr("10.0.10.100")) >= 0 && ip.Compare(netip.MustParseAddr("10.0.10.127")) <= 0 {
			held = append(held, n)
		}
	}
	sort.Strings(held)
	if len(held) != 3 {
		t.Fatalf("%d Services in 10.0.10.100-127: %v", len(held), held)
	}
	spec.Blocks = []alloc.LBBlock{{Start: netip.MustParseAddr("10.0.10.0"), Stop: netip.MustParseAddr("10.0.10.99")},
		{CIDR: netip.MustParsePrefix("10.0.10.128/25")}, {CIDR: netip.MustParsePrefix("10.0.11.0/24")}}
	if _, err := e.st.UpdateLBPool(e.ctx, alloc.DefaultSpace, "p", nil, spec); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		want := before[n]
		if strings.Contains(strings.Join(held, ","), n) {
			want = strings.Fields(want)[0] + " " + alloc.ReasonStranded
		}
		e.wait("edits", n, want)
	}
	// Another replica taking over sees the same and moves nothing.
	e.controller("b")
	time.Sleep(2 * time.Second)
	for _, n := range held {
		e.wait("edits", n, strings.Fields(before[n])[0]+" "+alloc.ReasonStranded)
	}
}

// TestOrphansReleased: a Kubernetes owner the store holds whose Service is
// gone (deleted while no replica led) is released by the leader, within a
// resync; an owner of the API is not.
func TestOrphansReleased(t *testing.T) {
	e := newEnv(t)
	e.pool("p", blocks("10.0.10.0/24"))
	if _, err := e.st.AssignVIPs(e.ctx, alloc.VIPRequest{Space: alloc.DefaultSpace, Owner: alloc.VIPOwner{Namespace: "gone", Name: "svc"},
		Families: []alloc.Family{alloc.IPv4}, RequireAll: true, Source: alloc.VIPSourceKubernetes}); err != nil {
		t.Fatal(err)
	}
	// An owner of the API of the same kind of name is not the
	// controller's: it stays.
	if _, err := e.st.AssignVIPs(e.ctx, alloc.VIPRequest{Space: alloc.DefaultSpace, Owner: alloc.VIPOwner{Namespace: "team", Name: "db"},
		Families: []alloc.Family{alloc.IPv4}, RequireAll: true}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		owners, _, err := e.st.ListVIPOwners(e.ctx, alloc.DefaultSpace, alloc.Page{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(owners) == 1 && owners[0].Owner.Name == "db" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orphan is still held: %+v", owners)
		}
	}
}

// TestFinalizerKeepsAddress: a Service being deleted while a finalizer
// holds it keeps its address, in the store and in its status, as under
// Cilium (which lets go only when the object is gone): the load balancer
// in front may still be draining to it. Once the finalizer is removed and
// the Service is gone, the address goes back and another Service gets it.
func TestFinalizerKeepsAddress(t *testing.T) {
	e := newEnv(t)
	e.pool("p", blocks("10.0.10.7/32"))
	held := service("shop", "web")
	held.Finalizers = []string{"example.com/drain"}
	e.create(held)
	e.wait("shop", "web", "10.0.10.7 "+alloc.ReasonSatisfied)
	svcs := e.kube.CoreV1().Services("shop")
	if err := svcs.Delete(e.ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(service("shop", "next"))
	// Several resyncs (1 s here): the terminating Service keeps it.
	time.Sleep(3 * time.Second)
	e.wait("shop", "web", "10.0.10.7 "+alloc.ReasonSatisfied)
	e.waitFor("shop", "next", "no address while web holds the only one", func(got string) bool { return !strings.HasPrefix(got, "10.0.10.7") })
	svc, err := svcs.Get(e.ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.DeletionTimestamp.IsZero() {
		t.Fatal("web is not being deleted")
	}
	svc.Finalizers = nil
	if _, err := svcs.Update(e.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.wait("shop", "next", "10.0.10.7 "+alloc.ReasonSatisfied)
}

// countingStore is the store, counting the controller's requests.
type countingStore struct {
	*store.Store
	assigns atomic.Int64
}

func (s *countingStore) AssignVIPs(ctx context.Context, r alloc.VIPRequest) (alloc.VIPAssignment, error) {
	s.assigns.Add(1)
	return s.Store.AssignVIPs(ctx, r)
}

// TestWaitingServicesServedAtOnce: with a resync of an hour, Services
// waiting for an address are served as soon as the store can serve them,
// as Cilium re-evaluates pending Services on every pool and Service event:
// (within 2 s) an address freed by a deleted Service, a pool widened, a pool created,
// a disabled pool enabled again. The changes go through the store (as the
// REST API of any replica makes them), not through this controller. While
// Services wait and nothing changes, the controller asks the store
// nothing: re-evaluating one announces no change of its own.
func TestWaitingServicesServedAtOnce(t *testing.T) {
	e := newIdleEnv(t)
	counting := &countingStore{Store: e.st}
	e.resync, e.store = time.Hour, counting
	e.controller("a")
	const soon = 2 * time.Second // issue 36's bound
	waitWithin := func(ns, name, want string) {
		t.Helper()
		began := time.Now()
		e.wait(ns, name, want)
		d := time.Since(began)
		if d > soon {
			t.Errorf("%s/%s served after %v", ns, name, d)
		}
		t.Logf("%s/%s served %v after the change", ns, name, d.Round(time.Millisecond))
	}
	e.pool("p", blocks("10.0.10.1/32"))
	e.create(service("w", "first"))
	e.wait("w", "first", "10.0.10.1 satisfied")
	e.create(service("w", "second"))
	e.wait("w", "second", " "+alloc.ReasonOutOfIPs)

	// Idle while second waits: a handful of requests at most (informer
	// events of its own status write), no loop.
	before := counting.assigns.Load()
	time.Sleep(2 * time.Second)
	if n := counting.assigns.Load() - before; n > 3 {
		t.Errorf("%d requests in 2 s with nothing changing", n)
	}

	// An address freed by another Service.
	if err := e.kube.CoreV1().Services("w").Delete(e.ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWithin("w", "second", "10.0.10.1 satisfied")

	// A pool widened.
	e.create(service("w", "third"))
	e.wait("w", "third", " "+alloc.ReasonOutOfIPs)
	if _, err := e.st.UpdateLBPool(e.ctx, alloc.DefaultSpace, "p", nil, blocks("10.0.10.1/32", "10.0.10.2/32")); err != nil {
		t.Fatal(err)
	}
	waitWithin("w", "third", "10.0.10.2 satisfied")

	// A pool created.
	e.create(service("w", "fourth"))
	e.wait("w", "fourth", " "+alloc.ReasonOutOfIPs)
	e.pool("q", blocks("10.0.11.1/32"))
	waitWithin("w", "fourth", "10.0.11.1 satisfied")

	// A disabled pool enabled again.
	disabled := blocks("10.0.12.1/32")
	disabled.Disabled = true
	e.pool("r", disabled)
	e.create(service("w", "fifth"))
	e.wait("w", "fifth", " "+alloc.ReasonOutOfIPs)
	disabled.Disabled = false
	if _, err := e.st.UpdateLBPool(e.ctx, alloc.DefaultSpace, "r", nil, disabled); err != nil {
		t.Fatal(err)
	}
	waitWithin("w", "fifth", "10.0.12.1 satisfied")
}

// TestMigrationKeepsAddresses: Services whose status holds addresses
// written by the LB IPAM this one replaces keep them when a pool gives
// them, as Cilium's stripOrImportIngresses (TestAllocOnInit): one alone,
// two sharing one address by their sharing key, one in a namespace the
// pool does not serve, one whose address no pool has, and one of two
// claiming the same address without a sharing key. The others get new
// addresses as any Service would.
func TestMigrationKeepsAddresses(t *testing.T) {
	e := newIdleEnv(t)
	spec := blocks("10.6.0.0/24")
	spec.ServiceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: alloc.LabelServiceNamespace, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"outsiders"}}}}
	e.pool("p", spec)
	e.pool("o", blocks("10.7.0.0/24")) // the outsiders'
	sharing := func(name string, port int32) *corev1.Service {
		svc := service("shop", name, port)
		svc.Annotations[AnnotationSharingKey] = "front"
		return svc
	}
	e.createWithStatus(service("shop", "alone"), "10.6.0.123")
	e.createWithStatus(sharing("http", 80), "10.6.0.200")
	e.createWithStatus(sharing("https", 443), "10.6.0.200")
	e.createWithStatus(service("outsiders", "elsewhere"), "10.6.0.50")
	e.createWithStatus(service("shop", "nowhere"), "10.99.0.1")
	e.createWithStatus(service("shop", "claim-a"), "10.6.0.77")
	e.createWithStatus(service("shop", "claim-b"), "10.6.0.77")
	e.controller("a")

	e.wait("shop", "alone", "10.6.0.123 satisfied")
	e.wait("shop", "http", "10.6.0.200 satisfied")
	e.wait("shop", "https", "10.6.0.200 satisfied")
	e.waitFor("outsiders", "elsewhere", "an address of its own pool", func(got string) bool { return strings.HasPrefix(got, "10.7.0.") })
	e.waitFor("shop", "nowhere", "an address of the pool", func(got string) bool { return strings.HasPrefix(got, "10.6.0.") })
	a := e.waitFor("shop", "claim-a", "an address", func(got string) bool { return strings.HasPrefix(got, "10.6.0.") })
	b := e.waitFor("shop", "claim-b", "an address", func(got string) bool { return strings.HasPrefix(got, "10.6.0.") })
	if (a == "10.6.0.77 satisfied") == (b == "10.6.0.77 satisfied") {
		t.Errorf("claim-a %q, claim-b %q: want exactly one to keep 10.6.0.77", a, b)
	}
}

// TestRelabelMovesService is Cilium's TestRemoveServiceLabel on a real
// API server: a Service relabelled out of its pool's selector moves to
// the pool that now selects it, and without a label any pool selects it
// is left without an address (no_pool).
func TestRelabelMovesService(t *testing.T) {
	e := newEnv(t)
	colored := func(color, cidr string) alloc.LBPoolSpec {
		s := blocks(cidr)
		s.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"color": color}}
		return s
	}
	e.pool("blue", colored("blue", "10.0.10.0/24"))
	e.pool("red", colored("red", "10.0.20.0/24"))
	svc := service("shop", "web")
	svc.Labels["color"] = "blue"
	e.create(svc)
	e.wait("shop", "web", "10.0.10.0 satisfied")
	relabel := func(color string) {
		t.Helper()
		got, err := e.kube.CoreV1().Services("shop").Get(e.ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Labels["color"] = color
		if _, err := e.kube.CoreV1().Services("shop").Update(e.ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel("red")
	e.wait("shop", "web", "10.0.20.0 satisfied")
	relabel("none")
	e.wait("shop", "web", " "+alloc.ReasonNoPool)
}

// node creates a Node with addresses ("InternalIP=10.1.0.1") and labels.
func (e *env) node(name string, labels map[string]string, addrs ...string) *corev1.Node {
	e.t.Helper()
	n, err := e.kube.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, a := range addrs {
		typ, ip, _ := strings.Cut(a, "=")
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeAddressType(typ), Address: ip})
	}
	if n, err = e.kube.CoreV1().Nodes().UpdateStatus(e.ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestLab6 is the seed's Lab 6, Node IPAM: a Service of class
// io.cilium/node lists the nodes' InternalIPs (kind nodes have no
// ExternalIP); a node labelled exclude-from-external-load-balancers, or
// tainted for deletion by the autoscaler, drops out; match-node-labels
// restricts the nodes; ExternalIPs win per family; with
// externalTrafficPolicy Local only nodes with a ready endpoint count.
func TestLab6(t *testing.T) {
	e := newEnv(t, kubetest.WithAPIServerFlags("--service-cluster-ip-range=10.96.0.0/24,fd00:96::/112"))
	e.node("node-a", map[string]string{"zone": "a"}, "InternalIP=10.1.0.1", "InternalIP=fd01::1")
	b := e.node("node-b", map[string]string{"zone": "b"}, "InternalIP=10.1.0.2", "Hostname=node-b")
	class := ClassNode
	svc := service("web", "nodes")
	svc.Spec.LoadBalancerClass = &class
	e.create(svc)
	e.wait("web", "nodes", "10.1.0.1,10.1.0.2 -")
	// No VIP was taken for it.
	if _, err := e.st.GetVIPs(e.ctx, alloc.DefaultSpace, alloc.VIPOwner{Namespace: "web", Name: "nodes"}); err == nil {
		t.Fatal("a Node IPAM Service holds a VIP")
	}

	b.Labels[corev1.LabelNodeExcludeBalancers] = ""
	if _, err := e.kube.CoreV1().Nodes().Update(e.ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.wait("web", "nodes", "10.1.0.1 -")
	b, _ = e.kube.CoreV1().Nodes().Get(e.ctx, "node-b", metav1.GetOptions{})
	delete(b.Labels, corev1.LabelNodeExcludeBalancers)
	b.Spec.Taints = []corev1.Taint{{Key: TaintToBeDeleted, Effect: corev1.TaintEffectNoSchedule}}
	if _, err := e.kube.CoreV1().Nodes().Update(e.ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.wait("web", "nodes", "10.1.0.1 -")
	b, _ = e.kube.CoreV1().Nodes().Get(e.ctx, "node-b", metav1.GetOptions{})
	b.Spec.Taints = nil
	if _, err := e.kube.CoreV1().Nodes().Update(e.ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.wait("web", "nodes", "10.1.0.1,10.1.0.2 -")

	zoned := service("web", "zone-b")
	zoned.Spec.LoadBalancerClass = &class
	zoned.Annotations[AnnotationMatchNodeLabels] = "zone=b"
	e.create(zoned)
	e.wait("web", "zone-b", "10.1.0.2 -")

	dual := service("web", "dual")
	dual.Spec.LoadBalancerClass = &class
	pol := corev1.IPFamilyPolicyRequireDualStack
	dual.Spec.IPFamilyPolicy = &pol
	e.create(dual)
	e.wait("web", "dual", "10.1.0.1,10.1.0.2,fd01::1 -")
	e.node("node-c", nil, "InternalIP=10.1.0.3", "ExternalIP=203.0.113.3")
	e.wait("web", "dual", "203.0.113.3,fd01::1 -")

	local := service("web", "local")
	local.Spec.LoadBalancerClass = &class
	local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	e.create(local)
	e.wait("web", "local", " -")
	ready, notReady, nodeA, nodeB := true, false, "node-a", "node-b"
	if _, err := e.kube.DiscoveryV1().EndpointSlices("web").Create(e.ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "local-1", Labels: map[string]string{discoveryv1.LabelServiceName: "local"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.0.5"}, NodeName: &nodeA, Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
			{Addresses: []string{"10.244.1.5"}, NodeName: &nodeB, Conditions: discoveryv1.EndpointConditions{Ready: &notReady}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.wait("web", "local", "10.1.0.1 -")
}

// TestMirror: VIP pools become CiliumLoadBalancerIPPool objects with
// Cilium's conditions (a conflicting pool says so, counts follow the
// Services), CIDR groups CiliumCIDRGroup objects; what is gone from the
// store goes from the cluster. (Objects the mirror did not make:
// mirror_test.go.)
func TestMirror(t *testing.T) {
	e := newMirrorEnv(t)
	cs, err := ciliumclient.NewForConfig(e.kc.Config())
	if err != nil {
		t.Fatal(err)
	}
	pools, groups := cs.CiliumV2().CiliumLoadBalancerIPPools(), cs.CiliumV2().CiliumCIDRGroups()
	spec := blocks("10.0.20.100-10.0.20.200", "10.0.10.0/24")
	spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"color": "blue"}}
	spec.ReserveFirstLast = true
	e.pool("blue", spec)
	e.pool("red", blocks("10.0.20.150/31"))
	if _, err := e.st.CreateCIDRGroup(e.ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "corp", Labels: map[string]string{"tier": "internal"},
		CIDRs: []netip.Prefix{netip.MustParsePrefix("10.30.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	web := service("shop", "web")
	web.Labels["color"] = "blue"
	e.create(web)
	e.wait("shop", "web", "10.0.20.100 satisfied")

	cond := func(name, typ string) string {
		p, err := pools.Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		c := meta.FindStatusCondition(p.Status.Conditions, typ)
		if c == nil {
			return "none"
		}
		return string(c.Status) + " " + c.Reason + " " + c.Message
	}
	eventually := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("never: %s", what)
			}
		}
	}
	eventually("blue's counts", func() bool {
		return cond("blue", ConditionIPsUsed) == "Unknown noreason 1" && cond("blue", ConditionIPsTotal) == "Unknown noreason 355" &&
			cond("blue", ConditionIPsAvailable) == "Unknown noreason 354" && cond("blue", ConditionPoolConflict) == "False resolved "
	})
	eventually("red conflicting", func() bool {
		return strings.HasPrefix(cond("red", ConditionPoolConflict), `True cidr_overlap block 10.0.20.150/31 overlaps block 10.0.20.100-10.0.20.200 of pool "blue"`)
	})
	blue, err := pools.Get(e.ctx, "blue", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if blue.Spec.AllowFirstLastIPs != ciliumv2.AllowFirstLastIPNo || len(blue.Spec.Blocks) != 2 || blue.Spec.Blocks[0].Start != "10.0.20.100" ||
		blue.Spec.Blocks[1].Cidr != "10.0.10.0/24" || blue.Spec.ServiceSelector.MatchLabels["color"] != "blue" || blue.Labels[LabelManagedBy] != ManagedBy {
		t.Fatalf("blue mirrored as %+v", blue)
	}
	eventually("the CIDR group", func() bool {
		g, err := groups.Get(e.ctx, "corp", metav1.GetOptions{})
		return err == nil && len(g.Spec.ExternalCIDRs) == 1 && g.Spec.ExternalCIDRs[0] == "10.30.0.0/16" && g.Labels["tier"] == "internal"
	})
	if _, err := e.st.DeleteLBPool(e.ctx, alloc.DefaultSpace, "red"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.DeleteCIDRGroup(e.ctx, alloc.DefaultSpace, "corp"); err != nil {
		t.Fatal(err)
	}
	eventually("red and corp gone", func() bool {
		_, perr := pools.Get(e.ctx, "red", metav1.GetOptions{})
		_, gerr := groups.Get(e.ctx, "corp", metav1.GetOptions{})
		return apierrors.IsNotFound(perr) && apierrors.IsNotFound(gerr)
	})
}
