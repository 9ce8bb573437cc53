// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package kube looks up what the server needs of a Pod: its labels and
// annotations and its namespace's, which pool selection reads (Cilium
// multi-pool semantics: the ipam.cilium.io/ip-pool annotations and pod or
// namespace label selectors), and the node it is bound to, which decides
// what a node certificate may do for it (a node acts only for the Pods on
// it, as Kubernetes' Node authorizer has it). With it the server resolves
// pools itself, so the CNI plugin sends only the Pod's namespace and name.
//
// Lookups sit on the Pod start critical path, so they are answered from
// informer caches. A node-wide server watches every Pod of the cluster,
// so the caches keep only what lookups read: namespaces through a
// metadata informer, Pods through a typed informer (spec.nodeName is not
// metadata) whose transform drops everything but the name, UID, labels,
// annotations and node name before an object is stored; full Pod specs
// and statuses would cost many times the memory. The Pod watch does carry
// whole Pods, in protobuf, as the kube-controller-manager's do.
//
// The caches lag the API server by a moment: a Pod created a moment ago
// (the CNI call comes right after the kubelet has it) is fetched with one
// direct GET on a miss, and a caller that expects something else of a
// cached Pod (bound to its node, not elsewhere) asks for the Pod to be read
// again (Lookup's stale), since the watch trails the scheduler's binding
// and a StatefulSet Pod recreated under the same name on another node.
package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/metadata/metadatalister"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Metadata is the part of an object the pool selection reads.
type Metadata struct {
	Labels      map[string]string
	Annotations map[string]string
}

// PodInfo is what is known of a Pod: its metadata and its namespace's, for
// pool selection, and its identity and placement.
type PodInfo struct {
	Pod       Metadata
	Namespace Metadata
	UID       string
	// NodeName is spec.nodeName: the node the Pod is bound to, empty while
	// it is not scheduled.
	NodeName string
}

// ErrNotFound is returned, wrapped, when the Pod or its namespace does not
// exist in the API server (not merely in the cache).
var ErrNotFound = errors.New("not found")

// lastApplied is written by kubectl apply and holds a copy of the whole
// object as applied; pool selection never reads it.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

var namespacesGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// protobuf is the Pod client's wire format: a Pod decodes several times
// faster from it than from JSON, and the watch of every Pod of a cluster
// is the server's largest stream.
const protobuf = "application/vnd.kubernetes.protobuf"

// Config says how to reach the API server.
type Config struct {
	// Kubeconfig is the path of a kubeconfig file; empty means the in-cluster
	// config (service account token and KUBERNETES_SERVICE_HOST).
	Kubeconfig string
	// Resync is the informers' periodic resync; 0 disables it. Nothing here
	// reacts to events, so a resync only costs CPU.
	Resync time.Duration
	// Logger receives watch failures and cache misses; nil means
	// slog.Default().
	Logger *slog.Logger
	// QPS and Burst bound the client's request rate; 0 means client-go's
	// defaults (5 and 10). Cache misses and rechecks (Lookup's stale)
	// are the only steady requests.
	QPS   float32
	Burst int
}

// Informers watches Pods and Namespace metadata and answers lookups from
// its caches. It is safe for concurrent use.
type Informers struct {
	core       kubernetes.Interface // Pods
	meta       metadata.Interface   // namespaces
	log        *slog.Logger
	pods       podResource
	namespaces resource
	start      sync.Once
}

// podResource is the Pod informer and the lister over its cache.
type podResource struct {
	informer cache.SharedIndexInformer
	lister   corelisters.PodLister
}

// resource is the metadata informer of one resource and the lister over
// its cache.
type resource struct {
	gvr      schema.GroupVersionResource
	informer cache.SharedIndexInformer
	lister   metadatalister.Lister
}

// New builds the clients from cfg's kubeconfig and the informers over
// them. It contacts nothing; Start does.
func New(cfg Config) (*Informers, error) {
	rc, err := RESTConfig(cfg.Kubeconfig, cfg.QPS, cfg.Burst)
	if err != nil {
		return nil, err
	}
	return NewForConfig(rc, cfg)
}

// NewForConfig builds the clients from rc and the informers over them;
// only cfg.Resync and cfg.Logger are used. It contacts nothing; Start
// does. Tests pass a kubetest cluster's configuration.
func NewForConfig(rc *rest.Config, cfg Config) (*Informers, error) {
	pc := rest.CopyConfig(rc)
	pc.ContentType = protobuf
	pc.AcceptContentTypes = protobuf + ",application/json"
	core, err := kubernetes.NewForConfig(pc)
	if err != nil {
		return nil, fmt.Errorf("kube: building client: %w", err)
	}
	meta, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: building metadata client: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	i := &Informers{core: core, meta: meta, log: log}
	i.pods = i.newPodResource(cfg.Resync)
	i.namespaces = i.newResource(namespacesGVR, cfg.Resync)
	return i, nil
}

