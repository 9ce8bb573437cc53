// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"

	ciliumv2alpha1 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2alpha1"
	slimv1 "github.com/cilium/cilium/pkg/k8s/slim/k8s/apis/meta/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// The CiliumPodIPPools of multi-pool mode. Cilium's agent waits for the
// CiliumPodIPPool of each pool it pre-allocates from, and `kubectl get
// cpip` is how people look at pools. The store stays the record:
//   - export: every multi-pool pool of the operator's space is a
//     CiliumPodIPPool (cilium.io/v2alpha1, as Cilium 1.20 serves it) of the
//     same name, labelled managed-by ipam, its spec the pool's (CIDRs,
//     mask sizes, allowFirstIP/allowLastIP, selectors, skip-masquerade
//     annotation); one a user changed is set back, one whose pool is gone
//     is deleted;
//   - import: a CiliumPodIPPool without the label, of a name no pool of
//     the space has, becomes a multi-pool pool of the store (then exported
//     like any other); one named like a pool of the store is taken over.

// Labels of the CiliumPodIPPools the operator exports.
const (
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedByIPAM  = "ipam"
)

// run keeps the CiliumPodIPPools and the store's pools in step while
// leading: at once, whenever a CiliumPodIPPool changes, and every resync
// (pools changed through the API). Nodes are queued again after an
// import: one may have waited for the pool.
func (r *multiPoolReconciler) run(ctx context.Context, requeueAll func()) {
	o := r.o
	trigger := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	inf := cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(o.cilium.CiliumV2alpha1().RESTClient(), "ciliumpodippools", metav1.NamespaceAll, fields.Everything()),
		&ciliumv2alpha1.CiliumPodIPPool{}, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, obj any) { poke(obj) }, DeleteFunc: poke,
	}); err != nil {
		o.log.Error("watching CiliumPodIPPools", "err", err)
		return
	}
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return
	}
	tick := time.NewTicker(o.cfg.Resync)
	defer tick.Stop()
	warned := map[string]string{}
	for {
		var cpips []*ciliumv2alpha1.CiliumPodIPPool
		for _, obj := range inf.GetStore().List() {
			cpips = append(cpips, obj.(*ciliumv2alpha1.CiliumPodIPPool))
		}
		imported, err := r.syncPodIPPools(ctx, cpips, warned)
		if err != nil && ctx.Err() == nil {
			o.log.Warn("syncing CiliumPodIPPools", "err", err)
		}
		if imported > 0 {
			requeueAll()
		}
		select {
		case <-ctx.Done():
			return
		case <-trigger:
		case <-tick.C:
		}
	}
}

// syncPodIPPools makes one pass over the CiliumPodIPPools (cpips, as the
// cache has them) and the store's pools, and answers how many it imported.
// A pool one side refuses is logged once per distinct refusal (warned
// remembers them by name) and skipped; other errors end the pass.
func (r *multiPoolReconciler) syncPodIPPools(ctx context.Context, cpips []*ciliumv2alpha1.CiliumPodIPPool, warned map[string]string) (int, error) {
	o := r.o
	warn := func(name, msg string, err error) {
		if s := msg + ": " + err.Error(); warned[name] != s {
			warned[name] = s
			o.log.Warn(msg, "pool", name, "err", err)
		}
	}
	var all []alloc.Pool
	for page := (alloc.Page{Limit: 1000}); ; {
		items, next, err := o.store.ListPools(ctx, o.cfg.Space, page)
		if err != nil {
			return 0, err
		}
		all = append(all, items...)
		if next == "" {
			break
		}
		page.Continue = next
	}
	inStore := map[string]bool{}
	exported := map[string]alloc.Pool{}
	for _, p := range all {
		inStore[p.Name] = true
		if p.Spec.EffectiveMode() == alloc.ModeMultiPool {
			exported[p.Name] = p
		}
	}
	api := o.cilium.CiliumV2alpha1().CiliumPodIPPools()
	imported := 0
	current := map[string]*ciliumv2alpha1.CiliumPodIPPool{}
	for _, c := range cpips {
		current[c.Name] = c
		if c.Labels[labelManagedBy] == managedByIPAM || inStore[c.Name] {
			continue
		}
		p, err := o.store.CreatePool(ctx, alloc.Pool{Space: o.cfg.Space, Name: c.Name, Spec: poolSpecOf(c)})
		var ae *alloc.Error
		if errors.As(err, &ae) {
			warn(c.Name, "importing a CiliumPodIPPool", err)
			continue
		} else if err != nil {
			return imported, err
		}
		o.log.Info("imported a CiliumPodIPPool as a pool", "pool", c.Name)
		delete(warned, c.Name)
		imported++
		exported[p.Name] = p
	}
	for name, p := range exported {
		want, err := podIPPoolOf(p)
		if err != nil {
			warn(name, "exporting a pool as a CiliumPodIPPool", err)
			continue
		}
		cur, ok := current[name]
		switch {
		case !ok:
			_, err = api.Create(ctx, want, metav1.CreateOptions{FieldManager: fieldManager})
			if apierrors.IsAlreadyExists(err) {
				continue // the cache lags: the next pass updates it
			}
		case !equality.Semantic.DeepEqual(cur.Spec, want.Spec) || cur.Labels[labelManagedBy] != managedByIPAM ||
			cur.Annotations[alloc.AnnotationSkipMasquerade] != want.Annotations[alloc.AnnotationSkipMasquerade]:
			upd := cur.DeepCopy()
			upd.Spec = want.Spec
			if upd.Labels == nil {
				upd.Labels = map[string]string{}
			}
			upd.Labels[labelManagedBy] = managedByIPAM
			if v, ok := want.Annotations[alloc.AnnotationSkipMasquerade]; ok {
				if upd.Annotations == nil {
					upd.Annotations = map[string]string{}
				}
				upd.Annotations[alloc.AnnotationSkipMasquerade] = v
			} else {
				delete(upd.Annotations, alloc.AnnotationSkipMasquerade)
			}
			if cur.Labels[labelManagedBy] != managedByIPAM && !inStore[name] {
				o.log.Info("taking over a CiliumPodIPPool", "pool", name)
			}
			_, err = api.Update(ctx, upd, metav1.UpdateOptions{FieldManager: fieldManager})
			if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
				continue // changed meanwhile: the next pass looks again
			}
		default:
			continue
		}
		switch {
		case apierrors.IsInvalid(err) || apierrors.IsForbidden(err):
			warn(name, "exporting a pool as a CiliumPodIPPool", err)
		case err != nil:
			return imported, fmt.Errorf("exporting pool %s: %w", name, err)
		default:
			delete(warned, name)
		}
	}
	for name, c := range current {
		if _, ok := exported[name]; ok || c.Labels[labelManagedBy] != managedByIPAM {
			continue
		}
		err := api.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &c.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return imported, fmt.Errorf("deleting the CiliumPodIPPool of pool %s: %w", name, err)
		}
		if err == nil {
			o.log.Info("deleted the CiliumPodIPPool of a pool that is gone", "pool", name)
		}
	}
	return imported, nil
}

