// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// allocLookup is what the first statement of an allocation learns.
type allocLookup struct {
	// nodeID is 0 when the node is not registered.
	nodeID int64
	held   bool
	// pools the selection may choose from: those the request, the Pod, the
	// namespace or the default name, and those with selectors.
	pools []allocPoolJSON
	// generation is the number the allocation's leases get (taken whether
	// or not they are made: numbers may skip, never repeat).
	generation int64
}

// lookup resolves, in one statement, the node, whether the attachment
// already holds leases, and the pools selection may need. It locks nothing:
// the block is locked by the statement that leases from it (leasesql.go),
// so the lock is held for that statement and the commit only, not for a
// round trip through the server as well.
func (s *Store) lookup(ctx context.Context, q querier, r alloc.LeaseRequest, sel alloc.Selection) (allocLookup, error) {
	return scanLookup(q.QueryRow(ctx, lookupSQL, lookupArgs(r, sel)))
}

// lookupShared is lookup outside a transaction: concurrent lookups share
// one round trip and, of one space, one statement (lookupManySQL), when
// the store batches.
func (s *Store) lookupShared(ctx context.Context, r alloc.LeaseRequest, sel alloc.Selection) (allocLookup, error) {
	if s.lookups == nil {
		return s.lookup(ctx, s.db, r, sel)
	}
	m := &mergedLookup{req: r, named: sel.Named()}
	it := &batchItem{sql: lookupSQL, args: []any{lookupArgs(r, sel)}, read: func(rows pgx.Rows) error {
		var err error
		m.lk, err = scanLookup(rowsRow{rows})
		return err
	}}
	it.merge = &merging{group: "lookup/" + r.Space, combine: combineLookups, payload: m}
	err := s.lookups.write(ctx, "", it)
	return m.lk, err
}

// lookupSQL is lookup's statement: one row, whose node id is NULL when the
// node is not registered.
const lookupSQL = `SELECT n.id,
		EXISTS (SELECT 1 FROM leases l WHERE l.node_id = n.id AND l.network = @network AND l.container_id = @container
		   AND l.interface = @iface AND l.state <> 'released'),
		` + lookupPoolsSQL + `,
		nextval('lease_generations')
	FROM (VALUES (1)) v
	LEFT JOIN nodes n ON n.space = @space AND n.name = @node`

// lookupPoolsSQL is the pools of space @space a selection naming @named
// may choose from (allocPoolJSON): those named, and those with selectors.
const lookupPoolsSQL = `(SELECT coalesce(json_agg(` + allocPoolJSONSQL + `), '[]') FROM pools p WHERE p.space = @space
		   AND (p.name = ANY (@named) OR p.pod_selector IS NOT NULL OR p.namespace_selector IS NOT NULL))`

func lookupArgs(r alloc.LeaseRequest, sel alloc.Selection) namedArgs {
	return namedArgs{"space": r.Space, "node": r.Node, "container": r.Attachment.ContainerID, "iface": r.Attachment.Interface,
		"named": sel.Named(), "network": r.Attachment.Network}
}

func scanLookup(row pgx.Row) (allocLookup, error) {
	var lk allocLookup
	var nid *int64
	var raw []byte
	err := row.Scan(&nid, &lk.held, &raw, &lk.generation)
	if nid != nil {
		lk.nodeID = *nid
	}
	if err == nil {
		lk.pools, err = decodePools(raw)
	}
	return lk, err
}

// decodedPools is the last pools JSON a lookup decoded, and what it
// decoded to.
type decodedPools struct {
	raw   []byte
	pools []allocPoolJSON
}

// lastPools is the pools JSON decoded last. Every allocation of a space
// reads the same pools until one changes, so decoding each lookup's (a
// reflection-driven json.Unmarshal of every pool and selector, a few
// percent of the server's CPU per allocation) is mostly decoding the same
// bytes again. The decoded pools are shared and read only, as the
// lookups of one merged statement already share theirs.
var lastPools atomic.Pointer[decodedPools]

