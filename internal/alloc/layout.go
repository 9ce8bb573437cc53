// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"net/netip"
)

// NodeLocal says which node-local addresses each block keeps for the node
// itself. They are taken, in this order, from the first leasable offsets of
// the block: router (cilium_host, returned to Pods as their gateway), health,
// ingress. Cilium reserves router and health, and ingress when enabled.
type NodeLocal struct {
	Router, Health, Ingress bool
}

// DefaultNodeLocal is Cilium's default: router and health.
var DefaultNodeLocal = NodeLocal{Router: true, Health: true}

// Count is the number of reserved addresses.
func (n NodeLocal) Count() int {
	c := 0
	for _, b := range []bool{n.Router, n.Health, n.Ingress} {
		if b {
			c++
		}
	}
	return c
}

// Layout is how the addresses of one block are used. Offsets count from the
// block's first address. Leasable offsets are [First, Last] minus Reserved.
type Layout struct {
	Prefix      netip.Prefix
	First, Last int64      // leasable range, network/broadcast excluded unless allowed
	Reserved    []int64    // node-local offsets, router first when reserved
	Router      netip.Addr // zero when the router is not reserved
	Health      netip.Addr
	Ingress     netip.Addr
	Capacity    int64 // leasable addresses: Last-First+1-len(Reserved), never negative
}

// maxBlockHostBits bounds a block to 2^32 addresses, so offsets and counts
// stay int64 and a lease never scans more than that. Kubernetes' and
// Cilium's range allocators keep a bitmap per block and cap it similarly.
const maxBlockHostBits = 32

// BlockLayout computes the layout of block. /31, /32, /127 and /128 blocks
// have no network or broadcast address, so allowFirst/allowLast are ignored
// for them, as in Cilium. Blocks larger than 2^32 addresses panic: pool
// validation refuses such mask sizes.
func BlockLayout(block netip.Prefix, allowFirst, allowLast bool, nl NodeLocal) Layout {
	hostBits := block.Addr().BitLen() - block.Bits()
	if hostBits > maxBlockHostBits {
		panic("alloc: block larger than 2^32 addresses")
	}
	size := int64(1) << hostBits
	l := Layout{Prefix: block, First: 0, Last: size - 1}
	if size > 2 {
		if !allowFirst {
			l.First++
		}
		if !allowLast {
			l.Last--
		}
	}
	next := l.First
	take := func(want bool) netip.Addr {
		if !want || next > l.Last {
			return netip.Addr{}
		}
		l.Reserved = append(l.Reserved, next)
		a := AddrAt(block, next)
		next++
		return a
	}
	l.Router = take(nl.Router)
	l.Health = take(nl.Health)
	l.Ingress = take(nl.Ingress)
	l.Capacity = max(l.Last-l.First+1-int64(len(l.Reserved)), 0)
	return l
}

// AddrAt returns the address at offset off from the start of p. off must lie
// inside p.
func AddrAt(p netip.Prefix, off int64) netip.Addr {
	b := p.Masked().Addr().As16()
	carry := uint64(off)
	for i := 15; i >= 0 && carry > 0; i-- {
		sum := uint64(b[i]) + carry&0xff
		b[i] = byte(sum)
		carry = carry>>8 + sum>>8
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		return a.Unmap()
	}
	return a
}
