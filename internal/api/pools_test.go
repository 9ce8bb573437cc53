// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

// Pool semantics through the HTTP API against PostgreSQL, checked against
// Cilium's behaviour (multi-pool selection, cluster-pool, Kubernetes host
// scope, safe pool updates, reserved ranges) and the labs of the reference
// text: every refusal is checked for its status, problem type and field, and
// for leaving the database exactly as it was.

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// The keys Cilium reads (pkg/annotation/k8s.go), spelled out rather than
// taken from package alloc, so a renamed constant cannot hide a changed wire
// contract.
const (
	plAnnIPPool         = "ipam.cilium.io/ip-pool"
	plAnnIPv4Pool       = "ipam.cilium.io/ipv4-pool"
	plAnnIPv6Pool       = "ipam.cilium.io/ipv6-pool"
	plAnnRequireMatch   = "ipam.cilium.io/require-pool-match"
	plLabelPodNamespace = "io.kubernetes.pod.namespace"
)

// plKV builds a string map from key, value pairs.
func plKV(pairs ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(pairs); i += 2 {
		m[pairs[i]] = pairs[i+1]
	}
	return m
}

// plMeta is an ObjectMetadata body (a Pod's or a namespace's).
func plMeta(labels, annotations map[string]string) map[string]any {
	m := map[string]any{}
	if labels != nil {
		m["labels"] = labels
	}
	if annotations != nil {
		m["annotations"] = annotations
	}
	return m
}

// plFam is a PoolFamilySpec body.
func plFam(mask int, cidrs ...string) map[string]any {
	return map[string]any{"cidrs": cidrs, "maskSize": mask}
}

// plLease is a LeaseRequest body for Pod ns/pod on eth0; extra fields
// (pool, pools, pod, namespace, families, ...) are merged in.
func plLease(containerID, ns, pod string, extra map[string]any) map[string]any {
	b := map[string]any{
		"owner":       map[string]any{"namespace": ns, "name": pod},
		"containerID": containerID,
		"interface":   "eth0",
	}
	maps.Copy(b, extra)
	return b
}

// plProblem checks a refusal: status, problem type, field ("" means the
// problem names none) and a non-empty detail.
func plProblem(t *testing.T, res response, status int, kind, field string) ipamv1.Problem {
	t.Helper()
	if res.status != status {
		t.Errorf("status %d, want %d: %s", res.status, status, res.body)
	}
	p := res.problem(t)
	if want := "urn:ipam:problem:" + kind; p.Type != want {
		t.Errorf("type %q, want %q: %s", p.Type, want, res.body)
	}
	if got := deref(p.Field, ""); got != field {
		t.Errorf("field %q, want %q: %s", got, field, res.body)
	}
	if deref(p.Detail, "") == "" {
		t.Errorf("problem without detail: %s", res.body)
	}
	return p
}

// plUnchanged fails the test when a table differs from the snapshot.
func (e *env) plUnchanged(before snapshot) {
	e.t.Helper()
	after := e.snapshot()
	for _, tbl := range tables {
		if before[tbl] != after[tbl] {
			e.t.Errorf("table %s changed: %s -> %s", tbl, before[tbl], after[tbl])
		}
	}
}

// plRefuse sends a request that must be refused with the given status,
// kind and field, and must leave the database unchanged.
func (e *env) plRefuse(method, path string, body any, status int, kind, field string) ipamv1.Problem {
	e.t.Helper()
	before := e.snapshot()
	res := e.do(method, path, body)
	p := plProblem(e.t, res, status, kind, field)
	e.plUnchanged(before)
	return p
}

// plDetail checks that the problem's detail contains every fragment.
func plDetail(t *testing.T, p ipamv1.Problem, fragments ...string) {
	t.Helper()
	for _, f := range fragments {
		if !strings.Contains(deref(p.Detail, ""), f) {
			t.Errorf("detail %q lacks %q", deref(p.Detail, ""), f)
		}
	}
}

// plNodes checks the nodes an in-use (or overlap) problem names.
func plNodes(t *testing.T, p ipamv1.Problem, want ...string) {
	t.Helper()
	if got := deref(p.Nodes, nil); !slices.Equal(got, want) {
		t.Errorf("nodes %q, want %q", got, want)
	}
}

// plPicks summarizes an allocation as "family pool selectedBy" per address.
func plPicks(addrs []ipamv1.LeaseAddress) []string {
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, fmt.Sprintf("%s %s %s", a.Family, a.Pool, deref(a.SelectedBy, "")))
	}
	return out
}

// plInCIDR reports whether addr (an address or address/len) lies in cidr.
func plInCIDR(t *testing.T, addr, cidr string) bool {
	t.Helper()
	a, err := netip.ParsePrefix(addr)
	if err != nil {
		ip, err2 := netip.ParseAddr(addr)
		if err2 != nil {
			t.Fatalf("not an address: %q", addr)
		}
		a = netip.PrefixFrom(ip, ip.BitLen())
	}
	return netip.MustParsePrefix(cidr).Contains(a.Addr())
}

// plLeaseOK allocates and expects 201.
func (e *env) plLeaseOK(node string, body map[string]any) ipamv1.Allocation {
	e.t.Helper()
	var a ipamv1.Allocation
	e.mustDo(201, "POST", "/v1/nodes/"+node+"/leases", body, &a)
	return a
}

func (e *env) plBlocks(node string) ipamv1.BlockList {
	e.t.Helper()
	var l ipamv1.BlockList
	e.mustDo(200, "GET", "/v1/nodes/"+node+"/blocks", nil, &l)
	return l
}

func plBlockCIDRs(l ipamv1.BlockList) []string {
	out := make([]string, 0, len(l.Items))
	for _, b := range l.Items {
		out = append(out, b.Cidr)
	}
	return out
}

func (e *env) plLeases(query string) ipamv1.LeaseList {
	e.t.Helper()
	var l ipamv1.LeaseList
	e.mustDo(200, "GET", "/v1/leases?limit=1000&"+query, nil, &l)
	return l
}

