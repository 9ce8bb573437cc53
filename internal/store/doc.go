// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package store persists the IPAM's state in PostgreSQL. Every state change
// is one transaction; serialization uses row locks only (never table locks
// or a process-wide mutex), so any number of replicas can share a database.
// Decisions that need no SQL (block layouts and numbering, validation) are
// made by package alloc; choices that need an index (the free address of a
// block, the first free block of a CIDR) are probes in SQL, one statement
// each, so they cost the same however many leases and blocks exist.
//
// # Domains and their files
//
// The store as a whole: store.go (Open, Options, querier, inTx and its
// retries, the PostgreSQL error codes it tells apart), errors.go,
// migrate.go, named.go (namedArgs), rows.go (writeOne, writeItem),
// page.go (continue tokens), stats.go, replication.go.
//
// Address spaces: spaces.go.
//
// Pod pools and their blocks: pools.go (pool CRUD, pool CIDRs),
// allocpool.go (allocPool: the allocation's view of a pool, read as JSON),
// blocks.go (carving, the block list, block release), capacity.go
// (usage samples, PoolCapacity), demand.go (node usage, Rebalance),
// topup.go (the top-up after allocations), report.go.
//
// Nodes: nodes.go (registration, podCIDRs adoption, DeleteNode, and
// nodeID/ensureNode, which resolve or register a node for the others).
//
// Allocation, the hot path, in the order a call goes down (each file
// calls only the files below it; TestAllocationPathGoesOnlyDown checks
// this): allocate.go (Allocate: the fast path, the general attempt, the
// carve), lookup.go (the allocation's first statement), leasesql.go (the
// statements that lease an address), and beside them leases.go (reading,
// confirming, releasing and reconciling leases), reserve.go (the hand-over
// from a reserve attachment), sticky.go (workload identities), fence.go
// (the generation-fenced calls), gc.go (pending expiry, cooled purge).
// batch.go and pipeline.go carry their statements (see below).
//
// Cilium: cilium.go (crd mode: a node's addresses as reserved leases),
// agentpools.go (cluster-pool and multi-pool agents, which allocate
// inside their blocks themselves).
//
// Clouds: cloudpools.go (cloud blocks, the cloud workers' lock),
// cloudinterfaces.go.
//
// Load balancer IPAM: lbpools.go (VIP pools), vips.go (VIP owners and
// their addresses), cidrgroups.go.
//
// And: history.go (the address history the triggers write),
// tokens.go (API tokens), consistency.go (CheckConsistency).
//
// # Lock order
//
// Transactions that take several locks take them in this order, so the
// waits cannot form a cycle (the comments at each site say which
// deadlock each rule removed):
//
//  1. Advisory locks, first in their transaction or on their own
//     connection, and only tried (the loser skips the pass): Rebalance and
//     the cloud workers hold a session lock (withSessionLock), PurgeCooled
//     and SampleUsage a transaction lock.
//  2. The space's row (address_spaces, FOR NO KEY UPDATE) before any write
//     of its VIP pools (lockSpace); DeleteSpace locks it FOR UPDATE.
//  3. A Pod pool's row (FOR NO KEY UPDATE) before its CIDR rows when the
//     pool is edited or deleted (getPool with forUpdate).
//  4. A node's blocks: by family, then id (ascending), FOR NO KEY UPDATE
//     (the lease statements take the oldest block with room and wait only
//     in id order, lockOldestWithRoomSQL; ReserveNodeAddresses fills them
//     in id order; PurgeCooled locks its blocks first, in this order,
//     skipping held ones; DeleteNode locks all of a node's blocks FOR
//     UPDATE in this order).
//  5. Pool CIDR rows (pool_cidrs), by position within a pool family
//     (carve; ORDER BY pool_id, family, position in lockCarveRowsOf):
//     after the node's blocks (DeleteNode, block release, SyncAgentPools),
//     and a carve holding them never waits for a block row: the blocks it
//     inserts are its own.
//  6. Lease rows, in address order (FOR UPDATE ... ORDER BY addr: the
//     reserve hand-over, Cilium's used/unused sync and node release), after
//     the block they are leased from (an allocation holds its block and may
//     then wait on a lease row's unique key). One exception by design: a
//     request with a workload identity first locks the lease row bound to
//     the identity (boundAddress), so requests of one identity take turns.
//  7. The node's row last: an allocation takes a key-share lock on it
//     through the lease's foreign key while it holds its block, so
//     DeleteNode locks it (FOR UPDATE) only after the blocks and CIDR
//     rows, and ReserveNodeAddresses updates it after its blocks.
//
// VIPs lock on their own tables: the owner's row (vip_owners, FOR
// UPDATE) first; then, for a sharing key, a transaction advisory lock on
// the key's hash; then the VIP pool searched (lb_pools, FOR NO KEY
// UPDATE, or FOR SHARE for a named address), oldest first; then the
// address's row (vips) when it is shared or released. A VIP pool write
// takes the space's row (2) and then keeps its reserved CIDR groups
// (cidr_groups, FOR KEY SHARE).
//
// # Kinds of statement
//
//   - In a transaction: inTx and inTxWhy run a function over a querier in
//     one READ COMMITTED transaction, retried on serialization failures,
//     deadlocks and a concurrent writer's unique or exclusion violation;
//     write (pools.go) adds dry runs. The transaction is a pipelinedTx
//     (pipeline.go): its BEGIN and the history context travel with its
//     first statement, in one message.
//   - Single statements: a change that is one statement runs alone,
//     setting the history context from its WHERE clause
//     (historyContextSQL).
//   - Batched: writeOne and writeItem (rows.go) queue a single-statement
//     write to a batcher (batch.go), which sends the writes that queued
//     meanwhile between one BEGIN and COMMIT; a node's writes go to one
//     queue. When a batch fails, each of its writes runs again alone.
//   - Merged: writes of one group in a batch (a node's leases, a node's
//     releases, the lookups of a space) become one multi-row statement
//     (leaseManySQL, releaseManySQL, lookupManySQL), each keeping its own
//     outcome.
//
// # Parameters
//
// Statements of more than about four parameters, and every statement
// built from fragments, name their parameters (@name) and bind them with
// namedArgs, which caches the rewrite to $n per statement text and
// refuses a name its map lacks (pass nil for NULL). No parameter number
// is computed in Go. Short statements may stay positional.
package store
