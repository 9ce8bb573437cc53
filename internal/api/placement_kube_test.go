// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/kube"
	"github.com/ipam-dev/ipam/internal/kubetest"
)

// The node-certificate rules with Kubernetes (placement.go), against a
// real API server: Pods are created, bound, deleted and recreated as the
// scheduler and the StatefulSet controller do, and the server reads them
// through internal/kube's informers.

// kubePods is the API's Pod source as cmd/server wires it (podMetadata in
// cmd/server/kube.go): internal/kube's informers, adapted.
type kubePods struct{ inf *kube.Informers }

func (p kubePods) Pod(ctx context.Context, namespace, name string, recheck func(alloc.PodPlacement) bool) (PodInfo, error) {
	var stale func(kube.PodInfo) bool
	if recheck != nil {
		stale = func(i kube.PodInfo) bool { return recheck(kubePlacement(i)) }
	}
	info, err := p.inf.Lookup(ctx, namespace, name, stale)
	if errors.Is(err, kube.ErrNotFound) {
		return PodInfo{}, fmt.Errorf("%w: %w", ErrPodNotFound, err)
	} else if err != nil {
		return PodInfo{}, err
	}
	return PodInfo{Pod: alloc.Metadata(info.Pod), Namespace: alloc.Metadata(info.Namespace), Placement: kubePlacement(info)}, nil
}

func kubePlacement(i kube.PodInfo) alloc.PodPlacement {
	return alloc.PodPlacement{Exists: true, UID: i.UID, Node: i.NodeName}
}

// kubeEnv is an API over mutual TLS whose Pod source is a real API
// server's, with an operator and the node certificates of node-a and
// node-b, and a namespace of the test's own holding no Pod yet.
type kubeEnv struct {
	*env
	c            *kubetest.Cluster
	inf          *kube.Informers
	stop         context.CancelFunc // stops the informers: the cache freezes
	ns           string
	op, a, b     caller
	body         func(v any) string
	podsInformed func(names ...string)
}

