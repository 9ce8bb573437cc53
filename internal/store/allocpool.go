// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// allocPool is the part of a pool the allocation path reads: no CIDR list
// (only carving needs it, and carving reads it under its own lock).
type allocPool struct {
	id         int64
	name       string
	masks      [2]*int16 // IPv4, IPv6
	allowFirst bool
	allowLast  bool
	nodeLocal  alloc.NodeLocal
	mode       alloc.PoolMode
	disabled   bool
	// cloud pools carve nothing: their blocks are the cloud's addresses,
	// recorded by the capacity workers.
	cloud          bool
	skipMasquerade bool
	selectors      [2]*metav1.LabelSelector // pod, namespace
	maxBlocks      *int                     // maxBlocksPerNode; nil: the default
}

// carves reports whether the pool carves blocks: neither disabled nor a
// cloud pool.
func (p allocPool) carves() bool { return !p.disabled && !p.cloud }

// mask is the block mask of family f, nil when the pool lacks f.
func (p allocPool) mask(f alloc.Family) *int16 {
	if f == alloc.IPv6 {
		return p.masks[1]
	}
	return p.masks[0]
}

// blockLimit is the most blocks of f one node may hold of the pool.
func (p allocPool) blockLimit(f alloc.Family) int64 {
	m := p.mask(f)
	if m == nil {
		return 0
	}
	return alloc.BlockLimit(p.maxBlocks, f, int(*m), p.allowFirst, p.allowLast, p.nodeLocal)
}

// capacityLimit is the capacity of the most blocks of f one node may hold
// of the pool.
func (p allocPool) capacityLimit(f alloc.Family) int64 {
	m := p.mask(f)
	if m == nil {
		return 0
	}
	return alloc.NodeCapacityLimit(p.maxBlocks, f, int(*m), p.allowFirst, p.allowLast, p.nodeLocal)
}

func (p allocPool) has(f alloc.Family) bool { return p.mask(f) != nil }

func (p allocPool) families() []alloc.Family {
	var fs []alloc.Family
	for _, f := range alloc.Families {
		if p.has(f) {
			fs = append(fs, f)
		}
	}
	return fs
}

// allocPoolJSON is a pool as the allocation lookup aggregates it.
type allocPoolJSON struct {
	ID                int64                 `json:"id"`
	Name              string                `json:"name"`
	M4                *int16                `json:"m4"`
	M6                *int16                `json:"m6"`
	AllowFirst        bool                  `json:"first"`
	AllowLast         bool                  `json:"last"`
	Router            bool                  `json:"router"`
	Health            bool                  `json:"health"`
	Ingress           bool                  `json:"ingress"`
	Mode              alloc.PoolMode        `json:"mode"`
	Disabled          bool                  `json:"disabled"`
	Cloud             bool                  `json:"cloud"`
	SkipMasquerade    bool                  `json:"skipMasq"`
	PodSelector       *metav1.LabelSelector `json:"podSel"`
	NamespaceSelector *metav1.LabelSelector `json:"nsSel"`
	MaxBlocks         *int                  `json:"maxBlocks"`
}

func (j allocPoolJSON) pool() allocPool {
	return allocPool{id: j.ID, name: j.Name, masks: [2]*int16{j.M4, j.M6}, allowFirst: j.AllowFirst, allowLast: j.AllowLast,
		nodeLocal: alloc.NodeLocal{Router: j.Router, Health: j.Health, Ingress: j.Ingress}, mode: j.Mode,
		disabled: j.Disabled, cloud: j.Cloud, skipMasquerade: j.SkipMasquerade, selectors: [2]*metav1.LabelSelector{j.PodSelector, j.NamespaceSelector},
		maxBlocks: j.MaxBlocks}
}

// allocPoolJSONSQL builds allocPoolJSON from pools p.
const allocPoolJSONSQL = `json_build_object('id', p.id, 'name', p.name, 'm4', p.ipv4_mask_size, 'm6', p.ipv6_mask_size,
	'first', p.allow_first_ip, 'last', p.allow_last_ip, 'router', p.reserve_router, 'health', p.reserve_health,
	'ingress', p.reserve_ingress, 'mode', p.mode, 'disabled', p.disabled, 'cloud', p.cloud IS NOT NULL, 'skipMasq', p.skip_masquerade,
	'podSel', p.pod_selector, 'nsSel', p.namespace_selector, 'maxBlocks', p.max_blocks_per_node)`

func (s *Store) allocPool(ctx context.Context, q querier, space, name string) (allocPool, error) {
	var j allocPoolJSON
	err := q.QueryRow(ctx, `SELECT `+allocPoolJSONSQL+` FROM pools p WHERE p.space = $1 AND p.name = $2`, space, name).Scan(&j)
	if errors.Is(err, pgx.ErrNoRows) {
		return allocPool{}, s.notFoundIn(ctx, q, space, "pool", "pool", name)
	}
	return j.pool(), err
}
