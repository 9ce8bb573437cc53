// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package kubetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	ciliumv2alpha1 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2alpha1"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	"golang.org/x/mod/modfile"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		exitWithoutCleanup() // for TestDeadBinaryLeavesNothing
	}
	Main(m)
}

// TestVersionIsToolsModules keeps KubernetesVersion (the cache directory's
// name) equal to what tools/kube builds.
func TestVersionIsToolsModules(t *testing.T) {
	path := filepath.Join("..", "..", "tools", "kube", "go.mod")
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse(path, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range f.Require {
		if r.Mod.Path == "k8s.io/kubernetes" {
			if r.Mod.Version != KubernetesVersion {
				t.Fatalf("tools/kube requires k8s.io/kubernetes %s; KubernetesVersion is %s", r.Mod.Version, KubernetesVersion)
			}
			return
		}
	}
	t.Fatalf("%s requires no k8s.io/kubernetes", path)
}

func TestBinDir(t *testing.T) {
	fake := func(t *testing.T, names ...string) string {
		dir := t.TempDir()
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	t.Run("env dir with both", func(t *testing.T) {
		dir := fake(t, "etcd", "kube-apiserver")
		t.Setenv(BinDirEnv, dir)
		if got, err := BinDir(); err != nil || got != dir {
			t.Fatalf("BinDir() = %q, %v; want %q", got, err, dir)
		}
	})
	t.Run("env dir lacks kube-apiserver", func(t *testing.T) {
		t.Setenv(BinDirEnv, fake(t, "etcd"))
		t.Setenv("IPAM_TOOLS_DIR", t.TempDir()) // the cache is never a fallback
		_, err := BinDir()
		if !errors.Is(err, ErrNoBinaries) || !strings.Contains(err.Error(), "kube-apiserver") || !strings.Contains(err.Error(), BinDirEnv) {
			t.Fatalf("BinDir() error %v; want one naming kube-apiserver and $%s", err, BinDirEnv)
		}
	})
	t.Run("not executable", func(t *testing.T) {
		dir := fake(t, "etcd", "kube-apiserver")
		if err := os.Chmod(filepath.Join(dir, "etcd"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Setenv(BinDirEnv, dir)
		if _, err := BinDir(); !errors.Is(err, ErrNoBinaries) || !strings.Contains(err.Error(), "etcd is not an executable") {
			t.Fatalf("BinDir() error %v; want etcd not executable", err)
		}
	})
	t.Run("cache dir", func(t *testing.T) {
		tools := t.TempDir()
		t.Setenv(BinDirEnv, "")
		t.Setenv("IPAM_TOOLS_DIR", tools)
		want := filepath.Join(tools, "kube-"+KubernetesVersion)
		if got := CacheDir(); got != want {
			t.Fatalf("CacheDir() = %q; want %q", got, want)
		}
		if _, err := BinDir(); !errors.Is(err, ErrNoBinaries) {
			t.Fatalf("BinDir() error %v on an empty cache; want ErrNoBinaries", err)
		}
		if err := os.MkdirAll(want, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"etcd", "kube-apiserver"} {
			if err := os.WriteFile(filepath.Join(want, n), nil, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := BinDir(); err != nil || got != want {
			t.Fatalf("BinDir() = %q, %v; want %q", got, err, want)
		}
	})
	t.Run("XDG cache", func(t *testing.T) {
		xdg := t.TempDir()
		t.Setenv("IPAM_TOOLS_DIR", "")
		t.Setenv("XDG_CACHE_HOME", xdg)
		if got, want := CacheDir(), filepath.Join(xdg, "ipam-tools", "kube-"+KubernetesVersion); got != want {
			t.Fatalf("CacheDir() = %q; want %q", got, want)
		}
	})
}

// TestMissingBinaries: without binaries a test skips on a developer's
// machine and fails under CI.
func TestMissingBinaries(t *testing.T) {
	t.Setenv(BinDirEnv, t.TempDir())
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		ft := &fakeT{TB: t}
		done := make(chan struct{})
		go func() { // Skip and Fatal end the goroutine
			defer close(done)
			requireBinDir(ft)
		}()
		<-done
		switch {
		case ci == "" && (!ft.skipped || ft.failed):
			t.Errorf("CI unset: skipped %v, failed %v; want a skip", ft.skipped, ft.failed)
		case ci != "" && (ft.skipped || !ft.failed):
			t.Errorf("CI set: skipped %v, failed %v; want a failure", ft.skipped, ft.failed)
		}
		if !strings.Contains(ft.msg, "make tools") {
			t.Errorf("message %q does not name make tools", ft.msg)
		}
	}
}

// fakeT records Skip and Fatal instead of ending the test.
type fakeT struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Skip(args ...any) {
	f.skipped, f.msg = true, args[0].(string)
	runtime.Goexit()
}
func (f *fakeT) Fatal(args ...any) {
	f.failed, f.msg = true, args[0].(string)
	runtime.Goexit()
}

const (
	nodeName         = "node-a"
	markedForRelease = ipamtypes.IPReleaseStatus("marked-for-release")
)

// TestCiliumNode stores a CiliumNode through Cilium's generated clientset
// and reads it back: spec through the object, status only through the
// status subresource.
func TestCiliumNode(t *testing.T) {
	c := Shared(t)
	c.InstallCiliumCRDs(t)
	cs := ciliumclient.NewForConfigOrDie(c.Config())
	nodes := cs.CiliumV2().CiliumNodes()
	ctx := t.Context()

	pool := ipamtypes.AllocationMap{
		"10.1.0.10": {Resource: "pool-a/10.1.0.0/24"},
		"10.1.0.11": {Resource: "pool-a/10.1.0.0/24"},
	}
	used := ipamtypes.AllocationMap{"10.1.0.10": {Owner: "default/pod-1", Resource: "pool-a/10.1.0.0/24"}}
	n := &ciliumv2.CiliumNode{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec:       ciliumv2.NodeSpec{IPAM: ipamtypes.IPAMSpec{Pool: pool, PreAllocate: 8}},
		Status:     ciliumv2.NodeStatus{IPAM: ipamtypes.IPAMStatus{Used: used}},
	}
	created, err := nodes.Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(created.Status.IPAM.Used) != 0 {
		t.Errorf("create kept status %v; the status subresource should drop it", created.Status.IPAM.Used)
	}
	got, err := nodes.Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.IPAM.Pool) != 2 || got.Spec.IPAM.Pool["10.1.0.11"].Resource != "pool-a/10.1.0.0/24" || got.Spec.IPAM.PreAllocate != 8 {
		t.Fatalf("read back spec.ipam %+v", got.Spec.IPAM)
	}

	got.Status.IPAM.Used = used
	got.Status.IPAM.ReleaseIPs = map[string]ipamtypes.IPReleaseStatus{"10.1.0.11": markedForRelease}
	updated, err := nodes.UpdateStatus(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if updated.ResourceVersion == got.ResourceVersion {
		t.Error("UpdateStatus left the resourceVersion unchanged")
	}
	// Stale resourceVersion: a conflict, as the controller must expect.
	if _, err := nodes.UpdateStatus(ctx, got, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("UpdateStatus with a stale resourceVersion: %v; want a conflict", err)
	}
	// Update (not UpdateStatus) ignores status.
	updated.Status.IPAM.Used = nil
	updated.Spec.IPAM.MinAllocate = 2
	if _, err := nodes.Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err = nodes.Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.IPAM.MinAllocate != 2 || got.Status.IPAM.Used["10.1.0.10"].Owner != "default/pod-1" ||
		got.Status.IPAM.ReleaseIPs["10.1.0.11"] != markedForRelease {
		t.Fatalf("after UpdateStatus and Update: spec.ipam %+v status.ipam %+v", got.Spec.IPAM, got.Status.IPAM)
	}

	// CiliumPodIPPool, the other CRD, is served too.
	pools := cs.CiliumV2alpha1().CiliumPodIPPools()
	p := &ciliumv2alpha1.CiliumPodIPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-a"},
		Spec: ciliumv2alpha1.IPPoolSpec{IPv4: &ciliumv2alpha1.IPv4PoolSpec{
			CIDRs: []ciliumv2alpha1.PoolCIDR{"10.1.0.0/16"}, MaskSize: 24,
		}},
	}
	if _, err := pools.Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := pools.Get(ctx, "pool-a", metav1.GetOptions{}); err != nil || got.Spec.IPv4.MaskSize != 24 {
		t.Fatalf("CiliumPodIPPool read back: %+v, %v", got, err)
	}
}

var ciliumNodes = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnodes"}

// TestCiliumSchemaEnforced: the API server validates writes against
// Cilium's CRD schema, so a test cluster catches a controller writing what
// Cilium would not read.
func TestCiliumSchemaEnforced(t *testing.T) {
	c := Shared(t)
	c.InstallCiliumCRDs(t)
	dyn := dynamic.NewForConfigOrDie(c.Config()).Resource(ciliumNodes)
	ctx := t.Context()
	obj := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
			"metadata": map[string]any{"name": name},
			"spec":     spec,
		}}
	}
	for _, tt := range []struct {
		name, field string
		spec        map[string]any
	}{
		{"pre-allocate a string", "spec.ipam.pre-allocate", map[string]any{"ipam": map[string]any{"pre-allocate": "8"}}},
		{"pre-allocate negative", "spec.ipam.pre-allocate", map[string]any{"ipam": map[string]any{"pre-allocate": int64(-1)}}},
		{"pool entry a string", "spec.ipam.pool", map[string]any{"ipam": map[string]any{"pool": map[string]any{"10.1.0.1": "pool-a"}}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := dyn.Create(ctx, obj("bad-"+strings.ReplaceAll(tt.name, " ", "-"), tt.spec), metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("create: %v; want Invalid naming %s", err, tt.field)
			}
		})
	}

	// The status schema too: release-ips values are an enum.
	good, err := dyn.Create(ctx, obj("schema-status", map[string]any{"ipam": map[string]any{"pre-allocate": int64(8)}}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(good.Object, map[string]any{"10.1.0.1": "gone"}, "status", "ipam", "release-ips")
	if _, err := dyn.UpdateStatus(ctx, good, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "release-ips") {
		t.Fatalf("status with release-ips value \"gone\": %v; want Invalid", err)
	}
	// Unknown fields are pruned, and refused under strict field validation.
	_ = unstructured.SetNestedField(good.Object, int64(3), "spec", "ipam", "pre-allocated")
	if _, err := dyn.Update(ctx, good, metav1.UpdateOptions{FieldValidation: "Strict"}); err == nil || !strings.Contains(err.Error(), "pre-allocated") {
		t.Fatalf("unknown field spec.ipam.pre-allocated under strict validation: %v; want refused", err)
	}
}

// TestImpersonation: ConfigAs and ServiceAccountConfig are authorised as
// the user they name, not as the admin.
func TestImpersonation(t *testing.T) {
	c := Shared(t)
	ctx := t.Context()
	admin := kubernetes.NewForConfigOrDie(c.Config())
	// Not the built-in "view": aggregated roles stay empty here, since no
	// kube-controller-manager runs to aggregate them.
	_, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "configmap-viewer"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "viewers-view"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "configmap-viewer"},
		Subjects:   []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: "viewers"}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "impersonation"}}
	listConfigMaps := Access{Verb: "list", Resource: "configmaps", Namespace: "default"}
	c.WaitAllowed(t, "carol", []string{"viewers"}, listConfigMaps)
	if ok, _, err := c.Allowed(ctx, "carol", nil, listConfigMaps); err != nil || ok {
		t.Errorf("carol outside group viewers may list configmaps: %v, %v", ok, err)
	}

	nobody := kubernetes.NewForConfigOrDie(c.ConfigAs("nobody"))
	if _, err := nobody.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list configmaps as nobody: %v; want forbidden", err)
	}
	viewer := kubernetes.NewForConfigOrDie(c.ConfigAs("carol", "viewers"))
	if _, err := viewer.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list configmaps as a viewer: %v", err)
	}
	if _, err := viewer.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("create a configmap as a viewer: %v; want forbidden", err)
	}

	// A service account's own token, through a kubeconfig file.
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sa := c.ServiceAccountConfig(t, "default", "robot")
	fromFile, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig(t, sa))
	if err != nil {
		t.Fatal(err)
	}
	robot := kubernetes.NewForConfigOrDie(fromFile)
	review, err := robot.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := review.Status.UserInfo.Username; got != "system:serviceaccount:default:robot" {
		t.Errorf("the token authenticates as %q", got)
	}
	if _, err := robot.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("list configmaps as a service account without RBAC: %v; want forbidden", err)
	}
	// Impersonating the service account carries the groups its token does.
	user, groups := ServiceAccount("default", "robot")
	review, err = kubernetes.NewForConfigOrDie(c.ConfigAs(user)).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := review.Status.UserInfo; got.Username != user || !sameSet(got.Groups, groups) {
		t.Errorf("impersonating %s: user %q groups %v; want groups %v", user, got.Username, got.Groups, groups)
	}
	// The admin's kubeconfig is the admin.
	fromFile, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig(t, c.Config()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(fromFile).CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Errorf("create a configmap through the admin's kubeconfig: %v", err)
	}
}

