// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package kube

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/ipam-dev/ipam/internal/kubetest"
)

// The tests share one real API server; each works in namespaces of its
// own, named after it.
func TestMain(m *testing.M) {
	kubetest.Main(m)
}

const poolAnnotation = "ipam.cilium.io/ip-pool"

// nsName is a namespace name of the test's own: its name as a DNS label.
func nsName(t *testing.T, suffix string) string {
	n := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
	n = strings.TrimPrefix(n, "test")
	if suffix != "" {
		n += "-" + suffix
	}
	return strings.Trim(n[:min(len(n), 63)], "-")
}

func testConfig(t *testing.T) Config {
	return Config{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))}
}

// getCounter counts the GETs of single objects a client sent, by URL
// path (lists and watches are GETs of collections, with other paths).
type getCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (g *getCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodGet && r.URL.Query().Get("watch") == "" {
			g.mu.Lock()
			g.n[r.URL.Path]++
			g.mu.Unlock()
		}
		return rt.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// podGets is how many GETs of Pod namespace/name the client sent.
func (g *getCounter) podGets(namespace, name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n["/api/v1/namespaces/"+namespace+"/pods/"+name]
}

// namespaceGets is how many GETs of namespace name the client sent.
func (g *getCounter) namespaceGets(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n["/api/v1/namespaces/"+name]
}

// newInformers builds informers over rc (the cluster administrator's
// configuration when nil) whose GETs are counted; not started.
func newInformers(t *testing.T, c *kubetest.Cluster, rc *rest.Config) (*Informers, *getCounter) {
	t.Helper()
	if rc == nil {
		rc = c.Config()
	}
	g := &getCounter{n: map[string]int{}}
	rc.Wrap(g.wrap)
	i, err := NewForConfig(rc, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	return i, g
}

// started returns informers over the cluster, started and synced, that
// stop with ctx.
func started(ctx context.Context, t *testing.T, c *kubetest.Cluster) (*Informers, *getCounter) {
	t.Helper()
	i, g := newInformers(t, c, nil)
	i.Start(ctx)
	wctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := i.WaitForSync(wctx); err != nil {
		t.Fatalf("WaitForSync: %v", err)
	}
	if !i.Synced() {
		t.Fatal("Synced false after WaitForSync")
	}
	return i, g
}

// eventually polls cond until it holds or a deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cached waits until the Pod cache holds pod (the watch delivered it).
func cached(t *testing.T, i *Informers, pod *corev1.Pod) {
	t.Helper()
	eventually(t, "pod "+pod.Namespace+"/"+pod.Name+" in the cache", func() bool {
		got, err := i.pods.lister.Pods(pod.Namespace).Get(pod.Name)
		return err == nil && got.UID == pod.UID
	})
}

func TestLookupCacheHit(t *testing.T) {
	c := kubetest.Shared(t)
	ns := nsName(t, "")
	c.CreateNamespace(t, ns, map[string]string{"team": "a"}, map[string]string{poolAnnotation: "ns-pool"})
	web := c.CreatePod(t, ns, "web-0", "node-a", map[string]string{"app": "web"}, map[string]string{poolAnnotation: "pod-pool"})
	bare := c.CreatePod(t, ns, "bare", "", nil, nil)
	i, g := started(t.Context(), t, c)
	cached(t, i, web)
	cached(t, i, bare)

	got, err := i.Lookup(t.Context(), ns, "web-0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Pod.Labels["app"] != "web" || got.Pod.Annotations[poolAnnotation] != "pod-pool" {
		t.Errorf("pod metadata = %+v", got.Pod)
	}
	if got.Namespace.Labels["team"] != "a" || got.Namespace.Annotations[poolAnnotation] != "ns-pool" {
		t.Errorf("namespace metadata = %+v", got.Namespace)
	}
	if got.NodeName != "node-a" || got.UID != string(web.UID) {
		t.Errorf("placement = %q %q, want node-a %s", got.NodeName, got.UID, web.UID)
	}
	if n := g.podGets(ns, "web-0") + g.namespaceGets(ns); n != 0 {
		t.Errorf("cache hit made %d GETs", n)
	}

	// The maps are copies: changing them leaves the cache alone.
	got.Pod.Labels["app"] = "changed"
	got.Pod.Annotations[poolAnnotation] = "changed"
	got.Namespace.Labels["team"] = "changed"
	got.Namespace.Annotations["new"] = "x"
	again, err := i.Lookup(t.Context(), ns, "web-0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.Pod.Labels["app"] != "web" || again.Pod.Annotations[poolAnnotation] != "pod-pool" ||
		again.Namespace.Labels["team"] != "a" || len(again.Namespace.Annotations) != 1 {
		t.Errorf("cache changed through returned maps: %+v", again)
	}

	// An object without labels or annotations gives empty maps, not nil;
	// an unscheduled Pod no node.
	b, err := i.Lookup(t.Context(), ns, "bare", nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.Pod.Labels == nil || b.Pod.Annotations == nil || len(b.Pod.Labels)+len(b.Pod.Annotations) != 0 || b.NodeName != "" {
		t.Errorf("bare pod = %#v", b)
	}
}

// The cache follows the API server: an annotation changed, and a Pod the
// scheduler binds (pods/binding), without a GET.
func TestLookupSeesUpdate(t *testing.T) {
	c := kubetest.Shared(t)
	ns := nsName(t, "")
	c.CreateNamespace(t, ns, nil, nil)
	pod := c.CreatePod(t, ns, "web-0", "", nil, map[string]string{poolAnnotation: "old"})
	i, g := started(t.Context(), t, c)
	cached(t, i, pod)
	got, err := i.Lookup(t.Context(), ns, "web-0", nil)
	if err != nil || got.Pod.Annotations[poolAnnotation] != "old" || got.NodeName != "" {
		t.Fatalf("before update: %+v, %v", got, err)
	}

	cs := kubernetes.NewForConfigOrDie(c.Config())
	pod.Annotations[poolAnnotation] = "new"
	if _, err := cs.CoreV1().Pods(ns).Update(t.Context(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.BindPod(t, ns, "web-0", "node-a")
	eventually(t, "the updated annotation and the binding", func() bool {
		got, err := i.Lookup(t.Context(), ns, "web-0", nil)
		if err != nil {
			t.Fatal(err)
		}
		return got.Pod.Annotations[poolAnnotation] == "new" && got.NodeName == "node-a"
	})
	if n := g.podGets(ns, "web-0"); n != 0 {
		t.Errorf("%d pod GETs, want none (cache hits)", n)
	}
}

func TestLookupCacheMissFallsBackToGet(t *testing.T) {
	c := kubetest.Shared(t)
	ns := nsName(t, "")
	c.CreateNamespace(t, ns, map[string]string{"team": "a"}, nil)
	i, g := newInformers(t, c, nil)
	// Only the namespace informer runs, so the Pod is never in the cache:
	// the state right after Pod creation, before the watch delivers it.
	go i.namespaces.informer.RunWithContext(t.Context())
	eventually(t, "the namespace cache", func() bool {
		_, err := i.namespaces.lister.Get(ns)
		return err == nil
	})

	created := c.CreatePod(t, ns, "web-0", "node-a", map[string]string{"app": "web"},
		map[string]string{poolAnnotation: "pod-pool", lastApplied: `{"big":"json"}`})
	got, err := i.Lookup(t.Context(), ns, "web-0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Pod.Labels["app"] != "web" || got.Pod.Annotations[poolAnnotation] != "pod-pool" || got.Namespace.Labels["team"] != "a" ||
		got.NodeName != "node-a" || got.UID != string(created.UID) {
		t.Errorf("lookup = %+v", got)
	}
	if _, ok := got.Pod.Annotations[lastApplied]; ok {
		t.Error("fallback kept last-applied-configuration")
	}
	if n := g.podGets(ns, "web-0"); n != 1 {
		t.Errorf("%d pod GETs, want 1", n)
	}
	if n := g.namespaceGets(ns); n != 0 {
		t.Errorf("%d namespace GETs, want 0 (cached)", n)
	}
	if i.Synced() {
		t.Error("Synced true with the pod informer not running")
	}
}

// A caller that finds the cached Pod other than it expected (bound to
// another node, or to none yet) has it read again from the API server,
// whose answer stands: the cache lags behind the scheduler, and behind a
// StatefulSet Pod recreated under the same name on another node. Without
// that expectation, or when the cached Pod meets it, the cache answers.
func TestLookupRechecksStaleCache(t *testing.T) {
	c := kubetest.Shared(t)
	ns := nsName(t, "")
	c.CreateNamespace(t, ns, nil, nil)
	old := c.CreatePod(t, ns, "web-0", "node-b", nil, nil)
	gone := c.CreatePod(t, ns, "gone", "node-b", nil, nil)
	ctx, stop := context.WithCancel(t.Context())
	i, g := started(ctx, t, c)
	cached(t, i, old)
	cached(t, i, gone)
	// Freeze the cache: the watch stops, the cache keeps what it holds.
	stop()
	eventually(t, "the informers to stop", func() bool {
		return i.pods.informer.IsStopped() && i.namespaces.informer.IsStopped()
	})
	c.DeletePod(t, ns, "web-0")
	moved := c.CreatePod(t, ns, "web-0", "node-a", nil, nil)
	c.DeletePod(t, ns, "gone")

	onNodeA := func(p PodInfo) bool { return p.NodeName != "node-a" }
	got, err := i.Lookup(t.Context(), ns, "web-0", nil)
	if err != nil || got.NodeName != "node-b" || got.UID != string(old.UID) || g.podGets(ns, "web-0") != 0 {
		t.Fatalf("without an expectation: %+v %v, %d GETs; want the cached Pod on node-b", got, err, g.podGets(ns, "web-0"))
	}
	got, err = i.Lookup(t.Context(), ns, "web-0", onNodeA)
	if err != nil || got.NodeName != "node-a" || got.UID != string(moved.UID) {
		t.Fatalf("expecting node-a: %+v %v; want the recreated Pod on node-a", got, err)
	}
	if n := g.podGets(ns, "web-0"); n != 1 {
		t.Errorf("%d pod GETs, want 1", n)
	}
	// The cache is not changed by the GET (the watch would fill it in).
	if got, _ := i.Lookup(t.Context(), ns, "web-0", nil); got.NodeName != "node-b" {
		t.Errorf("the recheck changed the cache: %+v", got)
	}
	// A cached Pod that meets the expectation is not read again.
	got, err = i.Lookup(t.Context(), ns, "web-0", func(p PodInfo) bool { return p.NodeName != "node-b" })
	if err != nil || got.NodeName != "node-b" || g.podGets(ns, "web-0") != 1 {
		t.Errorf("expecting node-b: %+v %v, %d GETs; want the cache alone", got, err, g.podGets(ns, "web-0"))
	}
	// A Pod gone from the API server but not from the cache.
	if _, err := i.Lookup(t.Context(), ns, "gone", onNodeA); !errors.Is(err, ErrNotFound) {
		t.Errorf("a deleted Pod still cached: %v, want ErrNotFound", err)
	}
}

func TestLookupNotFound(t *testing.T) {
	c := kubetest.Shared(t)
	ns := nsName(t, "")
	c.CreateNamespace(t, ns, nil, nil)
	c.CreatePod(t, ns, "web-0", "node-a", nil, nil)
	i, _ := started(t.Context(), t, c)
	missingNS := nsName(t, "missing")

	for _, tc := range []struct{ namespace, name, mention string }{
		{ns, "missing", "pods " + ns + "/missing"},
		{missingNS, "web-0", "namespaces " + missingNS},
	} {
		_, err := i.Lookup(t.Context(), tc.namespace, tc.name, nil)
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("Lookup(%s, %s) = %v, want ErrNotFound", tc.namespace, tc.name, err)
		} else if !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("Lookup(%s, %s) error %q does not name %q", tc.namespace, tc.name, err, tc.mention)
		}
	}
}

// A failed GET that is not a 404 (here RBAC's: a user who may read
// namespaces but not Pods) is wrapped, with the object named, and never
// taken for an absent Pod.
func TestLookupOtherErrorsWrapped(t *testing.T) {
	c := kubetest.Shared(t)
	ns := nsName(t, "")
	c.CreateNamespace(t, ns, nil, nil)
	c.CreatePod(t, ns, "web-0", "node-a", nil, nil)
	user := ns + "-reader"
	cs := kubernetes.NewForConfigOrDie(c.Config())
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}}}}
	if _, err := cs.RbacV1().ClusterRoles().Create(t.Context(), role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: user}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(t.Context(), binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.WaitAllowed(t, user, nil, kubetest.Access{Verb: "get", Resource: "namespaces", Name: ns})
	i, g := newInformers(t, c, c.ConfigAs(user)) // not started: every lookup misses

	_, err := i.Lookup(t.Context(), ns, "web-0", nil)
	if err == nil || errors.Is(err, ErrNotFound) || !apierrors.IsForbidden(err) {
		t.Fatalf("Lookup = %v, want a wrapped Forbidden", err)
	}
	if !strings.Contains(err.Error(), "pods "+ns+"/web-0") {
		t.Errorf("error %q lacks context", err)
	}
	if n := g.podGets(ns, "web-0"); n != 1 {
		t.Errorf("%d pod GETs, want 1", n)
	}
}

func TestLookupInvalidInput(t *testing.T) {
	c := kubetest.Shared(t)
	i, _ := newInformers(t, c, nil)
	for _, args := range [][2]string{{"", "web-0"}, {"team-a", ""}, {"", ""}} {
		_, err := i.Lookup(t.Context(), args[0], args[1], nil)
		if err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("Lookup(%q, %q) = %v, want an input error", args[0], args[1], err)
		}
	}
}

// The transforms keep of a Pod its key, UID, resource version, labels,
// annotations but kubectl's last-applied-configuration, and spec.nodeName;
// of a namespace the same metadata. The informers apply them.
func TestTransformTrims(t *testing.T) {
	meta := metav1.ObjectMeta{
		Namespace: "team-a", Name: "web-0", UID: "uid-web-0", ResourceVersion: "42", GenerateName: "web-",
		Labels:          map[string]string{"app": "web"},
		Annotations:     map[string]string{poolAnnotation: "p", lastApplied: `{"big":"json"}`},
		ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}},
		OwnerReferences: []metav1.OwnerReference{{Name: "web"}},
		Finalizers:      []string{"x"},
	}
	want := metav1.ObjectMeta{
		Namespace: "team-a", Name: "web-0", UID: "uid-web-0", ResourceVersion: "42",
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{poolAnnotation: "p"},
	}
	in := &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{NodeName: "node-a",
		Containers: []corev1.Container{{Name: "main", Image: "app"}}, Volumes: []corev1.Volume{{Name: "v"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1"}}
	out, err := trimPod(in)
	if err != nil {
		t.Fatal(err)
	}
	p := out.(*corev1.Pod)
	if !apiEqual(p.ObjectMeta, want) || p.Spec.NodeName != "node-a" || len(p.Spec.Containers)+len(p.Spec.Volumes) != 0 ||
		p.Status.Phase != "" || p.Status.PodIP != "" {
		t.Errorf("trimmed pod = %+v\nwant %+v on node-a", p, want)
	}
	if _, ok := in.Annotations[lastApplied]; !ok || len(in.Spec.Containers) != 1 {
		t.Error("trimPod changed its input")
	}
	// Idempotent, as client-go requires.
	again, _ := trimPod(p)
	if ap := again.(*corev1.Pod); !apiEqual(ap.ObjectMeta, want) || ap.Spec.NodeName != "node-a" {
		t.Error("trimPod is not idempotent")
	}
	m, _ := trim(&metav1.PartialObjectMetadata{ObjectMeta: meta})
	if !apiEqual(m.(*metav1.PartialObjectMetadata).ObjectMeta, want) {
		t.Errorf("trimmed metadata = %+v", m)
	}
	// Other objects (tombstones) pass through.
	tomb := "not an object"
	if o, _ := trim(tomb); o != tomb {
		t.Error("trim changed a foreign object")
	}
	if o, _ := trimPod(tomb); o != tomb {
		t.Error("trimPod changed a foreign object")
	}

	// The informers apply them: the caches hold trimmed objects.
	c := kubetest.Shared(t)
	ns := nsName(t, "")
	c.CreateNamespace(t, ns, nil, map[string]string{lastApplied: `{"big":"json"}`, poolAnnotation: "n"})
	pod := c.CreatePod(t, ns, "web-0", "node-a", nil, map[string]string{poolAnnotation: "p", lastApplied: `{"big":"json"}`})
	i, _ := started(t.Context(), t, c)
	cached(t, i, pod)
	cp, err := i.pods.lister.Pods(ns).Get("web-0")
	if err != nil {
		t.Fatal(err)
	}
	if cp.ManagedFields != nil || len(cp.Spec.Containers) != 0 || cp.Spec.NodeName != "node-a" || cp.Status.Phase != "" {
		t.Errorf("cached pod not trimmed: %+v", cp)
	}
	if _, ok := cp.Annotations[lastApplied]; ok || cp.Annotations[poolAnnotation] != "p" {
		t.Errorf("cached pod annotations = %v", cp.Annotations)
	}
	cn, err := i.namespaces.lister.Get(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cn.Annotations[lastApplied]; ok || cn.ManagedFields != nil || cn.Annotations[poolAnnotation] != "n" {
		t.Errorf("cached namespace not trimmed: %+v", cn.ObjectMeta)
	}
}

func apiEqual(a, b metav1.ObjectMeta) bool {
	if a.Namespace != b.Namespace || a.Name != b.Name || a.UID != b.UID || a.ResourceVersion != b.ResourceVersion ||
		a.GenerateName != b.GenerateName || a.ManagedFields != nil || a.OwnerReferences != nil || a.Finalizers != nil ||
		len(a.Labels) != len(b.Labels) || len(a.Annotations) != len(b.Annotations) {
		return false
	}
	for k, v := range b.Labels {
		if a.Labels[k] != v {
			return false
		}
	}
	for k, v := range b.Annotations {
		if a.Annotations[k] != v {
			return false
		}
	}
	return true
}

func TestWaitForSync(t *testing.T) {
	c := kubetest.Shared(t)
	i, _ := newInformers(t, c, nil)
	if i.Synced() {
		t.Error("Synced true before Start")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := i.WaitForSync(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitForSync with a cancelled context = %v, want context.Canceled", err)
	}

	started(t.Context(), t, c) // WaitForSync returns nil after Start.
}

func TestNewKubeconfig(t *testing.T) {
	if _, err := New(Config{Kubeconfig: filepath.Join(t.TempDir(), "missing")}); err == nil {
		t.Error("New with a missing kubeconfig succeeded")
	}

	path := filepath.Join(t.TempDir(), "kubeconfig")
	const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:1
    insecure-skip-tls-verify: true
users:
- name: test
  user:
    token: not-a-real-token
contexts:
- name: test
  context:
    cluster: test
    user: test
current-context: test
`
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	i, err := New(Config{Kubeconfig: path, QPS: 50, Burst: 100})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if i.Synced() {
		t.Error("Synced true without Start")
	}
}

func TestNewInClusterOutsideCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := New(Config{}); !errors.Is(err, rest.ErrNotInCluster) {
		t.Errorf("New outside a cluster = %v, want rest.ErrNotInCluster", err)
	}
}
