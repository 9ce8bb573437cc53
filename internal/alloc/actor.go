// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import "context"

// Actors the service itself acts as, for the address history.
const (
	// ActorAnonymous is a caller the transport did not identify (plain
	// HTTP in local development).
	ActorAnonymous = "anonymous"
	// ActorSystem is the service's own background work (expiry, purge,
	// rebalance) when no request started it.
	ActorSystem = "system"
)

type actorKey struct{}

// WithActor records who asks for the changes made under ctx: "node:NAME"
// for a node certificate, "cert:CN" for another client certificate, and
// the other forms the authentication layer defines. The store writes it
// into the address history of every change.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// ActorFrom answers the actor WithActor recorded, ActorAnonymous when none.
func ActorFrom(ctx context.Context) string {
	if a, ok := ctx.Value(actorKey{}).(string); ok && a != "" {
		return a
	}
	return ActorAnonymous
}