// TestPoolSelectionPrecedence walks Cilium's pool selection
// (pkg/ipam/metadata/manager.go), rule by rule and failure by failure: the
// request (pools.<family> over pool), the Pod's annotations (ipv4-pool /
// ipv6-pool over ip-pool), the namespace's, the pools' selectors (exactly one
// per family; both selectors must match when both are set), and the default
// pool unless require-pool-match is "true".
func TestPoolSelectionPrecedence(t *testing.T) {
	e := newEnv(t, nil)

	// Pool -> {IPv4 CIDR, IPv6 CIDR} ("" when the pool lacks the family).
	cidrs := map[string][2]string{
		"default":   {"10.0.0.0/16", "fd00::/104"},
		"blue":      {"10.1.0.0/16", "fd01::/104"},
		"green":     {"10.2.0.0/16", "fd02::/104"},
		"red":       {"10.3.0.0/16", ""},
		"sel-pod":   {"10.4.0.0/16", ""},
		"sel-ns":    {"10.5.0.0/16", ""},
		"sel-both":  {"10.6.0.0/16", ""},
		"sel-synth": {"10.7.0.0/16", ""},
		"sel-expr":  {"10.8.0.0/16", ""},
		"sel-v6":    {"", "fd09::/104"},
	}
	selectors := map[string]map[string]any{
		"sel-pod": {"podSelector": map[string]any{"matchLabels": plKV("app", "web")}},
		"sel-ns":  {"namespaceSelector": map[string]any{"matchLabels": plKV("tenant", "mars")}},
		"sel-both": {
			"podSelector":       map[string]any{"matchLabels": plKV("app", "db")},
			"namespaceSelector": map[string]any{"matchLabels": plKV("tenant", "venus")},
		},
		"sel-synth": {"podSelector": map[string]any{"matchLabels": plKV(plLabelPodNamespace, "tenant-x")}},
		"sel-expr": {"podSelector": map[string]any{"matchExpressions": []map[string]any{
			{"key": "tier", "operator": "In", "values": []string{"gold", "silver"}},
		}}},
		"sel-v6": {"namespaceSelector": map[string]any{"matchLabels": plKV("tenant", "saturn")}},
	}
	for _, name := range slices.Sorted(maps.Keys(cidrs)) {
		c := cidrs[name]
		spec := map[string]any{}
		if c[0] != "" {
			spec["ipv4"] = plFam(24, c[0])
		}
		if c[1] != "" {
			spec["ipv6"] = plFam(120, c[1])
		}
		maps.Copy(spec, selectors[name])
		e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": name, "spec": spec}, nil)
	}
	e.mustDo(201, "PUT", "/v1/nodes/n1", map[string]any{}, nil)

	pod := func(labels, ann map[string]string) map[string]any { return plMeta(labels, ann) }
	type selCase struct {
		name  string
		node  string // default n1
		ns    string // the owner's namespace; default "ns"
		extra map[string]any
		// want lists "family pool selectedBy" per address for a success.
		want []string
		// Otherwise the refusal.
		status                       int
		kind, field, detail, detail2 string
	}
	cases := []selCase{
		// Rule 5: the default pool.
		{name: "default pool without metadata", extra: nil,
			want: []string{"ipv4 default default", "ipv6 default default"}},
		{name: "default pool when nothing matches",
			extra: map[string]any{"pod": pod(plKV("app", "other"), plKV("unrelated.example.com/x", "y")), "namespace": pod(plKV("tenant", "pluto"), nil)},
			want:  []string{"ipv4 default default", "ipv6 default default"}},
		{name: "require-pool-match other than true does not block the default",
			extra: map[string]any{"pod": pod(nil, plKV(plAnnRequireMatch, "false"))},
			want:  []string{"ipv4 default default", "ipv6 default default"}},

		// Rule 1: the request.
		{name: "request pools.ipv4 over pool", extra: map[string]any{"pool": "blue", "pools": plKV("ipv4", "green")},
			want: []string{"ipv4 green request", "ipv6 blue request"}},
		{name: "request pools.ipv6 over pool", extra: map[string]any{"pool": "blue", "pools": plKV("ipv6", "green")},
			want: []string{"ipv4 blue request", "ipv6 green request"}},
		{name: "request pools for both families", extra: map[string]any{"pools": plKV("ipv4", "blue", "ipv6", "green")},
			want: []string{"ipv4 blue request", "ipv6 green request"}},
		{name: "request pool over pod and namespace annotations",
			extra: map[string]any{"pool": "blue",
				"pod":       pod(nil, plKV(plAnnIPPool, "green", plAnnIPv4Pool, "green", plAnnIPv6Pool, "green")),
				"namespace": pod(nil, plKV(plAnnIPPool, "green"))},
			want: []string{"ipv4 blue request", "ipv6 blue request"}},
		{name: "request pool over selectors", extra: map[string]any{"pool": "green", "pod": pod(plKV("app", "web"), nil)},
			want: []string{"ipv4 green request", "ipv6 green request"}},
		{name: "request pool lacking a family serves the other only", extra: map[string]any{"pool": "red"},
			want: []string{"ipv4 red request"}},

		// Rule 2: the Pod's annotations.
		{name: "pod ip-pool", extra: map[string]any{"pod": pod(nil, plKV(plAnnIPPool, "green"))},
			want: []string{"ipv4 green pod-annotation", "ipv6 green pod-annotation"}},
		{name: "pod ipv4-pool over pod ip-pool", extra: map[string]any{"pod": pod(nil, plKV(plAnnIPPool, "blue", plAnnIPv4Pool, "green"))},
			want: []string{"ipv4 green pod-annotation", "ipv6 blue pod-annotation"}},
		{name: "pod ipv6-pool over pod ip-pool", extra: map[string]any{"pod": pod(nil, plKV(plAnnIPPool, "blue", plAnnIPv6Pool, "green"))},
			want: []string{"ipv4 blue pod-annotation", "ipv6 green pod-annotation"}},
		{name: "pod ipv4-pool alone leaves ipv6 to the namespace",
			extra: map[string]any{"pod": pod(nil, plKV(plAnnIPv4Pool, "green")), "namespace": pod(nil, plKV(plAnnIPPool, "blue"))},
			want:  []string{"ipv4 green pod-annotation", "ipv6 blue namespace-annotation"}},
		{name: "pod annotation over namespace annotation",
			extra: map[string]any{"pod": pod(nil, plKV(plAnnIPPool, "green")), "namespace": pod(nil, plKV(plAnnIPPool, "blue"))},
			want:  []string{"ipv4 green pod-annotation", "ipv6 green pod-annotation"}},
		{name: "pod ip-pool over namespace ipv4-pool",
			extra: map[string]any{"pod": pod(nil, plKV(plAnnIPPool, "blue")), "namespace": pod(nil, plKV(plAnnIPv4Pool, "green"))},
			want:  []string{"ipv4 blue pod-annotation", "ipv6 blue pod-annotation"}},
		{name: "pod annotation over selectors", extra: map[string]any{"pod": pod(plKV("app", "web"), plKV(plAnnIPPool, "green"))},
			want: []string{"ipv4 green pod-annotation", "ipv6 green pod-annotation"}},
		{name: "pod annotation with require-pool-match",
			extra: map[string]any{"pod": pod(nil, plKV(plAnnIPPool, "blue", plAnnRequireMatch, "true"))},
			want:  []string{"ipv4 blue pod-annotation", "ipv6 blue pod-annotation"}},

		// Rule 3: the namespace's annotations.
		{name: "namespace ip-pool", extra: map[string]any{"namespace": pod(nil, plKV(plAnnIPPool, "blue"))},
			want: []string{"ipv4 blue namespace-annotation", "ipv6 blue namespace-annotation"}},
		{name: "namespace ipv4-pool over namespace ip-pool", extra: map[string]any{"namespace": pod(nil, plKV(plAnnIPPool, "blue", plAnnIPv4Pool, "green"))},
			want: []string{"ipv4 green namespace-annotation", "ipv6 blue namespace-annotation"}},
		{name: "namespace ipv6-pool over namespace ip-pool", extra: map[string]any{"namespace": pod(nil, plKV(plAnnIPPool, "blue", plAnnIPv6Pool, "green"))},
			want: []string{"ipv4 blue namespace-annotation", "ipv6 green namespace-annotation"}},
		{name: "namespace annotation over selectors",
			// Two selector pools would match (a refusal), so the answer proves
			// the selectors were not consulted.
			extra: map[string]any{"pod": pod(plKV("app", "web"), nil), "namespace": pod(plKV("tenant", "mars"), plKV(plAnnIPPool, "blue"))},
			want:  []string{"ipv4 blue namespace-annotation", "ipv6 blue namespace-annotation"}},

		// Rule 4: selectors.
		{name: "podSelector", extra: map[string]any{"pod": pod(plKV("app", "web"), nil)},
			want: []string{"ipv4 sel-pod selector", "ipv6 default default"}},
		{name: "podSelector on the synthetic namespace label", ns: "tenant-x",
			want: []string{"ipv4 sel-synth selector", "ipv6 default default"}},
		{name: "podSelector with matchExpressions", extra: map[string]any{"pod": pod(plKV("tier", "silver"), nil)},
			want: []string{"ipv4 sel-expr selector", "ipv6 default default"}},
		{name: "namespaceSelector", extra: map[string]any{"namespace": pod(plKV("tenant", "mars"), nil)},
			want: []string{"ipv4 sel-ns selector", "ipv6 default default"}},
		{name: "namespaceSelector does not read Pod labels", extra: map[string]any{"pod": pod(plKV("tenant", "mars"), nil)},
			want: []string{"ipv4 default default", "ipv6 default default"}},
		{name: "podSelector and namespaceSelector both match",
			extra: map[string]any{"pod": pod(plKV("app", "db"), nil), "namespace": pod(plKV("tenant", "venus"), nil)},
			want:  []string{"ipv4 sel-both selector", "ipv6 default default"}},
		{name: "only the podSelector of a pool with both matches", extra: map[string]any{"pod": pod(plKV("app", "db"), nil)},
			want: []string{"ipv4 default default", "ipv6 default default"}},
		{name: "only the namespaceSelector of a pool with both matches",
			extra: map[string]any{"pod": pod(plKV("app", "api"), nil), "namespace": pod(plKV("tenant", "venus"), nil)},
			want:  []string{"ipv4 default default", "ipv6 default default"}},
		{name: "selectors per family", extra: map[string]any{"namespace": pod(plKV("tenant", "saturn"), nil)},
			want: []string{"ipv4 default default", "ipv6 sel-v6 selector"}},
		{name: "selector satisfies require-pool-match",
			extra: map[string]any{"pod": pod(plKV("app", "web"), plKV(plAnnRequireMatch, "true")), "families": []string{"ipv4"}},
			want:  []string{"ipv4 sel-pod selector"}},

		// Refusals.
		{name: "two pools match",
			extra:  map[string]any{"pod": pod(plKV("app", "web"), nil), "namespace": pod(plKV("tenant", "mars"), nil)},
			status: 409, kind: "pool-match", field: "owner", detail: "multiple pools match", detail2: "sel-ns, sel-pod"},
		{name: "two pools match on a node not registered yet", node: "n9",
			extra:  map[string]any{"pod": pod(plKV("app", "web"), nil), "namespace": pod(plKV("tenant", "mars"), nil)},
			status: 409, kind: "pool-match", field: "owner", detail: "multiple pools match"},
		{name: "require-pool-match on the pod without a match",
			extra:  map[string]any{"pod": pod(plKV("app", "other"), plKV(plAnnRequireMatch, "true"))},
			status: 409, kind: "pool-match", field: "owner", detail: plAnnRequireMatch},
		{name: "require-pool-match on the namespace without a match",
			extra:  map[string]any{"namespace": pod(plKV("tenant", "pluto"), plKV(plAnnRequireMatch, "true"))},
			status: 409, kind: "pool-match", field: "owner", detail: plAnnRequireMatch},
		{name: "unknown pool in the pod's ip-pool", extra: map[string]any{"pod": pod(nil, plKV(plAnnIPPool, "nope"))},
			status: 404, kind: "not-found", field: "pod.annotations[" + plAnnIPPool + "]", detail: "nope"},
		{name: "unknown pool in the pod's ipv4-pool", extra: map[string]any{"pod": pod(nil, plKV(plAnnIPPool, "blue", plAnnIPv4Pool, "nope"))},
			status: 404, kind: "not-found", field: "pod.annotations[" + plAnnIPv4Pool + "]", detail: "nope"},
		{name: "unknown pool in the namespace's ip-pool", extra: map[string]any{"namespace": pod(nil, plKV(plAnnIPPool, "nope"))},
			status: 404, kind: "not-found", field: "namespace.annotations[" + plAnnIPPool + "]", detail: "nope"},
		{name: "unknown pool in the namespace's ipv6-pool", extra: map[string]any{"namespace": pod(nil, plKV(plAnnIPv6Pool, "nope"))},
			status: 404, kind: "not-found", field: "namespace.annotations[" + plAnnIPv6Pool + "]", detail: "nope"},
		{name: "unknown pool in request pools.ipv4", extra: map[string]any{"pools": plKV("ipv4", "nope")},
			status: 404, kind: "not-found", field: "pools.ipv4", detail: "nope"},
		{name: "invalid pool name in an annotation", extra: map[string]any{"pod": pod(nil, plKV(plAnnIPPool, "Not_A_Pool"))},
			status: 400, kind: "invalid-input", field: "pod.annotations[" + plAnnIPPool + "]"},
		{name: "request pools.ipv6 names a pool without ipv6", extra: map[string]any{"pools": plKV("ipv6", "red")},
			status: 400, kind: "invalid-input", field: "pools.ipv6", detail: "red"},
		{name: "pod ipv6-pool names a pool without ipv6", extra: map[string]any{"pod": pod(nil, plKV(plAnnIPv6Pool, "red"))},
			status: 400, kind: "invalid-input", field: "pod.annotations[" + plAnnIPv6Pool + "]", detail: "red"},
		{name: "namespace ipv6-pool names a pool without ipv6", extra: map[string]any{"namespace": pod(nil, plKV(plAnnIPv6Pool, "red"))},
			status: 400, kind: "invalid-input", field: "namespace.annotations[" + plAnnIPv6Pool + "]", detail: "red"},
		{name: "pod ipv4-pool names a pool without ipv4", extra: map[string]any{"pod": pod(nil, plKV(plAnnIPv4Pool, "sel-v6"))},
			status: 400, kind: "invalid-input", field: "pod.annotations[" + plAnnIPv4Pool + "]", detail: "sel-v6"},
		{name: "explicit family the annotated pool lacks",
			extra:  map[string]any{"pod": pod(nil, plKV(plAnnIPPool, "red")), "families": []string{"ipv6"}},
			status: 400, kind: "invalid-input", field: "families[0]", detail: "red"},
	}

	poolCIDR := func(pool string, f ipamv1.Family) string {
		if f == ipamv1.Ipv4 {
			return cidrs[pool][0]
		}
		return cidrs[pool][1]
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			defer func() { e.t = nil }()
			node, ns := c.node, c.ns
			if node == "" {
				node = "n1"
			}
			if ns == "" {
				ns = "ns"
			}
			id := fmt.Sprintf("c%d", i)
			body := plLease(id, ns, fmt.Sprintf("pod%d", i), c.extra)
			if c.want == nil {
				p := e.plRefuse("POST", "/v1/nodes/"+node+"/leases", body, c.status, c.kind, c.field)
				if c.detail != "" {
					plDetail(t, p, c.detail)
				}
				if c.detail2 != "" {
					plDetail(t, p, c.detail2)
				}
				return
			}
			res := e.do("POST", "/v1/nodes/"+node+"/leases", body)
			if res.status != 201 {
				t.Fatalf("status %d, want 201: %s", res.status, res.body)
			}
			var a ipamv1.Allocation
			e.mustDo(200, "GET", "/v1/nodes/"+node+"/attachments/"+id+"/eth0", nil, &a)
			var created ipamv1.Allocation
			if err := json.Unmarshal(res.body, &created); err != nil {
				t.Fatal(err)
			}
			if got := plPicks(created.Addresses); !slices.Equal(got, c.want) {
				t.Errorf("allocated %q, want %q", got, c.want)
			}
			// The rule is stored with the lease, not recomputed.
			if got := plPicks(a.Addresses); !slices.Equal(got, c.want) {
				t.Errorf("attachment reads back %q, want %q", got, c.want)
			}
			for _, ad := range created.Addresses {
				if cidr := poolCIDR(ad.Pool, ad.Family); cidr == "" || !plInCIDR(t, ad.Address, cidr) {
					t.Errorf("%s address %s is not in pool %s (%s)", ad.Family, ad.Address, ad.Pool, cidr)
				}
			}
		})
	}
	e.t = t
}

