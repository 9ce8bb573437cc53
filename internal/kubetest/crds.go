// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package kubetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ipam-dev/ipam/internal/cilium/crds"
)

// crdTimeout bounds the wait for a CRD to be served.
const crdTimeout = time.Minute

// InstallCiliumCRDs creates Cilium's CiliumNode and CiliumPodIPPool
// CustomResourceDefinitions (crds.CRDs, from Cilium's Go module) and
// waits until the API server serves them. CRDs already there (a shared
// cluster) are left as they are.
func (c *Cluster) InstallCiliumCRDs(t testing.TB) {
	t.Helper()
	if err := c.InstallCiliumCRDsCtx(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// InstallCiliumCRDsCtx is InstallCiliumCRDs for a program: it answers an
// error instead of failing a test, and gives up when ctx ends.
func (c *Cluster) InstallCiliumCRDsCtx(ctx context.Context) error {
	defs, err := crds.CRDs()
	if err != nil {
		return fmt.Errorf("kubetest: Cilium's CRDs: %w", err)
	}
	return c.InstallCRDsCtx(ctx, defs...)
}

// InstallCRDs creates each CRD unless one of its name exists, and waits
// until every one is Established (served).
func (c *Cluster) InstallCRDs(t testing.TB, crds ...*apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	if err := c.InstallCRDsCtx(t.Context(), crds...); err != nil {
		t.Fatal(err)
	}
}

// InstallCRDsCtx is InstallCRDs for a program: it answers an error, and
// gives up when ctx ends or after a minute.
func (c *Cluster) InstallCRDsCtx(ctx context.Context, crds ...*apiextensionsv1.CustomResourceDefinition) error {
	cs, err := apiextensions.NewForConfig(c.Config())
	if err != nil {
		return fmt.Errorf("kubetest: %w", err)
	}
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	ctx, cancel := context.WithTimeout(ctx, crdTimeout)
	defer cancel()
	for _, crd := range crds {
		if _, err := api.Create(ctx, crd.DeepCopy(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kubetest: creating CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range crds {
		var last *apiextensionsv1.CustomResourceDefinition
		err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			got, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			last = got
			return condition(got, apiextensionsv1.Established) && condition(got, apiextensionsv1.NamesAccepted), nil
		})
		if err != nil {
			return fmt.Errorf("kubetest: CRD %s not established: %w; conditions %s", crd.Name, err, conditions(last))
		}
	}
	return nil
}

func condition(crd *apiextensionsv1.CustomResourceDefinition, typ apiextensionsv1.CustomResourceDefinitionConditionType) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == typ {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

func conditions(crd *apiextensionsv1.CustomResourceDefinition) string {
	if crd == nil {
		return "unknown"
	}
	s := ""
	for _, c := range crd.Status.Conditions {
		s += fmt.Sprintf("[%s=%s %s: %s]", c.Type, c.Status, c.Reason, c.Message)
	}
	return s
}
