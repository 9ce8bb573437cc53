// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package api serves the IPAM's HTTP API (api/openapi.yaml) over the
// stores its handlers own.
//
// Handlers only translate: each parses its strings once into netip and alloc
// values (mapping*.go), validates them, calls one method of its group's store
// interface and formats the answer. Every error, from a handler, the JSON
// decoder, parameter binding or routing, becomes an RFC 9457 problem in one
// place (problem.go).
package api

import (
	"cmp"
	"fmt"
	"log/slog"
	"reflect"
	"strings"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// Server implements the generated strict server interface. Each group of
// handlers is a type of its own holding the one store interface it uses,
// declared in the group's file (leases.go: leaseHandlers over LeaseStore);
// Server only puts the groups together. Handlers return errors unchanged;
// NewHandler's error mapper turns them into problems.
type Server struct {
	healthHandlers
	sizingHandlers
	spaceHandlers
	poolHandlers
	lbPoolHandlers
	vipHandlers
	cidrGroupHandlers
	nodeHandlers
	blockHandlers
	leaseHandlers
	reconcileHandlers
	addressHandlers
	stickyHandlers
	historyHandlers
	consistencyHandlers
	tokenHandlers
}

var _ ipamv1.StrictServerInterface = (*Server)(nil)

// Stores are what the handlers and the authenticator need of persistence,
// one small interface per group, each declared beside its users. Every
// field is required. Errors are *alloc.Error for anything the client can
// fix; the handlers return them unchanged and the error mapper turns them
// into problems. Any other error is internal: it is logged and answered as
// a 500 without its text.
type Stores struct {
	Health      HealthStore      // health.go: /readyz
	Spaces      SpaceStore       // spaces.go
	Pools       PoolStore        // pools.go
	LBPools     LBPoolStore      // lbpools.go
	VIPs        VIPStore         // vips.go
	CIDRGroups  CIDRGroupStore   // cidrgroups.go
	Nodes       NodeStore        // nodes.go: nodes and their pool usage
	Blocks      BlockStore       // blocks.go
	Leases      LeaseStore       // leases.go: the allocation path
	Reconcile   ReconcileStore   // reconcile.go
	Addresses   AddressStore     // addresses.go: by address, and lists
	Sticky      StickyStore      // sticky.go
	History     HistoryStore     // history.go
	Consistency ConsistencyStore // consistency.go
	Tokens      TokenStore       // tokens.go
	Credentials CredentialStore  // authz.go: bearer tokens
}

// StoresOf answers Stores with every field s, a store that serves them all,
// as the PostgreSQL store (internal/store) does: the wiring of cmd/server
// and of tests. No handler sees more of s than its own interface.
func StoresOf[S interface {
	HealthStore
	SpaceStore
	PoolStore
	LBPoolStore
	VIPStore
	CIDRGroupStore
	NodeStore
	BlockStore
	LeaseStore
	ReconcileStore
	AddressStore
	StickyStore
	HistoryStore
	ConsistencyStore
	TokenStore
	CredentialStore
}](s S) Stores {
	return Stores{Health: s, Spaces: s, Pools: s, LBPools: s, VIPs: s, CIDRGroups: s, Nodes: s, Blocks: s, Leases: s, Reconcile: s, Addresses: s,
		Sticky: s, History: s, Consistency: s, Tokens: s, Credentials: s}
}

// missing names the fields of st that are nil.
func (st Stores) missing() []string {
	var names []string
	v := reflect.ValueOf(st)
	for i := range v.NumField() {
		if v.Field(i).IsNil() {
			names = append(names, v.Type().Field(i).Name)
		}
	}
	return names
}

// mustBeComplete panics, naming them, when fields of st are nil: a
// handler would otherwise fail on its first request.
func (st Stores) mustBeComplete(caller string) {
	if m := st.missing(); len(m) > 0 {
		panic(fmt.Sprintf("api: %s without the stores %s", caller, strings.Join(m, ", ")))
	}
}

// NewServer returns a Server over st, without metrics. Most callers want
// NewHandler, which adds routing, error mapping, the HTTP middleware and
// metrics. It panics when a field of st is nil.
func NewServer(st Stores) *Server {
	st.mustBeComplete("NewServer")
	m, err := newMetrics(noop.Meter{})
	if err != nil { // a no-op meter takes any name
		panic(err)
	}
	return newServer(st, m, Options{Logger: slog.Default()})
}

// newServer gives each handler group its store and what else it uses of
// o (with its defaults filled in) and m.
func newServer(st Stores, m *metrics, o Options) *Server {
	return &Server{
		healthHandlers:      healthHandlers{store: st.Health, liveness: o.Liveness},
		spaceHandlers:       spaceHandlers{store: st.Spaces},
		poolHandlers:        poolHandlers{store: st.Pools},
		lbPoolHandlers:      lbPoolHandlers{store: st.LBPools},
		vipHandlers:         vipHandlers{store: st.VIPs},
		cidrGroupHandlers:   cidrGroupHandlers{store: st.CIDRGroups},
		nodeHandlers:        nodeHandlers{store: st.Nodes, ciliumNodes: o.CiliumNodes, log: o.Logger},
		blockHandlers:       blockHandlers{store: st.Blocks},
		leaseHandlers:       leaseHandlers{store: st.Leases, bindings: st.Sticky, metrics: m, podMetadata: o.PodMetadata, kubeSpace: cmp.Or(o.KubeSpace, alloc.DefaultSpace)},
		reconcileHandlers:   reconcileHandlers{store: st.Reconcile, metrics: m},
		addressHandlers:     addressHandlers{store: st.Addresses, metrics: m},
		stickyHandlers:      stickyHandlers{store: st.Sticky},
		historyHandlers:     historyHandlers{store: st.History},
		consistencyHandlers: consistencyHandlers{store: st.Consistency},
		tokenHandlers:       tokenHandlers{store: st.Tokens},
	}
}