func newKubeEnv(t *testing.T) *kubeEnv {
	t.Helper()
	c := kubetest.Shared(t)
	ns := strings.Trim(strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(strings.TrimPrefix(t.Name(), "Test"), "-")), "-")
	ns = ns[:min(len(ns), 63)]
	c.CreateNamespace(t, ns, nil, nil)
	inf, err := kube.NewForConfig(c.Config(), kube.Config{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	inf.Start(ctx)
	wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := inf.WaitForSync(wctx); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, nil)
	s := newAuthServer(t, e, Options{PodMetadata: kubePods{inf: inf}})
	k := &kubeEnv{env: e, c: c, inf: inf, stop: stop, ns: ns,
		op:   s.operatorCaller(),
		a:    s.nodeCaller("node-a"),
		b:    s.nodeCaller("node-b"),
		body: func(v any) string { return jsonBody(t, v) },
	}
	k.podsInformed = func(names ...string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for _, n := range names {
			for {
				info, err := inf.Lookup(t.Context(), ns, n, nil)
				if err == nil && info.NodeName != "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("pod %s/%s not in the cache: %v", ns, n, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	if r := k.op.do(t, "POST", "/v1/pools", k.body(pool4("default", 28, "10.0.3.0/24"))); r.status != 201 {
		t.Fatalf("pool: %d %s", r.status, r.body)
	}
	return k
}

// lease is a lease request of container cid for Pod k.ns/pod, with extra
// fields.
func (k *kubeEnv) lease(cid, pod string, extra map[string]any) string {
	b := lease(cid, "eth0", pod)
	b["owner"] = map[string]any{"namespace": k.ns, "name": pod}
	for f, v := range extra {
		b[f] = v
	}
	return k.body(b)
}

// stickyLease is k.lease bound to identity.
func (k *kubeEnv) stickyLease(cid, pod, identity string) string {
	return k.lease(cid, pod, map[string]any{"sticky": map[string]any{"identity": identity}})
}

// leased sends the request as who on node and wants a 201.
func (k *kubeEnv) leased(t *testing.T, who caller, node, body string) ipamv1.Allocation {
	t.Helper()
	res := who.do(t, "POST", "/v1/nodes/"+node+"/leases", body)
	var a ipamv1.Allocation
	if res.status != 201 || json.Unmarshal(res.body, &a) != nil {
		t.Fatalf("%s leases on %s: %d %s", who.name, node, res.status, res.body)
	}
	return a
}

func (k *kubeEnv) release(t *testing.T, who caller, node, cid string) {
	t.Helper()
	if r := who.do(t, "DELETE", "/v1/nodes/"+node+"/attachments/"+cid+"/eth0", ""); r.status != 204 {
		t.Fatalf("%s releases %s: %d %s", who.name, cid, r.status, r.body)
	}
}

// With Kubernetes a node certificate leases only for Pods bound to its
// node: a Pod bound to another node, not scheduled, or absent is a 403 on
// owner, alike, and changes nothing, also when the request carries the
// Pod's metadata itself. Operators are not restricted. A reserve slot's
// lease names no Pod and asks nothing of Kubernetes; its handover to a
// Pod is held to the rule.
func TestNodeLeasesOnlyForPodsOnIt(t *testing.T) {
	k := newKubeEnv(t)
	here := k.c.CreatePod(t, k.ns, "here", "node-a", nil, nil)
	k.c.CreatePod(t, k.ns, "there", "node-b", nil, nil)
	k.c.CreatePod(t, k.ns, "pending", "", nil, nil)
	metadata := map[string]any{"pod": map[string]any{"labels": map[string]string{"app": "x"}}, "namespace": map[string]any{}}

	before := k.snapshot()
	var refusal string
	for _, c := range []struct {
		what, pod string
		extra     map[string]any
	}{
		{"bound to another node", "there", nil},
		{"bound to another node, metadata carried", "there", metadata},
		{"not scheduled", "pending", nil},
		{"absent", "missing", nil},
		{"bound here, but another UID", "here", map[string]any{"owner": map[string]any{"namespace": k.ns, "name": "here", "uid": "not-its-uid"}}},
	} {
		res := k.a.do(t, "POST", "/v1/nodes/node-a/leases", k.lease("x1", c.pod, c.extra))
		p := wantProblem(t, c.what, res, 403, "forbidden", "owner")
		d := strings.ReplaceAll(strings.ReplaceAll(deref(p.Detail, ""), c.pod, "POD"), " (uid not-its-uid)", "")
		switch {
		case refusal == "":
			refusal = d
		case d != refusal:
			t.Errorf("%s: detail %q differs from %q", c.what, d, refusal)
		}
		if strings.Contains(string(res.body), "node-b") {
			t.Errorf("%s: the refusal names node-b: %s", c.what, res.body)
		}
	}
	if after := k.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatal("a refused lease changed the database")
	}

	// Operators act for the cluster; an absent Pod is still a 404 to them.
	k.leased(t, k.op, "node-a", k.lease("o1", "there", nil))
	wantProblem(t, "operator, absent Pod", k.op.do(t, "POST", "/v1/nodes/node-a/leases", k.lease("o2", "missing", nil)), 404, "not-found", "owner")

	// The node's own Pods, by name or with their UID.
	k.leased(t, k.a, "node-a", k.lease("a1", "here", nil))
	k.leased(t, k.a, "node-a", k.lease("a2", "here", map[string]any{"owner": map[string]any{"namespace": k.ns, "name": "here", "uid": string(here.UID)}}))
	// A Pod the scheduler binds to node-a is served at once, whether or
	// not the watch has brought the binding yet.
	k.c.BindPod(t, k.ns, "pending", "node-a")
	k.leased(t, k.a, "node-a", k.lease("a3", "pending", nil))

	// A reserve slot (expire false: active at once) names no Pod...
	reserve := k.body(map[string]any{"owner": map[string]any{"namespace": alloc.ReserveOwnerNamespace, "name": "net"},
		"containerID": "slot-1", "interface": "eth0", "expire": false})
	slot := k.leased(t, k.a, "node-a", reserve)
	// ... and is handed over only to a Pod on the node.
	handOver := func(cid, pod string) response {
		return k.a.do(t, "POST", "/v1/nodes/node-a/leases", k.lease(cid, pod, map[string]any{
			"fromReserve": map[string]any{"containerID": "slot-1", "interface": "eth0", "generation": slot.Generation}}))
	}
	wantProblem(t, "a handover to another node's Pod", handOver("h1", "there"), 403, "forbidden", "owner")
	if r := handOver("h2", "here"); r.status != 201 {
		t.Fatalf("the handover to node-a's Pod: %d %s", r.status, r.body)
	}
}

// With Kubernetes a node takes a sticky identity from another node only
// when the Pod that held it has left that node, and then, while that Pod
// exists, only for that Pod: the StatefulSet's Pod recreated under its
// name on this node. A node leasing for a Pod of its own with another
// workload's identity is refused while that workload is on its node, or
// being recreated; once the Pod is gone for good (a VM whose new launcher
// Pod has a name of its own), a Pod of the node may take it.
func TestStickyTakeoverWithKubernetes(t *testing.T) {
	k := newKubeEnv(t)
	id := "statefulset/" + k.ns + "/web/0"
	k.c.CreatePod(t, k.ns, "web-0", "node-b", nil, nil)
	k.c.CreatePod(t, k.ns, "attacker", "node-a", nil, nil)
	first := k.leased(t, k.b, "node-b", k.stickyLease("b1", "web-0", id))
	addr := first.Addresses[0].Address
	k.release(t, k.b, "node-b", "b1")
	secrets := []string{"node-b", strings.TrimSuffix(addr, "/28"), first.Addresses[0].Block, "b1"}
	leak := func(what, text string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s names %q: %s", what, s, text)
			}
		}
	}
	boundOn := func(what, node string) ipamv1.Lease {
		t.Helper()
		b := k.bindingsOf(id)
		if len(b) != 1 || b[0].Node != node {
			t.Fatalf("%s: bindings %s, want one on %s", what, dump(b), node)
		}
		return b[0]
	}

	// The attacker, while web-0 is still bound to node-b: refused.
	before := k.snapshot()
	res := k.a.do(t, "POST", "/v1/nodes/node-a/leases", k.stickyLease("a1", "attacker", id))
	p := wantProblem(t, "the attacker while web-0 is on node-b", res, 403, "forbidden", "sticky.identity")
	if d := deref(p.Detail, ""); !strings.Contains(d, "still bound to that node") || !strings.Contains(d, "operator") {
		t.Errorf("detail %q", d)
	}
	leak("the refusal", string(res.body))
	// web-0 itself is not node-a's to lease for.
	wantProblem(t, "node-a for web-0 on node-b", k.a.do(t, "POST", "/v1/nodes/node-a/leases", k.stickyLease("a2", "web-0", id)),
		403, "forbidden", "owner")
	if after := k.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatal("a refused takeover changed the database")
	}
	boundOn("after the refusals", "node-b")

	// The StatefulSet controller deletes web-0 and creates it again, not
	// yet scheduled: still web-0's identity.
	k.c.DeletePod(t, k.ns, "web-0")
	k.c.CreatePod(t, k.ns, "web-0", "", nil, nil)
	res = k.a.do(t, "POST", "/v1/nodes/node-a/leases", k.stickyLease("a3", "attacker", id))
	if p := wantProblem(t, "the attacker while web-0 is recreated", res, 403, "forbidden", "sticky.identity"); !strings.Contains(deref(p.Detail, ""), "only it may take") {
		t.Errorf("detail %q", deref(p.Detail, ""))
	}
	leak("the refusal", string(res.body))
	boundOn("after the attacker's second try", "node-b")

	// The scheduler binds the new web-0 to node-a: node-a takes the
	// identity for it, to a fresh address, and learns no more than that it
	// was on another node.
	k.c.BindPod(t, k.ns, "web-0", "node-a")
	moved := k.leased(t, k.a, "node-a", k.stickyLease("a4", "web-0", id))
	s := moved.Addresses[0].Sticky
	if s == nil || deref(s.Reused, true) || deref(s.Reason, "") == "" || moved.Addresses[0].Address == addr {
		t.Fatalf("the move: %s", dump(moved))
	}
	leak("the move's reason", deref(s.Reason, ""))
	boundOn("after the move", "node-a")
	k.release(t, k.a, "node-a", "a4")
	// node-b, whose web-0 is gone, cannot take it back.
	k.c.CreatePod(t, k.ns, "other-b", "node-b", nil, nil)
	wantProblem(t, "node-b takes it back", k.b.do(t, "POST", "/v1/nodes/node-b/leases", k.stickyLease("b2", "other-b", id)),
		403, "forbidden", "sticky.identity")

	// A VM's identity: its launcher Pod on node-b is gone for good, and a
	// new launcher, with another name, runs on node-a.
	vm := "vm/" + k.ns + "/db"
	k.c.CreatePod(t, k.ns, "launcher-1", "node-b", nil, nil)
	k.leased(t, k.b, "node-b", k.stickyLease("b3", "launcher-1", vm))
	k.release(t, k.b, "node-b", "b3")
	k.c.CreatePod(t, k.ns, "launcher-2", "node-a", nil, nil)
	wantProblem(t, "while launcher-1 is on node-b", k.a.do(t, "POST", "/v1/nodes/node-a/leases", k.stickyLease("a5", "launcher-2", vm)),
		403, "forbidden", "sticky.identity")
	k.c.DeletePod(t, k.ns, "launcher-1")
	k.leased(t, k.a, "node-a", k.stickyLease("a5", "launcher-2", vm))
	if b := k.bindingsOf(vm); len(b) != 1 || b[0].Node != "node-a" {
		t.Fatalf("the VM's binding %s", dump(b))
	}
}

