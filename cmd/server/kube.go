package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/kube"
)

// podMetadata answers the API's Pod lookups from the Kubernetes informers.
type podMetadata struct{ inf *kube.Informers }

func (p podMetadata) PodMetadata(ctx context.Context, namespace, name string) (pod, ns alloc.Metadata, err error) {
	info, err := p.inf.Lookup(ctx, namespace, name)
	if errors.Is(err, kube.ErrNotFound) {
		return pod, ns, fmt.Errorf("%w: %w", api.ErrPodNotFound, err)
	} else if err != nil {
		return pod, ns, err
	}
	return alloc.Metadata(info.Pod), alloc.Metadata(info.Namespace), nil
}

// startKube starts the Pod and namespace informers when the configuration
// asks for Kubernetes access, and answers nil otherwise. Lookups before the
// caches sync fall back to direct reads, so serving need not wait.
func startKube(ctx context.Context, cfg config, log *slog.Logger) (api.PodMetadataSource, error) {
	if cfg.Kubeconfig == "" && !cfg.KubeInCluster {
		return nil, nil
	}
	inf, err := kube.New(kube.Config{Kubeconfig: cfg.Kubeconfig, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	inf.Start(ctx)
	go func() {
		if err := inf.WaitForSync(ctx); err == nil {
			log.Info("kubernetes pod and namespace caches synced")
		}
	}()
	return podMetadata{inf: inf}, nil
}
