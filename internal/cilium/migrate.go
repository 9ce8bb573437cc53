// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"errors"
	"net/netip"
	"strings"

	iputil "github.com/cilium/cilium/pkg/ip"
	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The cluster-pool to multi-pool migration (Cilium's
// enable-cluster-pool-to-multi-pool-migration, operator/pkg/ipam/allocator/
// multipool/multipool.go): in multi-pool mode, every CiliumNode that
// still lists spec.ipam.podCIDRs has them moved to
// spec.ipam.pools.allocated under the default pool, podCIDRs cleared,
// before the operator allocates anything, so that the agents, restarted in
// multi-pool mode one by one, find their Pods' CIDRs in their pool.
//
// Where Cilium rewrites the object alone, the store is moved first
// (MigrateClusterPoolNode): the node's blocks become its blocks of the
// default pool, all or none, and only then is the object written. A node
// the store refuses (a CIDR another node holds, one the default pool does
// not cover or of another mask, no default pool) keeps its podCIDRs
// untouched, its operator-status says why in Cilium's words, what of its
// CIDRs the default pool can hold stays held for it (no other node is
// carved them), and it is tried again every retryUnserved while this
// replica leads, where Cilium tries once at start and writes pools.allocated
// whatever the pools say. Until it is moved the multi-pool rounds leave it
// alone: they would take the blocks held for it for blocks its agent gave
// back.

// migrationFailed begins the operator-status error of a node the
// migration refused, as Cilium's updateStatusForFailure words it.
const migrationFailed = "migration to multi-pool IPAM failed: "

// migrates says whether cn is a CiliumNode the migration has yet to move.
func (r *multiPoolReconciler) migrates(cn *ciliumv2.CiliumNode) bool {
	return r.o.cfg.ClusterPoolToMultiPoolMigration && cn != nil && cn.DeletionTimestamp.IsZero() && !ignored(cn) &&
		len(listedPodCIDRs(cn)) > 0
}

// listedPodCIDRs is what cn lists in spec.ipam.podCIDRs, masked.
func listedPodCIDRs(cn *ciliumv2.CiliumNode) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cn.Spec.IPAM.PodCIDRs {
		if c.IsValid() {
			out = append(out, c.Masked())
		}
	}
	return out
}

// migrate moves one CiliumNode from cluster-pool to multi-pool: the store
// first, then the object (spec.ipam.pools set as Cilium's migrateNode sets
// it, podCIDRs cleared). A refusal is answered as refused, with the node's
// operator-status written; err is any other failure, a conflict included
// (the caller reads the node again).
func (r *multiPoolReconciler) migrate(ctx context.Context, name string, cn *ciliumv2.CiliumNode) (refused *alloc.Error, err error) {
	o := r.o
	listed := listedPodCIDRs(cn)
	err = o.store.MigrateClusterPoolNode(ctx, o.cfg.Space, name, o.cfg.DefaultPool, listed)
	desired := cn.DeepCopy()
	switch {
	case err == nil:
		cidrs := make([]iputil.Prefix, len(listed))
		for i, c := range listed {
			cidrs[i] = iputil.PrefixFrom(c)
		}
		desired.Spec.IPAM.PodCIDRs = nil
		desired.Spec.IPAM.Pools = ipamtypes.IPAMPoolSpec{
			Allocated: []ipamtypes.IPAMPoolAllocation{{Pool: o.cfg.DefaultPool, CIDRs: cidrs}},
		}
		if strings.HasPrefix(desired.Status.IPAM.OperatorStatus.Error, migrationFailed) {
			desired.Status.IPAM.OperatorStatus.Error = ""
		}
	case errors.As(err, &refused):
		// The detail names each refused podCIDRs entry.
		desired.Status.IPAM.OperatorStatus.Error = migrationFailed + refused.Detail
	default:
		return nil, err
	}
	if err := o.write(ctx, cn, desired); err != nil {
		return nil, err
	}
	switch {
	case refused == nil:
		r.migrated.Add(1)
		o.m.migration(ctx, "migrated", "")
		o.log.Debug("migrated a CiliumNode from cluster-pool to multi-pool", "node", name, "pool", o.cfg.DefaultPool, "cidrs", listed)
	case cn.Status.IPAM.OperatorStatus.Error != desired.Status.IPAM.OperatorStatus.Error:
		// Counted and logged once per reason, not at every retry.
		r.refused.Add(1)
		o.m.migration(ctx, "refused", refused.Kind)
		o.log.Warn("migrating a CiliumNode from cluster-pool to multi-pool: refused; it keeps its podCIDRs",
			"node", name, "kind", refused.Kind, "field", refused.Field, "err", refused.Detail)
	}
	return refused, nil
}

// migrateAtRestore migrates a node on taking the lead, before anything is
// allocated, reading the node again after a conflict (its agent wrote in
// between). A refusal is no error here: the node's operator-status, the
// log and the metric report it, and its reconcile tries again.
func (r *multiPoolReconciler) migrateAtRestore(ctx context.Context, name string, cn *ciliumv2.CiliumNode) error {
	for attempt := 0; ; attempt++ {
		_, err := r.migrate(ctx, name, cn)
		if !apierrors.IsConflict(err) || attempt == maxConflictRetries {
			return err
		}
		cn, err = r.o.cilium.CiliumV2().CiliumNodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		} else if err != nil {
			return err
		}
		if !r.migrates(cn) {
			return nil
		}
	}
}

// migration counts a node the migration moved or refused.
func (m *metrics) migration(ctx context.Context, outcome string, kind alloc.Kind) {
	m.migrations.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", outcome), attribute.String("kind", string(kind))))
}
