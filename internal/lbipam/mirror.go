// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package lbipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	slimv1 "github.com/cilium/cilium/pkg/k8s/slim/k8s/apis/meta/v1"
	"github.com/cilium/cilium/pkg/policy/api"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/leader"
)

// The mirror (Config.Mirror) keeps the space's VIP pools and the
// cluster's CiliumLoadBalancerIPPool objects, and its CIDR groups and the
// CiliumCIDRGroup objects, in line by one rule of ownership:
//
//   - A pool or group made through the REST API is the database's. The
//     mirror writes it out as an object labelled managed-by ipam and
//     annotated owned-by database, with Cilium's status conditions, for
//     what reads them in the cluster (kubectl get ippools, network
//     policies naming a group). An edit or deletion of that object is
//     reverted as soon as the informer sees it, with a Warning event
//     saying why.
//   - An object the mirror did not make is the cluster's: imported as a
//     pool or group owned by the object (its UID recorded in the
//     database). Its edits flow in, validated as the REST API validates;
//     a refusal leaves the database as it was and is said on the object
//     (a pool's condition ipam-dev.io/Imported, a group's Warning event).
//     Its deletion deletes the pool, releasing its addresses: their
//     Services are re-homed to another pool or stripped, as under Cilium.
//
// Each name is brought in line alone (syncPool, syncGroup) on the
// informers' events and, for every name, at each change the store
// announces (ipam_lb_changed: a pool or group written through the REST
// API of any replica) and at each resync.
//
// Cilium's own LB IPAM must be off (Helm enableLBIPAM=false) where the
// mirror runs, or it would allocate from the pools too.

// LabelManagedBy marks the objects the mirror made.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "ipam"
)

// Annotations of the mirror's objects and of imported ones.
const (
	// AnnotationOwnedBy says on a mirrored object that the database owns
	// it (OwnedByDatabase): an edit is reverted.
	AnnotationOwnedBy = "ipam-dev.io/owned-by"
	OwnedByDatabase   = "database"
	// AnnotationRevision is the database's revision (updated_at) a
	// mirrored object was written from: an object differing from the
	// database at the revision it was written from was edited in the
	// cluster, and its revert says so with an event; one written from an
	// older revision is only behind.
	AnnotationRevision = "ipam-dev.io/database-revision"
	// AnnotationAllowSpecialPurpose "true" on an imported object is the
	// REST API's allowSpecialPurpose, which Cilium's types lack.
	AnnotationAllowSpecialPurpose = "ipam-dev.io/allow-special-purpose"
)

// The pool conditions Cilium's LB IPAM writes.
const (
	ConditionPoolConflict = "cilium.io/PoolConflict"
	ConditionIPsTotal     = "cilium.io/IPsTotal"
	ConditionIPsAvailable = "cilium.io/IPsAvailable"
	ConditionIPsUsed      = "cilium.io/IPsUsed"
)

// ConditionImported says on a CiliumLoadBalancerIPPool of the cluster
// whether its spec is the database's: True (ReasonImported), or False
// when the database refused it (ReasonInvalidSpec: the REST API would
// refuse it too, the message says which field and why; ReasonNameTaken:
// a pool of the database has the name). A refused edit leaves the pool
// as it was before it.
const (
	ConditionImported = "ipam-dev.io/Imported"
	ReasonImported    = "imported"
	ReasonInvalidSpec = "invalid_spec"
	ReasonNameTaken   = "name_taken"
)

// The reasons of the mirror's events.
const (
	// EventReadOnly: an edit of a mirrored object was reverted.
	EventReadOnly = "ReadOnly"
	// EventImportRefused: the database refused an object's spec.
	EventImportRefused = "ImportRefused"
)