// RESTConfig loads the client configuration from a kubeconfig file, or the
// in-cluster one when the path is empty; qps and burst above 0 replace
// client-go's defaults (5 and 10).
func RESTConfig(kubeconfig string, qps float32, burst int) (*rest.Config, error) {
	var (
		rc  *rest.Config
		err error
	)
	if kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kube: loading client config: %w", err)
	}
	if qps > 0 {
		rc.QPS = qps
	}
	if burst > 0 {
		rc.Burst = burst
	}
	return rc, nil
}

func (i *Informers) newPodResource(resync time.Duration) podResource {
	// No indexers: lookups are by namespace/name key only.
	inf := coreinformers.NewPodInformer(i.core, metav1.NamespaceAll, resync, cache.Indexers{})
	// Both setters fail only once the informer runs, which it cannot yet.
	_ = inf.SetTransform(trimPod)
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		i.watchError("pods", err)
	})
	return podResource{informer: inf, lister: corelisters.NewPodLister(inf.GetIndexer())}
}

func (i *Informers) newResource(gvr schema.GroupVersionResource, resync time.Duration) resource {
	// No indexers: lookups are by namespace/name key only.
	inf := metadatainformer.NewFilteredMetadataInformer(i.meta, gvr, metav1.NamespaceAll, resync, cache.Indexers{}, nil).Informer()
	// Both setters fail only once the informer runs, which it cannot yet.
	_ = inf.SetTransform(trim)
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		i.watchError(gvr.Resource, err)
	})
	return resource{gvr: gvr, informer: inf, lister: metadatalister.New(inf.GetIndexer(), gvr)}
}

// watchError sends list and watch failures to the server's log rather than
// klog's, so that a missing RBAC permission (the caches never sync) shows
// where the operator looks.
func (i *Informers) watchError(resource string, err error) {
	switch {
	case errors.Is(err, io.EOF):
		// The watch closed normally; the reflector reopens it.
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err), errors.Is(err, io.ErrUnexpectedEOF):
		i.log.Debug("kubernetes watch closed", "resource", resource, "err", err)
	default:
		i.log.Warn("kubernetes list or watch failed", "resource", resource, "err", err)
	}
}

// trim is the namespace informer's transform: it keeps only what lookups
// and the cache itself need (trimmedMeta). It is idempotent, as client-go
// requires of transforms.
func trim(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: trimmedMeta(m.ObjectMeta)}, nil
}

// trimPod is the Pod informer's transform: of the whole Pod it keeps the
// metadata lookups read (trimmedMeta) and spec.nodeName, nothing of the
// rest of the spec or of the status. Every Pod of the cluster sits in the
// cache, and a Pod's containers, volumes and status are many times the
// size of what is kept. It is idempotent, as client-go requires.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{TypeMeta: p.TypeMeta, ObjectMeta: trimmedMeta(p.ObjectMeta),
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName}}, nil
}

// trimmedMeta keeps of m its key, UID and resource version (which the
// cache needs) and its labels and annotations. managedFields and kubectl's
// last-applied-configuration annotation are usually larger than everything
// else in the metadata together; dropping them (and owner references,
// finalizers and the like) keeps the cache small. m is not changed.
func trimmedMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	out := metav1.ObjectMeta{
		Namespace:       m.Namespace,
		Name:            m.Name,
		UID:             m.UID,
		ResourceVersion: m.ResourceVersion,
		Labels:          m.Labels,
		Annotations:     m.Annotations,
	}
	if _, ok := m.Annotations[lastApplied]; ok {
		out.Annotations = maps.Clone(m.Annotations)
		delete(out.Annotations, lastApplied)
	}
	return out
}

// Start starts the informers; they stop when ctx ends. Calls after the first
// do nothing.
func (i *Informers) Start(ctx context.Context) {
	i.start.Do(func() {
		go i.namespaces.informer.RunWithContext(ctx)
		go i.pods.informer.RunWithContext(ctx)
	})
}

// syncPoll is how often WaitForSync checks the caches; short, since the
// server waits on it at start-up.
const syncPoll = 20 * time.Millisecond

