// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package kube

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/metadata/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
)

const poolAnnotation = "ipam.cilium.io/ip-pool"

func object(kind, namespace, name string, labels, annotations map[string]string) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: kind},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace, Name: name, UID: types.UID("uid-" + name),
			Labels: labels, Annotations: annotations,
		},
	}
}

func pod(namespace, name string, labels, annotations map[string]string) *metav1.PartialObjectMetadata {
	return object("Pod", namespace, name, labels, annotations)
}

func namespace(name string, labels, annotations map[string]string) *metav1.PartialObjectMetadata {
	return object("Namespace", "", name, labels, annotations)
}

func newClient(objs ...runtime.Object) *fake.FakeMetadataClient {
	scheme := fake.NewTestScheme()
	if err := metav1.AddMetaToScheme(scheme); err != nil {
		panic(err)
	}
	return fake.NewSimpleMetadataClient(scheme, objs...)
}

func testConfig(t *testing.T) Config {
	return Config{Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))}
}

// started returns informers over c, started and synced, that stop with the
// test.
func started(t *testing.T, c *fake.FakeMetadataClient) *Informers {
	t.Helper()
	i := NewFromClient(c, testConfig(t))
	i.Start(t.Context())
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := i.WaitForSync(ctx); err != nil {
		t.Fatalf("WaitForSync: %v", err)
	}
	if !i.Synced() {
		t.Fatal("Synced false after WaitForSync")
	}
	return i
}

// gets counts the GETs of resource the client served.
func gets(c *fake.FakeMetadataClient, resource string) int {
	n := 0
	for _, a := range c.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == resource {
			n++
		}
	}
	return n
}

// eventually polls cond until it holds or a deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLookupCacheHit(t *testing.T) {
	c := newClient(
		namespace("team-a", map[string]string{"team": "a"}, map[string]string{poolAnnotation: "ns-pool"}),
		pod("team-a", "web-0", map[string]string{"app": "web"}, map[string]string{poolAnnotation: "pod-pool"}),
		pod("team-a", "bare", nil, nil),
	)
	i := started(t, c)
	before := len(c.Actions())

	got, err := i.Lookup(t.Context(), "team-a", "web-0")
	if err != nil {
		t.Fatal(err)
	}
	if got.Pod.Labels["app"] != "web" || got.Pod.Annotations[poolAnnotation] != "pod-pool" {
		t.Errorf("pod metadata = %+v", got.Pod)
	}
	if got.Namespace.Labels["team"] != "a" || got.Namespace.Annotations[poolAnnotation] != "ns-pool" {
		t.Errorf("namespace metadata = %+v", got.Namespace)
	}
	if n := len(c.Actions()) - before; n != 0 {
		t.Errorf("cache hit made %d API calls", n)
	}

	// The maps are copies: changing them leaves the cache alone.
	got.Pod.Labels["app"] = "changed"
	got.Pod.Annotations[poolAnnotation] = "changed"
	got.Namespace.Labels["team"] = "changed"
	got.Namespace.Annotations["new"] = "x"
	again, err := i.Lookup(t.Context(), "team-a", "web-0")
	if err != nil {
		t.Fatal(err)
	}
	if again.Pod.Labels["app"] != "web" || again.Pod.Annotations[poolAnnotation] != "pod-pool" ||
		again.Namespace.Labels["team"] != "a" || len(again.Namespace.Annotations) != 1 {
		t.Errorf("cache changed through returned maps: %+v", again)
	}

	// An object without labels or annotations gives empty maps, not nil.
	bare, err := i.Lookup(t.Context(), "team-a", "bare")
	if err != nil {
		t.Fatal(err)
	}
	if bare.Pod.Labels == nil || bare.Pod.Annotations == nil || len(bare.Pod.Labels)+len(bare.Pod.Annotations) != 0 {
		t.Errorf("bare pod metadata = %#v", bare.Pod)
	}
}

func TestLookupSeesUpdate(t *testing.T) {
	c := newClient(
		namespace("team-a", nil, nil),
		pod("team-a", "web-0", nil, map[string]string{poolAnnotation: "old"}),
	)
	i := started(t, c)
	got, err := i.Lookup(t.Context(), "team-a", "web-0")
	if err != nil || got.Pod.Annotations[poolAnnotation] != "old" {
		t.Fatalf("before update: %+v, %v", got.Pod, err)
	}

	updated := pod("team-a", "web-0", nil, map[string]string{poolAnnotation: "new"})
	podClient := c.Resource(podsGVR).Namespace("team-a").(fake.MetadataClient)
	if _, err := podClient.UpdateFake(updated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the updated annotation", func() bool {
		got, err := i.Lookup(t.Context(), "team-a", "web-0")
		if err != nil {
			t.Fatal(err)
		}
		return got.Pod.Annotations[poolAnnotation] == "new"
	})
	if n := gets(c, "pods"); n != 0 {
		t.Errorf("%d pod GETs, want none (cache hits)", n)
	}
}

