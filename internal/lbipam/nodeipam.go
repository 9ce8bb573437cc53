// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package lbipam

import (
	"context"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/ipam-dev/ipam/internal/leader"
)

// Node IPAM (Cilium's operator/pkg/nodeipam): a Service of the class
// io.cilium/node is given the addresses of the nodes it may be reached on,
// nothing being allocated.
const (
	// AnnotationMatchNodeLabels restricts the nodes by a label selector
	// (Kubernetes' selector syntax: "zone=a,!spot").
	AnnotationMatchNodeLabels = "io.cilium.nodeipam/match-node-labels"
	// TaintToBeDeleted is the Cluster Autoscaler's taint on a node it is
	// about to delete.
	TaintToBeDeleted = "ToBeDeletedByClusterAutoscaler"
)

// nodeEligible is Kubernetes' stable node set for load balancers
// (KEP-3458), as Cilium's Node IPAM applies it: not being deleted, not
// labelled node.kubernetes.io/exclude-from-external-load-balancers, not
// tainted for deletion by the Cluster Autoscaler.
func nodeEligible(n *corev1.Node) bool {
	if !n.DeletionTimestamp.IsZero() {
		return false
	}
	if _, excluded := n.Labels[corev1.LabelNodeExcludeBalancers]; excluded {
		return false
	}
	return !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintToBeDeleted })
}

// nodeIngress answers the addresses Node IPAM publishes for svc: of the
// eligible nodes matching its match-node-labels annotation (an annotation
// that does not parse selects none, and says why) and, with
// externalTrafficPolicy Local, hosting a ready endpoint of it in slices
// (the Service's EndpointSlices), for each family of spec.ipFamilies the
// nodes' ExternalIPs of that family, or their InternalIPs when none has
// one: as the Node writes them, sorted as strings, as Cilium's
// getNodeLoadBalancerIngresses does (so a cluster moving over sees no
// status rewritten: 10.0.0.10 before 10.0.0.9).
//
// Cilium prefers ExternalIPs over InternalIPs for all families at once, so
// a dual-stack cluster whose nodes have an IPv4 ExternalIP and no IPv6 one
// publishes no IPv6 address; here each family falls back on its own.
func nodeIngress(svc *corev1.Service, nodes []*corev1.Node, eps []*discoveryv1.EndpointSlice) ([]string, error) {
	sel := labels.Everything()
	if s, ok := svc.Annotations[AnnotationMatchNodeLabels]; ok {
		var err error
		if sel, err = labels.Parse(s); err != nil {
			return nil, err
		}
	}
	var local map[string]bool
	if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
		local = map[string]bool{}
		for _, es := range eps {
			for _, ep := range es.Endpoints {
				if ep.NodeName != nil && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
					local[*ep.NodeName] = true
				}
			}
		}
	}
	fams := svc.Spec.IPFamilies
	if len(fams) == 0 {
		fams = []corev1.IPFamily{corev1.IPv4Protocol}
	}
	var out []string
	for _, fam := range fams {
		var ext, in []string
		for _, n := range nodes {
			if !nodeEligible(n) || !sel.Matches(labels.Set(n.Labels)) || (local != nil && !local[n.Name]) {
				continue
			}
			for _, a := range n.Status.Addresses {
				ip, err := netip.ParseAddr(a.Address)
				if err != nil || ip.Is4() != (fam == corev1.IPv4Protocol) {
					continue
				}
				switch a.Type {
				case corev1.NodeExternalIP:
					ext = append(ext, a.Address)
				case corev1.NodeInternalIP:
					in = append(in, a.Address)
				}
			}
		}
		if len(ext) == 0 {
			ext = in
		}
		out = append(out, ext...)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// nodeIPAMInformers watch Nodes (any change may change every Node IPAM
// Service's addresses) and EndpointSlices (a change concerns its
// Service), queueing the Services concerned.
func (c *Controller) nodeIPAMInformers(q workqueue.TypedRateLimitingInterface[string], services cache.Indexer) (nodes, sliceInf cache.SharedIndexInformer, err error) {
	nodes = cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(c.kube.CoreV1().RESTClient(), "nodes", metav1.NamespaceAll, fields.Everything()),
		&corev1.Node{}, 0, cache.Indexers{})
	everyNodeService := func(any) {
		for _, obj := range services.List() {
			if svc, ok := obj.(*corev1.Service); ok && c.handler(svc) == DefaultNodeIPAM {
				q.Add(svc.Namespace + "/" + svc.Name)
			}
		}
	}
	if _, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: everyNodeService, UpdateFunc: func(_, obj any) { everyNodeService(obj) }, DeleteFunc: everyNodeService,
	}); err != nil {
		return nil, nil, err
	}
	sliceInf = cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(c.kube.DiscoveryV1().RESTClient(), "endpointslices", metav1.NamespaceAll, fields.Everything()),
		&discoveryv1.EndpointSlice{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	itsService := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if es, ok := obj.(*discoveryv1.EndpointSlice); ok && es.Labels[discoveryv1.LabelServiceName] != "" {
			q.Add(es.Namespace + "/" + es.Labels[discoveryv1.LabelServiceName])
		}
	}
	if _, err := sliceInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: itsService, UpdateFunc: func(_, obj any) { itsService(obj) }, DeleteFunc: itsService,
	}); err != nil {
		return nil, nil, err
	}
	return nodes, sliceInf, nil
}

// reconcileNodeIPAM writes svc's node addresses as its load balancer
// ingress (and drops LB IPAM's condition, from a class it had before).
func (c *Controller) reconcileNodeIPAM(ctx context.Context, svc *corev1.Service) error {
	c.mu.Lock()
	nodeIdx, sliceIdx := c.nodes, c.slices
	c.mu.Unlock()
	if nodeIdx == nil || sliceIdx == nil {
		return leader.ErrNotLeading
	}
	var nodes []*corev1.Node
	for _, obj := range nodeIdx.List() {
		if n, ok := obj.(*corev1.Node); ok {
			nodes = append(nodes, n)
		}
	}
	var eps []*discoveryv1.EndpointSlice
	inNS, err := sliceIdx.ByIndex(cache.NamespaceIndex, svc.Namespace)
	if err != nil {
		return err
	}
	for _, obj := range inNS {
		if es, ok := obj.(*discoveryv1.EndpointSlice); ok && es.Labels[discoveryv1.LabelServiceName] == svc.Name {
			eps = append(eps, es)
		}
	}
	addrs, err := nodeIngress(svc, nodes, eps)
	if err != nil {
		// The Service's annotation is at fault: said once per change of
		// it, not retried.
		c.log.Warn("node IPAM: the Service's "+AnnotationMatchNodeLabels+" does not parse", "service", svc.Namespace+"/"+svc.Name, "err", err)
		return nil
	}
	st, _ := clearedStatus(svc)
	st.LoadBalancer.Ingress = nil
	for _, a := range addrs {
		st.LoadBalancer.Ingress = append(st.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: a})
	}
	if equality.Semantic.DeepEqual(st, svc.Status) {
		return nil
	}
	return c.writeStatus(ctx, svc, st)
}