// TestLab2MultiPoolSelection is Lab 2 of the reference: pools default
// (10.10.0.0/16, /27) and mars (10.20.0.0/16, /27); a namespace annotated
// ip-pool=mars gets mars, an unannotated one the default, a Pod annotation
// wins over its namespace, and require-pool-match without a match is
// refused.
func TestLab2MultiPoolSelection(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": map[string]any{"ipv4": plFam(27, "10.10.0.0/16")}}, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "mars", "spec": map[string]any{"ipv4": plFam(27, "10.20.0.0/16"), "preAllocate": 4}}, nil)
	const node = "kind-worker"
	nsA := plMeta(plKV("kubernetes.io/metadata.name", "ns-a"), plKV(plAnnIPPool, "mars"))
	nsB := plMeta(plKV("kubernetes.io/metadata.name", "ns-b"), nil)

	check := func(a ipamv1.Allocation, pool, cidr string, by ipamv1.LeaseAddressSelectedBy) {
		t.Helper()
		if len(a.Addresses) != 1 {
			t.Fatalf("addresses %s", dump(a.Addresses))
		}
		got := a.Addresses[0]
		if got.Pool != pool || !plInCIDR(t, got.Address, cidr) || deref(got.SelectedBy, "") != by {
			t.Errorf("got %s, want pool %s in %s selected by %s", dump(got), pool, cidr, by)
		}
	}

	// Step 2: a Pod in each namespace.
	podA := plLease("a1", "ns-a", "app-a", map[string]any{"pod": plMeta(plKV("app", "a"), nil), "namespace": nsA})
	a := e.plLeaseOK(node, podA)
	check(a, "mars", "10.20.0.0/16", ipamv1.LeaseAddressSelectedByNamespaceAnnotation)
	firstA := a.Addresses[0].Address
	check(e.plLeaseOK(node, plLease("b1", "ns-b", "app-b", map[string]any{"pod": plMeta(plKV("app", "b"), nil), "namespace": nsB})),
		"default", "10.10.0.0/16", ipamv1.LeaseAddressSelectedByDefault)

	// Step 3: the Pod annotation wins over the namespace's default.
	check(e.plLeaseOK(node, plLease("b2", "ns-b", "pinned", map[string]any{"pod": plMeta(nil, plKV(plAnnIPPool, "mars")), "namespace": nsB})),
		"mars", "10.20.0.0/16", ipamv1.LeaseAddressSelectedByPodAnnotation)

	// Selection is evaluated once: a retry after the namespace annotation
	// changed answers the address it got.
	retry := plLease("a1", "ns-a", "app-a", map[string]any{"namespace": plMeta(nil, plKV(plAnnIPPool, "default"))})
	var again ipamv1.Allocation
	e.mustDo(200, "POST", "/v1/nodes/"+node+"/leases", retry, &again)
	if len(again.Addresses) != 1 || again.Addresses[0].Address != firstA || again.Addresses[0].Pool != "mars" {
		t.Errorf("retry after the annotation changed answered %s, first %s", dump(again.Addresses), firstA)
	}

	// Step 4: require-pool-match without a matching pool stays pending.
	nsC := plMeta(plKV("kubernetes.io/metadata.name", "ns-c"), plKV(plAnnRequireMatch, "true"))
	p := e.plRefuse("POST", "/v1/nodes/"+node+"/leases", plLease("c1", "ns-c", "app-c", map[string]any{"namespace": nsC}),
		409, "pool-match", "owner")
	plDetail(t, p, plAnnRequireMatch, "ns-c/app-c")

	// Step 5: the node holds a block of each pool; the leases name their pool.
	if got := plBlockCIDRs(e.plBlocks(node)); !slices.Equal(got, []string{"10.10.0.0/27", "10.20.0.0/27"}) {
		t.Errorf("blocks %v", got)
	}
	l := e.plLeases("pool=mars")
	if len(l.Items) != 2 {
		t.Fatalf("mars leases %s", dump(l))
	}
	for _, it := range l.Items {
		if it.Pool != "mars" || !plInCIDR(t, it.Address, "10.20.0.0/16") || it.Node != node {
			t.Errorf("mars lease %s", dump(it))
		}
	}
	if l := e.plLeases("pool=default"); len(l.Items) != 1 || deref(l.Items[0].SelectedBy, "") != ipamv1.LeaseSelectedByDefault {
		t.Errorf("default leases %s", dump(l))
	}
}

