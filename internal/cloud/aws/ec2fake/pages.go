// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"fmt"
	"slices"
)

// Unpaginated listings on large accounts. EC2 documents for
// DescribeNetworkInterfaces: "If you have a large number of network
// interfaces, the operation fails unless you use pagination or one of
// the following filters: group-id, mac-address, private-dns-name,
// private-ip-address, subnet-id, or vpc-id", and recommends paginated
// requests only, unpaginated ones being "susceptible to throttling and
// timeouts" (the same note stands on DescribeInstances). Accounts with
// raised interface limits report even filtered unpaginated listings
// refused (aws/amazon-vpc-resource-controller-k8s#188, #411). A request
// is paginated when it carries MaxResults; one naming ids is not a
// listing.

// UnpaginatedFilters are the filters EC2 documents as letting an
// unpaginated DescribeNetworkInterfaces through on a large account.
var UnpaginatedFilters = []string{"group-id", "mac-address", "private-dns-name", "private-ip-address", "subnet-id", "vpc-id"}

type unpaginatedLimit struct {
	above  int
	exempt []string
}

// SetUnpaginatedLimit makes an unpaginated listing by action
// (DescribeNetworkInterfaces or DescribeInstances: no MaxResults, no
// ids) fail with OperationNotPermitted while the account holds more than
// above of its items, unless the request names one of the filters
// exempt: pass UnpaginatedFilters for what EC2 documents, none for the
// accounts that refuse filtered listings too. A negative above removes
// the limit.
func (s *Server) SetUnpaginatedLimit(action string, above int, exempt ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if above < 0 {
		delete(s.unpaginated, action)
		return
	}
	s.unpaginated[action] = unpaginatedLimit{above: above, exempt: slices.Clone(exempt)}
}

// unpaginatedLocked refuses an unpaginated listing by action of an
// account holding n items, when a limit says so.
func (s *Server) unpaginatedLocked(action string, form map[string][]string, n int) *APIError {
	l, ok := s.unpaginated[action]
	if !ok || n <= l.above || first(form, "MaxResults") != "" {
		return nil
	}
	for name := range filters(form) {
		if slices.Contains(l.exempt, name) {
			return nil
		}
	}
	return &APIError{Code: "OperationNotPermitted", Message: fmt.Sprintf("%s without pagination is not permitted for this account: specify MaxResults and follow NextToken.", action)}
}

// idsWithMaxResults is EC2's answer to a describe naming ids and
// MaxResults both.
func idsWithMaxResults(form map[string][]string, ids []string) *APIError {
	if len(ids) > 0 && first(form, "MaxResults") != "" {
		return &APIError{Code: "InvalidParameterCombination", Message: "The parameter MaxResults cannot be used with the parameter ids."}
	}
	return nil
}
