// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/store"
)

// The PostgreSQL store serves every store interface the API's handlers own
// (api.StoresOf wires it into all of them). These lines live in the wiring:
// internal/store must not import internal/api (dependencies point
// downward), and here a mismatch breaks the build of the server itself,
// not only the tests of one package.
var (
	_ api.HealthStore      = (*store.Store)(nil)
	_ api.SpaceStore       = (*store.Store)(nil)
	_ api.PoolStore        = (*store.Store)(nil)
	_ api.NodeStore        = (*store.Store)(nil)
	_ api.BlockStore       = (*store.Store)(nil)
	_ api.LeaseStore       = (*store.Store)(nil)
	_ api.ReconcileStore   = (*store.Store)(nil)
	_ api.AddressStore     = (*store.Store)(nil)
	_ api.StickyStore      = (*store.Store)(nil)
	_ api.HistoryStore     = (*store.Store)(nil)
	_ api.ConsistencyStore = (*store.Store)(nil)
	_ api.TokenStore       = (*store.Store)(nil)
	_ api.CredentialStore  = (*store.Store)(nil)
)