// WaitForSync waits until both caches hold a full listing, and returns
// ctx.Err() if ctx ends first. Lookups work before that, through direct
// GETs, so waiting only spares the API server a burst at start-up.
func (i *Informers) WaitForSync(ctx context.Context) error {
	t := time.NewTicker(syncPoll)
	defer t.Stop()
	for !i.Synced() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// Synced reports whether both caches hold a full listing, for readiness.
func (i *Informers) Synced() bool {
	return i.namespaces.informer.HasSynced() && i.pods.informer.HasSynced()
}

// Lookup returns the labels and annotations of Pod namespace/name and of
// its namespace, and the Pod's UID and node. It reads the caches and falls
// back to a direct GET on a miss; an error wrapping ErrNotFound means the
// API server has no such object. stale, when not nil, is asked about a
// Pod found in the cache: when it answers true (the caller expected
// otherwise, say the Pod bound to its node), the Pod is read again from
// the API server, whose answer stands. The maps returned are the caller's
// own.
func (i *Informers) Lookup(ctx context.Context, namespace, name string, stale func(PodInfo) bool) (PodInfo, error) {
	if namespace == "" || name == "" {
		return PodInfo{}, fmt.Errorf("kube: lookup needs a namespace and a pod name, got %q and %q", namespace, name)
	}
	ns, err := i.getNamespace(ctx, namespace)
	if err != nil {
		return PodInfo{}, err
	}
	pod, cached, err := i.getPod(ctx, namespace, name, false)
	if err == nil && cached && stale != nil && stale(podInfo(pod, ns)) {
		i.log.DebugContext(ctx, "kubernetes cache may be stale, reading from the API server",
			"object", "pods "+namespace+"/"+name, "cachedNode", pod.Spec.NodeName)
		pod, _, err = i.getPod(ctx, namespace, name, true)
	}
	if err != nil {
		return PodInfo{}, err
	}
	return podInfo(pod, ns), nil
}

// podInfo is what Lookup answers of pod in namespace ns.
func podInfo(pod *corev1.Pod, ns *metav1.PartialObjectMetadata) PodInfo {
	return PodInfo{Pod: metadataOf(pod.ObjectMeta), Namespace: metadataOf(ns.ObjectMeta), UID: string(pod.UID), NodeName: pod.Spec.NodeName}
}

// getNamespace returns the namespace from its cache, or from the API
// server on a miss.
func (i *Informers) getNamespace(ctx context.Context, name string) (*metav1.PartialObjectMetadata, error) {
	r := &i.namespaces
	obj, err := r.lister.Get(name)
	if err == nil {
		return obj, nil
	}
	desc := r.gvr.Resource + " " + name
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("kube: reading %s from cache: %w", desc, err)
	}
	i.log.DebugContext(ctx, "kubernetes cache miss, reading from the API server", "object", desc)
	obj, err = i.meta.Resource(r.gvr).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, getError(desc, err)
	}
	trimmed, _ := trim(obj)
	return trimmed.(*metav1.PartialObjectMetadata), nil
}

// getPod returns Pod namespace/name from the cache, or from the API server
// on a miss or when direct; cached says which. An object read from the API
// server is not added to the cache, which the watch fills in shortly.
func (i *Informers) getPod(ctx context.Context, namespace, name string, direct bool) (pod *corev1.Pod, cached bool, err error) {
	desc := "pods " + namespace + "/" + name
	if !direct {
		pod, err = i.pods.lister.Pods(namespace).Get(name)
		if err == nil {
			return pod, true, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, false, fmt.Errorf("kube: reading %s from cache: %w", desc, err)
		}
		i.log.DebugContext(ctx, "kubernetes cache miss, reading from the API server", "object", desc)
	}
	// A plain GET is a quorum read: the point is to see what the cache has
	// not, so the API server's own watch cache (ResourceVersion "0") would
	// share the lag.
	pod, err = i.core.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, false, getError(desc, err)
	}
	trimmed, _ := trimPod(pod)
	return trimmed.(*corev1.Pod), false, nil
}

// getError wraps the error of a direct GET of desc: ErrNotFound for an
// object the API server does not have.
func getError(desc string, err error) error {
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("kube: %s: %w", desc, ErrNotFound)
	}
	return fmt.Errorf("kube: getting %s: %w", desc, err)
}

// metadataOf copies the maps of m: cached objects are shared and must not
// change.
func metadataOf(m metav1.ObjectMeta) Metadata {
	return Metadata{Labels: copyMap(m.Labels), Annotations: copyMap(m.Annotations)}
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	maps.Copy(out, m)
	return out
}
