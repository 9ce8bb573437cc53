// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// restorer is a reconciler of a mode whose agents list what the operator
// gave them (cluster-pool podCIDRs, multi-pool pools.allocated, crd-mode
// addresses in spec.ipam.pool). restore only occupies what cn lists, as
// the node's, carving nothing for a need.
//
// On taking the lead the operator restores every CiliumNode before it
// reconciles any, as Cilium's allocators occupy the CIDRs of every
// existing node before they allocate (podcidr.go and the multi-pool
// pool_allocator's "ready"): a CIDR one node lists is then never carved
// for another, whatever order the workers take the nodes in, after a
// migration from Cilium's operator or a restore of an older database.
type restorer interface {
	restore(ctx context.Context, name string, cn *ciliumv2.CiliumNode) error
}

// restoreAll restores the CiliumNodes, oldest first (so that of two nodes
// listing one CIDR, the one that has listed it longest keeps it). A CIDR
// the store refuses (another node's, of no pool, of another mask) is
// counted, logged and left to the node's reconcile, which reports it in
// operator-status and never gives the CIDR to a second node; any other
// error ends the restore, and the lead with it.
func (o *Operator) restoreAll(ctx context.Context, r restorer, nodes []*ciliumv2.CiliumNode) error {
	slices.SortFunc(nodes, func(a, b *ciliumv2.CiliumNode) int {
		return cmp.Or(a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	restored, refused := 0, 0
	for _, cn := range nodes {
		if !cn.DeletionTimestamp.IsZero() || ignored(cn) {
			continue
		}
		err := r.restore(ctx, cn.Name, cn)
		var ae *alloc.Error
		switch {
		case err == nil:
			restored++
		case errors.As(err, &ae):
			refused++
			o.m.restoreRefused(ctx, ae.Kind)
			o.log.Warn("restoring a CiliumNode: the store refused what it lists; its operator-status will say why",
				"node", cn.Name, "kind", ae.Kind, "field", ae.Field, "err", ae.Detail)
		default:
			return fmt.Errorf("restoring CiliumNode %s: %w", cn.Name, err)
		}
	}
	o.log.Info("restored the CiliumNodes' listed CIDRs before allocating", "nodes", len(nodes), "restored", restored, "refused", refused)
	return nil
}

func (r *clusterPoolReconciler) restore(ctx context.Context, name string, cn *ciliumv2.CiliumNode) error {
	var listed []netip.Prefix
	for _, c := range cn.Spec.IPAM.PodCIDRs {
		if c.IsValid() {
			listed = append(listed, c.Masked())
		}
	}
	if len(listed) == 0 {
		return nil
	}
	return r.o.store.RestoreClusterPoolBlocks(ctx, r.o.cfg.Space, name, r.o.cfg.DefaultPool, listed)
}

func (r *multiPoolReconciler) restore(ctx context.Context, name string, cn *ciliumv2.CiliumNode) error {
	if r.migrates(cn) {
		return r.migrateAtRestore(ctx, name, cn)
	}
	report := agentPoolsOf(cn)
	if len(report.Allocated) == 0 {
		return nil
	}
	// Without the requests the sync adopts what is listed and carves
	// nothing; what it could not adopt is in the answer's Errors.
	st, err := r.o.store.SyncAgentPools(ctx, r.o.cfg.Space, name, alloc.AgentPools{Allocated: report.Allocated})
	if err != nil {
		return err
	}
	if len(st.Errors) > 0 {
		return st.Errors[0]
	}
	return nil
}

// restore occupies, for a crd-mode node, every address its CiliumNode
// lists in spec.ipam.pool and status.ipam.used: another operator (or this
// one, before the database was restored from an older backup) gave it
// those, and the agent hands them to Pods whatever the store says. The
// node's reconcile keeps an occupied address in the pool as the store's,
// where before it dropped it (the store did not hold it) and another
// node's first round could be given it. Refused addresses are remembered
// for the node's operator-status for as long as this leadership lasts:
// the reconcile drops an unused one from the pool at once, and the
// reason should outlive that round.
func (r *crdReconciler) restore(ctx context.Context, name string, cn *ciliumv2.CiliumNode) error {
	listed := crdListed(cn)
	if len(listed) == 0 {
		return nil
	}
	_, all, err := r.o.store.RestoreNodeAddresses(ctx, r.o.cfg.Space, name, r.o.nodeLabels(name, cn), listed)
	if err != nil {
		return err
	}
	var refused []*alloc.Error
	var details []string
	for _, e := range all {
		if e.Kind == alloc.KindConflict {
			// The node's own address, released and cooling down: a
			// release handshake the last leader ended in the store but
			// not yet in the CiliumNode. The node's round drops it from
			// the pool, as that leader would have: nothing to report.
			r.o.log.Info("restoring a CiliumNode: a listed address is released and cools down; its release goes on",
				"node", name, "err", e.Detail)
			continue
		}
		refused = append(refused, e)
		details = append(details, e.Detail)
	}
	if len(refused) == 0 {
		return nil
	}
	msg := "listed addresses refused at restore: " + strings.Join(details, "; ")
	r.o.stateOf().setRefused(name, msg)
	return &alloc.Error{Kind: refused[0].Kind, Field: "spec.ipam.pool", Nodes: refused[0].Nodes, Detail: msg}
}

// crdListed is the addresses cn lists in spec.ipam.pool and
// status.ipam.used, by address; keys that are no address are left to the
// reconcile, which reports them.
func crdListed(cn *ciliumv2.CiliumNode) []netip.Addr {
	set := map[netip.Addr]bool{}
	for _, m := range []ipamtypes.AllocationMap{cn.Spec.IPAM.Pool, cn.Status.IPAM.Used} {
		for ip := range m {
			if a, err := netip.ParseAddr(ip); err == nil && a.Zone() == "" {
				set[a.Unmap()] = true
			}
		}
	}
	return slices.SortedFunc(maps.Keys(set), netip.Addr.Compare)
}

// restoreRefused counts a listed CIDR the store refused at restore.
func (m *metrics) restoreRefused(ctx context.Context, kind alloc.Kind) {
	m.restoreRefusals.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", string(kind))))
}