func TestLookupCacheMissFallsBackToGet(t *testing.T) {
	c := newClient(namespace("team-a", map[string]string{"team": "a"}, nil))
	i := NewFromClient(c, testConfig(t))
	// Only the namespace informer runs, so the Pod is never in the cache:
	// the state right after Pod creation, before the watch delivers it.
	go i.namespaces.informer.RunWithContext(t.Context())
	eventually(t, "the namespace cache", i.namespaces.informer.HasSynced)

	created := pod("team-a", "web-0", map[string]string{"app": "web"},
		map[string]string{poolAnnotation: "pod-pool", lastApplied: `{"big":"json"}`})
	created.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	if err := c.Tracker().Add(created); err != nil {
		t.Fatal(err)
	}

	got, err := i.Lookup(t.Context(), "team-a", "web-0")
	if err != nil {
		t.Fatal(err)
	}
	if got.Pod.Labels["app"] != "web" || got.Pod.Annotations[poolAnnotation] != "pod-pool" || got.Namespace.Labels["team"] != "a" {
		t.Errorf("lookup = %+v", got)
	}
	if _, ok := got.Pod.Annotations[lastApplied]; ok {
		t.Error("fallback kept last-applied-configuration")
	}
	if n := gets(c, "pods"); n != 1 {
		t.Errorf("%d pod GETs, want 1", n)
	}
	if n := gets(c, "namespaces"); n != 0 {
		t.Errorf("%d namespace GETs, want 0 (cached)", n)
	}
	if i.Synced() {
		t.Error("Synced true with the pod informer not running")
	}
}

func TestLookupNotFound(t *testing.T) {
	c := newClient(namespace("team-a", nil, nil), pod("team-a", "web-0", nil, nil))
	i := started(t, c)

	for _, tc := range []struct{ namespace, name, mention string }{
		{"team-a", "missing", "pods team-a/missing"},
		{"missing", "web-0", "namespaces missing"},
	} {
		_, err := i.Lookup(t.Context(), tc.namespace, tc.name)
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("Lookup(%s, %s) = %v, want ErrNotFound", tc.namespace, tc.name, err)
		} else if !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("Lookup(%s, %s) error %q does not name %q", tc.namespace, tc.name, err, tc.mention)
		}
	}
}

func TestLookupOtherErrorsWrapped(t *testing.T) {
	c := newClient(namespace("team-a", nil, nil))
	var calls atomic.Int32
	c.PrependReactor("get", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		calls.Add(1)
		return true, nil, apierrors.NewForbidden(podsGVR.GroupResource(), "web-0", errors.New("no RBAC"))
	})
	i := NewFromClient(c, testConfig(t)) // not started: every lookup misses

	_, err := i.Lookup(t.Context(), "team-a", "web-0")
	if err == nil || errors.Is(err, ErrNotFound) || !apierrors.IsForbidden(err) {
		t.Fatalf("Lookup = %v, want a wrapped Forbidden", err)
	}
	if !strings.Contains(err.Error(), "pods team-a/web-0") {
		t.Errorf("error %q lacks context", err)
	}
	if calls.Load() != 1 {
		t.Errorf("%d pod GETs, want 1", calls.Load())
	}
}

func TestLookupInvalidInput(t *testing.T) {
	i := NewFromClient(newClient(), testConfig(t))
	for _, args := range [][2]string{{"", "web-0"}, {"team-a", ""}, {"", ""}} {
		_, err := i.Lookup(t.Context(), args[0], args[1])
		if err == nil || errors.Is(err, ErrNotFound) {
			t.Errorf("Lookup(%q, %q) = %v, want an input error", args[0], args[1], err)
		}
	}
}

func TestTransformTrims(t *testing.T) {
	in := pod("team-a", "web-0", map[string]string{"app": "web"},
		map[string]string{poolAnnotation: "p", lastApplied: `{"big":"json"}`})
	in.ResourceVersion = "42"
	in.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	in.OwnerReferences = []metav1.OwnerReference{{Name: "web"}}
	in.Finalizers = []string{"x"}
	in.GenerateName = "web-"

	out, err := trim(in)
	if err != nil {
		t.Fatal(err)
	}
	m := out.(*metav1.PartialObjectMetadata)
	want := metav1.ObjectMeta{
		Namespace: "team-a", Name: "web-0", UID: "uid-web-0", ResourceVersion: "42",
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{poolAnnotation: "p"},
	}
	if !apiEqual(m.ObjectMeta, want) {
		t.Errorf("trimmed = %+v\nwant %+v", m.ObjectMeta, want)
	}
	if _, ok := in.Annotations[lastApplied]; !ok {
		t.Error("trim changed its input's annotations")
	}
	// Idempotent, as client-go requires.
	again, _ := trim(m)
	if !apiEqual(again.(*metav1.PartialObjectMetadata).ObjectMeta, want) {
		t.Error("trim is not idempotent")
	}
	// Other objects (tombstones) pass through.
	tomb := "not metadata"
	if o, _ := trim(tomb); o != tomb {
		t.Error("trim changed a foreign object")
	}

	// The informers apply it: the cache holds trimmed objects.
	c := newClient(namespace("team-a", nil, nil), in)
	i := started(t, c)
	cached, ok, err := i.pods.informer.GetIndexer().GetByKey("team-a/web-0")
	if err != nil || !ok {
		t.Fatalf("cache lookup: %v %v", ok, err)
	}
	cm := cached.(*metav1.PartialObjectMetadata)
	if cm.ManagedFields != nil || cm.OwnerReferences != nil || cm.Finalizers != nil {
		t.Errorf("cached object not trimmed: %+v", cm.ObjectMeta)
	}
	if _, ok := cm.Annotations[lastApplied]; ok || cm.Annotations[poolAnnotation] != "p" {
		t.Errorf("cached annotations = %v", cm.Annotations)
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
	c := newClient(namespace("team-a", nil, nil))

	i := NewFromClient(c, testConfig(t))
	if i.Synced() {
		t.Error("Synced true before Start")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := i.WaitForSync(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitForSync with a cancelled context = %v, want context.Canceled", err)
	}

	started(t, c) // WaitForSync returns nil after Start.
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
