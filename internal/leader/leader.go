// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package leader runs a controller on one replica at a time: a
// coordination.k8s.io Lease elects the leader, and the controller runs
// while its replica leads. The Cilium operator role (internal/cilium) and
// the LB IPAM controller (internal/lbipam) share it, each with a Lease of
// its own.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/workqueue"
)

// Defaults: a candidate takes a killed leader's lease once it has seen no
// renewal for LeaseDuration. Candidates look every RetryPeriod stretched
// by client-go's jitter (up to 2.2 x), and the last renewal may be that
// old when it is seen, so takeover comes within 8 + 2 x 2.2 x 1 = 12.4 s.
const (
	DefaultLeaseDuration = 8 * time.Second
	DefaultRenewDeadline = 5 * time.Second
	DefaultRetryPeriod   = time.Second
)

// Election names the Lease and this replica in it.
type Election struct {
	// LeaseNamespace and LeaseName name the Lease; Identity is this
	// replica's name in it (host name and process id when empty).
	LeaseNamespace, LeaseName, Identity       string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Logger                                    *slog.Logger
}

// SetDefaults fills what is left out; the Lease's name has no default.
func (e *Election) SetDefaults() error {
	if e.LeaseNamespace == "" {
		e.LeaseNamespace = "kube-system"
	}
	if e.Identity == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("leader identity: %w", err)
		}
		e.Identity = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if e.LeaseDuration == 0 {
		e.LeaseDuration = DefaultLeaseDuration
	}
	if e.RenewDeadline == 0 {
		e.RenewDeadline = DefaultRenewDeadline
	}
	if e.RetryPeriod == 0 {
		e.RetryPeriod = DefaultRetryPeriod
	}
	if e.Logger == nil {
		e.Logger = slog.Default()
	}
	return nil
}

// Run campaigns for the Lease until ctx ends, through leaseKube, and
// while leading runs lead with a context that ends when leadership does
// (lead's writes stop with it); then it campaigns again.
func (e Election) Run(ctx context.Context, leaseKube kubernetes.Interface, lead func(ctx context.Context)) error {
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, e.LeaseNamespace, e.LeaseName,
		leaseKube.CoreV1(), leaseKube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: e.Identity})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   e.LeaseDuration,
			RenewDeadline:   e.RenewDeadline,
			RetryPeriod:     e.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            e.LeaseName,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: lead,
				OnStoppedLeading: func() { e.Logger.Info("not leading", "identity", e.Identity) },
				OnNewLeader: func(id string) {
					if id != e.Identity {
						e.Logger.Info("following", "leader", id)
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		le.Run(ctx)
	}
	return nil
}

// LeaseBurst is the burst of the renewals' budget.
const LeaseBurst = 2

// SplitBudget divides rc's QPS and burst between the work (watches,
// writes) and the Lease renewals, one every retry period, so that writes
// queued behind the limit never delay a renewal past its deadline; the
// two add up to rc's limits. Each budget is one token bucket shared by
// the clientsets built from it (client-go gives every clientset a limiter
// of its own otherwise, and the sum would exceed the limit).
func SplitBudget(rc *rest.Config, retry time.Duration) (work, lease *rest.Config) {
	qps, burst := rc.QPS, rc.Burst
	if qps <= 0 {
		qps = rest.DefaultQPS
	}
	if burst <= 0 {
		burst = rest.DefaultBurst
	}
	leaseQPS := min(float32(time.Second)/float32(retry), qps/2)
	work, lease = rest.CopyConfig(rc), rest.CopyConfig(rc)
	work.QPS, work.Burst = qps-leaseQPS, max(burst-LeaseBurst, 1)
	lease.QPS, lease.Burst = leaseQPS, LeaseBurst
	work.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(work.QPS, work.Burst)
	lease.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(lease.QPS, lease.Burst)
	return work, lease
}

// ErrNotLeading answers a lookup in a cache that only exists while the
// replica leads.
var ErrNotLeading = errors.New("not leading")

// Lookup answers the object of key in an informer's store as a *T, nil
// when there is none; a nil store (the replica does not lead) is
// ErrNotLeading. Callers must not modify the object.
func Lookup[T any](idx cache.Indexer, key string) (*T, error) {
	if idx == nil {
		return nil, ErrNotLeading
	}
	obj, ok, err := idx.GetByKey(key)
	if err != nil || !ok {
		return nil, err
	}
	t, ok := obj.(*T)
	if !ok {
		return nil, fmt.Errorf("cache holds a %T under %s", obj, key)
	}
	return t, nil
}

// Work runs n workers, each calling process until it answers false (its
// queue shut down), and returns once ctx has ended, q is shut down and
// every worker has returned.
func Work[K comparable](ctx context.Context, q workqueue.TypedRateLimitingInterface[K], n int, process func() bool) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for process() {
			}
		})
	}
	<-ctx.Done()
	q.ShutDown()
	wg.Wait()
}
