// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"github.com/ipam-dev/ipam/internal/alloc"
)

// Limits of request fields that no format rule bounds already, as
// api/openapi.yaml declares them (maxLength, maxItems). Names, label keys
// and values, container IDs and interfaces are bounded by their validators
// (DNS label 63, DNS subdomain 253, qualified name 317, 256, 64); these
// bound the rest, so that no request carries more than its purpose needs
// and no error detail echoes a huge value. TestRequestLimits sends one
// value over each limit the spec declares.
const (
	maxContinueLen     = 1024 // continue: a page's last key, base64url
	maxNetworkLen      = 253  // a CNI network name (query parameter)
	maxAddressTextLen  = 64   // an address or CIDR as text (IPv6 /128: 43)
	maxDurationTextLen = 32   // window, expiresIn
	maxProviderIDLen   = 512
	maxNodeAddresses   = 16
	maxNodePodCIDRs    = 16 // Kubernetes allows 2 (one per family)
	maxFamilies        = 2
	maxAttachments     = 4096 // a node's containers; max-pods is rarely over 250
	maxMatchExprs      = 32
	maxMatchValues     = 64
	maxCIDRConfigs     = 32 // spec.ipv4.pool[]: one per CIDR, at most 32 CIDRs
	maxUsagePools      = 8  // the pools one node-usage query names
)

// checkLen refuses a string longer than max without quoting it.
func checkLen(field, s string, max int) error {
	if len(s) > max {
		return alloc.Invalid(field, "longer than %d characters", max)
	}
	return nil
}

// checkCount refuses a list or map of more than max entries.
func checkCount(field string, n, max int) error {
	if n > max {
		return alloc.Invalid(field, "has %d entries; at most %d are allowed", n, max)
	}
	return nil
}
