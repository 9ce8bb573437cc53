// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package lbipam

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	slimv1 "github.com/cilium/cilium/pkg/k8s/slim/k8s/apis/meta/v1"
	"github.com/cilium/cilium/pkg/policy/api"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/util/retry"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// newIdleMirrorEnv is newMirrorEnv with no controller started.
func newIdleMirrorEnv(t *testing.T) *env { return start(t, true, true) }

func (e *env) ciliumClient() ciliumclient.Interface {
	e.t.Helper()
	cs, err := ciliumclient.NewForConfig(e.kc.Config())
	if err != nil {
		e.t.Fatal(err)
	}
	return cs
}

// eventually waits up to 15 s for ok, or fails the test saying what.
func (e *env) eventually(what string, ok func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(15 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			e.t.Fatalf("never: %s", what)
		}
	}
}

// poolCondition is a pool object's condition as "Status reason message",
// "none" when absent.
func (e *env) poolCondition(name, typ string) string {
	p, err := e.ciliumClient().CiliumV2().CiliumLoadBalancerIPPools().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	c := meta.FindStatusCondition(p.Status.Conditions, typ)
	if c == nil {
		return "none"
	}
	return string(c.Status) + " " + c.Reason + " " + c.Message
}

// events are the messages of the events of reason on the cluster-scoped
// object of name (their namespace is default).
func (e *env) events(name, reason string) []string {
	e.t.Helper()
	list, err := e.kube.CoreV1().Events(metav1.NamespaceDefault).List(e.ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": name, "reason": reason}.String()})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ev := range list.Items {
		out = append(out, ev.Message)
	}
	return out
}

