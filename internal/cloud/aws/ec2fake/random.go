// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"math/rand/v2"
	"net/netip"

	"go4.org/netipx"
)

// Random free addresses: EC2 hands out a free address of the subnet of
// its choosing, not the lowest, so an address freed a moment ago may
// come back at once, to this interface or another. By default the fake
// hands out the lowest (tests read better); SetRandomAddresses makes it
// draw every new primary address, secondary address and aligned /28
// prefix at random among the free ones, from a seeded generator. A draw
// scans the whole subnet.

// SetRandomAddresses makes the fake hand out free addresses and /28s at
// random, from a generator seeded with seed.
func (s *Server) SetRandomAddresses(seed uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addrRNG = rand.New(rand.NewPCG(seed, seed^0x6a09e667f3bcc908))
}

// pickAddrs answers n free addresses of sn, the lowest or at random by
// rng (nil: the lowest), fewer when it has fewer.
func (sn *subnet) pickAddrs(n int, rng *rand.Rand) []netip.Addr {
	if rng == nil {
		return sn.freeAddrs(n)
	}
	var free []netip.Addr
	for a := sn.CIDR.Addr(); sn.CIDR.Contains(a); a = a.Next() {
		if sn.usable(a) && !sn.taken(a) {
			free = append(free, a)
		}
	}
	return draw(free, n, rng)
}

// pickPrefixes answers n wholly free aligned /28s of sn, the lowest or
// at random by rng (nil: the lowest), fewer when it has fewer.
func (sn *subnet) pickPrefixes(n int, rng *rand.Rand) []netip.Prefix {
	if rng == nil || sn.CIDR.Bits() > 28 {
		return sn.freePrefixes(n)
	}
	var free []netip.Prefix
	for p := netip.PrefixFrom(sn.CIDR.Addr(), 28); sn.CIDR.Contains(p.Addr()); {
		ok := true
		for a := p.Addr(); p.Contains(a) && ok; a = a.Next() {
			ok = sn.usable(a) && !sn.taken(a)
		}
		if ok {
			free = append(free, p)
		}
		next := netipx.PrefixLastIP(p).Next()
		if !next.IsValid() {
			break
		}
		p = netip.PrefixFrom(next, 28)
	}
	return draw(free, n, rng)
}

// draw answers n of items at random (a partial shuffle), all when there
// are fewer.
func draw[T any](items []T, n int, rng *rand.Rand) []T {
	n = min(n, len(items))
	for i := range n {
		j := i + rng.IntN(len(items)-i)
		items[i], items[j] = items[j], items[i]
	}
	return items[:n]
}
