// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"k8s.io/client-go/rest"
)

// metrics are the operator's own instruments: its request rate to the
// API server (to compare with its client QPS limit), whether this replica
// leads, and reconcile rounds by outcome.
type metrics struct {
	requests metric.Int64Counter
	rounds   metric.Int64Counter
	// restoreRefusals counts CIDRs a CiliumNode lists that the store
	// refused when the operator restored the nodes on taking the lead.
	restoreRefusals metric.Int64Counter
	// migrations counts CiliumNodes moved from cluster-pool to multi-pool
	// (outcome migrated) or refused (outcome refused, with the kind).
	migrations metric.Int64Counter
	leading    atomic.Bool
}

func newMetrics(m metric.Meter) (*metrics, error) {
	if m == nil {
		m = noop.NewMeterProvider().Meter("")
	}
	out := &metrics{}
	var err error
	if out.requests, err = m.Int64Counter("ipam_cilium_operator_kube_requests",
		metric.WithDescription("Requests the Cilium operator sent to the Kubernetes API server, by method and status code (0: no answer).")); err != nil {
		return nil, err
	}
	if out.rounds, err = m.Int64Counter("ipam_cilium_operator_reconciles",
		metric.WithDescription("CiliumNode reconcile rounds, by outcome (ok, conflict, error).")); err != nil {
		return nil, err
	}
	if out.restoreRefusals, err = m.Int64Counter("ipam_cilium_operator_restore_refusals",
		metric.WithDescription("CiliumNodes whose listed CIDRs the store refused when the operator restored every node on taking the lead, by kind (overlap: another node holds one; invalid: of no pool or of another mask; conflict). Each such node's operator-status says why; none is given a listed CIDR of another.")); err != nil {
		return nil, err
	}
	if out.migrations, err = m.Int64Counter("ipam_cilium_operator_cluster_pool_migrations",
		metric.WithDescription("CiliumNodes the cluster-pool to multi-pool migration moved (outcome migrated) or refused (outcome refused, by kind: overlap, another node holds a podCIDR; invalid-input, the default pool cannot cover it; not-found, no default pool). A refused node keeps its podCIDRs and its operator-status says why.")); err != nil {
		return nil, err
	}
	_, err = m.Int64ObservableGauge("ipam_cilium_operator_leader",
		metric.WithDescription("1 while this replica is the elected Cilium operator and serving (its caches synced), else 0."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			v := int64(0)
			if out.leading.Load() {
				v = 1
			}
			o.Observe(v)
			return nil
		}))
	return out, err
}

func (m *metrics) round(ctx context.Context, outcome string) {
	m.rounds.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome)))
}

// countRequests wraps rc's transport to count every request.
func (m *metrics) countRequests(rc *rest.Config) *rest.Config {
	rc = rest.CopyConfig(rc)
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			m.requests.Add(r.Context(), 1, metric.WithAttributes(
				attribute.String("method", r.Method), attribute.String("code", strconv.Itoa(code))))
			return resp, err
		})
	})
	return rc
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
