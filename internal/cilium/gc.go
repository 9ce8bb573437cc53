// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"strings"
	"sync"
	"time"

	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// AnnotationDoNotGC on a CiliumNode keeps the garbage collector away from
// it whatever its Node (Cilium's skipGCAnnotationKey; "true" in any
// letter case).
const AnnotationDoNotGC = "cilium.io/do-not-gc"

// DefaultNodesGCInterval is Cilium's nodes-gc-interval.
const DefaultNodesGCInterval = 5 * time.Minute

// nodeGC deletes the CiliumNodes whose Kubernetes Node is gone, as Cilium's
// operator does (operator/watchers/cilium_node_gc.go, v1.20.2): a pass
// every interval marks such a CiliumNode as a candidate, and a later pass
// at least an interval after the mark deletes it if its Node is still
// gone. A CiliumNode with ownerReferences is left to Kubernetes' own
// garbage collector, and one annotated cilium.io/do-not-gc is never
// deleted. A Node that comes back clears the mark.
//
// Deleting the CiliumNode is what gives the node's addresses back (its
// reconcile sees it gone); this is also why the delete waits: an agent
// whose Node briefly vanished (re-registration, an API server restored
// from backup) keeps every address it reports.
type nodeGC struct {
	o        *Operator
	interval time.Duration

	mu         sync.Mutex
	candidates map[string]time.Time // node name -> first seen without its Node
}

// run passes over the CiliumNodes at once and then every interval until
// ctx ends, as Cilium's controller runs its GC.
func (g *nodeGC) run(ctx context.Context) {
	wait.UntilWithContext(ctx, g.pass, g.interval)
}

// pass is one round over the cached CiliumNodes.
func (g *nodeGC) pass(ctx context.Context) {
	o := g.o
	o.mu.Lock()
	nodes, kNodes := o.nodes, o.kNode
	o.mu.Unlock()
	if nodes == nil || kNodes == nil {
		return
	}
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, obj := range nodes.List() {
		cn, ok := obj.(*ciliumv2.CiliumNode)
		if !ok {
			continue
		}
		name := cn.Name
		if _, exists, err := kNodes.GetByKey(name); err != nil || exists {
			delete(g.candidates, name)
			continue
		}
		if !gcCandidate(cn) {
			delete(g.candidates, name)
			continue
		}
		marked, ok := g.candidates[name]
		if !ok {
			o.log.Info("CiliumNode without its Node: a garbage collection candidate", "node", name)
			g.candidates[name] = now
			continue
		}
		if !marked.Before(now.Add(-g.interval)) {
			continue
		}
		err := o.cilium.CiliumV2().CiliumNodes().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			o.log.Warn("garbage collecting a CiliumNode", "node", name, "err", err)
			continue
		}
		o.log.Info("garbage collected the CiliumNode of a deleted Node", "node", name)
		delete(g.candidates, name)
	}
	// Forget the marks of CiliumNodes that are gone.
	for name := range g.candidates {
		if _, exists, _ := nodes.GetByKey(name); !exists {
			delete(g.candidates, name)
		}
	}
}

// gcCandidate says whether Cilium's garbage collector may delete cn once
// its Node is gone.
func gcCandidate(cn *ciliumv2.CiliumNode) bool {
	if len(cn.OwnerReferences) > 0 {
		return false
	}
	v, ok := cn.Annotations[AnnotationDoNotGC]
	return !ok || strings.ToLower(v) != "true"
}