// TestLab1ClusterPoolExhaustion is Lab 1: a cluster-pool pool 10.244.0.0/16
// with /28 node blocks. Each node gets its /28 at registration; a node takes
// exactly the block's usable addresses (16 minus network, broadcast, router,
// health and ingress), then "node range full", and no second block.
func TestLab1ClusterPoolExhaustion(t *testing.T) {
	e := newEnv(t, nil)
	var pool ipamv1.Pool
	e.mustDo(201, "POST", "/v1/pools", map[string]any{
		"name": "default",
		"spec": map[string]any{
			"ipv4": plFam(28, "10.244.0.0/16"),
			"mode": "cluster-pool",
			// The lab counts router, health and ingress out of each block.
			"nodeLocal": map[string]any{"ingress": true},
		},
	}, &pool)
	if deref(pool.Spec.Mode, "") != ipamv1.ClusterPool {
		t.Fatalf("mode %v", pool.Spec.Mode)
	}

	// The sizing rule: 2^(32-M) addresses minus network and broadcast
	// (unless allowed) minus the node-local addresses the pool reserves.
	nl := pool.Spec.NodeLocal
	reserved := int64(0)
	for _, on := range []*bool{nl.Router, nl.Health, nl.Ingress} {
		if deref(on, false) {
			reserved++
		}
	}
	if !deref(pool.Spec.AllowFirstIP, false) {
		reserved++
	}
	if !deref(pool.Spec.AllowLastIP, false) {
		reserved++
	}
	usable := int64(1)<<(32-28) - reserved
	if usable != 11 {
		t.Errorf("the lab expects 11 usable addresses per /28; the pool's settings give %d", usable)
	}
	var sz ipamv1.Sizing
	e.mustDo(200, "GET", "/v1/sizing?cidr=10.244.0.0/16&maskSize=28&ingress=true", nil, &sz)
	if sz.UsablePerNode != usable || sz.Nodes != 4096 || sz.AddressesPerNode != 16 {
		t.Errorf("sizing %+v, want %d usable of 16 on 4096 nodes", sz, usable)
	}

	// Step 2: each node owns a /28 from its registration.
	const node = "kind-worker"
	e.mustDo(201, "PUT", "/v1/nodes/"+node, map[string]any{}, nil)
	e.mustDo(201, "PUT", "/v1/nodes/kind-worker2", map[string]any{}, nil)
	bl := e.plBlocks(node)
	if len(bl.Items) != 1 {
		t.Fatalf("blocks at registration %s", dump(bl))
	}
	b := bl.Items[0]
	if b.Cidr != "10.244.0.0/28" || b.Pool != "default" || deref(b.Source, "") != ipamv1.Carved || b.Capacity != usable || b.Leased != 0 {
		t.Errorf("block at registration %s", dump(b))
	}
	if got := plBlockCIDRs(e.plBlocks("kind-worker2")); !slices.Equal(got, []string{"10.244.0.16/28"}) {
		t.Errorf("kind-worker2 blocks %v", got)
	}
	taken := map[string]bool{"10.244.0.0": true, "10.244.0.15": true}
	for _, a := range []*string{b.Reserved.Router, b.Reserved.Health, b.Reserved.Ingress} {
		if a == nil {
			t.Fatalf("node-local addresses %s", dump(b.Reserved))
		}
		taken[*a] = true
	}

	// Steps 3-4: Pods pinned to the node until the range is full.
	for i := range usable {
		a := e.plLeaseOK(node, plLease(fmt.Sprintf("c%d", i), "default", fmt.Sprintf("web-%d", i), nil))
		if len(a.Addresses) != 1 {
			t.Fatalf("lease %d: %s", i, dump(a))
		}
		got := a.Addresses[0]
		ip := netip.MustParsePrefix(got.Address).Addr().String()
		if got.Block != "10.244.0.0/28" || taken[ip] {
			t.Errorf("lease %d got %s (block %s), taken before: %v", i, got.Address, got.Block, taken[ip])
		}
		taken[ip] = true
	}
	p := e.plRefuse("POST", "/v1/nodes/"+node+"/leases", plLease("c-over", "default", "web-over", nil), 409, "pool-exhausted", "pool")
	plDetail(t, p, "node range full")
	if deref(p.Pool, "") != "default" || deref(p.Family, "") != ipamv1.Ipv4 {
		t.Errorf("problem pool %v family %v", deref(p.Pool, ""), deref(p.Family, ""))
	}
	// An explicit carve cannot give the node a second block either.
	p = e.plRefuse("POST", "/v1/nodes/"+node+"/blocks", map[string]string{"pool": "default", "family": "ipv4"}, 409, "pool-exhausted", "pool")
	plDetail(t, p, "node range full")
	if got := plBlockCIDRs(e.plBlocks(node)); !slices.Equal(got, []string{"10.244.0.0/28"}) {
		t.Errorf("blocks after the refusals %v", got)
	}
	// The node's view: its one fixed block is full, and cluster-pool never
	// asks for more (no pre-allocation, no deficit).
	var nu ipamv1.NodeUsage
	e.mustDo(200, "GET", "/v1/nodes/"+node+"/pools", nil, &nu)
	if len(nu.Items) != 1 {
		t.Fatalf("node usage %s", dump(nu))
	}
	if u := nu.Items[0]; u.Pool != "default" || u.Mode != ipamv1.ClusterPool || u.Blocks != 1 || u.Capacity != usable ||
		u.Leased != usable || u.Available != 0 || !u.AtCapacity || u.PreAllocate != 0 || u.Deficit != 0 {
		t.Errorf("node usage at range full %s", dump(u))
	}
	// The other worker is unaffected.
	if a := e.plLeaseOK("kind-worker2", plLease("w2", "default", "other", nil)); a.Addresses[0].Block != "10.244.0.16/28" {
		t.Errorf("kind-worker2 leased %s", dump(a.Addresses))
	}
	e.mustDo(200, "GET", "/v1/pools/default", nil, &pool)
	if st := pool.Status.Ipv4; st == nil || st.BlocksCarved != 2 || st.Leased != usable+1 || st.AddressesTotal != 2*usable {
		t.Errorf("status %s", dump(pool.Status))
	}
}

// TestLab3ClusterPoolToMultiPool is Lab 3: a cluster-pool pool becomes
// multi-pool in place; every block and lease stays, a full node grows a
// second block, and the migration is one-way.
func TestLab3ClusterPoolToMultiPool(t *testing.T) {
	e := newEnv(t, nil)
	spec := func(mode string) map[string]any {
		s := map[string]any{"ipv4": plFam(28, "10.244.0.0/16")}
		if mode != "" {
			s["mode"] = mode
		}
		return s
	}
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": spec("cluster-pool")}, nil)
	e.mustDo(201, "PUT", "/v1/nodes/n1", map[string]any{}, nil)
	e.mustDo(201, "PUT", "/v1/nodes/n2", map[string]any{}, nil)
	capacity := e.plBlocks("n1").Items[0].Capacity
	for i := range capacity {
		e.plLeaseOK("n1", plLease(fmt.Sprintf("a%d", i), "ns", fmt.Sprintf("a%d", i), nil))
	}
	for i := range 3 {
		e.plLeaseOK("n2", plLease(fmt.Sprintf("b%d", i), "ns", fmt.Sprintf("b%d", i), nil))
	}
	p := e.plRefuse("POST", "/v1/nodes/n1/leases", plLease("full", "ns", "full", nil), 409, "pool-exhausted", "pool")
	plDetail(t, p, "node range full")

	// A PUT without mode keeps cluster-pool.
	var pool ipamv1.Pool
	e.mustDo(200, "PUT", "/v1/pools/default", map[string]any{"labels": plKV("step", "1"), "spec": spec("")}, &pool)
	if deref(pool.Spec.Mode, "") != ipamv1.ClusterPool {
		t.Fatalf("a PUT without mode changed it to %v", deref(pool.Spec.Mode, ""))
	}
	e.plRefuse("POST", "/v1/nodes/n1/leases", plLease("full", "ns", "full", nil), 409, "pool-exhausted", "pool")

	blocks1, blocks2, leases := e.plBlocks("n1"), e.plBlocks("n2"), e.plLeases("")
	if len(leases.Items) != int(capacity)+3 {
		t.Fatalf("%d leases before the migration", len(leases.Items))
	}

	// The migration: same CIDRs and mask, mode multi-pool.
	e.clock.Advance(time.Minute)
	e.mustDo(200, "PUT", "/v1/pools/default", map[string]any{"spec": spec("multi-pool")}, &pool)
	if deref(pool.Spec.Mode, "") != ipamv1.MultiPool || pool.Status.Ipv4.BlocksCarved != 2 || pool.Status.Ipv4.Leased != capacity+3 {
		t.Fatalf("migrated pool %s", dump(pool))
	}
	if got := e.plBlocks("n1"); dump(got) != dump(blocks1) {
		t.Errorf("n1 blocks changed by the migration:\n%s\n%s", dump(blocks1), dump(got))
	}
	if got := e.plBlocks("n2"); dump(got) != dump(blocks2) {
		t.Errorf("n2 blocks changed by the migration:\n%s\n%s", dump(blocks2), dump(got))
	}
	if got := e.plLeases(""); dump(got) != dump(leases) {
		t.Errorf("leases changed by the migration:\n%s\n%s", dump(leases), dump(got))
	}

	// The full node now grows a second block on its next lease.
	a := e.plLeaseOK("n1", plLease("full", "ns", "full", nil))
	if got := a.Addresses[0]; got.Block != "10.244.0.32/28" || !plInCIDR(t, got.Address, "10.244.0.32/28") {
		t.Errorf("lease after the migration %s", dump(got))
	}
	bl := e.plBlocks("n1")
	if got := plBlockCIDRs(bl); !slices.Equal(got, []string{"10.244.0.0/28", "10.244.0.32/28"}) {
		t.Errorf("n1 blocks after growing %v", got)
	} else if deref(bl.Items[1].Source, "") != ipamv1.Carved || bl.Items[1].Leased != 1 || bl.Items[0].Leased != capacity {
		t.Errorf("n1 blocks %s", dump(bl))
	}
	// A node registered now gets no block until it needs one.
	e.mustDo(201, "PUT", "/v1/nodes/n3", map[string]any{}, nil)
	if got := e.plBlocks("n3"); len(got.Items) != 0 {
		t.Errorf("multi-pool carved at registration: %s", dump(got))
	}

	// One way only.
	p = e.plRefuse("PUT", "/v1/pools/default", map[string]any{"spec": spec("cluster-pool")}, 409, "immutable-field", "spec.mode")
	plDetail(t, p, "one-way")
	// Without mode it stays multi-pool.
	e.mustDo(200, "PUT", "/v1/pools/default", map[string]any{"labels": plKV("step", "2"), "spec": spec("")}, &pool)
	if deref(pool.Spec.Mode, "") != ipamv1.MultiPool {
		t.Errorf("a PUT without mode changed it to %v", deref(pool.Spec.Mode, ""))
	}
}

