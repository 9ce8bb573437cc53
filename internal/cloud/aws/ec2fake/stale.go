// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"time"
)

// Eventually consistent reads: EC2's describes may answer a state some
// seconds old (a new interface missing, an unassigned address still
// listed, a detached interface still in use). With SetStaleReads the
// fake keeps, per interface, instance and subnet, the versions of the
// last window (as described, with the time each began) and answers a
// share of DescribeNetworkInterfaces, DescribeInstances and
// DescribeSubnets as of a time drawn in the window. Time is the test's
// (SetClock), so a test moves it instead of sleeping.

// FaultStale counts describes answered with a past state.
const FaultStale FaultKind = "stale"

// version is an object as described from a time on; nil: absent.
type version[T any] struct {
	from time.Time
	item *T
}

// history holds the versions of each object by id, oldest first.
type history[T any] map[string][]version[T]

// record adds the versions of live that differ from the last ones, and
// absence for the objects live lacks, then drops the versions no time
// after cut can see.
func (h history[T]) record(now, cut time.Time, live map[string]T) {
	for id, it := range live {
		vs := h[id]
		if len(vs) == 0 || vs[len(vs)-1].item == nil || !reflect.DeepEqual(*vs[len(vs)-1].item, it) {
			h[id] = append(vs, version[T]{from: now, item: &it})
		}
	}
	for id, vs := range h {
		if _, ok := live[id]; !ok && vs[len(vs)-1].item != nil {
			h[id] = append(vs, version[T]{from: now})
		}
	}
	for id, vs := range h {
		i := 0
		for i+1 < len(vs) && !vs[i+1].from.After(cut) {
			i++
		}
		if vs = vs[i:]; len(vs) == 1 && vs[0].item == nil {
			delete(h, id)
			continue
		}
		h[id] = vs
	}
}

// at answers the objects as they were at t, by id.
func (h history[T]) at(t time.Time) []T {
	var out []T
	for _, id := range slices.Sorted(maps.Keys(h)) {
		var it *T
		for _, v := range h[id] {
			if v.from.After(t) {
				break
			}
			it = v.item
		}
		if it != nil {
			out = append(out, *it)
		}
	}
	return out
}

// stale is the state of eventually consistent reads.
type stale struct {
	window    time.Duration
	rate      float64
	rng       *rand.Rand
	ifaces    history[ifaceItem]
	instances history[instanceItem]
	subnets   history[subnetItem]
}

// SetStaleReads makes a share rate of the describes of interfaces,
// instances and subnets answer the state at a time drawn uniformly in
// the last window, from a generator seeded with seed; the state before
// this call counts as always there. A zero window turns them off.
func (s *Server) SetStaleReads(window time.Duration, rate float64, seed uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if window <= 0 {
		s.stale = stale{}
		return
	}
	s.stale = stale{window: window, rate: rate, rng: rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d)),
		ifaces: history[ifaceItem]{}, instances: history[instanceItem]{}, subnets: history[subnetItem]{}}
	s.recordAtLocked(time.Time{})
}

// SetClock sets the fake's clock (time.Now when nil), which dates the
// versions of SetStaleReads.
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clock = now
}

func (s *Server) nowLocked() time.Time {
	if s.clock != nil {
		return s.clock()
	}
	return time.Now()
}

// recordLocked dates the changes since the last record now; a no-op
// without stale reads. Every change to the fake's state ends with it.
func (s *Server) recordLocked() {
	if s.stale.window > 0 {
		s.recordAtLocked(s.nowLocked())
	}
}

func (s *Server) recordAtLocked(now time.Time) {
	cut := s.nowLocked().Add(-s.stale.window)
	ifaces := map[string]ifaceItem{}
	for id, f := range s.ifaces {
		ifaces[id] = s.itemLocked(f)
	}
	instances := map[string]instanceItem{}
	for id, in := range s.instances {
		instances[id] = s.instanceItemLocked(in)
	}
	subnets := map[string]subnetItem{}
	for id, sn := range s.subnets {
		subnets[id] = subnetItemOf(sn)
	}
	s.stale.ifaces.record(now, cut, ifaces)
	s.stale.instances.record(now, cut, instances)
	s.stale.subnets.record(now, cut, subnets)
}

// staleLocked decides whether this describe reads the past, and answers
// the time it reads.
func (s *Server) staleLocked() (time.Time, bool) {
	st := &s.stale
	if st.window <= 0 || st.rng.Float64() >= st.rate {
		return time.Time{}, false
	}
	s.faults[FaultStale]++
	back := time.Duration((1 - st.rng.Float64()) * float64(st.window)) // in (0, window]
	return s.nowLocked().Add(-back), true
}
