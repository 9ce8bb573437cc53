// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package kubetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// rbacTimeout bounds the wait for new RBAC objects to take effect.
const rbacTimeout = 30 * time.Second

// Access is one request to authorise: a verb on a resource (and
// subresource) of an API group, in a namespace ("" for cluster scope),
// optionally of one object by name.
type Access struct {
	Verb, Group, Resource, Subresource, Namespace, Name string
}

func (a Access) String() string {
	r := a.Resource
	if a.Group != "" {
		r += "." + a.Group
	}
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	if a.Name != "" {
		r += " " + a.Name
	}
	if a.Namespace != "" {
		r += " in namespace " + a.Namespace
	}
	return a.Verb + " " + r
}

// Allowed asks the API server (a SubjectAccessReview) whether user in
// groups may do a, and why. The RBAC authorizer reads roles and bindings
// from a cache: a binding created a moment ago may not count yet (see
// WaitAllowed).
func (c *Cluster) Allowed(ctx context.Context, user string, groups []string, a Access) (allowed bool, reason string, err error) {
	cs, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		return false, "", err
	}
	sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   user,
			Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource,
				Namespace: a.Namespace, Name: a.Name,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("kubetest: SubjectAccessReview of %v: %w", a, err)
	}
	reason = sar.Status.Reason
	if sar.Status.EvaluationError != "" {
		reason += " (evaluation error: " + sar.Status.EvaluationError + ")"
	}
	return sar.Status.Allowed, reason, nil
}

// WaitAllowed waits until user in groups may do each of accesses, and
// fails t when one is still denied after 30 s. Call it after creating RBAC
// objects, before relying on them (or on their limits: a denial is only
// telling once the grants around it have taken effect).
func (c *Cluster) WaitAllowed(t testing.TB, user string, groups []string, accesses ...Access) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), rbacTimeout)
	defer cancel()
	for _, a := range accesses {
		var reason string
		err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			ok, why, err := c.Allowed(ctx, user, groups, a)
			reason = why
			return ok, err
		})
		if err != nil {
			t.Fatalf("kubetest: %s (groups %v) may not %v: %v (last reason %q)", user, groups, a, err, reason)
		}
	}
}

// ServiceAccount returns the user name and groups the API server gives
// the service account namespace/name's tokens, for Allowed, WaitAllowed
// and ConfigAs.
func ServiceAccount(namespace, name string) (user string, groups []string) {
	return "system:serviceaccount:" + namespace + ":" + name,
		[]string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}
}