// TestSafePoolChanges checks the rules of "Updating pools safely": CIDRs may
// be appended live and removed only while no node holds a block of them; an
// in-use pool cannot be deleted; the shaping fields are immutable; dry runs
// write nothing and refuse what the real call refuses.
func TestSafePoolChanges(t *testing.T) {
	e := newEnv(t, nil)
	def := func(v4 ...string) map[string]any {
		return map[string]any{"ipv4": plFam(24, v4...), "ipv6": plFam(120, "fd00::/104")}
	}
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": def("10.0.0.0/16")}, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "other", "spec": map[string]any{"ipv4": plFam(24, "10.9.0.0/16")}}, nil)
	e.plLeaseOK("n1", plLease("c1", "ns", "p1", nil))
	e.plLeaseOK("n2", plLease("c2", "ns", "p2", nil))
	blocks := e.plBlocks("n1")

	// Append a CIDR live.
	var p ipamv1.Pool
	e.mustDo(200, "PUT", "/v1/pools/default", map[string]any{"spec": def("10.0.0.0/16", "10.1.0.0/16")}, &p)
	if !slices.Equal(p.Spec.Ipv4.Cidrs, []string{"10.0.0.0/16", "10.1.0.0/16"}) || p.Status.Ipv4.BlocksPossible != 512 || p.Status.Ipv4.BlocksCarved != 2 {
		t.Errorf("after the append %s", dump(p))
	}
	if got := e.plBlocks("n1"); dump(got) != dump(blocks) {
		t.Errorf("the append changed n1's blocks: %s", dump(got))
	}

	// Remove a CIDR that holds blocks; remove a family that does.
	pr := e.plRefuse("PUT", "/v1/pools/default", map[string]any{"spec": def("10.1.0.0/16")}, 409, "in-use", "spec.ipv4.cidrs")
	plNodes(t, pr, "n1", "n2")
	plDetail(t, pr, "still in use by", "10.0.0.0/16", "n1", "n2")
	pr = e.plRefuse("PUT", "/v1/pools/default", map[string]any{"spec": map[string]any{"ipv4": plFam(24, "10.0.0.0/16", "10.1.0.0/16")}},
		409, "in-use", "spec.ipv6")
	plNodes(t, pr, "n1", "n2")
	plDetail(t, pr, "still in use by")
	// A CIDR no block came from goes.
	e.mustDo(200, "PUT", "/v1/pools/default", map[string]any{"spec": def("10.0.0.0/16")}, &p)
	if !slices.Equal(p.Spec.Ipv4.Cidrs, []string{"10.0.0.0/16"}) || p.Status.Ipv4.BlocksPossible != 256 {
		t.Errorf("after removing the unused CIDR %s", dump(p))
	}

	// Delete a pool in use.
	pr = e.plRefuse("DELETE", "/v1/pools/default", nil, 409, "in-use", "pool")
	plNodes(t, pr, "n1", "n2")
	plDetail(t, pr, "still in use by")

	// Immutable fields.
	for _, c := range []struct {
		spec  map[string]any
		field string
	}{
		{map[string]any{"ipv4": plFam(25, "10.0.0.0/16"), "ipv6": plFam(120, "fd00::/104")}, "spec.ipv4.maskSize"},
		{map[string]any{"ipv4": plFam(24, "10.0.0.0/16"), "ipv6": plFam(112, "fd00::/104")}, "spec.ipv6.maskSize"},
		{map[string]any{"ipv4": plFam(24, "10.0.0.0/16"), "ipv6": plFam(120, "fd00::/104"), "allowFirstIP": true}, "spec.allowFirstIP"},
		{map[string]any{"ipv4": plFam(24, "10.0.0.0/16"), "ipv6": plFam(120, "fd00::/104"), "allowLastIP": true}, "spec.allowLastIP"},
		{map[string]any{"ipv4": plFam(24, "10.0.0.0/16"), "ipv6": plFam(120, "fd00::/104"), "nodeLocal": map[string]any{"health": false}}, "spec.nodeLocal"},
	} {
		e.plRefuse("PUT", "/v1/pools/default", map[string]any{"spec": c.spec}, 409, "immutable-field", c.field)
	}

	// 33 CIDRs, on update and on create.
	many := []string{"10.0.0.0/16"}
	for i := range 32 {
		many = append(many, fmt.Sprintf("10.%d.0.0/16", 100+i))
	}
	e.plRefuse("PUT", "/v1/pools/default", map[string]any{"spec": def(many...)}, 400, "invalid-input", "spec.ipv4.cidrs")
	fresh := make([]string, 33)
	for i := range fresh {
		fresh[i] = fmt.Sprintf("10.%d.0.0/16", 100+i)
	}
	e.plRefuse("POST", "/v1/pools", map[string]any{"name": "many", "spec": map[string]any{"ipv4": plFam(24, fresh...)}},
		400, "invalid-input", "spec.ipv4.cidrs")

	// Overlap with another pool, on update and on create.
	pr = e.plRefuse("PUT", "/v1/pools/default", map[string]any{"spec": def("10.0.0.0/16", "10.9.128.0/17")}, 409, "overlap", "spec.ipv4.cidrs[1]")
	plDetail(t, pr, "10.9.0.0/16", `"other"`)
	pr = e.plRefuse("POST", "/v1/pools", map[string]any{"name": "third", "spec": map[string]any{"ipv4": plFam(24, "10.2.0.0/16", "10.0.128.0/17")}},
		409, "overlap", "spec.ipv4.cidrs[1]")
	plDetail(t, pr, `"default"`)
	e.plRefuse("POST", "/v1/pools", map[string]any{"name": "third", "spec": map[string]any{"ipv6": plFam(120, "fd00::/112")}},
		409, "overlap", "spec.ipv6.cidrs[0]")

	// Dry run of a create: the pool as it would be, nothing written; the
	// real create then answers the same.
	third := map[string]any{"name": "third", "labels": plKV("team", "net"), "spec": map[string]any{"ipv4": plFam(26, "10.2.0.0/16")}}
	before := e.snapshot()
	var dry ipamv1.Pool
	e.mustDo(200, "POST", "/v1/pools?dryRun=true", third, &dry)
	e.plUnchanged(before)
	if dry.Name != "third" || dry.Labels["team"] != "net" || dry.Spec.Ipv4 == nil || dry.Spec.Ipv4.MaskSize != 26 ||
		dry.Status.Ipv4 == nil || dry.Status.Ipv4.BlocksPossible != 1024 || dry.Status.Ipv4.BlocksCarved != 0 ||
		deref(dry.Spec.Mode, "") != ipamv1.MultiPool || !dry.CreatedAt.Equal(e.clock.Now()) {
		t.Errorf("dry-run create answered %s", dump(dry))
	}
	if res := e.do("GET", "/v1/pools/third", nil); res.status != 404 {
		t.Errorf("the dry-run create wrote the pool: %d %s", res.status, res.body)
	}
	var real ipamv1.Pool
	e.mustDo(201, "POST", "/v1/pools", third, &real)
	if dump(real) != dump(dry) {
		t.Errorf("created %s\ndry run answered %s", dump(real), dump(dry))
	}

	// Dry run of an update.
	e.clock.Advance(time.Minute)
	upd := map[string]any{"labels": plKV("team", "infra"), "spec": def("10.0.0.0/16", "10.1.0.0/16")}
	var cur ipamv1.Pool
	e.mustDo(200, "GET", "/v1/pools/default", nil, &cur)
	before = e.snapshot()
	e.mustDo(200, "PUT", "/v1/pools/default?dryRun=true", upd, &dry)
	e.plUnchanged(before)
	if len(dry.Spec.Ipv4.Cidrs) != 2 || dry.Labels["team"] != "infra" || dry.Status.Ipv4.BlocksPossible != 512 ||
		dry.Status.Ipv4.BlocksCarved != 2 || !dry.UpdatedAt.Equal(e.clock.Now()) {
		t.Errorf("dry-run update answered %s", dump(dry))
	}
	var now ipamv1.Pool
	e.mustDo(200, "GET", "/v1/pools/default", nil, &now)
	if dump(now) != dump(cur) {
		t.Errorf("the dry-run update changed the pool: %s", dump(now))
	}
	e.mustDo(200, "PUT", "/v1/pools/default", upd, &real)
	if dump(real) != dump(dry) {
		t.Errorf("updated %s\ndry run answered %s", dump(real), dump(dry))
	}

	// Dry run of a delete: 200 with the pool, which stays.
	var other ipamv1.Pool
	e.mustDo(200, "GET", "/v1/pools/other", nil, &other)
	before = e.snapshot()
	e.mustDo(200, "DELETE", "/v1/pools/other?dryRun=true", nil, &dry)
	e.plUnchanged(before)
	if dump(dry) != dump(other) {
		t.Errorf("dry-run delete answered %s, want %s", dump(dry), dump(other))
	}
	e.mustDo(200, "GET", "/v1/pools/other", nil, nil)
	e.mustDo(204, "DELETE", "/v1/pools/other", nil, nil)
	if res := e.do("GET", "/v1/pools/other", nil); res.status != 404 {
		t.Errorf("deleted pool: %d %s", res.status, res.body)
	}

	// A refused dry run answers what the real call answers.
	both := def("10.0.0.0/16", "10.1.0.0/16")
	clusterPool := maps.Clone(both)
	clusterPool["mode"] = "cluster-pool"
	for _, c := range []struct {
		name, method, path string
		body               any
		status             int
		kind, field        string
	}{
		{"delete a pool in use", "DELETE", "/v1/pools/default", nil, 409, "in-use", "pool"},
		{"remove a CIDR in use", "PUT", "/v1/pools/default", map[string]any{"spec": def("10.1.0.0/16")}, 409, "in-use", "spec.ipv4.cidrs"},
		{"change maskSize", "PUT", "/v1/pools/default",
			map[string]any{"spec": map[string]any{"ipv4": plFam(25, "10.0.0.0/16", "10.1.0.0/16"), "ipv6": plFam(120, "fd00::/104")}},
			409, "immutable-field", "spec.ipv4.maskSize"},
		{"become cluster-pool", "PUT", "/v1/pools/default", map[string]any{"spec": clusterPool}, 409, "immutable-field", "spec.mode"},
		{"update with an overlap", "PUT", "/v1/pools/default", map[string]any{"spec": def("10.0.0.0/16", "10.1.0.0/16", "10.2.0.0/24")},
			409, "overlap", "spec.ipv4.cidrs[2]"},
		{"create with an overlap", "POST", "/v1/pools", map[string]any{"name": "fourth", "spec": map[string]any{"ipv4": plFam(24, "10.2.0.0/24")}},
			409, "overlap", "spec.ipv4.cidrs[0]"},
		{"create with 33 CIDRs", "POST", "/v1/pools", map[string]any{"name": "many", "spec": map[string]any{"ipv4": plFam(24, fresh...)}},
			400, "invalid-input", "spec.ipv4.cidrs"},
		{"create a taken name with another spec", "POST", "/v1/pools", map[string]any{"name": "third", "spec": map[string]any{"ipv4": plFam(24, "10.3.0.0/16")}},
			409, "conflict", "name"},
		{"update an unknown pool", "PUT", "/v1/pools/nope", map[string]any{"spec": map[string]any{"ipv4": plFam(24, "10.5.0.0/16")}},
			404, "not-found", "pool"},
		{"delete an unknown pool", "DELETE", "/v1/pools/nope", nil, 404, "not-found", "pool"},
	} {
		t.Run("dry run: "+c.name, func(t *testing.T) {
			e.t = t
			defer func() { e.t = nil }()
			dryP := e.plRefuse(c.method, c.path+"?dryRun=true", c.body, c.status, c.kind, c.field)
			realP := e.plRefuse(c.method, c.path, c.body, c.status, c.kind, c.field)
			if dump(dryP) != dump(realP) {
				t.Errorf("dry run answered %s\nthe real call %s", dump(dryP), dump(realP))
			}
			if c.kind == "in-use" {
				plNodes(t, dryP, "n1", "n2")
			}
		})
	}
	e.t = t
}

