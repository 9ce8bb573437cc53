// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package alloc holds the IPAM's domain: the types every layer shares and
// the decisions that need no database. It imports neither SQL nor HTTP:
// internal/api translates requests into these types, internal/store
// persists them, and both ask alloc what is valid and what a change
// should be. A rule that can be decided from values alone (a layout, a
// size, a selection, a validation) belongs here, where it is tested
// without PostgreSQL; a rule that needs rows under a lock belongs to the
// store, which calls back into alloc for the arithmetic.
//
// The files, by concept:
//
//   - Addresses and prefixes: family.go (IPv4/IPv6), parse.go (canonical
//     prefixes and addresses), carve.go (block index arithmetic),
//     layout.go (which addresses of a block are leasable: Cilium's first
//     and last address rules, node-local addresses), capacity.go (free
//     space of a pool family).
//   - Pools and node blocks: pool.go (pool families, reserved ranges,
//     block limits, special-purpose ranges), sizing.go (block sizes from
//     a CIDR and mask), nodepool.go (which pool a node's block comes from),
//     agentpools.go and ciliumnode.go (Cilium multi-pool agent requests
//     and the CiliumNode state derived from blocks), cidrgroup.go (named
//     CIDR sets nothing is allocated from, Cilium's CiliumCIDRGroup).
//   - Demand and pre-allocation: demand.go (Cilium's neededIPCeil and
//     per-node usage), watermark.go (pre-allocate, min and max), forecast.go
//     (exhaustion forecasts), warmtargets.go and cloudspec.go (AWS warm
//     targets and /28 prefixes, Azure interface specs).
//   - Leases: lease.go (owners, attachments, lease states and requests),
//     sticky.go (StatefulSet identities), placement.go (a node acts only
//     for Pods bound to it), selection.go (pool selection by label
//     selectors, through k8s.io/apimachinery).
//   - LoadBalancer VIPs: lbpool.go (Cilium LB IPAM pools and blocks),
//     vip.go (VIP requests, sharing keys, assignments).
//   - Operations: token.go (API tokens and roles), history.go (the event
//     log's kinds and filters), consistency.go (findings of the
//     consistency check), fence.go (lease generations, which fence a late
//     release or confirmation off a later lease), write.go (dry
//     runs), actor.go (who made a change, carried in the context),
//     names.go (Kubernetes name and label validation).
//
// Errors: every refusal is an *Error of one Kind (errors.go); the kind
// picks the HTTP problem type in internal/api and Field names the input
// at fault, so a new kind is a change to the API contract.
package alloc
