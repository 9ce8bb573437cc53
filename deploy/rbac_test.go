// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	ciliumv2alpha1 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2alpha1"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	ipamkube "github.com/ipam-dev/ipam/internal/kube"
	"github.com/ipam-dev/ipam/internal/kubetest"
)

const (
	serverNamespace      = "ipam"
	serverServiceAccount = "ipam-server"
)

// rbacManifests are what a cluster running the server as Cilium's
// operator applies: the namespace and service account of deploy/kubernetes,
// and both RBAC files of deploy/kube-access.
var rbacManifests = []string{
	"kubernetes/namespace.yaml",
	"kubernetes/serviceaccount.yaml",
	"kube-access/rbac.yaml",
	"kube-access/cilium-operator.yaml",
}

// applyManifest creates every object of a multi-document YAML file, with
// strict field validation: an unknown or misspelt field fails the test as
// kubectl apply would fail.
func applyManifest(t *testing.T, cfg *rest.Config, path string) {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	dyn := dynamic.NewForConfigOrDie(cfg)
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(readFile(t, path))), 4096)
	for {
		var obj unstructured.Unstructured
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %s %s: %v", path, gvk, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if obj.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		if _, err := ri.Create(t.Context(), &obj, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("%s: creating %s %s: %v", path, gvk.Kind, obj.GetName(), err)
		}
	}
}