// plRange is a PoolCIDRConfig body: a CIDR and its reserved ranges.
func plRange(cidr string, ranges ...[2]string) map[string]any {
	l := []map[string]string{}
	for _, r := range ranges {
		l = append(l, map[string]string{"start": r[0], "end": r[1]})
	}
	return map[string]any{"cidr": cidr, "reservedRanges": l}
}

// plWithCIDRConfig adds per-CIDR settings (spec.<family>.pool) to a family.
func plWithCIDRConfig(fam map[string]any, entries ...map[string]any) map[string]any {
	fam["pool"] = entries
	return fam
}

// plFreeBlocks lists the blocks of mask in cidr, in order, that overlap none
// of the inclusive ranges.
func plFreeBlocks(cidr string, mask int, ranges [][2]string) []string {
	p := netip.MustParsePrefix(cidr)
	bits := p.Addr().BitLen()
	size := new(big.Int).Lsh(big.NewInt(1), uint(bits-mask))
	base := new(big.Int).SetBytes(p.Addr().AsSlice())
	addr := func(x *big.Int) netip.Addr {
		a, _ := netip.AddrFromSlice(x.FillBytes(make([]byte, bits/8)))
		return a
	}
	var out []string
	for i := range int64(1) << (mask - p.Bits()) {
		first := new(big.Int).Add(base, new(big.Int).Mul(big.NewInt(i), size))
		last := new(big.Int).Sub(new(big.Int).Add(first, size), big.NewInt(1))
		fa, la := addr(first), addr(last)
		free := true
		for _, r := range ranges {
			if netip.MustParseAddr(r[0]).Compare(la) <= 0 && fa.Compare(netip.MustParseAddr(r[1])) <= 0 {
				free = false
			}
		}
		if free {
			out = append(out, netip.PrefixFrom(fa, mask).String())
		}
	}
	return out
}

