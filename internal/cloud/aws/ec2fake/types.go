// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Interface types and what else a test needs to set up interfaces the
// workers do not own, and the idempotency of CreateNetworkInterface.

// TypedInterface is an interface a test attaches as a user, an EKS
// controller or a launch template would: AttachTypedInterface's spec.
type TypedInterface struct {
	Instance, Subnet string
	// Card and Device are the network card and device index it is
	// attached at.
	Card, Device int
	// Type is its InterfaceType: interface ("" too), trunk, efa or
	// efa-only.
	Type string
	Tags map[string]string
	// Addresses secondary addresses are assigned to it.
	Addresses int
}

// AttachTypedInterface creates an interface as spec says, attached as EC2
// checks an attach (per-card device indexes and limits), and answers its
// id.
func (s *Server) AttachTypedInterface(spec TypedInterface) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch spec.Type {
	case "", "interface", "trunk", "efa", "efa-only":
	default:
		return "", fmt.Errorf("unknown interface type %q", spec.Type)
	}
	if _, ok := s.subnets[spec.Subnet]; !ok {
		return "", fmt.Errorf("unknown subnet %q", spec.Subnet)
	}
	f, e := s.createLocked(spec.Subnet, []string{"sg-node"}, maps.Clone(spec.Tags))
	if e == nil {
		f.typ = spec.Type
		if spec.Addresses > 0 {
			_, _, e = s.takeLocked(f, spec.Addresses, false)
		}
	}
	if e == nil {
		e = s.attachCardLocked(f, spec.Instance, spec.Card, spec.Device)
	}
	if e != nil {
		return "", fmt.Errorf("%s: %s", e.Code, e.Message)
	}
	return f.id, nil
}

// Changes answers how many calls that change an interface (assign,
// unassign, attach, modify, detach, delete, IPv6 delegation) named
// interface id, refused ones included: a test counts the calls the
// workers made on interfaces that are not theirs.
func (s *Server) Changes(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changes[id]
}

func (s *Server) changedLocked(f *iface) { s.changes[f.id]++ }

// tokenAnswer is what a create with a ClientToken answered, and the
// request it answered (without the token).
type tokenAnswer struct {
	request string
	item    ifaceItem
}

// requestKey is form without its ClientToken, in a stable order: EC2
// refuses a token repeated with other parameters.
func requestKey(form map[string][]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(form)) {
		if k == "ClientToken" {
			continue
		}
		fmt.Fprintf(&b, "%s=%q;", k, form[k])
	}
	return b.String()
}

// repeatedLocked answers, for a create whose ClientToken an earlier
// create carried, that create's answer (EC2's idempotency: the retry of a
// create whose answer was lost gets the interface made, not a second
// one), or IdempotentParameterMismatch when the parameters differ.
func (s *Server) repeatedLocked(token string, form map[string][]string) (ifaceItem, bool, *APIError) {
	if token == "" {
		return ifaceItem{}, false, nil
	}
	was, ok := s.tokens[token]
	if !ok {
		return ifaceItem{}, false, nil
	}
	if was.request != requestKey(form) {
		return ifaceItem{}, false, &APIError{Code: "IdempotentParameterMismatch",
			Message: "The client token you have provided is associated with a resource that is already deleted or has different parameters."}
	}
	return was.item, true, nil
}

// rememberLocked keeps the answer of a create that carried a token.
func (s *Server) rememberLocked(token string, form map[string][]string, item ifaceItem) {
	if token != "" {
		s.tokens[token] = tokenAnswer{request: requestKey(form), item: item}
	}
}