// MirrorStore is what the mirror and the import need of the store. The
// writes of the import speak for the object (alloc.AsOrigin); those of a
// pool or group the database owns are refused (alloc.NotOwner).
type MirrorStore interface {
	ListLBPools(ctx context.Context, space string, page alloc.Page) ([]alloc.LBPool, string, error)
	ListCIDRGroups(ctx context.Context, space string, page alloc.Page) ([]alloc.CIDRGroup, string, error)
	// GetLBPool and GetCIDRGroup answer KindNotFound when absent.
	GetLBPool(ctx context.Context, space, name string) (alloc.LBPool, error)
	GetCIDRGroup(ctx context.Context, space, name string) (alloc.CIDRGroup, error)
	CreateLBPool(ctx context.Context, p alloc.LBPool, opts ...alloc.WriteOption) (alloc.LBPool, error)
	UpdateLBPool(ctx context.Context, space, name string, labels map[string]string, spec alloc.LBPoolSpec, opts ...alloc.WriteOption) (alloc.LBPool, error)
	// DeleteLBPool of a Kubernetes writer releases the pool's addresses.
	DeleteLBPool(ctx context.Context, space, name string, opts ...alloc.WriteOption) (alloc.LBPool, error)
	CreateCIDRGroup(ctx context.Context, g alloc.CIDRGroup, opts ...alloc.WriteOption) (alloc.CIDRGroup, error)
	UpdateCIDRGroup(ctx context.Context, g alloc.CIDRGroup, opts ...alloc.WriteOption) (alloc.CIDRGroup, error)
	DeleteCIDRGroup(ctx context.Context, space, name string, opts ...alloc.WriteOption) (alloc.CIDRGroup, error)
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

// Keys of the mirror's queue: a pool's or a group's name behind its
// prefix, or every name (keyAll).
const (
	keyPool  = "pool/"
	keyGroup = "group/"
	keyAll   = "all"
)

// mirrorInformers watches the cluster's pools and groups, queueing each
// name that changes.
func (c *Controller) mirrorInformers(q workqueue.TypedRateLimitingInterface[string]) (pools, groups cache.SharedIndexInformer, err error) {
	watch := func(resource string, obj runtime.Object, prefix string) (cache.SharedIndexInformer, error) {
		inf := cache.NewSharedIndexInformer(
			cache.NewListWatchFromClient(c.cilium.CiliumV2().RESTClient(), resource, metav1.NamespaceAll, fields.Everything()),
			obj, 0, cache.Indexers{})
		add := func(o any) {
			if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
				q.Add(prefix + key)
			}
		}
		_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, o any) { add(o) }, DeleteFunc: add})
		return inf, err
	}
	if pools, err = watch("ciliumloadbalancerippools", &ciliumv2.CiliumLoadBalancerIPPool{}, keyPool); err != nil {
		return nil, nil, err
	}
	groups, err = watch("ciliumcidrgroups", &ciliumv2.CiliumCIDRGroup{}, keyGroup)
	return pools, groups, err
}

// queueMirror queues every name of a pool or group, of the database or
// of the cluster: the resync's look at all of them.
func (c *Controller) queueMirror(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) error {
	pools, err := listAll(ctx, c.cfg.Space, c.mirrorStore.ListLBPools)
	if err != nil {
		return err
	}
	groups, err := listAll(ctx, c.cfg.Space, c.mirrorStore.ListCIDRGroups)
	if err != nil {
		return err
	}
	for _, p := range pools {
		q.Add(keyPool + p.Name)
	}
	for _, g := range groups {
		q.Add(keyGroup + g.Name)
	}
	c.mu.Lock()
	poolIdx, groupIdx := c.poolObjects, c.groupObjects
	c.mu.Unlock()
	if poolIdx != nil {
		for _, k := range poolIdx.ListKeys() {
			q.Add(keyPool + k)
		}
		for _, k := range groupIdx.ListKeys() {
			q.Add(keyGroup + k)
		}
	}
	return nil
}

func (c *Controller) processMirror(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	var err error
	if key == keyAll {
		err = c.queueMirror(ctx, q)
	} else if name, ok := strings.CutPrefix(key, keyPool); ok {
		err = c.syncPool(ctx, name)
	} else if name, ok := strings.CutPrefix(key, keyGroup); ok {
		err = c.syncGroup(ctx, name)
	}
	if err == nil {
		q.Forget(key)
		return true
	}
	if ctx.Err() == nil {
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) { // the cache lagged a write: quietly again
			c.log.Warn("mirror", "key", key, "err", err)
		}
		q.AddRateLimited(key)
	}
	return true
}

func managedLabels(l map[string]string) map[string]string {
	out := maps.Clone(l)
	if out == nil {
		out = map[string]string{}
	}
	out[LabelManagedBy] = ManagedBy
	return out
}

