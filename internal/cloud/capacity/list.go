// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipam-dev/ipam/internal/cloud"
)

// Listing a network describes every instance in it, and on a large
// account that is pages of calls: Cilium's operator lists once a minute
// (its resync) and otherwise resyncs only the nodes it changed. The
// workers do the same: a network is listed at most once every Resync;
// between, its last listing is read again, and a node the workers asked
// the cloud to change since (a round that added, a give-back, a detach,
// an IPv6 delegation: the answer may have been lost, so asked is enough)
// or that the listing lacks is described alone, its description kept as
// its entry in the listing. When a listing fails its nodes are not all
// described alone (a herd of calls on an API that already failed): the
// last listing is read again while younger than ListingMaxAge, and after
// that the network's nodes are left out of the pass.
//
// A listing read again is no new reading: settle does not count a lack
// it shows twice, and the dead-instance watch only ever starts on a
// NotFound a node's own describe answered.

// DefaultResync is how often the networks are listed when Worker.Resync
// is 0: Cilium's operator's resync interval.
const DefaultResync = time.Minute

// ListingMaxAge, in Resync intervals, is how old a network's last
// listing may be and still be read when listing it again fails: 5
// minutes by default, the longest a failing node backs off.
const ListingMaxAge = 5

// listings are the networks' last listings and the nodes changed since.
type listings struct {
	mu      sync.Mutex
	pass    uint64              // the passes listed so far
	of      map[string]*listing // network -> its last listing
	changed map[string]bool     // lower-cased instance id -> asked to change since its listing
}

// listing is one network's listing.
type listing struct {
	at    time.Time          // when it was made
	pass  uint64             // the pass that made it
	insts map[string]reading // lower-cased instance id -> its reading
}

// reading is an instance as the cloud described it at a time.
type reading struct {
	inst cloud.Instance
	at   time.Time
}

// inventory is what a pass reads of the listings: immutable during the
// pass (its reads run in parallel).
type inventory struct {
	insts map[string]reading // lower-cased id -> reading
	fresh map[string]bool    // lower-cased id -> read this pass
	down  map[string]bool    // lower-cased ids of networks neither listed nor readable: left out
}

// lookup answers id's reading, whether it is from an earlier pass, and
// whether there is one (nil inventory: none).
func (v *inventory) lookup(id string) (r reading, reused, ok bool) {
	if v == nil {
		return reading{}, false, false
	}
	id = strings.ToLower(id)
	r, ok = v.insts[id]
	return r, ok && !v.fresh[id], ok
}

// left answers whether id's network is left out of the pass.
func (v *inventory) left(id string) bool {
	return v != nil && v.down[strings.ToLower(id)]
}

// resync is the worker's resync interval, or the default.
func (w *Worker) resync() time.Duration {
	if w.Resync > 0 {
		return w.Resync
	}
	return DefaultResync
}

// list is this pass's inventory of the networks nodes were seen in: each
// listed again once its listing is a Resync old, or read again, without
// the nodes changed since. A listing that fails is answered.
func (w *Worker) list(ctx context.Context) (*inventory, []error) {
	if w.Inventory == nil {
		return nil, nil
	}
	w.mu.Lock()
	vpcs := slices.Sorted(maps.Keys(w.vpcs))
	w.mu.Unlock()
	l := &w.listings
	l.mu.Lock()
	l.pass++
	pass := l.pass
	if l.of == nil {
		l.of = map[string]*listing{}
	}
	l.mu.Unlock()
	now := w.now()
	v := &inventory{insts: map[string]reading{}, fresh: map[string]bool{}, down: map[string]bool{}}
	var errs []error
	for _, vpc := range vpcs {
		l.mu.Lock()
		last := l.of[vpc]
		l.mu.Unlock()
		if last == nil || now.Sub(last.at) >= w.resync() {
			got, err := w.Inventory.Instances(ctx, vpc)
			if err == nil {
				last = &listing{at: now, pass: pass, insts: map[string]reading{}}
				for id, inst := range got {
					last.insts[strings.ToLower(id)] = reading{inst: inst, at: now}
				}
				l.mu.Lock()
				l.of[vpc] = last
				for id := range last.insts {
					delete(l.changed, id)
				}
				l.mu.Unlock()
			} else {
				errs = append(errs, fmt.Errorf("listing the instances of %s: %w", vpc, err))
				if last != nil && now.Sub(last.at) >= ListingMaxAge*w.resync() {
					// Too old to read: its nodes wait for a listing.
					l.mu.Lock()
					for id := range last.insts {
						v.down[id] = true
					}
					l.mu.Unlock()
					continue
				}
			}
		}
		if last == nil {
			continue
		}
		l.mu.Lock()
		for id, r := range last.insts {
			if l.changed[id] {
				continue // described alone
			}
			v.insts[id] = r
			if last.pass == pass {
				v.fresh[id] = true
			}
		}
		l.mu.Unlock()
	}
	return v, errs
}

// changed notes that the workers asked the cloud to change instance id:
// the next pass describes it alone.
func (w *Worker) changed(id string) {
	if id == "" || w.Inventory == nil {
		return
	}
	l := &w.listings
	l.mu.Lock()
	if l.changed == nil {
		l.changed = map[string]bool{}
	}
	l.changed[strings.ToLower(id)] = true
	l.mu.Unlock()
}

// describedAlone keeps inst, described alone, as its entry in its
// network's listing, so that the passes until the next listing read it:
// no longer changed since.
func (w *Worker) describedAlone(inst cloud.Instance, at time.Time) {
	if w.Inventory == nil {
		return
	}
	id := strings.ToLower(inst.ID)
	l := &w.listings
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.changed, id)
	if last := l.of[inst.VPC]; last != nil {
		last.insts[id] = reading{inst: inst, at: at}
	}
}

// answered keeps inst, as the cloud's answer to a round left it, as its
// entry in its network's listing: the passes until the next listing plan
// on it instead of describing the node (Cilium's operator updates its
// instance cache from the answer the same way). A node something else
// marked changed (a reading that lacked a block) is still described.
func (w *Worker) answered(inst cloud.Instance, at time.Time) {
	if w.Inventory == nil {
		return
	}
	l := &w.listings
	l.mu.Lock()
	defer l.mu.Unlock()
	if last := l.of[inst.VPC]; last != nil {
		last.insts[strings.ToLower(inst.ID)] = reading{inst: inst, at: at}
	}
}

// learnNetwork, when the worker knows no network yet (its first pass, a
// new leader's), describes the first node of work whose instance it
// finds and takes its network as seen, so that this very pass lists it:
// on a fresh worker a thousand nodes cost one describe and a listing,
// not a describe each (the scale-out's first pass was most of its
// describes). Nodes of other networks are described alone this pass, as
// the listings lack them, and listed from the next.
func (w *Worker) learnNetwork(ctx context.Context, work []*nodeWork) {
	if w.Inventory == nil {
		return
	}
	w.mu.Lock()
	known := len(w.vpcs) > 0
	w.mu.Unlock()
	if known {
		return
	}
	for _, x := range work {
		id := InstanceID(w.Provider, x.node.ProviderID)
		if id == "" {
			continue
		}
		inst, err := w.Cloud.Instance(ctx, id)
		if err != nil || inst.VPC == "" {
			// Gone, not yet visible, or the cloud failing: read() tells.
			return
		}
		w.mu.Lock()
		if w.vpcs == nil {
			w.vpcs = map[string]bool{}
		}
		w.vpcs[inst.VPC] = true
		w.mu.Unlock()
		return
	}
}
