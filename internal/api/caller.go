// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// identity is an authenticated caller.
type identity struct {
	role  alloc.Role
	node  string // the node of a RoleNode identity
	space string // the address space of a RoleNode identity
	// actor is who the address history and the logs name: node:NAME,
	// token:NAME, cert:CN, or anonymous.
	actor string
	// key is the rate-limit bucket, limit its size (zero: unlimited).
	key   string
	limit RateLimit
}

// callerKey is the context key of the authenticated caller's identity.
type callerKey struct{}

// mayReadEveryNode reports whether the request's caller may read what
// every node holds: any authenticated caller but a node certificate.
// Answers carry an alloc.Error's OperatorDetail, or a binding's
// OperatorReason, only to such callers.
func mayReadEveryNode(ctx context.Context) bool {
	id, ok := ctx.Value(callerKey{}).(identity)
	return ok && id.role != "" && id.role != alloc.RoleNode
}

// withCaller records the authenticated caller in ctx, for
// mayReadEveryNode.
func withCaller(ctx context.Context, id identity) context.Context {
	return context.WithValue(ctx, callerKey{}, id)
}

// nodeCaller answers the node of the request's caller when it is a node
// certificate, which acts only for the Pods on its node (placement.go);
// ok is false for every other caller.
func nodeCaller(ctx context.Context) (node string, ok bool) {
	id, ok := ctx.Value(callerKey{}).(identity)
	if !ok || id.role != alloc.RoleNode {
		return "", false
	}
	return id.node, true
}
