// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package lbipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	slimv1 "github.com/cilium/cilium/pkg/k8s/slim/k8s/apis/meta/v1"
	"github.com/cilium/cilium/pkg/policy/api"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The mirror (Config.Mirror) writes the space's VIP pools as
// CiliumLoadBalancerIPPool objects, with Cilium's status conditions, and
// its CIDR groups as CiliumCIDRGroup objects, for what reads them in the
// cluster (kubectl get ippools, network policies naming a group). The
// database stays the record: the objects are rewritten from it at every
// resync, objects of the same name that the mirror did not make are left
// alone, and those it made whose pool or group is gone are deleted.
//
// Cilium's own LB IPAM must be off (Helm enableLBIPAM=false) where the
// mirror runs, or it would allocate from the mirrored pools too.

// LabelManagedBy marks the objects the mirror made.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "ipam"
)

// The pool conditions Cilium's LB IPAM writes.
const (
	ConditionPoolConflict = "cilium.io/PoolConflict"
	ConditionIPsTotal     = "cilium.io/IPsTotal"
	ConditionIPsAvailable = "cilium.io/IPsAvailable"
	ConditionIPsUsed      = "cilium.io/IPsUsed"
)

// MirrorStore is what the mirror reads of the store.
type MirrorStore interface {
	ListLBPools(ctx context.Context, space string, page alloc.Page) ([]alloc.LBPool, string, error)
	ListCIDRGroups(ctx context.Context, space string, page alloc.Page) ([]alloc.CIDRGroup, string, error)
}

// listAll pages through a list of the store.
func listAll[T any](ctx context.Context, space string, list func(context.Context, string, alloc.Page) ([]T, string, error)) ([]T, error) {
	var out []T
	page := alloc.Page{Limit: 1000}
	for {
		items, next, err := list(ctx, space, page)
		if err != nil {
			return nil, err
		}
		out = append(out, items...)
		if next == "" {
			return out, nil
		}
		page.Continue = next
	}
}

// mirror brings the mirrored objects in line with the store once.
func (c *Controller) mirror(ctx context.Context) error {
	return errors.Join(c.mirrorPools(ctx), c.mirrorGroups(ctx))
}

func managedLabels(l map[string]string) map[string]string {
	out := maps.Clone(l)
	if out == nil {
		out = map[string]string{}
	}
	out[LabelManagedBy] = ManagedBy
	return out
}

