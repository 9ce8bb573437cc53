// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package kube looks up the labels and annotations of a Pod and of its
// namespace, which pool selection reads (Cilium multi-pool semantics: the
// ipam.cilium.io/ip-pool annotations and pod or namespace label selectors).
// With it the server resolves pools itself, so the CNI plugin sends only the
// Pod's namespace and name.
//
// Lookups sit on the Pod start critical path, so they are answered from
// informer caches. The caches hold object metadata only (metadata informers,
// trimmed further by a transform): a node-wide server watches every Pod of
// the cluster, and full Pod specs and statuses would cost far more memory
// and watch traffic than the two maps selection needs. A Pod that the cache
// has not seen yet (the watch lags its creation by a moment, and the CNI
// call comes right after the kubelet has it) is fetched with one direct GET.
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

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

// PodInfo is what is known of a Pod for pool selection.
type PodInfo struct {
	Pod       Metadata
	Namespace Metadata
}

// ErrNotFound is returned, wrapped, when the Pod or its namespace does not
// exist in the API server (not merely in the cache).
var ErrNotFound = errors.New("not found")

// lastApplied is written by kubectl apply and holds a copy of the whole
// object as applied; pool selection never reads it.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

var (
	podsGVR       = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	namespacesGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
)

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
	// defaults (5 and 10). Cache misses are the only steady requests.
	QPS   float32
	Burst int
}

// Informers watches Pod and Namespace metadata and answers lookups from its
// caches. It is safe for concurrent use.
type Informers struct {
	client     metadata.Interface
	log        *slog.Logger
	pods       resource
	namespaces resource
	start      sync.Once
}

// resource is the informer of one resource and the lister over its cache.
type resource struct {
	gvr      schema.GroupVersionResource
	informer cache.SharedIndexInformer
	lister   metadatalister.Lister
}

// New builds a metadata client from cfg and the informers over it. It
// contacts nothing; Start does.
func New(cfg Config) (*Informers, error) {
	rc, err := RESTConfig(cfg.Kubeconfig, cfg.QPS, cfg.Burst)
	if err != nil {
		return nil, err
	}
	c, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: building metadata client: %w", err)
	}
	return NewFromClient(c, cfg), nil
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

// NewFromClient builds the informers over c; only cfg.Resync and cfg.Logger
// are used. Tests pass a fake client.
func NewFromClient(c metadata.Interface, cfg Config) *Informers {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	i := &Informers{client: c, log: log}
	i.pods = i.newResource(podsGVR, cfg.Resync)
	i.namespaces = i.newResource(namespacesGVR, cfg.Resync)
	return i
}

func (i *Informers) newResource(gvr schema.GroupVersionResource, resync time.Duration) resource {
	// No indexers: lookups are by namespace/name key only.
	inf := metadatainformer.NewFilteredMetadataInformer(i.client, gvr, metav1.NamespaceAll, resync, cache.Indexers{}, nil).Informer()
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

// trim is the informers' transform: it keeps only what lookups and the cache
// itself need. Every Pod of the cluster sits in the cache, and managedFields
// and kubectl's last-applied-configuration annotation are usually larger than
// everything else in the metadata together; dropping them (and owner
// references, finalizers and the like) keeps the cache small. It is
// idempotent, as client-go requires of transforms.
func trim(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	out := &metav1.PartialObjectMetadata{
		TypeMeta: m.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       m.Namespace,
			Name:            m.Name,
			UID:             m.UID,
			ResourceVersion: m.ResourceVersion,
			Labels:          m.Labels,
			Annotations:     m.Annotations,
		},
	}
	if _, ok := m.Annotations[lastApplied]; ok {
		out.Annotations = maps.Clone(m.Annotations)
		delete(out.Annotations, lastApplied)
	}
	return out, nil
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
// its namespace. It reads the caches and falls back to a direct GET on a
// miss; an error wrapping ErrNotFound means the API server has no such
// object. The maps returned are the caller's own.
func (i *Informers) Lookup(ctx context.Context, namespace, name string) (PodInfo, error) {
	if namespace == "" || name == "" {
		return PodInfo{}, fmt.Errorf("kube: lookup needs a namespace and a pod name, got %q and %q", namespace, name)
	}
	ns, err := i.get(ctx, &i.namespaces, "", namespace)
	if err != nil {
		return PodInfo{}, err
	}
	pod, err := i.get(ctx, &i.pods, namespace, name)
	if err != nil {
		return PodInfo{}, err
	}
	return PodInfo{Pod: metadataOf(pod), Namespace: metadataOf(ns)}, nil
}

// get returns object namespace/name (name alone for a cluster-scoped
// resource) from r's cache, or from the API server on a miss. A miss is
// expected for a Pod created a moment ago; the object is not added to the
// cache, which the watch fills in shortly.
func (i *Informers) get(ctx context.Context, r *resource, namespace, name string) (*metav1.PartialObjectMetadata, error) {
	var (
		obj *metav1.PartialObjectMetadata
		err error
	)
	if namespace == "" {
		obj, err = r.lister.Get(name)
	} else {
		obj, err = r.lister.Namespace(namespace).Get(name)
	}
	if err == nil {
		return obj, nil
	}
	desc := r.gvr.Resource + " " + name
	if namespace != "" {
		desc = r.gvr.Resource + " " + namespace + "/" + name
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("kube: reading %s from cache: %w", desc, err)
	}
	i.log.DebugContext(ctx, "kubernetes cache miss, reading from the API server", "object", desc)
	// A plain GET is a quorum read: the point is to see what the cache has
	// not, so the API server's own watch cache (ResourceVersion "0") would
	// share the lag.
	obj, err = i.client.Resource(r.gvr).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("kube: %s: %w", desc, ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("kube: getting %s: %w", desc, err)
	}
	trimmed, _ := trim(obj)
	return trimmed.(*metav1.PartialObjectMetadata), nil
}

// metadataOf copies the maps of m: cached objects are shared and must not
// change.
func metadataOf(m *metav1.PartialObjectMetadata) Metadata {
	return Metadata{Labels: copyMap(m.Labels), Annotations: copyMap(m.Annotations)}
}

func copyMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	maps.Copy(out, m)
	return out
}