// TestOperatorRBAC applies the RBAC of deploy/kube-access to a real API
// server and checks, as the server's service account, that it may do
// everything the Cilium operator role and the Pod informers need,
// and nothing else that matters.
func TestOperatorRBAC(t *testing.T) {
	c := kubetest.Start(t)
	c.InstallCiliumCRDs(t)
	root := filepath.Join(repoRoot(t), "deploy")
	for _, m := range rbacManifests {
		applyManifest(t, c.Config(), filepath.Join(root, m))
	}
	user, groups := kubetest.ServiceAccount(serverNamespace, serverServiceAccount)
	ctx := t.Context()

	var allowed []kubetest.Access
	all := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	for _, r := range []struct{ resource, sub string }{{"ciliumnodes", ""}, {"ciliumnodes", "status"}, {"ciliumpodippools", ""}} {
		for _, verb := range all {
			allowed = append(allowed, kubetest.Access{Verb: verb, Group: "cilium.io", Resource: r.resource, Subresource: r.sub})
		}
	}
	for _, verb := range []string{"get", "list", "watch"} {
		allowed = append(allowed,
			kubetest.Access{Verb: verb, Resource: "nodes"},
			kubetest.Access{Verb: verb, Resource: "pods"},       // kube-access/rbac.yaml
			kubetest.Access{Verb: verb, Resource: "namespaces"}, // kube-access/rbac.yaml
		)
	}
	for _, verb := range []string{"get", "create", "update"} {
		allowed = append(allowed, kubetest.Access{Verb: verb, Group: "coordination.k8s.io", Resource: "leases", Namespace: serverNamespace})
	}
	// Every grant takes effect (RBAC reads bindings from a cache) ...
	c.WaitAllowed(t, user, groups, allowed...)
	// ... and, with them in effect, the rest stays denied.
	denied := []kubetest.Access{
		{Verb: "delete", Resource: "nodes"},
		{Verb: "update", Resource: "nodes"},
		{Verb: "patch", Resource: "nodes", Subresource: "status"},
		{Verb: "create", Resource: "nodes"},
		{Verb: "get", Resource: "secrets", Namespace: serverNamespace},
		{Verb: "list", Resource: "secrets"},
		{Verb: "create", Resource: "pods"},
		{Verb: "delete", Resource: "pods", Namespace: serverNamespace},
		{Verb: "deletecollection", Group: "cilium.io", Resource: "ciliumnodes"},
		{Verb: "list", Group: "cilium.io", Resource: "ciliumendpoints"},
		{Verb: "delete", Group: "coordination.k8s.io", Resource: "leases", Namespace: serverNamespace},
		{Verb: "list", Group: "coordination.k8s.io", Resource: "leases", Namespace: serverNamespace},
		{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system"},
		{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: "default"},
		{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Namespace: serverNamespace},
		{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
		{Verb: "update", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"},
	}
	for _, a := range denied {
		ok, reason, err := c.Allowed(ctx, user, groups, a)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			t.Errorf("%s may %v (%s); it should not", user, a, reason)
		}
	}

	// The same with the service account's own token, through the clients
	// the controller uses.
	sa := c.ServiceAccountConfig(t, serverNamespace, serverServiceAccount)
	kube := kubernetes.NewForConfigOrDie(sa)
	admin := kubernetes.NewForConfigOrDie(c.Config())
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{"pool": "a"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Run("nodes", func(t *testing.T) {
		if _, err := kube.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{}); err != nil {
			t.Error(err)
		}
		w, err := kube.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Error(err)
		} else {
			w.Stop()
		}
		forbidden(t, "delete a node", kube.CoreV1().Nodes().Delete(ctx, "node-1", metav1.DeleteOptions{}))
		_, err = kube.CoreV1().Nodes().Patch(ctx, "node-1", types.MergePatchType, []byte(`{"metadata":{"labels":{"pool":"b"}}}`), metav1.PatchOptions{})
		forbidden(t, "relabel a node", err)
		_, err = kube.CoreV1().Secrets(serverNamespace).Get(ctx, "ipam-database", metav1.GetOptions{})
		forbidden(t, "read a secret", err)
	})
	t.Run("pod informers", func(t *testing.T) {
		// The server's own Pod and namespace informers (internal/kube), as
		// the service account: they sync, and read a Pod's node again
		// from the API server when asked to.
		c.CreateNamespace(t, "rbac-pods", nil, nil)
		c.CreatePod(t, "rbac-pods", "web-0", "node-1", nil, nil)
		inf, err := ipamkube.NewForConfig(sa, ipamkube.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ictx, stop := context.WithCancel(ctx)
		defer stop()
		inf.Start(ictx)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := inf.WaitForSync(wctx); err != nil {
			t.Fatalf("the informers did not sync as %s: %v", user, err)
		}
		info, err := inf.Lookup(ctx, "rbac-pods", "web-0", func(ipamkube.PodInfo) bool { return true })
		if err != nil || info.NodeName != "node-1" {
			t.Errorf("lookup as %s: %+v %v", user, info, err)
		}
	})
	t.Run("ciliumnodes", func(t *testing.T) {
		nodes := ciliumclient.NewForConfigOrDie(sa).CiliumV2().CiliumNodes()
		n, err := nodes.Create(ctx, &ciliumv2.CiliumNode{
			ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
			Spec:       ciliumv2.NodeSpec{IPAM: ipamtypes.IPAMSpec{Pool: ipamtypes.AllocationMap{"10.1.0.1": {Resource: "a"}}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Spec.IPAM.Pool["10.1.0.2"] = ipamtypes.AllocationIP{Resource: "a"}
		if n, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		n.Status.IPAM.OperatorStatus.Error = "allocator full"
		if _, err = nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := nodes.Patch(ctx, "node-1", types.MergePatchType, []byte(`{"status":{"ipam":{"operator-status":{"error":""}}}}`), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
		if _, err := nodes.List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := nodes.Delete(ctx, "node-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		forbidden(t, "delete every CiliumNode at once", nodes.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	})
	t.Run("ciliumpodippools", func(t *testing.T) {
		pools := ciliumclient.NewForConfigOrDie(sa).CiliumV2alpha1().CiliumPodIPPools()
		p, err := pools.Create(ctx, &ciliumv2alpha1.CiliumPodIPPool{
			ObjectMeta: metav1.ObjectMeta{Name: "a"},
			Spec:       ciliumv2alpha1.IPPoolSpec{IPv4: &ciliumv2alpha1.IPv4PoolSpec{CIDRs: []ciliumv2alpha1.PoolCIDR{"10.1.0.0/16"}, MaskSize: 24}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Spec.IPv4.CIDRs = append(p.Spec.IPv4.CIDRs, "10.2.0.0/16")
		if _, err := pools.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := pools.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("leader election", func(t *testing.T) {
		// client-go's leader election on a Lease in the server's namespace,
		// as the controller runs it: acquire, then release on stop.
		lock := &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: serverNamespace, Name: "ipam-cilium-operator"},
			Client:     kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: "replica-1"},
		}
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		led := false
		leaderelection.RunOrDie(lctx, leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   15 * time.Second,
			RenewDeadline:   10 * time.Second,
			RetryPeriod:     2 * time.Second,
			ReleaseOnCancel: true,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { led = true; cancel() },
				OnStoppedLeading: func() {},
			},
		})
		if !led {
			t.Fatal("never became leader")
		}
		l, err := admin.CoordinationV1().Leases(serverNamespace).Get(ctx, "ipam-cilium-operator", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "" {
			t.Errorf("lease holder %v after release; want released (empty)", l.Spec.HolderIdentity)
		}
		lock.LeaseMeta.Namespace = "default"
		_, _, err = lock.Get(ctx)
		forbidden(t, "read a lease in another namespace", err)
	})
}

func forbidden(t *testing.T, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: %v; want forbidden", what, err)
	}
}

// TestLBIPAMRBAC: kube-access/lbipam.yaml lets the server's service
// account read Services and write their status, and nothing of their
// spec.
func TestLBIPAMRBAC(t *testing.T) {
	c := kubetest.Start(t)
	root := filepath.Join(repoRoot(t), "deploy")
	for _, m := range []string{"kubernetes/namespace.yaml", "kubernetes/serviceaccount.yaml", "kube-access/lbipam.yaml"} {
		applyManifest(t, c.Config(), filepath.Join(root, m))
	}
	user, groups := kubetest.ServiceAccount(serverNamespace, serverServiceAccount)
	var allowed []kubetest.Access
	for _, verb := range []string{"get", "list", "watch"} {
		allowed = append(allowed, kubetest.Access{Verb: verb, Resource: "services"}, kubetest.Access{Verb: verb, Resource: "nodes"},
			kubetest.Access{Verb: verb, Group: "discovery.k8s.io", Resource: "endpointslices"})
	}
	for _, verb := range []string{"update", "patch"} {
		allowed = append(allowed, kubetest.Access{Verb: verb, Resource: "services", Subresource: "status", Namespace: "shop"})
	}
	for _, verb := range []string{"get", "list", "watch", "create", "update", "delete"} {
		allowed = append(allowed, kubetest.Access{Verb: verb, Group: "cilium.io", Resource: "ciliumloadbalancerippools"},
			kubetest.Access{Verb: verb, Group: "cilium.io", Resource: "ciliumcidrgroups"})
	}
	for _, verb := range []string{"create", "patch"} {
		allowed = append(allowed, kubetest.Access{Verb: verb, Resource: "events", Namespace: "default"})
	}
	allowed = append(allowed, kubetest.Access{Verb: "update", Group: "cilium.io", Resource: "ciliumloadbalancerippools", Subresource: "status"})
	c.WaitAllowed(t, user, groups, allowed...)
	for _, a := range []kubetest.Access{
		{Verb: "update", Resource: "services", Namespace: "shop"},
		{Verb: "patch", Resource: "services", Namespace: "shop"},
		{Verb: "create", Resource: "services", Namespace: "shop"},
		{Verb: "delete", Resource: "services", Namespace: "shop"},
		{Verb: "list", Resource: "endpoints"},
		{Verb: "update", Resource: "nodes"},
		{Verb: "list", Group: "cilium.io", Resource: "ciliumnetworkpolicies"},
		{Verb: "update", Group: "discovery.k8s.io", Resource: "endpointslices", Namespace: "shop"},
		{Verb: "get", Resource: "secrets", Namespace: serverNamespace},
	} {
		ok, reason, err := c.Allowed(t.Context(), user, groups, a)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			t.Errorf("%s may %v (%s); it should not", user, a, reason)
		}
	}
}