// decodePools decodes the pools column of a lookup (JSON, NULL on the
// rows of a merged lookup but its first); the previous answer when raw is
// the same JSON as the last decoded.
func decodePools(raw []byte) ([]allocPoolJSON, error) {
	if raw == nil {
		return nil, nil
	}
	if last := lastPools.Load(); last != nil && bytes.Equal(last.raw, raw) {
		return last.pools, nil
	}
	var pools []allocPoolJSON
	if err := json.Unmarshal(raw, &pools); err != nil {
		return nil, fmt.Errorf("lookup: pools: %w", err)
	}
	lastPools.Store(&decodedPools{raw: bytes.Clone(raw), pools: pools})
	return pools, nil
}

// mergedLookup is one lookup of a lookupManySQL statement, and its answer.
type mergedLookup struct {
	req   alloc.LeaseRequest
	named []string
	lk    allocLookup
}

// combineLookups makes one lookupManySQL statement of lookups of one
// space. The statement reads the pools any of them names once; each lookup
// keeps those its own statement would have read.
func combineLookups(group []*batchItem) (string, []any, func(pgx.Rows) error) {
	ms := make([]*mergedLookup, len(group))
	n := len(group)
	nodes, networks, containers, ifaces := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	var named []string
	for i, it := range group {
		m := it.merge.payload.(*mergedLookup)
		ms[i] = m
		a := m.req.Attachment
		nodes[i], networks[i], containers[i], ifaces[i] = m.req.Node, a.Network, a.ContainerID, a.Interface
		for _, name := range m.named {
			if !slices.Contains(named, name) {
				named = append(named, name)
			}
		}
	}
	args := namedArgs{"space": ms[0].req.Space, "named": named, "nodes": nodes, "networks": networks,
		"containers": containers, "ifaces": ifaces}
	read := func(rows pgx.Rows) error {
		answered := make([]bool, len(ms))
		var pools []allocPoolJSON
		for rows.Next() {
			var i int
			var lk allocLookup
			var nid *int64
			var raw []byte
			if err := rows.Scan(&i, &nid, &lk.held, &raw, &lk.generation); err != nil {
				return err
			}
			if i < 1 || i > len(ms) {
				return fmt.Errorf("lookup answered request %d of %d", i, len(ms))
			}
			if nid != nil {
				lk.nodeID = *nid
			}
			if raw != nil {
				all, err := decodePools(raw)
				if err != nil {
					return err
				}
				pools = all
			}
			ms[i-1].lk, answered[i-1] = lk, true
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for i, m := range ms {
			if !answered[i] {
				return fmt.Errorf("lookup answered no row for request %d of %d", i+1, len(ms))
			}
			m.lk.pools = poolsNamedOrSelecting(pools, m.named)
		}
		return nil
	}
	return lookupManySQL, []any{args}, read
}

// poolsNamedOrSelecting keeps the pools lookupSQL reads for a request that
// names named: those named, and those with a selector.
func poolsNamedOrSelecting(pools []allocPoolJSON, named []string) []allocPoolJSON {
	out := make([]allocPoolJSON, 0, len(pools))
	for _, p := range pools {
		if p.PodSelector != nil || p.NamespaceSelector != nil || slices.Contains(named, p.Name) {
			out = append(out, p)
		}
	}
	return out
}

// lookupManySQL is lookupSQL for many requests of space @space at once
// (the arrays, one element per request): a row per request, its number
// first, with the pools that any request names (or that select) on the
// first row only.
const lookupManySQL = `SELECT r.n, n.id, h.held IS NOT NULL,
		CASE WHEN r.n = 1 THEN ` + lookupPoolsSQL + ` END,
		nextval('lease_generations')
	FROM unnest(@nodes::text[], @networks::text[], @containers::text[], @ifaces::text[])
		WITH ORDINALITY AS r (node, network, container, iface, n)
	-- LIMIT keeps both joins probes of an index per request: as plain
	-- joins the planner may hash every node of the space, or every
	-- lease held, for the handful of requests.
	LEFT JOIN LATERAL (SELECT id FROM nodes WHERE space = @space AND name = r.node LIMIT 1) n ON true
	LEFT JOIN LATERAL (
		SELECT true AS held FROM leases l WHERE l.node_id = n.id AND l.network = r.network AND l.container_id = r.container
		   AND l.interface = r.iface AND l.state <> 'released' LIMIT 1
	) h ON true`
