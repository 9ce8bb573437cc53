// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"fmt"
	"net/netip"
)

// EC2 describes a terminated instance in state terminated for about an
// hour, and then no more: DescribeInstances naming it answers
// InvalidInstanceID.NotFound, as it does for an id it never knew. It
// answers the same for a while about an instance it just started
// (eventual consistency). The two below let a test play both.

// ForgetTerminated makes a terminated instance unknown, as EC2 after
// about an hour; an instance that still runs is left as it is.
func (s *Server) ForgetTerminated(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in, ok := s.instances[id]; ok && in.terminated {
		delete(s.instances, id)
	}
}

// HideInstance makes a running instance unknown to DescribeInstances
// (and to attaches) until show is called, as EC2 answers about one it
// just started; its interfaces stay attached and described. Nothing may
// be assigned on its interfaces while it is hidden.
func (s *Server) HideInstance(id string) (show func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.instances[id]
	if !ok {
		return func() {}
	}
	delete(s.instances, id)
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.instances[id] = in
	}
}

// AssignAddresses assigns addrs, free in its subnet, to interface id as
// secondary addresses, as AssignPrivateIpAddresses naming them does: a
// test hands the addresses a terminated instance freed to another one,
// whichever addresses the fake would choose itself.
func (s *Server) AssignAddresses(id string, addrs ...netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, ok := s.ifaces[id]
	if !ok {
		return fmt.Errorf("no interface %s", id)
	}
	sn := s.subnets[f.subnet]
	for _, a := range addrs {
		if !sn.usable(a) || sn.taken(a) {
			return fmt.Errorf("%s is not free in %s", a, sn.ID)
		}
	}
	for _, a := range addrs {
		sn.take(a, f.id)
	}
	f.addrs = append(f.addrs, addrs...)
	return nil
}