// TestReservedRanges checks Cilium 1.21's pool[].reservedRanges: no new
// block overlaps a reserved range, blocks already there keep serving, so a
// CIDR can be retired without orphans.
func TestReservedRanges(t *testing.T) {
	e := newEnv(t, nil)

	// The first CIDR reserved whole: new blocks come from the second only.
	var p ipamv1.Pool
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": map[string]any{
		"ipv4": plWithCIDRConfig(plFam(24, "10.10.0.0/16", "10.20.0.0/16"), plRange("10.10.0.0/16", [2]string{"10.10.0.0", "10.10.255.255"})),
	}}, &p)
	wantCfg := []ipamv1.PoolCIDRConfig{{Cidr: "10.10.0.0/16", ReservedRanges: &[]ipamv1.AddressRange{{Start: "10.10.0.0", End: "10.10.255.255"}}}}
	if got := deref(p.Spec.Ipv4.Pool, nil); dump(got) != dump(wantCfg) {
		t.Errorf("spec.ipv4.pool %s, want %s", dump(got), dump(wantCfg))
	}
	if a := e.plLeaseOK("n1", plLease("c1", "ns", "p1", nil)); a.Addresses[0].Block != "10.20.0.0/24" {
		t.Errorf("first block %s", a.Addresses[0].Block)
	}
	var b ipamv1.Block
	e.mustDo(201, "POST", "/v1/nodes/n1/blocks", map[string]string{"pool": "default", "family": "ipv4"}, &b)
	if b.Cidr != "10.20.1.0/24" {
		t.Errorf("carved %s", b.Cidr)
	}
	if a := e.plLeaseOK("n2", plLease("c2", "ns", "p2", nil)); a.Addresses[0].Block != "10.20.2.0/24" {
		t.Errorf("n2 block %s", a.Addresses[0].Block)
	}

	// Retiring a CIDR in use: the block carved there before the
	// reservation keeps serving until full; then the node grows elsewhere.
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "retire", "spec": map[string]any{"ipv4": plFam(28, "10.30.0.0/16", "10.40.0.0/16")}}, nil)
	ret := func(id string) map[string]any { return plLease(id, "ns", id, map[string]any{"pool": "retire"}) }
	if a := e.plLeaseOK("r1", ret("r0")); a.Addresses[0].Block != "10.30.0.0/28" {
		t.Fatalf("block before the reservation %s", a.Addresses[0].Block)
	}
	capacity := e.plBlocks("r1").Items[0].Capacity
	retired := map[string]any{"spec": map[string]any{
		"ipv4": plWithCIDRConfig(plFam(28, "10.30.0.0/16", "10.40.0.0/16"), plRange("10.30.0.0/16", [2]string{"10.30.0.0", "10.30.255.255"})),
	}}
	e.mustDo(200, "PUT", "/v1/pools/retire", retired, &p)
	if len(deref(p.Spec.Ipv4.Pool, nil)) != 1 || p.Status.Ipv4.BlocksCarved != 1 {
		t.Errorf("pool with the reservation %s", dump(p))
	}
	for i := int64(1); i < capacity; i++ {
		if a := e.plLeaseOK("r1", ret(fmt.Sprintf("r%d", i))); a.Addresses[0].Block != "10.30.0.0/28" {
			t.Errorf("lease %d in the retired CIDR's block went to %s", i, a.Addresses[0].Block)
		}
	}
	if a := e.plLeaseOK("r1", ret("r-next")); a.Addresses[0].Block != "10.40.0.0/28" {
		t.Errorf("the full node grew into %s, want 10.40.0.0/28", a.Addresses[0].Block)
	}
	if a := e.plLeaseOK("r2", ret("s0")); a.Addresses[0].Block != "10.40.0.16/28" {
		t.Errorf("a new node got %s, want 10.40.0.16/28", a.Addresses[0].Block)
	}
	// The old CIDR goes only once no block of it is left.
	pr := e.plRefuse("PUT", "/v1/pools/retire", map[string]any{"spec": map[string]any{"ipv4": plFam(28, "10.40.0.0/16")}},
		409, "in-use", "spec.ipv4.cidrs")
	plNodes(t, pr, "r1")
	plDetail(t, pr, "still in use by", "10.30.0.0/16")
	// A pool entry must name one of cidrs.
	e.plRefuse("PUT", "/v1/pools/retire", map[string]any{"spec": map[string]any{
		"ipv4": plWithCIDRConfig(plFam(28, "10.40.0.0/16"), plRange("10.30.0.0/16", [2]string{"10.30.0.0", "10.30.255.255"})),
	}}, 400, "invalid-input", "spec.ipv4.pool[0].cidr")
	for i := range capacity {
		e.mustDo(204, "DELETE", fmt.Sprintf("/v1/nodes/r1/attachments/r%d/eth0", i), nil, nil)
	}
	e.clock.Advance(testCooldown)
	e.mustDo(204, "DELETE", "/v1/nodes/r1/blocks?cidr=10.30.0.0/28", nil, nil)
	e.mustDo(200, "PUT", "/v1/pools/retire", map[string]any{"spec": map[string]any{"ipv4": plFam(28, "10.40.0.0/16")}}, &p)
	if !slices.Equal(p.Spec.Ipv4.Cidrs, []string{"10.40.0.0/16"}) || p.Spec.Ipv4.Pool != nil || p.Status.Ipv4.BlocksCarved != 2 {
		t.Errorf("retired pool %s", dump(p))
	}

	// Partial ranges skip exactly the blocks they overlap.
	ranges := [][2]string{{"10.50.0.20", "10.50.0.40"}, {"10.50.0.160", "10.50.0.175"}, {"10.50.0.200", "10.50.0.200"}}
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "partial", "spec": map[string]any{
		"ipv4": plWithCIDRConfig(plFam(28, "10.50.0.0/24"), plRange("10.50.0.0/24", ranges...)),
	}}, nil)
	want := plFreeBlocks("10.50.0.0/24", 28, ranges)
	if len(want) != 12 {
		t.Fatalf("the ranges should leave 12 of 16 blocks, not %d", len(want))
	}
	e.mustDo(201, "PUT", "/v1/nodes/p1", map[string]any{}, nil)
	var got []string
	for range want {
		e.mustDo(201, "POST", "/v1/nodes/p1/blocks", map[string]string{"pool": "partial", "family": "ipv4"}, &b)
		got = append(got, b.Cidr)
	}
	if !slices.Equal(got, want) {
		t.Errorf("carved %v\nwant %v", got, want)
	}
	e.plRefuse("POST", "/v1/nodes/p1/blocks", map[string]string{"pool": "partial", "family": "ipv4"}, 409, "pool-exhausted", "pool")

	// The same for IPv6.
	ranges6 := [][2]string{{"fd50::14", "fd50::28"}, {"fd50::f0", "fd50::ff"}}
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "partial6", "spec": map[string]any{
		"ipv6": plWithCIDRConfig(plFam(124, "fd50::/120"), plRange("fd50::/120", ranges6...)),
	}}, nil)
	want = plFreeBlocks("fd50::/120", 124, ranges6)
	if len(want) != 13 {
		t.Fatalf("the IPv6 ranges should leave 13 of 16 blocks, not %d", len(want))
	}
	got = nil
	for range want {
		e.mustDo(201, "POST", "/v1/nodes/p1/blocks", map[string]string{"pool": "partial6", "family": "ipv6"}, &b)
		got = append(got, b.Cidr)
	}
	if !slices.Equal(got, want) {
		t.Errorf("carved %v\nwant %v", got, want)
	}
	e.plRefuse("POST", "/v1/nodes/p1/blocks", map[string]string{"pool": "partial6", "family": "ipv6"}, 409, "pool-exhausted", "pool")

	// Invalid ranges.
	bad := func(entries ...map[string]any) map[string]any {
		return map[string]any{"name": "bad", "spec": map[string]any{"ipv4": plWithCIDRConfig(plFam(24, "10.60.0.0/16", "10.61.0.0/16"), entries...)}}
	}
	ok60 := [2]string{"10.60.1.0", "10.60.1.255"}
	ok61 := [2]string{"10.61.1.0", "10.61.1.255"}
	tooMany := make([][2]string, 33)
	for i := range tooMany {
		tooMany[i] = [2]string{fmt.Sprintf("10.60.%d.0", i), fmt.Sprintf("10.60.%d.9", i)}
	}
	for _, c := range []struct {
		name  string
		body  map[string]any
		field string
	}{
		{"start after end", bad(plRange("10.60.0.0/16", [2]string{"10.60.0.9", "10.60.0.1"})), "spec.ipv4.pool[0].reservedRanges[0].end"},
		{"start outside the CIDR", bad(plRange("10.60.0.0/16", [2]string{"10.59.255.255", "10.60.0.1"})), "spec.ipv4.pool[0].reservedRanges[0].start"},
		{"end outside the CIDR", bad(plRange("10.60.0.0/16", [2]string{"10.60.0.1", "10.61.0.0"})), "spec.ipv4.pool[0].reservedRanges[0].end"},
		{"range in another CIDR of the pool", bad(plRange("10.60.0.0/16", [2]string{"10.61.0.1", "10.61.0.2"})), "spec.ipv4.pool[0].reservedRanges[0].start"},
		{"cidr not in cidrs", bad(plRange("10.62.0.0/16", [2]string{"10.62.0.1", "10.62.0.2"})), "spec.ipv4.pool[0].cidr"},
		{"cidr inside a listed one", bad(plRange("10.60.0.0/24", [2]string{"10.60.0.1", "10.60.0.2"})), "spec.ipv4.pool[0].cidr"},
		{"cidr listed twice", bad(plRange("10.60.0.0/16", ok60), plRange("10.60.0.0/16", ok60)), "spec.ipv4.pool[1].cidr"},
		{"bad range in the second entry", bad(plRange("10.60.0.0/16", ok60), plRange("10.61.0.0/16", ok61, [2]string{"10.61.0.9", "10.61.0.8"})),
			"spec.ipv4.pool[1].reservedRanges[1].end"},
		{"malformed start", bad(plRange("10.60.0.0/16", [2]string{"10.60.0.256", "10.60.1.0"})), "spec.ipv4.pool[0].reservedRanges[0].start"},
		{"IPv6 end in an IPv4 CIDR", bad(plRange("10.60.0.0/16", [2]string{"10.60.0.1", "fd00::1"})), "spec.ipv4.pool[0].reservedRanges[0].end"},
		{"cidr with host bits", bad(plRange("10.60.0.1/16", ok60)), "spec.ipv4.pool[0].cidr"},
		{"33 ranges", bad(plRange("10.60.0.0/16", tooMany...)), "spec.ipv4.pool[0].reservedRanges"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			defer func() { e.t = nil }()
			e.plRefuse("POST", "/v1/pools", c.body, 400, "invalid-input", c.field)
		})
	}
	e.t = t
	// And on update.
	e.plRefuse("PUT", "/v1/pools/default", map[string]any{"spec": map[string]any{
		"ipv4": plWithCIDRConfig(plFam(24, "10.10.0.0/16", "10.20.0.0/16"), plRange("10.20.0.0/16", [2]string{"10.20.0.5", "10.20.0.4"})),
	}}, 400, "invalid-input", "spec.ipv4.pool[0].reservedRanges[0].end")
}

// TestDisabledPool: a disabled pool carves no new block, while leases from
// the blocks nodes already hold go on and existing leases stay.
func TestDisabledPool(t *testing.T) {
	e := newEnv(t, nil)
	spec := func(disabled bool) map[string]any {
		return map[string]any{"ipv4": plFam(28, "10.0.0.0/16"), "disabled": disabled}
	}
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": spec(false)}, nil)
	first := []ipamv1.Allocation{e.plLeaseOK("n1", plLease("c1", "ns", "p1", nil)), e.plLeaseOK("n1", plLease("c2", "ns", "p2", nil))}
	e.mustDo(200, "POST", "/v1/nodes/n1/attachments/c1/eth0/confirm", nil, nil)
	before := e.plLeases("")
	capacity := e.plBlocks("n1").Items[0].Capacity

	var p ipamv1.Pool
	e.mustDo(200, "PUT", "/v1/pools/default", map[string]any{"spec": spec(true)}, &p)
	if !deref(p.Spec.Disabled, false) || p.Status.Ipv4.BlocksCarved != 1 {
		t.Fatalf("disabled pool %s", dump(p))
	}
	for i := int64(2); i < capacity; i++ {
		if a := e.plLeaseOK("n1", plLease(fmt.Sprintf("c%d", i+1), "ns", fmt.Sprintf("p%d", i+1), nil)); a.Addresses[0].Block != "10.0.0.0/28" {
			t.Errorf("lease %d from %s", i+1, a.Addresses[0].Block)
		}
	}
	checkDisabled := func(p ipamv1.Problem) {
		t.Helper()
		plDetail(t, p, "disabled")
		if deref(p.Pool, "") != "default" || deref(p.Family, "") != ipamv1.Ipv4 {
			t.Errorf("problem pool %q family %q", deref(p.Pool, ""), deref(p.Family, ""))
		}
	}
	checkDisabled(e.plRefuse("POST", "/v1/nodes/n1/leases", plLease("c-over", "ns", "over", nil), 409, "pool-exhausted", "pool"))
	checkDisabled(e.plRefuse("POST", "/v1/nodes/n2/leases", plLease("d1", "ns", "d1", nil), 409, "pool-exhausted", "pool"))
	checkDisabled(e.plRefuse("POST", "/v1/nodes/n1/blocks", map[string]string{"pool": "default", "family": "ipv4"}, 409, "pool-exhausted", "pool"))

	// The leases made before the pool was disabled are untouched.
	after := e.plLeases("")
	if int64(len(after.Items)) != capacity {
		t.Errorf("%d leases, want %d", len(after.Items), capacity)
	}
	for _, l := range before.Items {
		i := slices.IndexFunc(after.Items, func(x ipamv1.Lease) bool { return x.Address == l.Address })
		if i < 0 || dump(after.Items[i]) != dump(l) {
			t.Errorf("lease %s changed or went: %s", dump(l), dump(after.Items))
		}
	}
	// A released address is leased again from the existing block.
	e.mustDo(204, "DELETE", "/v1/nodes/n1/attachments/c2/eth0", nil, nil)
	e.clock.Advance(testCooldown)
	if a := e.plLeaseOK("n1", plLease("c-reuse", "ns", "reuse", nil)); a.Addresses[0].Address != first[1].Addresses[0].Address {
		t.Errorf("reuse leased %s, want %s", a.Addresses[0].Address, first[1].Addresses[0].Address)
	}

	// Enabled again, a new node gets a block.
	e.mustDo(200, "PUT", "/v1/pools/default", map[string]any{"spec": spec(false)}, nil)
	if a := e.plLeaseOK("n2", plLease("d1", "ns", "d1", nil)); a.Addresses[0].Block != "10.0.0.16/28" {
		t.Errorf("n2 block %s", a.Addresses[0].Block)
	}

	// A disabled cluster-pool pool gives a registering node no block.
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "cp", "spec": map[string]any{
		"ipv4": plFam(28, "10.1.0.0/16"), "mode": "cluster-pool", "disabled": true,
	}}, nil)
	e.mustDo(201, "PUT", "/v1/nodes/n3", map[string]any{}, nil)
	if got := e.plBlocks("n3"); len(got.Items) != 0 {
		t.Errorf("a disabled cluster-pool pool gave n3 %s", dump(got))
	}
	pr := e.plRefuse("POST", "/v1/nodes/n3/leases", plLease("e1", "ns", "e1", map[string]any{"pool": "cp"}), 409, "pool-exhausted", "pool")
	plDetail(t, pr, "disabled")
}

