// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"net/netip"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// Store is what the operator needs of the system of record. Every write
// to a CiliumNode follows one of these calls' commits.
type Store interface {
	BlockStore
	// NodeAddresses lists the single addresses the node holds (crd mode),
	// reserved or used by a Pod.
	NodeAddresses(ctx context.Context, space, node string) ([]alloc.HeldAddress, error)
	// ReserveNodeAddresses gives the node up to n more addresses of a
	// family from the pool its labels select (else defaultPool). When the
	// pool runs out it commits what it could and answers a pool-exhausted
	// error with them.
	ReserveNodeAddresses(ctx context.Context, space, node string, labels map[string]string, defaultPool string,
		f alloc.Family, n int) ([]alloc.HeldAddress, error)
	// RestoreNodeAddresses occupies the addresses the node's CiliumNode
	// lists as the node's, reserving nothing else (the restore before
	// allocating), and answers those now the node's and one error per
	// address refused (of no pool, another node's).
	RestoreNodeAddresses(ctx context.Context, space, node string, labels map[string]string,
		addrs []netip.Addr) ([]netip.Addr, []*alloc.Error, error)
	// SyncNodeUse records which of the node's addresses Pods use, and by
	// whom (the agent's status.ipam.used).
	SyncNodeUse(ctx context.Context, space, node string, used map[netip.Addr]alloc.Owner) (alloc.NodeUseChange, error)
	// ReleaseNodeAddresses gives reserved addresses back to their pool,
	// all or none, and answers those it released (addresses the node no
	// longer holds are skipped).
	ReleaseNodeAddresses(ctx context.Context, space, node string, addrs []netip.Addr) ([]netip.Addr, error)
	// ReleaseAllNodeAddresses gives back every address of a node that is
	// gone.
	ReleaseAllNodeAddresses(ctx context.Context, space, node string) (int, error)
	// CiliumNodes names the nodes holding single addresses.
	CiliumNodes(ctx context.Context, space string) ([]string, error)
	// SetCiliumNodeProviderID records the node's providerID, and which
	// of its interfaces hold Pod addresses (its spec.eni), when its labels
	// select a cloud pool of that cloud, and answers whether they do.
	SetCiliumNodeProviderID(ctx context.Context, space, node string, labels map[string]string, defaultPool, providerID string,
		ifaces store.PodInterfaces) (bool, error)
	// CloudInterfaces is the capacity workers' last reading of the
	// node's cloud interfaces, with its instance type's limits.
	CloudInterfaces(ctx context.Context, space, node string) (store.CloudInterfaces, error)
}

// BlockStore is what the block modes (cluster-pool and multi-pool) need of
// the store: nodes hold blocks, and the agent allocates inside them itself,
// so the store has no lease of its Pods.
type BlockStore interface {
	// ClusterPoolBlocks gives the node one block per family of the
	// cluster-pool pool, adopting the podCIDRs it already lists, and
	// answers its blocks of the pool, IPv4 first; when the pool cannot
	// give a family, with a pool-exhausted error.
	ClusterPoolBlocks(ctx context.Context, space, node, pool string, podCIDRs []netip.Prefix) ([]netip.Prefix, error)
	// RestoreClusterPoolBlocks only adopts the node's listed podCIDRs as
	// its blocks of the cluster-pool pool, carving nothing (the restore
	// before allocating).
	RestoreClusterPoolBlocks(ctx context.Context, space, node, pool string, podCIDRs []netip.Prefix) error
	// MigrateClusterPoolNode makes the node's podCIDRs its blocks of the
	// multi-pool pool (the default pool), all or none, turning that pool
	// from cluster-pool to multi-pool when it still is one; a CIDR it may
	// not take is an *alloc.Error naming the podCIDRs entry.
	MigrateClusterPoolNode(ctx context.Context, space, node, pool string, podCIDRs []netip.Prefix) error
	// SyncAgentPools follows the agent's spec.ipam.pools: blocks it no
	// longer lists go back to their pools after the hold-off, listed
	// CIDRs the node lacks are adopted, needs are covered with blocks.
	// Unmet needs and refused CIDRs are in the answer, not errors.
	SyncAgentPools(ctx context.Context, space, node string, r alloc.AgentPools) (alloc.AgentPoolsState, error)
	// ReleaseReturnedBlocks gives the blocks the agent returned back to
	// their pools once the hold-off has passed, unless listed (the
	// agent's allocated CIDRs, read afresh) names them; it answers when
	// the next hold-off ends.
	ReleaseReturnedBlocks(ctx context.Context, space, node string, listed []netip.Prefix) (time.Time, error)
	// AgentNodes names the nodes holding blocks of pools of the mode and
	// no lease: the nodes the operator of that mode serves.
	AgentNodes(ctx context.Context, space string, mode alloc.PoolMode) ([]string, error)
	// DeleteNode removes a node that is gone, its blocks going back to
	// their pools; without force it refuses a node holding leases.
	DeleteNode(ctx context.Context, space, name string, force bool) error
	// ListPools and CreatePool export the multi-pool pools as
	// CiliumPodIPPools and import those the store lacks.
	ListPools(ctx context.Context, space string, page alloc.Page) ([]alloc.Pool, string, error)
	CreatePool(ctx context.Context, p alloc.Pool, opts ...alloc.WriteOption) (alloc.Pool, error)
}