// TestRestartAPIServer: objects survive an API server restart (they live
// in etcd), on the same address, and clients carry on.
func TestRestartAPIServer(t *testing.T) {
	c := Start(t)
	c.InstallCiliumCRDs(t)
	cs := ciliumclient.NewForConfigOrDie(c.Config())
	nodes := cs.CiliumV2().CiliumNodes()
	ctx := t.Context()
	n, err := nodes.Create(ctx, &ciliumv2.CiliumNode{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec:       ciliumv2.NodeSpec{IPAM: ipamtypes.IPAMSpec{Pool: ipamtypes.AllocationMap{"10.2.0.1": {Resource: "p"}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	host := c.Host()
	oldPID := c.apiserver.cmd.Process.Pid

	c.RestartAPIServer(t)
	if c.Host() != host {
		t.Errorf("host %s after the restart; want %s", c.Host(), host)
	}
	if c.apiserver.cmd.Process.Pid == oldPID {
		t.Error("the same API server process after the restart")
	}
	if err := syscall.Kill(oldPID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the old API server (pid %d) is still there: %v", oldPID, err)
	}
	got, err := nodes.Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != n.UID || got.ResourceVersion != n.ResourceVersion || got.Spec.IPAM.Pool["10.2.0.1"].Resource != "p" {
		t.Fatalf("after the restart: %+v; want the object created before", got)
	}
	got.Status.IPAM.OperatorStatus.Error = "allocator full"
	if _, err := nodes.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("UpdateStatus after the restart: %v", err)
	}

	// A crash (SIGKILL): requests fail while it is down, then work again.
	c.KillAPIServer(t)
	if _, err := nodes.Get(ctx, nodeName, metav1.GetOptions{}); err == nil {
		t.Fatal("Get succeeded with the API server down")
	}
	c.StartAPIServer(t)
	if got, err := nodes.Get(ctx, nodeName, metav1.GetOptions{}); err != nil || got.Status.IPAM.OperatorStatus.Error != "allocator full" {
		t.Fatalf("after the crash: %+v, %v", got, err)
	}
}

// TestLaunchAndClose: a program's cluster (Launch, no testing.TB) serves
// Cilium's CRDs installed with a context to a client built from a
// kubeconfig file, and Close leaves no process and no file behind.
func TestLaunchAndClose(t *testing.T) {
	requireBinDir(t)
	c, err := Launch()
	if err != nil {
		t.Fatal(err)
	}
	pids := []int{c.etcd.cmd.Process.Pid, c.apiserver.cmd.Process.Pid}
	closed := false
	defer func() {
		if !closed {
			t.Log(c.Logs())
			c.Close()
		}
	}()
	ctx := t.Context()
	if err := c.InstallCiliumCRDsCtx(ctx); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "sub", "kubeconfig")
	if err := c.WriteKubeconfig(c.Config(), path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig %s: %v, %v; want mode 0600 (it holds a key)", path, fi, err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	nodes := ciliumclient.NewForConfigOrDie(rc).CiliumV2().CiliumNodes()
	if _, err := nodes.Create(ctx, &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create a CiliumNode through the kubeconfig: %v", err)
	}
	// A context that has ended: an error, not a wait.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.InstallCiliumCRDsCtx(done); !errors.Is(err, context.Canceled) {
		t.Errorf("InstallCiliumCRDsCtx with a cancelled context: %v; want context.Canceled", err)
	}

	closed = true
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(-pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process group %d still exists after Close: %v", pid, err)
		}
	}
	if _, err := os.Stat(c.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after Close: %v", c.dir, err)
	}
}

// TestLaunchWithoutBinaries: Launch's error says what is missing and how
// to build it, and a program can tell it from a failed start.
func TestLaunchWithoutBinaries(t *testing.T) {
	t.Setenv(BinDirEnv, t.TempDir())
	c, err := Launch()
	if err == nil {
		c.Close()
		t.Fatal("Launch without binaries succeeded")
	}
	if !errors.Is(err, ErrNoBinaries) || !strings.Contains(err.Error(), "make tools") {
		t.Fatalf("Launch: %v; want ErrNoBinaries naming make tools", err)
	}
}

// TestStartFailureShowsLog: an API server that cannot start fails Start
// with the tail of its output, and leaves nothing behind.
func TestStartFailureShowsLog(t *testing.T) {
	binDir := requireBinDir(t)
	// This process's directories only (kubetest-PID-*): the other test
	// packages, run at the same time by go test ./..., make their own.
	mine := filepath.Join(os.TempDir(), fmt.Sprintf("kubetest-%d-*", os.Getpid()))
	before, _ := filepath.Glob(mine)
	began := time.Now()
	c, err := start(binDir, WithAPIServerFlags("--no-such-flag"))
	if err == nil {
		c.Close()
		t.Fatal("start with an unknown flag succeeded")
	}
	if !strings.Contains(err.Error(), "kube-apiserver exited during start") || !strings.Contains(err.Error(), "unknown flag: --no-such-flag") {
		t.Fatalf("start: %v; want the API server's exit and its complaint", err)
	}
	after, _ := filepath.Glob(mine)
	for _, d := range after {
		if fi, err := os.Stat(d); err == nil && fi.ModTime().After(began) && !slices.Contains(before, d) {
			t.Errorf("a failed start left %s behind", d)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// helperEnv makes the test binary, run by TestDeadBinaryLeavesNothing,
// start a cluster and exit without cleaning up, running no test.
const helperEnv = "KUBETEST_EXIT_WITHOUT_CLEANUP"

func exitWithoutCleanup() {
	binDir, err := BinDir()
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	c, err := start(binDir)
	if err != nil {
		fmt.Println(err)
		os.Exit(2)
	}
	fmt.Printf("cluster %s %d %d\n", c.dir, c.etcd.cmd.Process.Pid, c.apiserver.cmd.Process.Pid)
	os.Exit(0) // as a test binary killed at its timeout: no cleanup runs
}

// TestDeadBinaryLeavesNothing: when a test binary dies without stopping
// its cluster, the kernel kills the servers, and the next start removes
// their files.
func TestDeadBinaryLeavesNothing(t *testing.T) {
	requireBinDir(t)
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var dir string
	var pids [2]int
	i := strings.Index(string(out), "cluster ")
	if i < 0 {
		t.Fatalf("helper printed no cluster:\n%s", out)
	}
	if _, err := fmt.Sscanf(string(out[i:]), "cluster %s %d %d", &dir, &pids[0], &pids[1]); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	for _, pid := range pids {
		deadline := time.Now().Add(30 * time.Second)
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("server pid %d still runs after its test binary died", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the dead binary's cluster dir %s: %v; want it left behind until the next start", dir, err)
	}
	removeStale()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after removeStale: %v", dir, err)
	}
}

// alive reports whether process pid exists and is no zombie (a container's
// init may never reap the servers the kernel killed).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// TestServersOutliveForkingThread: the servers run until the cluster
// stops, even when the goroutine that started them was locked to its OS
// thread and ended, which ends the thread (the kernel sends Pdeathsig when
// the forking thread exits).
func TestServersOutliveForkingThread(t *testing.T) {
	binDir := requireBinDir(t)
	var c *Cluster
	var err error
	tid := make(chan int)
	startOnOwnThread := func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		c, err = start(binDir)
		tid <- syscall.Gettid()
	}
	go func() {
		// The main thread never ends (a goroutine that ends locked to it
		// wedges it instead): hold it, if this is it, so that the starting
		// goroutine runs on another thread.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done := make(chan struct{})
		go func() {
			defer close(done)
			startOnOwnThread()
		}()
		<-done
	}()
	thread := fmt.Sprintf("/proc/self/task/%d", <-tid)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(thread); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %s did not end", thread)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The kernel signals at the thread's exit; a request after it answers
	// only if the servers survived it.
	cs := kubernetes.NewForConfigOrDie(c.Config())
	if _, err := cs.CoreV1().Namespaces().Get(t.Context(), "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("after the starting thread ended: %v", err)
	}
	for _, p := range []*proc{c.etcd, c.apiserver} {
		if !p.running() {
			t.Errorf("%s died with the thread that started it: %v", p.name, p.exitError())
		}
	}
}
