// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package cilium plays Cilium's operator for the IPAM modes where the
// addresses come from outside the agent: crd (single addresses written to
// CiliumNode spec.ipam.pool), multi-pool (CIDRs in spec.ipam.pools) and
// cluster-pool (spec.ipam.podCIDRs). PostgreSQL stays the system of
// record: every write to a CiliumNode follows a committed change in the
// store. Cilium's own API types, clientset and CRDs come from Cilium's Go
// module; none is copied here.
package cilium
