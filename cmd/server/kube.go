// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/metric"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/cilium"
	"github.com/ipam-dev/ipam/internal/kube"
	"github.com/ipam-dev/ipam/internal/lbipam"
	"github.com/ipam-dev/ipam/internal/leader"
	"github.com/ipam-dev/ipam/internal/store"
)

// podMetadata answers the API's Pod lookups from the Kubernetes informers.
type podMetadata struct{ inf *kube.Informers }

func (p podMetadata) Pod(ctx context.Context, namespace, name string, recheck func(alloc.PodPlacement) bool) (api.PodInfo, error) {
	var stale func(kube.PodInfo) bool
	if recheck != nil {
		stale = func(i kube.PodInfo) bool { return recheck(placementOf(i)) }
	}
	info, err := p.inf.Lookup(ctx, namespace, name, stale)
	if errors.Is(err, kube.ErrNotFound) {
		return api.PodInfo{}, fmt.Errorf("%w: %w", api.ErrPodNotFound, err)
	} else if err != nil {
		return api.PodInfo{}, err
	}
	return api.PodInfo{Pod: alloc.Metadata(info.Pod), Namespace: alloc.Metadata(info.Namespace), Placement: placementOf(info)}, nil
}

// placementOf is where a Pod the informers found is.
func placementOf(i kube.PodInfo) alloc.PodPlacement {
	return alloc.PodPlacement{Exists: true, UID: i.UID, Node: i.NodeName}
}

// startKube starts the Pod and namespace informers when the configuration
// asks for Kubernetes access, and answers nil otherwise (node certificates
// then never take a sticky identity from another node: internal/api's
// placement.go). Lookups before the
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

// checkClusterSpace refuses to start the Kubernetes side in a cluster
// space that does not exist: every controller would fail each round, and
// a misspelt space would look like a cluster without addresses.
func checkClusterSpace(ctx context.Context, cfg config, getSpace func(context.Context, string) (alloc.Space, error)) error {
	if cfg.Kubeconfig == "" && !cfg.KubeInCluster {
		return nil
	}
	if _, err := getSpace(ctx, cfg.ClusterSpace); err != nil {
		if alloc.IsKind(err, alloc.KindNotFound) {
			return fmt.Errorf("cluster-space %q: no such address space; create it first (POST /v1/spaces), then start this cluster's replicas", cfg.ClusterSpace)
		}
		return fmt.Errorf("cluster-space %q: %w", cfg.ClusterSpace, err)
	}
	return nil
}

// startCiliumOperator runs the Cilium operator role when the configuration
// names a mode, until ctx ends; done is closed when it has stopped (its
// leader lease given up). Off, it answers no operator and a closed channel.
func startCiliumOperator(ctx context.Context, cfg config, st cilium.Store, meter metric.Meter, log *slog.Logger) (op *cilium.Operator, done <-chan struct{}, err error) {
	stopped := make(chan struct{})
	if cfg.CiliumIPAMMode == "" {
		close(stopped)
		return nil, stopped, nil
	}
	rc, err := kube.RESTConfig(cfg.Kubeconfig, float32(cfg.CiliumKubeQPS), cfg.CiliumKubeBurst)
	if err != nil {
		return nil, nil, err
	}
	op, err = cilium.New(cilium.Config{
		Mode: cilium.Mode(cfg.CiliumIPAMMode), Space: cfg.ClusterSpace, DefaultPool: cfg.DefaultPool, Kube: rc,
		LeaseNamespace: cfg.CiliumLeaseNamespace, ExcessIPReleaseDelay: cfg.ExcessIPReleaseDelay, AWSReleaseExcessIPs: cfg.AWSReleaseExcessIPs,
		NodesGCInterval: cfg.CiliumNodesGCInterval, Workers: cfg.CiliumWorkers, Logger: log, Meter: meter,
		ClusterPoolToMultiPoolMigration: cfg.CiliumClusterPoolToMultiPoolMigration,
	}, st)
	if err != nil {
		return nil, nil, err
	}
	go func() {
		defer close(stopped)
		if err := op.Run(ctx); err != nil {
			log.Error("cilium operator", "err", err)
		}
	}()
	return op, stopped, nil
}

// lbipamFamilies reads --lbipam-families.
func lbipamFamilies(s string) (v4, v6 bool, err error) {
	for _, f := range strings.Split(s, ",") {
		switch strings.TrimSpace(f) {
		case "ipv4":
			v4 = true
		case "ipv6":
			v6 = true
		default:
			return false, false, fmt.Errorf("%q: want ipv4, ipv6 or ipv4,ipv6", s)
		}
	}
	return v4, v6, nil
}

// startLBIPAM runs the LB IPAM controller when the configuration asks for
// it, until ctx ends; done is closed once it has stopped (its Lease given
// up). Off, it answers a closed channel.
// The store announces the changes that serve waiting Services at once.
var _ lbipam.ChangeListener = (*store.Store)(nil)

func startLBIPAM(ctx context.Context, cfg config, st lbipam.Store, log *slog.Logger) (done <-chan struct{}, err error) {
	stopped := make(chan struct{})
	if !cfg.LBIPAM {
		close(stopped)
		return stopped, nil
	}
	rc, err := kube.RESTConfig(cfg.Kubeconfig, float32(cfg.CiliumKubeQPS), cfg.CiliumKubeBurst)
	if err != nil {
		return nil, err
	}
	v4, v6, err := lbipamFamilies(cfg.LBIPAMFamilies)
	if err != nil {
		return nil, err
	}
	var classes []string
	for _, c := range strings.Split(cfg.LBIPAMClasses, ",") {
		if c = strings.TrimSpace(c); c != "" {
			classes = append(classes, c)
		}
	}
	ctl, err := lbipam.New(lbipam.Config{Space: cfg.ClusterSpace, Kube: rc, Election: leader.Election{LeaseNamespace: cfg.LBIPAMLeaseNS},
		DefaultIPAM: cfg.LBIPAMDefault, NodeIPAM: cfg.NodeIPAM, Mirror: cfg.LBIPAMMirror, Resync: cfg.LBIPAMResync, Classes: append([]string{}, classes...), IPv4: v4, IPv6: v6, Logger: log}, st)
	if err != nil {
		return nil, err
	}
	go func() {
		defer close(stopped)
		if err := ctl.Run(ctx); err != nil {
			log.Error("lbipam", "err", err)
		}
	}()
	return stopped, nil
}

// agentPoolsSpace is the space whose multi-pool blocks Cilium's agents size
// themselves (store.Options.AgentPoolsSpace): the operator's, when it plays
// the multi-pool role; none otherwise. Every replica has the same flags,
// so the one running the maintenance pass knows it too.
func agentPoolsSpace(cfg config) string {
	if cilium.Mode(cfg.CiliumIPAMMode) == cilium.ModeMultiPool {
		return cfg.ClusterSpace
	}
	return ""
}