// The informers' cache lags the API server. A node asking for a Pod
// recreated on it, which the cache still has on another node, is served
// (the Pod is read again before a refusal), and so is its takeover of the
// Pod's sticky identity, which is decided on the API server's answer, not
// on the cache that still has the Pod on its old node.
func TestNodeLeasesThroughALaggingCache(t *testing.T) {
	k := newKubeEnv(t)
	id := "statefulset/" + k.ns + "/web/0"
	k.c.CreatePod(t, k.ns, "web-0", "node-b", nil, nil)
	k.c.CreatePod(t, k.ns, "web-1", "node-b", nil, nil)
	k.leased(t, k.b, "node-b", k.stickyLease("b1", "web-0", id))
	k.release(t, k.b, "node-b", "b1")
	k.podsInformed("web-0", "web-1")
	// The watch stops: the cache keeps web-0 and web-1 on node-b. The
	// reflectors see their context end at once; the pause only makes sure
	// no event in flight is taken in after it (the check below fails the
	// test rather than let it pass on a cache that moved).
	k.stop()
	time.Sleep(200 * time.Millisecond)
	for _, n := range []string{"web-0", "web-1"} {
		k.c.DeletePod(t, k.ns, n)
		k.c.CreatePod(t, k.ns, n, "node-a", nil, nil)
		if info, err := k.inf.Lookup(t.Context(), k.ns, n, nil); err != nil || info.NodeName != "node-b" {
			t.Fatalf("the cache should still have %s on node-b: %+v %v", n, info, err)
		}
	}
	k.leased(t, k.a, "node-a", k.lease("a1", "web-1", nil))
	moved := k.leased(t, k.a, "node-a", k.stickyLease("a2", "web-0", id))
	if s := moved.Addresses[0].Sticky; s == nil || deref(s.Reused, true) {
		t.Fatalf("the move: %s", dump(moved))
	}
	if b := k.bindingsOf(id); len(b) != 1 || b[0].Node != "node-a" {
		t.Fatalf("bindings %s", dump(b))
	}
}

