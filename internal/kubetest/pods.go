// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package kubetest

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Pods as a cluster without controllers, scheduler or kubelets holds
// them: objects only. A test plays the scheduler (spec.nodeName at
// creation, or BindPod) and the kubelet (DeletePod removes a Pod at once,
// as a kubelet confirming its end would).

// clientset is the administrator's clientset, failing t when it cannot be
// built.
func (c *Cluster) clientset(t testing.TB) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// CreateNamespace creates namespace name with labels and annotations, and
// in it the service account "default", which the controller manager would
// create and without which the API server admits no Pod. A cluster has no
// namespace controller, so a deleted namespace never goes away: tests use
// names of their own and leave them.
func (c *Cluster) CreateNamespace(t testing.TB, name string, labels, annotations map[string]string) {
	t.Helper()
	cs := c.clientset(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations}}
	if _, err := cs.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: creating namespace %s: %v", name, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
	if _, err := cs.CoreV1().ServiceAccounts(name).Create(t.Context(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: creating service account %s/default: %v", name, err)
	}
}

// CreatePod creates Pod namespace/name with labels and annotations, bound
// to node (spec.nodeName; "" leaves it unscheduled), and returns it as
// the API server stored it (with its UID). Its one container runs nothing:
// no kubelet is there to run it.
func (c *Cluster) CreatePod(t testing.TB, namespace, name, node string, labels, annotations map[string]string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	got, err := c.clientset(t).CoreV1().Pods(namespace).Create(t.Context(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: creating pod %s/%s: %v", namespace, name, err)
	}
	return got
}

// BindPod binds the unscheduled Pod namespace/name to node through its
// binding subresource, as the scheduler does.
func (c *Cluster) BindPod(t testing.TB, namespace, name, node string) {
	t.Helper()
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	if err := c.clientset(t).CoreV1().Pods(namespace).Bind(t.Context(), b, metav1.CreateOptions{}); err != nil {
		t.Fatalf("kubetest: binding pod %s/%s to %s: %v", namespace, name, node, err)
	}
}

// DeletePod deletes Pod namespace/name at once (grace period 0): a bound
// Pod otherwise waits for its kubelet, which this cluster lacks.
func (c *Cluster) DeletePod(t testing.TB, namespace, name string) {
	t.Helper()
	zero := int64(0)
	if err := c.clientset(t).CoreV1().Pods(namespace).Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("kubetest: deleting pod %s/%s: %v", namespace, name, err)
	}
}
