// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package lbipam

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/ipam-dev/ipam/internal/kubetest"
)

// A new leader writes nothing to the Services the last one left
// satisfied: its first pass over every Service (from its initial list)
// and its resyncs find each status as it should be. At 5,000 Services a
// write each would cost the client's QPS for most of a minute (make bench
// counts them, target 0). Counted twice: the Services' resourceVersions
// (a write that changed something) and the new leader's PUT and PATCH
// requests to them (any write, one that changes nothing included).
func TestNewLeaderWritesNothingToServedServices(t *testing.T) {
	e := start(t, false, true, kubetest.WithAPIServerFlags("--service-cluster-ip-range=10.96.0.0/24,fd00:96::/112"))
	e.pool("main", blocks("10.50.0.0/24", "fd00:50::/120"))
	stopFirst := e.controller("first")
	var names []string
	for i := range 6 {
		svc := service("shop", fmt.Sprintf("svc-%d", i), 80, int32(8080+i))
		switch i {
		case 1: // dual stack
			policy := corev1.IPFamilyPolicyRequireDualStack
			svc.Spec.IPFamilyPolicy = &policy
			svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
		case 2: // an address asked for
			svc.Annotations[AnnotationIPs] = "10.50.0.77"
		}
		e.create(svc)
		names = append(names, svc.Name)
	}
	for _, n := range names {
		e.waitFor("shop", n, "satisfied", func(got string) bool { return strings.HasSuffix(got, " satisfied") })
	}
	time.Sleep(1500 * time.Millisecond) // a resync (1 s) of the first leader: settled
	stopFirst()
	before := map[string]string{}
	for _, n := range names {
		before[n] = e.get("shop", n).ResourceVersion
	}

	var writes atomic.Int64
	e.configure = func(c *Config) { c.Kube = countServiceWrites(c.Kube, "/services/svc-", &writes) }
	e.controller("second")
	// Served: a Service created now is satisfied, by the new leader.
	e.create(service("shop", "zz-after"))
	e.waitFor("shop", "zz-after", "satisfied", func(got string) bool { return strings.HasSuffix(got, " satisfied") })
	time.Sleep(2500 * time.Millisecond) // resyncs (1 s)
	for _, n := range names {
		if rv := e.get("shop", n).ResourceVersion; rv != before[n] {
			t.Errorf("%s: resourceVersion %s, was %s before the new leader: written", n, rv, before[n])
		}
	}
	if w := writes.Load(); w != 0 {
		t.Errorf("the new leader sent %d PUT or PATCH requests for Services satisfied before it led; want 0", w)
	}
}

func (e *env) get(ns, name string) *corev1.Service {
	e.t.Helper()
	svc, err := e.kube.CoreV1().Services(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return svc
}

// countServiceWrites answers a copy of rc that counts in n its PUT and
// PATCH requests whose path holds path.
func countServiceWrites(rc *rest.Config, path string, n *atomic.Int64) *rest.Config {
	rc = rest.CopyConfig(rc)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTrip(func(r *http.Request) (*http.Response, error) {
			if (r.Method == http.MethodPut || r.Method == http.MethodPatch) && strings.Contains(r.URL.Path, path) {
				n.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	return rc
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