// ownedAnnotations are a mirrored object's annotations: what it had, the
// mark of the database's ownership and the revision written.
func ownedAnnotations(have map[string]string, rev string) map[string]string {
	out := maps.Clone(have)
	if out == nil {
		out = map[string]string{}
	}
	out[AnnotationOwnedBy], out[AnnotationRevision] = OwnedByDatabase, rev
	return out
}

func revision(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// mirrored reports whether the mirror made the object.
func mirrored(o metav1.Object) bool { return o.GetLabels()[LabelManagedBy] == ManagedBy }

// storeRefusal answers the store's refusal in err (nil when err is not
// one).
func storeRefusal(err error) *alloc.Error {
	var ae *alloc.Error
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}

func (c *Controller) poolObject(name string) (*ciliumv2.CiliumLoadBalancerIPPool, error) {
	c.mu.Lock()
	idx := c.poolObjects
	c.mu.Unlock()
	return leader.Lookup[ciliumv2.CiliumLoadBalancerIPPool](idx, name)
}

func (c *Controller) groupObject(name string) (*ciliumv2.CiliumCIDRGroup, error) {
	c.mu.Lock()
	idx := c.groupObjects
	c.mu.Unlock()
	return leader.Lookup[ciliumv2.CiliumCIDRGroup](idx, name)
}

// syncPool brings the pool of name and its object in line.
func (c *Controller) syncPool(ctx context.Context, name string) error {
	obj, err := c.poolObject(name)
	if err != nil {
		return err
	}
	db, err := c.mirrorStore.GetLBPool(ctx, c.cfg.Space, name)
	found := err == nil
	if !found && !alloc.IsKind(err, alloc.KindNotFound) {
		return err
	}
	ippools := c.cilium.CiliumV2().CiliumLoadBalancerIPPools()
	switch {
	case found && !db.Origin.Kubernetes():
		if obj != nil && !mirrored(obj) {
			return c.writeImported(ctx, obj, nil, alloc.NotOwner("VIP pool", name, db.Origin, "CiliumLoadBalancerIPPool"))
		}
		return c.mirrorPool(ctx, obj, db)
	case found:
		if obj == nil || mirrored(obj) {
			// The object is gone (a mirrored one of the name owns
			// nothing): so goes its pool, as in Cilium.
			_, err := c.mirrorStore.DeleteLBPool(ctx, c.cfg.Space, name, alloc.AsOrigin(db.Origin))
			if alloc.IsKind(err, alloc.KindNotFound) || alloc.IsKind(err, alloc.KindStaleGeneration) {
				return nil
			}
			return err
		}
		return c.importPool(ctx, obj, &db)
	case obj == nil:
		return nil
	case mirrored(obj):
		// The database's pool is gone: so goes its mirror.
		uid := obj.UID
		err := ippools.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	return c.importPool(ctx, obj, nil)
}

// mirrorPool writes the database's pool db as its object (obj, nil when
// absent), reverting an edit with an event.
func (c *Controller) mirrorPool(ctx context.Context, obj *ciliumv2.CiliumLoadBalancerIPPool, db alloc.LBPool) error {
	spec, err := poolSpecToCilium(db.Spec)
	if err != nil {
		return err
	}
	ippools := c.cilium.CiliumV2().CiliumLoadBalancerIPPools()
	rev, labels := revision(db.UpdatedAt), managedLabels(db.Labels)
	cur := obj
	switch {
	case obj == nil:
		cur, err = ippools.Create(ctx, &ciliumv2.CiliumLoadBalancerIPPool{
			ObjectMeta: metav1.ObjectMeta{Name: db.Name, Labels: labels, Annotations: ownedAnnotations(nil, rev)}, Spec: spec}, metav1.CreateOptions{})
	case !equality.Semantic.DeepEqual(obj.Spec, spec) || !maps.Equal(obj.Labels, labels) ||
		obj.Annotations[AnnotationOwnedBy] != OwnedByDatabase || obj.Annotations[AnnotationRevision] != rev:
		edited := obj.Annotations[AnnotationRevision] == rev
		next := obj.DeepCopy()
		next.Spec, next.Labels, next.Annotations = spec, labels, ownedAnnotations(obj.Annotations, rev)
		if cur, err = ippools.Update(ctx, next, metav1.UpdateOptions{}); err == nil && edited {
			c.events.Eventf(cur, corev1.EventTypeWarning, EventReadOnly,
				"Edit reverted: VIP pool %q is owned by the database (made through the REST API, %s: %s); change it with PUT /v1/lb-pools/%s",
				db.Name, AnnotationOwnedBy, OwnedByDatabase, db.Name)
		}
	}
	if err != nil {
		return err
	}
	next := cur.DeepCopy()
	setPoolConditions(next, db, c.cfg.Now())
	if equality.Semantic.DeepEqual(next.Status, cur.Status) {
		return nil
	}
	_, err = ippools.UpdateStatus(ctx, next, metav1.UpdateOptions{})
	return err
}

// importPool brings the object's spec into the database (db, nil when
// the pool is absent) and writes the outcome on the object's status.
func (c *Controller) importPool(ctx context.Context, obj *ciliumv2.CiliumLoadBalancerIPPool, db *alloc.LBPool) error {
	origin := alloc.FromKubernetes(string(obj.UID))
	spec, err := poolSpecFromCilium(obj.Spec, obj.Annotations)
	if err == nil {
		switch {
		case db == nil:
			_, err = c.mirrorStore.CreateLBPool(ctx, alloc.LBPool{Space: c.cfg.Space, Name: obj.Name, Labels: obj.Labels, Spec: spec, Origin: origin})
		case db.Origin != origin || !samePoolSpec(db.Spec, spec) || !maps.Equal(db.Labels, obj.Labels):
			_, err = c.mirrorStore.UpdateLBPool(ctx, c.cfg.Space, obj.Name, obj.Labels, spec, alloc.AsOrigin(origin))
		}
	}
	refusal := storeRefusal(err)
	if err != nil && refusal == nil {
		return err
	}
	return c.writeImported(ctx, obj, refusal, nil)
}

// writeImported writes an object's status of the cluster: Cilium's
// conditions of its pool, when the database has one of its own, and
// ConditionImported (refused by refusal, or named by a pool of the
// database when taken is set).
func (c *Controller) writeImported(ctx context.Context, obj *ciliumv2.CiliumLoadBalancerIPPool, refusal *alloc.Error, taken error) error {
	next := obj.DeepCopy()
	cond := metav1.Condition{Type: ConditionImported, Status: metav1.ConditionTrue, Reason: ReasonImported,
		Message: "the VIP pool of the database of this name is owned by this object", ObservedGeneration: obj.Generation,
		LastTransitionTime: metav1.NewTime(c.cfg.Now())}
	switch {
	case taken != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonNameTaken, storeRefusal(taken).Detail
	case refusal != nil && refusal.Kind == alloc.KindConflict:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonNameTaken, refusal.Detail
	case refusal != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonInvalidSpec, refusal.Field+": "+refusal.Detail
	}
	if taken == nil {
		db, err := c.mirrorStore.GetLBPool(ctx, c.cfg.Space, obj.Name)
		switch {
		case err == nil && db.Origin.Kubernetes():
			setPoolConditions(next, db, c.cfg.Now())
		case err != nil && !alloc.IsKind(err, alloc.KindNotFound):
			return err
		}
	}
	before := meta.FindStatusCondition(obj.Status.Conditions, ConditionImported)
	meta.SetStatusCondition(&next.Status.Conditions, cond)
	if equality.Semantic.DeepEqual(next.Status, obj.Status) {
		return nil
	}
	cur, err := c.cilium.CiliumV2().CiliumLoadBalancerIPPools().UpdateStatus(ctx, next, metav1.UpdateOptions{})
	if err == nil && cond.Status == metav1.ConditionFalse && (before == nil || before.Message != cond.Message) {
		c.events.Eventf(cur, corev1.EventTypeWarning, EventImportRefused, "Not imported (%s): %s", cond.Reason, cond.Message)
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// samePoolSpec reports whether a pool of the database (db) already has
// the spec an object asks.
func samePoolSpec(db, asked alloc.LBPoolSpec) bool {
	db.Reserved = nil // resolved by the read, never asked
	return reflect.DeepEqual(db, asked)
}

// poolSpecFromCilium is a CiliumLoadBalancerIPPool's spec as a VIP
// pool's, the inverse of poolSpecToCilium: a block's cidr (its network,
// host bits cleared), or its start and stop (a start alone is one
// address, as in Cilium). What does not
// parse is a KindInvalid naming the field.
func poolSpecFromCilium(s ciliumv2.CiliumLoadBalancerIPPoolSpec, annotations map[string]string) (alloc.LBPoolSpec, error) {
	out := alloc.LBPoolSpec{Disabled: s.Disabled, ReserveFirstLast: s.AllowFirstLastIPs == ciliumv2.AllowFirstLastIPNo,
		AllowSpecialPurpose: annotations[AnnotationAllowSpecialPurpose] == "true"}
	for i, b := range s.Blocks {
		if b.Cidr != "" {
			p, err := netip.ParsePrefix(string(b.Cidr))
			if err != nil {
				return out, alloc.Invalid(fmt.Sprintf("spec.blocks[%d].cidr", i), "%q is no CIDR", b.Cidr)
			}
			// Cilium reads a CIDR with host bits as its network
			// (RangeFromPrefix): 10.0.0.12/24 is 10.0.0.0/24.
			out.Blocks = append(out.Blocks, alloc.LBBlock{CIDR: p.Masked()})
			continue
		}
		start, err := netip.ParseAddr(b.Start)
		if err != nil {
			return out, alloc.Invalid(fmt.Sprintf("spec.blocks[%d].start", i), "%q is no address", b.Start)
		}
		stop := start
		if b.Stop != "" {
			if stop, err = netip.ParseAddr(b.Stop); err != nil {
				return out, alloc.Invalid(fmt.Sprintf("spec.blocks[%d].stop", i), "%q is no address", b.Stop)
			}
		}
		out.Blocks = append(out.Blocks, alloc.LBBlock{Start: start, Stop: stop})
	}
	if s.ServiceSelector != nil {
		// The same JSON: Cilium's slim selector is Kubernetes'.
		j, err := json.Marshal(s.ServiceSelector)
		if err != nil {
			return out, err
		}
		out.ServiceSelector = new(metav1.LabelSelector)
		if err := json.Unmarshal(j, out.ServiceSelector); err != nil {
			return out, alloc.Invalid("spec.serviceSelector", "%v", err)
		}
	}
	return out, nil
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

// syncGroup brings the CIDR group of name and its object in line.
func (c *Controller) syncGroup(ctx context.Context, name string) error {
	obj, err := c.groupObject(name)
	if err != nil {
		return err
	}
	db, err := c.mirrorStore.GetCIDRGroup(ctx, c.cfg.Space, name)
	found := err == nil
	if !found && !alloc.IsKind(err, alloc.KindNotFound) {
		return err
	}
	cg := c.cilium.CiliumV2().CiliumCIDRGroups()
	switch {
	case found && !db.Origin.Kubernetes():
		if obj != nil && !mirrored(obj) {
			c.refuseGroup(obj, alloc.NotOwner("CIDR group", name, db.Origin, "CiliumCIDRGroup").(*alloc.Error))
			return nil
		}
		return c.mirrorGroup(ctx, obj, db)
	case found:
		if obj == nil || mirrored(obj) {
			_, err := c.mirrorStore.DeleteCIDRGroup(ctx, c.cfg.Space, name, alloc.AsOrigin(db.Origin))
			switch {
			case alloc.IsKind(err, alloc.KindNotFound), alloc.IsKind(err, alloc.KindStaleGeneration):
				return nil
			case alloc.IsKind(err, alloc.KindInUse):
				// A pool of the database reserves it: kept until the pool
				// lets it go, looked at again at each resync.
				c.log.Warn("mirror: the CiliumCIDRGroup is gone but a VIP pool reserves its group; kept", "group", name, "err", err)
				return nil
			}
			return err
		}
		return c.importGroup(ctx, obj, &db)
	case obj == nil:
		return nil
	case mirrored(obj):
		uid := obj.UID
		err := cg.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	return c.importGroup(ctx, obj, nil)
}

func (c *Controller) mirrorGroup(ctx context.Context, obj *ciliumv2.CiliumCIDRGroup, g alloc.CIDRGroup) error {
	cg := c.cilium.CiliumV2().CiliumCIDRGroups()
	spec := ciliumv2.CiliumCIDRGroupSpec{ExternalCIDRs: make([]api.CIDR, len(g.CIDRs))}
	for i, p := range g.CIDRs {
		spec.ExternalCIDRs[i] = api.CIDR(p.String())
	}
	rev, labels := revision(g.UpdatedAt), managedLabels(g.Labels)
	var err error
	switch {
	case obj == nil:
		_, err = cg.Create(ctx, &ciliumv2.CiliumCIDRGroup{
			ObjectMeta: metav1.ObjectMeta{Name: g.Name, Labels: labels, Annotations: ownedAnnotations(nil, rev)}, Spec: spec}, metav1.CreateOptions{})
	case !equality.Semantic.DeepEqual(obj.Spec, spec) || !maps.Equal(obj.Labels, labels) ||
		obj.Annotations[AnnotationOwnedBy] != OwnedByDatabase || obj.Annotations[AnnotationRevision] != rev:
		edited := obj.Annotations[AnnotationRevision] == rev
		next := obj.DeepCopy()
		next.Spec, next.Labels, next.Annotations = spec, labels, ownedAnnotations(obj.Annotations, rev)
		var cur *ciliumv2.CiliumCIDRGroup
		if cur, err = cg.Update(ctx, next, metav1.UpdateOptions{}); err == nil && edited {
			c.events.Eventf(cur, corev1.EventTypeWarning, EventReadOnly,
				"Edit reverted: CIDR group %q is owned by the database (made through the REST API, %s: %s); change it with PUT /v1/cidr-groups/%s",
				g.Name, AnnotationOwnedBy, OwnedByDatabase, g.Name)
		}
	}
	return err
}

// importGroup brings the object's CIDRs into the database (db, nil when
// the group is absent); a refusal is an event on the object, the
// CiliumCIDRGroup having no status.
func (c *Controller) importGroup(ctx context.Context, obj *ciliumv2.CiliumCIDRGroup, db *alloc.CIDRGroup) error {
	g := alloc.CIDRGroup{Space: c.cfg.Space, Name: obj.Name, Labels: obj.Labels, Origin: alloc.FromKubernetes(string(obj.UID)),
		AllowSpecialPurpose: obj.Annotations[AnnotationAllowSpecialPurpose] == "true"}
	var err error
	for i, s := range obj.Spec.ExternalCIDRs {
		p, perr := netip.ParsePrefix(string(s))
		if perr != nil {
			err = alloc.Invalid(fmt.Sprintf("spec.externalCIDRs[%d]", i), "%q is no CIDR", s)
			break
		}
		g.CIDRs = append(g.CIDRs, p)
	}
	if err == nil {
		switch {
		case db == nil:
			_, err = c.mirrorStore.CreateCIDRGroup(ctx, g)
		case db.Origin != g.Origin || !slices.Equal(db.CIDRs, g.CIDRs) || !maps.Equal(db.Labels, g.Labels) || db.AllowSpecialPurpose != g.AllowSpecialPurpose:
			_, err = c.mirrorStore.UpdateCIDRGroup(ctx, g, alloc.AsOrigin(g.Origin))
		}
	}
	if refusal := storeRefusal(err); refusal != nil {
		c.refuseGroup(obj, refusal)
		return nil
	}
	if err == nil {
		c.mu.Lock()
		delete(c.groupRefusals, obj.Name)
		c.mu.Unlock()
	}
	return err
}

// refuseGroup says the refusal on the group's object, once per refusal
// (the resync looks again and again).
func (c *Controller) refuseGroup(obj *ciliumv2.CiliumCIDRGroup, refusal *alloc.Error) {
	reason := ReasonInvalidSpec
	if refusal.Kind == alloc.KindConflict {
		reason = ReasonNameTaken
	}
	msg := fmt.Sprintf("Not imported (%s): %s: %s", reason, refusal.Field, refusal.Detail)
	c.mu.Lock()
	seen := c.groupRefusals[obj.Name] == string(obj.UID)+msg
	if c.groupRefusals != nil {
		c.groupRefusals[obj.Name] = string(obj.UID) + msg
	}
	c.mu.Unlock()
	if !seen {
		c.events.Event(obj, corev1.EventTypeWarning, EventImportRefused, msg)
	}
}