// Kubernetes out of reach is a 503 naming it, whenever the request needs
// it: a node certificate's always, an operator's when it carries no Pod
// metadata. Nothing is leased meanwhile.
func TestKubernetesUnreachable(t *testing.T) {
	inf, err := kube.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1", Timeout: 2 * time.Second}, kube.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, nil)
	s := newAuthServer(t, e, Options{PodMetadata: kubePods{inf: inf}}) // never started: every lookup is a GET
	op := s.operatorCaller()
	a := s.nodeCaller("node-a")
	if r := op.do(t, "POST", "/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.0.3.0/24"],"maskSize":28}}}`); r.status != 201 {
		t.Fatalf("pool: %d %s", r.status, r.body)
	}
	body := `{"owner":{"namespace":"ns","name":"web-0"},"containerID":"c1","interface":"eth0"}`
	carried := `{"owner":{"namespace":"ns","name":"web-0"},"containerID":"c2","interface":"eth0","pod":{"labels":{"app":"web"}}}`
	before := e.snapshot()
	for _, c := range []struct {
		who  caller
		body string
	}{{a, body}, {a, carried}, {op, body}} {
		res := c.who.do(t, "POST", "/v1/nodes/node-a/leases", c.body)
		p := wantProblem(t, c.who.name, res, 503, "unavailable", "")
		if d := deref(p.Detail, ""); !strings.Contains(d, "Kubernetes is unavailable") {
			t.Errorf("%s: detail %q", c.who.name, d)
		}
	}
	if after := e.snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatal("a request that could not ask Kubernetes changed the database")
	}
	if r := op.do(t, "POST", "/v1/nodes/node-a/leases", carried); r.status != 201 {
		t.Errorf("an operator's request carrying its metadata: %d %s", r.status, r.body)
	}
}

// The Pods the server sees are those of its cluster, whose address space
// is KubeSpace (the server's --cluster-space). A node certificate of
// another space belongs to another cluster: Kubernetes is not asked for
// its Pods (they are not in this one, and every lookup would answer "not
// on this node"), and it is served as by a server without Kubernetes.
func TestPlacementOnlyInTheClusterSpace(t *testing.T) {
	k := newKubeEnv(t)
	k.c.CreatePod(t, k.ns, "there", "node-b", nil, nil)
	s := newAuthServer(t, k.env, Options{PodMetadata: kubePods{inf: k.inf}, KubeSpace: "east"})
	if _, err := k.env.store.CreateSpace(t.Context(), "east"); err != nil {
		t.Fatal(err)
	}
	if res := s.operatorCaller().do(t, "POST", "/v1/pools?space=east", k.body(pool4("default", 28, "10.0.3.0/24"))); res.status != 201 {
		t.Fatalf("the pool of east: %d %s", res.status, res.body)
	}
	east := s.certCaller("node-a")(s.ca.IssueNodeInSpace("east", "node-a", time.Hour))
	other := s.nodeCaller("node-a") // the default space: not this server's cluster

	// In the cluster's space the rule holds: the Pod is on node-b.
	wantProblem(t, "the cluster space", east.do(t, "POST", "/v1/nodes/node-a/leases?space=east", k.lease("e1", "there", nil)), 403, "forbidden", "owner")
	// In another space the server has no Kubernetes: the lease is served.
	if res := other.do(t, "POST", "/v1/nodes/node-a/leases", k.lease("d1", "there", nil)); res.status != 201 {
		t.Fatalf("another space's node, a Pod this cluster has on node-b: %d %s; want 201, as without Kubernetes", res.status, res.body)
	}
}