func (c *Controller) mirrorPools(ctx context.Context) error {
	pools, err := listAll(ctx, c.cfg.Space, c.mirrorStore.ListLBPools)
	if err != nil {
		return err
	}
	ippools := c.cilium.CiliumV2().CiliumLoadBalancerIPPools()
	have, err := ippools.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	byName := map[string]*ciliumv2.CiliumLoadBalancerIPPool{}
	for i := range have.Items {
		byName[have.Items[i].Name] = &have.Items[i]
	}
	var errs []error
	keep := map[string]bool{}
	for _, p := range pools {
		keep[p.Name] = true
		spec, err := poolSpecToCilium(p.Spec)
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", p.Name, err))
			continue
		}
		cur, ok := byName[p.Name]
		switch {
		case !ok:
			cur, err = ippools.Create(ctx, &ciliumv2.CiliumLoadBalancerIPPool{
				ObjectMeta: metav1.ObjectMeta{Name: p.Name, Labels: managedLabels(p.Labels)}, Spec: spec}, metav1.CreateOptions{})
		case cur.Labels[LabelManagedBy] != ManagedBy:
			c.log.Warn("mirror: a CiliumLoadBalancerIPPool of the pool's name exists and is not the mirror's; left alone", "pool", p.Name)
			continue
		case !equality.Semantic.DeepEqual(cur.Spec, spec) || !maps.Equal(cur.Labels, managedLabels(p.Labels)):
			next := cur.DeepCopy()
			next.Spec, next.Labels = spec, managedLabels(p.Labels)
			cur, err = ippools.Update(ctx, next, metav1.UpdateOptions{})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", p.Name, err))
			continue
		}
		next := cur.DeepCopy()
		setPoolConditions(next, p, c.cfg.Now())
		if !equality.Semantic.DeepEqual(next.Status, cur.Status) {
			if _, err := ippools.UpdateStatus(ctx, next, metav1.UpdateOptions{}); err != nil {
				errs = append(errs, fmt.Errorf("pool %s status: %w", p.Name, err))
			}
		}
	}
	for name, o := range byName {
		if !keep[name] && o.Labels[LabelManagedBy] == ManagedBy {
			if err := ippools.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("pool %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// poolSpecToCilium is a VIP pool's spec in Cilium's type.
func poolSpecToCilium(s alloc.LBPoolSpec) (ciliumv2.CiliumLoadBalancerIPPoolSpec, error) {
	out := ciliumv2.CiliumLoadBalancerIPPoolSpec{AllowFirstLastIPs: ciliumv2.AllowFirstLastIPYes, Disabled: s.Disabled}
	if s.ReserveFirstLast {
		out.AllowFirstLastIPs = ciliumv2.AllowFirstLastIPNo
	}
	for _, b := range s.Blocks {
		if b.CIDR.IsValid() {
			out.Blocks = append(out.Blocks, ciliumv2.CiliumLoadBalancerIPPoolIPBlock{Cidr: ciliumv2.IPv4orIPv6CIDR(b.CIDR.String())})
		} else {
			out.Blocks = append(out.Blocks, ciliumv2.CiliumLoadBalancerIPPoolIPBlock{Start: b.Start.String(), Stop: b.Stop.String()})
		}
	}
	if s.ServiceSelector != nil {
		// The same JSON: Cilium's slim selector is Kubernetes'.
		j, err := json.Marshal(s.ServiceSelector)
		if err != nil {
			return out, err
		}
		out.ServiceSelector = new(slimv1.LabelSelector)
		if err := json.Unmarshal(j, out.ServiceSelector); err != nil {
			return out, err
		}
	}
	return out, nil
}

// setPoolConditions writes Cilium's pool conditions from the pool's
// status: PoolConflict (reason cidr_overlap or resolved, as Cilium's), and
// the counts over its families as Cilium writes them (status Unknown,
// reason noreason, the number as the message).
func setPoolConditions(o *ciliumv2.CiliumLoadBalancerIPPool, p alloc.LBPool, now time.Time) {
	set := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&o.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg,
			ObservedGeneration: o.Generation, LastTransitionTime: metav1.NewTime(now)})
	}
	if p.Status.Conflicting() {
		set(ConditionPoolConflict, metav1.ConditionTrue, "cidr_overlap", p.Status.Conflict)
	} else {
		set(ConditionPoolConflict, metav1.ConditionFalse, "resolved", "")
	}
	var total, used, available int64
	for _, st := range p.Status.Families {
		total = alloc.SaturatingAdd(total, st.Total)
		used += st.Used
		available = alloc.SaturatingAdd(available, st.Available())
	}
	set(ConditionIPsTotal, metav1.ConditionUnknown, "noreason", strconv.FormatInt(total, 10))
	set(ConditionIPsAvailable, metav1.ConditionUnknown, "noreason", strconv.FormatInt(available, 10))
	set(ConditionIPsUsed, metav1.ConditionUnknown, "noreason", strconv.FormatInt(used, 10))
}

func (c *Controller) mirrorGroups(ctx context.Context) error {
	groups, err := listAll(ctx, c.cfg.Space, c.mirrorStore.ListCIDRGroups)
	if err != nil {
		return err
	}
	cg := c.cilium.CiliumV2().CiliumCIDRGroups()
	have, err := cg.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	byName := map[string]*ciliumv2.CiliumCIDRGroup{}
	for i := range have.Items {
		byName[have.Items[i].Name] = &have.Items[i]
	}
	var errs []error
	keep := map[string]bool{}
	for _, g := range groups {
		keep[g.Name] = true
		spec := ciliumv2.CiliumCIDRGroupSpec{ExternalCIDRs: make([]api.CIDR, len(g.CIDRs))}
		for i, p := range g.CIDRs {
			spec.ExternalCIDRs[i] = api.CIDR(p.String())
		}
		cur, ok := byName[g.Name]
		switch {
		case !ok:
			_, err = cg.Create(ctx, &ciliumv2.CiliumCIDRGroup{ObjectMeta: metav1.ObjectMeta{Name: g.Name, Labels: managedLabels(g.Labels)}, Spec: spec},
				metav1.CreateOptions{})
		case cur.Labels[LabelManagedBy] != ManagedBy:
			c.log.Warn("mirror: a CiliumCIDRGroup of the group's name exists and is not the mirror's; left alone", "group", g.Name)
		case !equality.Semantic.DeepEqual(cur.Spec, spec) || !maps.Equal(cur.Labels, managedLabels(g.Labels)):
			next := cur.DeepCopy()
			next.Spec, next.Labels = spec, managedLabels(g.Labels)
			_, err = cg.Update(ctx, next, metav1.UpdateOptions{})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("CIDR group %s: %w", g.Name, err))
			err = nil
		}
	}
	for name, o := range byName {
		if !keep[name] && o.Labels[LabelManagedBy] == ManagedBy {
			if err := cg.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("CIDR group %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}
