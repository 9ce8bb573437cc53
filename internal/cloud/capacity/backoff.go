// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ipam-dev/ipam/internal/cloud"
)

// A node whose round failed is left out of the passes for a while, as
// Cilium's operator retries a node's failed pool maintenance only after an
// exponential backoff (operator/pkg/ipam/nodemanager, pkg/backoff): else a
// persistent failure (an attach the instance refuses, an Azure write the
// subnet cannot hold) is repeated every pass, create -> attach -> delete
// each time, and spends the account's shared rate on a node it cannot
// serve. The hold doubles from BackoffMin with each failure in a row up to
// BackoffMax, with jitter so that nodes that failed together (a throttled
// pass) do not come back together; a cloud that said how long to wait
// (cloud.RetryAfterOf, ARM's Retry-After) is waited for at least that
// long. A round that succeeds ends the backoff.
const (
	BackoffMin = time.Second
	BackoffMax = 5 * time.Minute
)

// holds are the nodes backing off, by "space/pool/node".
type holds struct {
	mu    sync.Mutex
	nodes map[string]hold
}

// hold is a node's failures in a row and the time until which it is left
// out.
type hold struct {
	failures int
	until    time.Time
}

// holding answers whether key's node is backing off at now.
func (h *holds) holding(key string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return now.Before(h.nodes[key].until)
}

// failed records that key's round failed at now with err, and answers how
// long the node is left out. A round the pass's own context cut short
// (the lock lost, the server stopping) is no failure of the node.
func (h *holds) failed(ctx context.Context, key string, now time.Time, err error) time.Duration {
	if ctx.Err() != nil {
		return 0
	}
	if cloud.KindOf(err) == cloud.KindSubnetFull {
		// A node waiting for subnet room makes no call while its subnets
		// cool down or read full (the subnet cooldown is its backoff): it
		// is served at the first reading with room, not minutes later.
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.nodes == nil {
		h.nodes = map[string]hold{}
	}
	x := h.nodes[key]
	x.failures++
	d := max(backoffDelay(x.failures, rand.Float64()), cloud.RetryAfterOf(err))
	x.until = now.Add(d)
	h.nodes[key] = x
	return d
}

// succeeded ends key's backoff.
func (h *holds) succeeded(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.nodes, key)
}

// backoffDelay is the hold after the n-th failure in a row (n >= 1):
// BackoffMin doubled n-1 times, plus up to half again as jitter (j in
// [0, 1)), at most BackoffMax. The jitter only adds, so that each hold is
// at least the doubled one and the holds of a failing node grow whatever
// the draw (Cilium draws between the minimum and the doubled time).
func backoffDelay(n int, j float64) time.Duration {
	d := BackoffMax
	if n-1 < 20 && BackoffMin<<(n-1) < BackoffMax {
		d = BackoffMin << (n - 1)
	}
	return min(d+time.Duration(j*float64(d/2)), BackoffMax)
}

// holdKey is the key of x's node in the holds.
func holdKey(x *nodeWork) string { return nodeKey(x.pool, x.node) }