func (e *env) dbPool(name string) alloc.LBPool {
	e.t.Helper()
	p, err := e.st.GetLBPool(e.ctx, alloc.DefaultSpace, name)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// TestKubectlPool: a CiliumLoadBalancerIPPool applied in the cluster is a
// VIP pool owned by the object. A new Service is served from it within
// 2 s of the pool's creation; its status says imported, with Cilium's
// counts; an edit changes the database; an edit the REST API would
// refuse is refused on its status and the database keeps the last good
// spec; its deletion re-homes a Service another pool selects and strips
// one no other pool selects (no_pool), as Cilium does.
func TestKubectlPool(t *testing.T) {
	e := newMirrorEnv(t)
	ippools := e.ciliumClient().CiliumV2().CiliumLoadBalancerIPPools()
	if _, err := e.kube.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The controller serving, its informers watching (a first pool
	// imported: a watch of a CRD this fresh may start a second or two
	// after its list), before the clock runs.
	if _, err := ippools.Create(e.ctx, &ciliumv2.CiliumLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: "warm-up"},
		Spec: ciliumv2.CiliumLoadBalancerIPPoolSpec{Disabled: true, Blocks: []ciliumv2.CiliumLoadBalancerIPPoolIPBlock{{Cidr: "10.0.39.0/30"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the warm-up pool imported", func() bool {
		return strings.HasPrefix(e.poolCondition("warm-up", ConditionImported), "True "+ReasonImported)
	})
	if err := ippools.Delete(e.ctx, "warm-up", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the warm-up pool deleted", func() bool {
		_, err := e.st.GetLBPool(e.ctx, alloc.DefaultSpace, "warm-up")
		return alloc.IsKind(err, alloc.KindNotFound)
	})

	began := time.Now()
	if _, err := ippools.Create(e.ctx, &ciliumv2.CiliumLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: "kp", Labels: map[string]string{"team": "web"}},
		Spec: ciliumv2.CiliumLoadBalancerIPPoolSpec{Blocks: []ciliumv2.CiliumLoadBalancerIPPoolIPBlock{{Cidr: "10.0.40.0/30"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	green := service("shop", "green")
	green.Labels["color"] = "green"
	e.create(green)
	e.wait("shop", "green", "10.0.40.0 satisfied")
	took := time.Since(began)
	t.Logf("pool created to the Service's ingress: %v", took)
	if took > 2*time.Second {
		t.Errorf("a new Service served %v after its kubectl pool was created, want within 2 s", took)
	}
	e.create(service("shop", "plain"))
	e.wait("shop", "plain", "10.0.40.1 satisfied")

	p := e.dbPool("kp")
	if !p.Origin.Kubernetes() || p.Origin.UID == "" || p.Labels["team"] != "web" {
		t.Fatalf("imported as %+v", p)
	}
	e.eventually("imported, with Cilium's counts", func() bool {
		return strings.HasPrefix(e.poolCondition("kp", ConditionImported), "True "+ReasonImported) &&
			e.poolCondition("kp", ConditionIPsUsed) == "Unknown noreason 2" && e.poolCondition("kp", ConditionIPsTotal) == "Unknown noreason 4" &&
			e.poolCondition("kp", ConditionPoolConflict) == "False resolved "
	})

	// kubectl edit: a second block, then one the REST API refuses (a
	// loopback range without the opt-in).
	// As kubectl edit: again on a conflict with a status write.
	edit := func(blocks ...ciliumv2.IPv4orIPv6CIDR) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			o, err := ippools.Get(e.ctx, "kp", metav1.GetOptions{})
			if err != nil {
				return err
			}
			o.Spec.Blocks = nil
			for _, b := range blocks {
				o.Spec.Blocks = append(o.Spec.Blocks, ciliumv2.CiliumLoadBalancerIPPoolIPBlock{Cidr: b})
			}
			_, err = ippools.Update(e.ctx, o, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	edit("10.0.40.0/30", "10.0.42.0/30")
	e.eventually("the edit in the database", func() bool { return len(e.dbPool("kp").Spec.Blocks) == 2 })
	edit("10.0.40.0/30", "127.0.0.0/30")
	e.eventually("the invalid edit refused on the status", func() bool {
		return strings.HasPrefix(e.poolCondition("kp", ConditionImported), "False "+ReasonInvalidSpec+" spec.blocks[1]")
	})
	if got := e.dbPool("kp").Spec.Blocks; len(got) != 2 || got[1].CIDR != netip.MustParsePrefix("10.0.42.0/30") {
		t.Fatalf("after a refused edit the database has %v, want the last good blocks", got)
	}
	// The event recorder writes asynchronously: the event may follow the
	// status it goes with.
	e.eventually("an ImportRefused event", func() bool { return len(e.events("kp", EventImportRefused)) > 0 })
	edit("10.0.40.0/30", "10.0.42.0/30")
	e.eventually("imported again", func() bool {
		return strings.HasPrefix(e.poolCondition("kp", ConditionImported), "True "+ReasonImported)
	})

	// Deleted: green goes to the pool that selects it, plain has none.
	spec := blocks("10.0.41.0/30")
	spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"color": "green"}}
	e.pool("greens", spec)
	if err := ippools.Delete(e.ctx, "kp", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.wait("shop", "green", "10.0.41.0 satisfied")
	e.wait("shop", "plain", " "+alloc.ReasonNoPool)
	if _, err := e.st.GetLBPool(e.ctx, alloc.DefaultSpace, "kp"); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("the deleted object's pool: %v", err)
	}
}

// TestKubectlPoolAsCilium: a pool applied with kubectl is taken as
// Cilium's operator takes it where the REST API is stricter. Cilium's
// TestPoolInternalConflict: blocks overlapping one another mark the pool
// conflicting (cidr_overlap; its Services have no pool), and an edit
// that removes the overlap lifts the mark and serves them. Cilium's
// TestRangeFromPrefix: a CIDR with host bits (10.0.12.12/24) is its
// network (10.0.12.0/24).
func TestKubectlPoolAsCilium(t *testing.T) {
	e := newMirrorEnv(t)
	ippools := e.ciliumClient().CiliumV2().CiliumLoadBalancerIPPools()
	cidrs := func(cs ...ciliumv2.IPv4orIPv6CIDR) []ciliumv2.CiliumLoadBalancerIPPoolIPBlock {
		var out []ciliumv2.CiliumLoadBalancerIPPoolIPBlock
		for _, c := range cs {
			out = append(out, ciliumv2.CiliumLoadBalancerIPPoolIPBlock{Cidr: c})
		}
		return out
	}
	apply := func(name, color string, blocks []ciliumv2.CiliumLoadBalancerIPPoolIPBlock) {
		t.Helper()
		spec := ciliumv2.CiliumLoadBalancerIPPoolSpec{Blocks: blocks,
			ServiceSelector: &slimv1.LabelSelector{MatchLabels: map[string]slimv1.MatchLabelsValue{"color": color}}}
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			o, err := ippools.Get(e.ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				_, err = ippools.Create(e.ctx, &ciliumv2.CiliumLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}, metav1.CreateOptions{})
				return err
			} else if err != nil {
				return err
			}
			o.Spec = spec
			_, err = ippools.Update(e.ctx, o, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	svc := func(name, color string) {
		s := service("default", name)
		s.Labels["color"] = color
		e.create(s)
	}

	apply("pool-a", "a", cidrs("10.0.10.0/24", "10.0.10.64/28"))
	e.eventually("pool-a imported and marked conflicting", func() bool {
		return strings.HasPrefix(e.poolCondition("pool-a", ConditionImported), "True "+ReasonImported) &&
			strings.HasPrefix(e.poolCondition("pool-a", ConditionPoolConflict), "True cidr_overlap block 10.0.10.64/28 overlaps block 10.0.10.0/24")
	})
	svc("a", "a")
	e.wait("default", "a", " "+alloc.ReasonNoPool)
	apply("pool-a", "a", cidrs("10.0.10.0/24"))
	e.wait("default", "a", "10.0.10.0 satisfied")
	if got := e.poolCondition("pool-a", ConditionPoolConflict); got != "False resolved " {
		t.Errorf("pool-a's conflict after the edit: %q", got)
	}

	apply("offset", "b", cidrs("10.0.12.12/24"))
	svc("b", "b")
	e.wait("default", "b", "10.0.12.0 satisfied")
	if got := e.dbPool("offset").Spec.Blocks; len(got) != 1 || got[0].CIDR != netip.MustParsePrefix("10.0.12.0/24") {
		t.Errorf("10.0.12.12/24 imported as %v, want 10.0.12.0/24", got)
	}
	if got := e.poolCondition("offset", ConditionIPsTotal); got != "Unknown noreason 256" {
		t.Errorf("offset's total: %q", got)
	}
}

// TestMirroredPoolReadOnly: with a resync of an hour, so that only
// events can act, a pool made through the REST API is mirrored annotated
// read-only; a kubectl edit of it is reverted with a ReadOnly event, an
// edit through the REST API is mirrored at once without one, a kubectl
// delete re-creates it; a pool object of the
// cluster of the same name as a pool of the database is refused on its
// status (name_taken) and changes nothing. CIDR groups of the database
// are reverted likewise.
func TestMirroredPoolReadOnly(t *testing.T) {
	e := newIdleMirrorEnv(t)
	e.resync = time.Hour
	cs := e.ciliumClient()
	ippools, groups := cs.CiliumV2().CiliumLoadBalancerIPPools(), cs.CiliumV2().CiliumCIDRGroups()
	e.pool("blue", blocks("10.0.50.0/30"))
	e.pool("taken", blocks("10.0.51.0/30"))
	if _, err := e.st.CreateCIDRGroup(e.ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "corp",
		CIDRs: []netip.Prefix{netip.MustParsePrefix("10.30.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ippools.Create(e.ctx, &ciliumv2.CiliumLoadBalancerIPPool{ObjectMeta: metav1.ObjectMeta{Name: "taken"},
		Spec: ciliumv2.CiliumLoadBalancerIPPoolSpec{Blocks: []ciliumv2.CiliumLoadBalancerIPPoolIPBlock{{Cidr: "10.0.99.0/30"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.controller("a")

	e.eventually("blue mirrored read-only", func() bool {
		o, err := ippools.Get(e.ctx, "blue", metav1.GetOptions{})
		return err == nil && o.Annotations[AnnotationOwnedBy] == OwnedByDatabase && o.Labels[LabelManagedBy] == ManagedBy
	})
	e.eventually("taken refused", func() bool {
		return strings.HasPrefix(e.poolCondition("taken", ConditionImported), "False "+ReasonNameTaken)
	})
	if got := e.dbPool("taken"); got.Origin.Kubernetes() || got.Spec.Blocks[0].CIDR != netip.MustParsePrefix("10.0.51.0/30") {
		t.Fatalf("a pool object of the name of a database pool changed it: %+v", got)
	}

	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		o, err := ippools.Get(e.ctx, "blue", metav1.GetOptions{})
		if err != nil {
			return err
		}
		o.Spec.Blocks = []ciliumv2.CiliumLoadBalancerIPPoolIPBlock{{Cidr: "10.0.60.0/24"}}
		o.Spec.Disabled = true
		_, err = ippools.Update(e.ctx, o, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the edit reverted", func() bool {
		o, err := ippools.Get(e.ctx, "blue", metav1.GetOptions{})
		return err == nil && !o.Spec.Disabled && len(o.Spec.Blocks) == 1 && o.Spec.Blocks[0].Cidr == "10.0.50.0/30"
	})
	e.eventually("a ReadOnly event", func() bool {
		evs := e.events("blue", EventReadOnly)
		return len(evs) > 0 && strings.Contains(evs[0], "owned by the database")
	})
	if got := e.dbPool("blue"); got.Spec.Disabled || got.Spec.Blocks[0].CIDR != netip.MustParsePrefix("10.0.50.0/30") {
		t.Fatalf("a kubectl edit of a mirrored pool reached the database: %+v", got.Spec)
	}
	// An edit through the REST API reaches the object at once, and is no
	// edit of the object: no event.
	reverts := len(e.events("blue", EventReadOnly))
	if _, err := e.st.UpdateLBPool(e.ctx, alloc.DefaultSpace, "blue", map[string]string{"tier": "gold"}, blocks("10.0.50.0/29")); err != nil {
		t.Fatal(err)
	}
	e.eventually("the REST API's edit mirrored", func() bool {
		o, err := ippools.Get(e.ctx, "blue", metav1.GetOptions{})
		return err == nil && o.Labels["tier"] == "gold" && len(o.Spec.Blocks) == 1 && o.Spec.Blocks[0].Cidr == "10.0.50.0/29"
	})
	time.Sleep(time.Second) // an event would be written by now
	if n := len(e.events("blue", EventReadOnly)); n != reverts {
		t.Errorf("%d ReadOnly events after the REST API's edit, want %d", n, reverts)
	}
	if err := ippools.Delete(e.ctx, "blue", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("blue re-created", func() bool {
		o, err := ippools.Get(e.ctx, "blue", metav1.GetOptions{})
		return err == nil && o.UID != "" && len(o.Spec.Blocks) == 1
	})
	e.dbPool("blue")

	e.eventually("corp mirrored", func() bool {
		_, err := groups.Get(e.ctx, "corp", metav1.GetOptions{})
		return err == nil
	})
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		g, err := groups.Get(e.ctx, "corp", metav1.GetOptions{})
		if err != nil {
			return err
		}
		g.Spec.ExternalCIDRs = []api.CIDR{"10.31.0.0/16"}
		_, err = groups.Update(e.ctx, g, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the group's edit reverted with an event", func() bool {
		g, err := groups.Get(e.ctx, "corp", metav1.GetOptions{})
		return err == nil && slices.Equal(g.Spec.ExternalCIDRs, []api.CIDR{"10.30.0.0/16"}) && len(e.events("corp", EventReadOnly)) > 0
	})
}

// TestKubectlCIDRGroup: a CiliumCIDRGroup applied in the cluster is a
// CIDR group owned by the object: imported, its edits flow in, one the
// REST API refuses (a group reaching link-local addresses without the
// opt-in) is an event and leaves the database as it was, the opt-in's
// annotation lets it in, and its deletion deletes the group.
func TestKubectlCIDRGroup(t *testing.T) {
	e := newMirrorEnv(t)
	groups := e.ciliumClient().CiliumV2().CiliumCIDRGroups()
	if _, err := groups.Create(e.ctx, &ciliumv2.CiliumCIDRGroup{ObjectMeta: metav1.ObjectMeta{Name: "partners", Labels: map[string]string{"tier": "ext"}},
		Spec: ciliumv2.CiliumCIDRGroupSpec{ExternalCIDRs: []api.CIDR{"192.0.2.0/24"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dbGroup := func() (alloc.CIDRGroup, error) { return e.st.GetCIDRGroup(e.ctx, alloc.DefaultSpace, "partners") }
	e.eventually("imported", func() bool {
		g, err := dbGroup()
		return err == nil && g.Origin.Kubernetes() && g.Labels["tier"] == "ext" && slices.Equal(g.CIDRs, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")})
	})
	edit := func(mutate func(*ciliumv2.CiliumCIDRGroup)) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			g, err := groups.Get(e.ctx, "partners", metav1.GetOptions{})
			if err != nil {
				return err
			}
			mutate(g)
			_, err = groups.Update(e.ctx, g, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	edit(func(g *ciliumv2.CiliumCIDRGroup) {
		g.Spec.ExternalCIDRs = append(g.Spec.ExternalCIDRs, "198.51.100.0/24")
	})
	e.eventually("the edit in the database", func() bool {
		g, err := dbGroup()
		return err == nil && len(g.CIDRs) == 2
	})
	edit(func(g *ciliumv2.CiliumCIDRGroup) { g.Spec.ExternalCIDRs = []api.CIDR{"0.0.0.0/0"} })
	e.eventually("the invalid edit refused by an event", func() bool {
		evs := e.events("partners", EventImportRefused)
		return len(evs) > 0 && strings.Contains(evs[0], ReasonInvalidSpec)
	})
	if g, err := dbGroup(); err != nil || len(g.CIDRs) != 2 {
		t.Fatalf("after a refused edit the database has %v (%v), want the last good CIDRs", g.CIDRs, err)
	}
	edit(func(g *ciliumv2.CiliumCIDRGroup) {
		g.Annotations = map[string]string{AnnotationAllowSpecialPurpose: "true"}
	})
	e.eventually("the opt-in lets it in", func() bool {
		g, err := dbGroup()
		return err == nil && g.AllowSpecialPurpose && slices.Equal(g.CIDRs, []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")})
	})
	if _, err := e.st.UpdateCIDRGroup(e.ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "partners"}); !alloc.IsKind(err, alloc.KindConflict) {
		t.Fatalf("the REST API edited a group of the cluster: %v", err)
	}
	if err := groups.Delete(e.ctx, "partners", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("the group deleted", func() bool {
		_, err := dbGroup()
		return alloc.IsKind(err, alloc.KindNotFound)
	})
	if _, err := groups.Get(e.ctx, "partners", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the object came back: %v", err)
	}
}
