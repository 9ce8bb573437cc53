// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// agent plays the side of Cilium's agent in crd mode, as faithfully as a
// test needs: it creates its CiliumNode, hands Pods addresses only from
// spec.ipam.pool (IPv4), reports them in status.ipam.used no more often
// than every updateRate (Cilium's ipam.ciliumNodeUpdateRate, 15 s), and
// answers the release handshake from its own state. An address it uses
// that leaves the pool is the failure the whole design exists to prevent:
// it is recorded, and the test fails.
type agent struct {
	t          testing.TB
	name       string
	client     ciliumclient.Interface
	updateRate time.Duration

	mu sync.Mutex
	// pool is the latest spec.ipam.pool seen; used maps an address to
	// its Pod; releasing holds addresses answered ready-for-release
	// (never handed out again until the handshake ends or aborts).
	pool      map[string]bool
	used      map[string]string
	releasing map[string]bool
	lost      []string // used addresses that left the pool
	pods      int
	lastWrite time.Time
	dirty     bool
}

func newAgent(t testing.TB, client ciliumclient.Interface, name string, updateRate time.Duration) *agent {
	return &agent{t: t, name: name, client: client, updateRate: updateRate,
		pool: map[string]bool{}, used: map[string]string{}, releasing: map[string]bool{}}
}

// create makes the agent's CiliumNode with the given sizing knobs, as the
// agent does at start (auto-create-cilium-node-resource).
func (a *agent) create(ctx context.Context, spec ipamtypes.IPAMSpec, labels map[string]string) error {
	cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: a.name, Labels: labels}}
	cn.Spec.IPAM = spec
	_, err := a.client.CiliumV2().CiliumNodes().Create(ctx, cn, metav1.CreateOptions{})
	return err
}

// observe takes in a CiliumNode the operator wrote: the pool, and the
// release entries to answer.
func (a *agent) observe(cn *ciliumv2.CiliumNode) {
	a.mu.Lock()
	defer a.mu.Unlock()
	pool := map[string]bool{}
	for ip := range cn.Spec.IPAM.Pool {
		pool[ip] = true
	}
	for ip, pod := range a.used {
		if !pool[ip] {
			a.lost = append(a.lost, fmt.Sprintf("%s (used by %s)", ip, pod))
		}
	}
	a.pool = pool
	for ip := range a.releasing {
		if _, ok := cn.Status.IPAM.ReleaseIPs[ip]; !ok {
			delete(a.releasing, ip) // the handshake ended or was aborted
		}
	}
	for ip, st := range cn.Status.IPAM.ReleaseIPs {
		if st == releaseMarked || (st == releaseReleased && !pool[ip]) {
			a.dirty = true // an answer is due
		}
	}
}

// podStart hands a Pod a free pool address; false when none is free.
func (a *agent) podStart() (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for ip := range a.pool {
		if _, busy := a.used[ip]; !busy && !a.releasing[ip] {
			a.pods++
			a.used[ip] = fmt.Sprintf("default/pod-%s-%d", a.name, a.pods)
			a.dirty = true
			return ip, true
		}
	}
	return "", false
}

// podStop ends the Pod on ip.
func (a *agent) podStop(ip string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.used, ip)
	a.dirty = true
}

func (a *agent) usedAddresses() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.used))
}

func (a *agent) lostAddresses() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.lost)
}

// sync writes status.ipam.used and the handshake answers, when something
// changed and updateRate has passed since the last write. It answers
// whether it wrote.
func (a *agent) sync(ctx context.Context, force bool) (bool, error) {
	a.mu.Lock()
	due := a.dirty && (force || time.Since(a.lastWrite) >= a.updateRate)
	a.mu.Unlock()
	if !due {
		return false, nil
	}
	for {
		cn, err := a.client.CiliumV2().CiliumNodes().Get(ctx, a.name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		a.observe(cn)
		a.mu.Lock()
		used := ipamtypes.AllocationMap{}
		for ip, pod := range a.used {
			used[ip] = ipamtypes.AllocationIP{Owner: pod}
		}
		cn.Status.IPAM.Used = used
		for ip, st := range cn.Status.IPAM.ReleaseIPs {
			switch {
			case st == releaseMarked:
				// Cilium's agent: in use (or gone from the pool) means
				// do-not-release; otherwise it stops handing it out.
				if _, busy := a.used[ip]; busy || !a.pool[ip] {
					cn.Status.IPAM.ReleaseIPs[ip] = releaseDoNotRelease
				} else {
					a.releasing[ip] = true
					cn.Status.IPAM.ReleaseIPs[ip] = releaseReady
				}
			case st == releaseReleased && !a.pool[ip]:
				delete(cn.Status.IPAM.ReleaseIPs, ip)
				delete(a.releasing, ip)
			}
		}
		a.mu.Unlock()
		_, err = a.client.CiliumV2().CiliumNodes().UpdateStatus(ctx, cn, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return false, err
		}
		a.mu.Lock()
		a.lastWrite, a.dirty = time.Now(), false
		a.mu.Unlock()
		return true, nil
	}
}

// churn runs Pods on the node until ctx ends: it starts and stops Pods at
// random, keeping about target running, refreshes its view of the node
// and syncs its status at the agent's rate.
func (a *agent) churn(ctx context.Context, target int, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 1))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		cn, err := a.client.CiliumV2().CiliumNodes().Get(ctx, a.name, metav1.GetOptions{})
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			// The API server may be restarting under the test.
			continue
		}
		a.observe(cn)
		used := a.usedAddresses()
		if len(used) < target || (len(used) > 0 && rng.IntN(2) == 0) {
			a.podStart()
		}
		if len(used) > 0 && rng.IntN(3) == 0 {
			a.podStop(used[rng.IntN(len(used))])
		}
		if _, err := a.sync(ctx, false); err != nil && ctx.Err() == nil {
			continue
		}
	}
}