// podIPPoolOf is the CiliumPodIPPool of a store pool.
func podIPPoolOf(p alloc.Pool) (*ciliumv2alpha1.CiliumPodIPPool, error) {
	c := &ciliumv2alpha1.CiliumPodIPPool{ObjectMeta: metav1.ObjectMeta{Name: p.Name,
		Labels: map[string]string{labelManagedBy: managedByIPAM}}}
	c.Spec.AllowFirstIP, c.Spec.AllowLastIP = p.Spec.AllowFirstIP, p.Spec.AllowLastIP
	if pf := p.Spec.IPv4; pf != nil {
		c.Spec.IPv4 = &ciliumv2alpha1.IPv4PoolSpec{CIDRs: poolCIDRsOf(pf.CIDRs), MaskSize: uint8(pf.MaskSize)}
	}
	if pf := p.Spec.IPv6; pf != nil {
		c.Spec.IPv6 = &ciliumv2alpha1.IPv6PoolSpec{CIDRs: poolCIDRsOf(pf.CIDRs), MaskSize: uint8(pf.MaskSize)}
	}
	var err error
	if c.Spec.PodSelector, err = convertSelector[slimv1.LabelSelector](p.Spec.PodSelector); err != nil {
		return nil, fmt.Errorf("podSelector: %w", err)
	}
	if c.Spec.NamespaceSelector, err = convertSelector[slimv1.LabelSelector](p.Spec.NamespaceSelector); err != nil {
		return nil, fmt.Errorf("namespaceSelector: %w", err)
	}
	if p.Spec.SkipMasquerade {
		c.Annotations = map[string]string{alloc.AnnotationSkipMasquerade: "true"}
	}
	return c, nil
}

func poolCIDRsOf(cidrs []netip.Prefix) []ciliumv2alpha1.PoolCIDR {
	out := make([]ciliumv2alpha1.PoolCIDR, len(cidrs))
	for i, c := range cidrs {
		out[i] = ciliumv2alpha1.PoolCIDR(c.String())
	}
	return out
}

// poolSpecOf is the multi-pool pool spec of a CiliumPodIPPool. What does
// not parse is left for the store's validation to refuse, naming the
// field: a CIDR that is none becomes an invalid prefix.
func poolSpecOf(c *ciliumv2alpha1.CiliumPodIPPool) alloc.PoolSpec {
	s := alloc.PoolSpec{Mode: alloc.ModeMultiPool, AllowFirstIP: c.Spec.AllowFirstIP, AllowLastIP: c.Spec.AllowLastIP,
		SkipMasquerade: c.Annotations[alloc.AnnotationSkipMasquerade] == "true"}
	family := func(cidrs []ciliumv2alpha1.PoolCIDR, mask uint8) *alloc.PoolFamily {
		pf := &alloc.PoolFamily{MaskSize: int(mask)}
		for _, cidr := range cidrs {
			p, _ := netip.ParsePrefix(string(cidr))
			pf.CIDRs = append(pf.CIDRs, p)
		}
		return pf
	}
	if v4 := c.Spec.IPv4; v4 != nil {
		s.IPv4 = family(v4.CIDRs, v4.MaskSize)
	}
	if v6 := c.Spec.IPv6; v6 != nil {
		s.IPv6 = family(v6.CIDRs, v6.MaskSize)
	}
	// Cilium's selectors and Kubernetes' have the same JSON.
	s.PodSelector, _ = convertSelector[metav1.LabelSelector](c.Spec.PodSelector)
	s.NamespaceSelector, _ = convertSelector[metav1.LabelSelector](c.Spec.NamespaceSelector)
	return s
}

// convertSelector converts between Cilium's slim label selector and
// Kubernetes' (nil stays nil) through their common JSON.
func convertSelector[To any, From any](from *From) (*To, error) {
	if from == nil {
		return nil, nil
	}
	b, err := json.Marshal(from)
	if err != nil {
		return nil, err
	}
	to := new(To)
	return to, json.Unmarshal(b, to)
}