// TestAdoptPodCIDRs: CIDRs Kubernetes assigned a node (Node.spec.podCIDRs,
// host scope) become its blocks; Cilium's conflict message for a node that
// holds others; a CIDR of another node is an overlap naming it.
func TestAdoptPodCIDRs(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": map[string]any{
		"ipv4": plFam(24, "10.244.0.0/16"), "mode": "cluster-pool",
	}}, nil)
	node := func(cidrs ...string) map[string]any { return map[string]any{"podCIDRs": cidrs} }

	var n ipamv1.Node
	e.mustDo(201, "PUT", "/v1/nodes/n1", node("10.244.5.0/24"), &n)
	if n.Blocks != 1 {
		t.Errorf("registered %s", dump(n))
	}
	bl := e.plBlocks("n1")
	if len(bl.Items) != 1 {
		t.Fatalf("blocks %s", dump(bl))
	}
	if b := bl.Items[0]; b.Cidr != "10.244.5.0/24" || deref(b.Source, "") != ipamv1.Adopted || b.Pool != "default" ||
		deref(b.Gateway, "") != "10.244.5.1" || b.Capacity != 252 {
		t.Errorf("adopted %s", dump(b))
	}
	for i := range 3 {
		a := e.plLeaseOK("n1", plLease(fmt.Sprintf("c%d", i), "ns", fmt.Sprintf("p%d", i), nil))
		if got := a.Addresses[0]; got.Block != "10.244.5.0/24" || got.Address != fmt.Sprintf("10.244.5.%d/24", 3+i) || deref(got.Gateway, "") != "10.244.5.1" {
			t.Errorf("lease %d: %s", i, dump(got))
		}
	}

	// Registering again with the same CIDRs changes nothing.
	before := e.snapshot()
	e.mustDo(200, "PUT", "/v1/nodes/n1", node("10.244.5.0/24"), &n)
	e.plUnchanged(before)
	if n.Blocks != 1 || n.Leases != 3 {
		t.Errorf("re-registered %s", dump(n))
	}

	// Another CIDR of the same pool and family: Cilium's conflict.
	pr := e.plRefuse("PUT", "/v1/nodes/n1", node("10.244.6.0/24"), 409, "conflict", "podCIDRs[0]")
	if want := "node has CIDRs allocated (10.244.5.0/24) that conflict with requested CIDRs (10.244.6.0/24)"; deref(pr.Detail, "") != want {
		t.Errorf("detail %q, want %q", deref(pr.Detail, ""), want)
	}

	// A CIDR another node holds, adopted or carved.
	pr = e.plRefuse("PUT", "/v1/nodes/n2", node("10.244.5.0/24"), 409, "overlap", "podCIDRs[0]")
	plNodes(t, pr, "n1")
	plDetail(t, pr, "n1")
	e.mustDo(201, "PUT", "/v1/nodes/n3", map[string]any{}, nil)
	if got := e.plBlocks("n3"); len(got.Items) != 1 || got.Items[0].Cidr != "10.244.0.0/24" || deref(got.Items[0].Source, "") != ipamv1.Carved {
		t.Fatalf("n3 blocks %s", dump(got))
	}
	pr = e.plRefuse("PUT", "/v1/nodes/n2", node("10.244.9.0/24", "10.244.0.0/24"), 409, "overlap", "podCIDRs[1]")
	plNodes(t, pr, "n3")
	plDetail(t, pr, "n3")

	// Outside every pool, the wrong mask, malformed.
	for _, c := range []struct {
		name  string
		cidrs []string
		field string
	}{
		{"outside every pool", []string{"192.168.0.0/24"}, "podCIDRs[0]"},
		{"the wrong mask", []string{"10.244.7.0/25"}, "podCIDRs[0]"},
		{"a whole pool CIDR", []string{"10.244.0.0/16"}, "podCIDRs[0]"},
		{"the second outside every pool", []string{"10.244.8.0/24", "10.245.0.0/24"}, "podCIDRs[1]"},
		{"host bits set", []string{"10.244.9.1/24"}, "podCIDRs[0]"},
		{"not a CIDR", []string{"10.244.9.0"}, "podCIDRs[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.t = t
			defer func() { e.t = nil }()
			e.plRefuse("PUT", "/v1/nodes/n2", node(c.cidrs...), 400, "invalid-input", c.field)
		})
	}
	e.t = t

	// A free CIDR is adopted for n2, and its leases come from it.
	e.mustDo(201, "PUT", "/v1/nodes/n2", node("10.244.9.0/24"), nil)
	if a := e.plLeaseOK("n2", plLease("d0", "ns", "d0", nil)); a.Addresses[0].Block != "10.244.9.0/24" {
		t.Errorf("n2 leased %s", dump(a.Addresses))
	}
	if got := plBlockCIDRs(e.plBlocks("n2")); !slices.Equal(got, []string{"10.244.9.0/24"}) {
		t.Errorf("n2 blocks %v", got)
	}
}

// TestSkipMasquerade: a pool's skipMasquerade is returned with every lease
// address of it and in the lease list.
func TestSkipMasquerade(t *testing.T) {
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "default", "spec": map[string]any{"ipv4": plFam(24, "10.0.0.0/16")}}, nil)
	var p ipamv1.Pool
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "routable", "spec": map[string]any{
		"ipv4": plFam(24, "10.1.0.0/16"), "ipv6": plFam(120, "fd01::/104"), "skipMasquerade": true,
	}}, &p)
	if !deref(p.Spec.SkipMasquerade, false) {
		t.Errorf("spec %s", dump(p.Spec))
	}

	checkAll := func(a ipamv1.Allocation, n int, want bool) {
		t.Helper()
		if len(a.Addresses) != n {
			t.Fatalf("addresses %s", dump(a.Addresses))
		}
		for _, ad := range a.Addresses {
			if ad.SkipMasquerade != want {
				t.Errorf("%s skipMasquerade %v, want %v", ad.Address, ad.SkipMasquerade, want)
			}
		}
	}
	byRequest := plLease("r1", "ns", "p1", map[string]any{"pool": "routable"})
	checkAll(e.plLeaseOK("n1", byRequest), 2, true)
	byAnnotation := e.plLeaseOK("n1", plLease("r2", "ns", "p2", map[string]any{"pod": plMeta(nil, plKV(plAnnIPPool, "routable"))}))
	checkAll(byAnnotation, 2, true)
	checkAll(e.plLeaseOK("n1", plLease("d1", "ns", "p3", nil)), 1, false)
	// A retry answers it too.
	var again ipamv1.Allocation
	e.mustDo(200, "POST", "/v1/nodes/n1/leases", byRequest, &again)
	checkAll(again, 2, true)
	// The field is always present on the wire.
	res := e.do("POST", "/v1/nodes/n1/leases", plLease("d2", "ns", "p4", nil))
	if res.status != 201 || !strings.Contains(string(res.body), `"skipMasquerade":false`) {
		t.Errorf("allocation %d %s", res.status, res.body)
	}

	for pool, want := range map[string]struct {
		n    int
		skip bool
	}{"routable": {4, true}, "default": {2, false}} {
		l := e.plLeases("pool=" + pool)
		if len(l.Items) != want.n {
			t.Errorf("pool %s: %d leases, want %d", pool, len(l.Items), want.n)
		}
		for _, it := range l.Items {
			if it.SkipMasquerade == nil || *it.SkipMasquerade != want.skip {
				t.Errorf("lease %s skipMasquerade %v, want %v", it.Address, dump(it.SkipMasquerade), want.skip)
			}
		}
	}
	var l ipamv1.Lease
	addr := netip.MustParsePrefix(byAnnotation.Addresses[1].Address).Addr().String()
	e.mustDo(200, "GET", "/v1/addresses/"+addr, nil, &l)
	if l.SkipMasquerade == nil || !*l.SkipMasquerade || l.Pool != "routable" {
		t.Errorf("address %s", dump(l))
	}
}
