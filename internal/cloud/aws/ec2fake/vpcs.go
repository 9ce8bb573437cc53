// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"encoding/xml"
	"fmt"
	"maps"
	"net/netip"
	"slices"
)

// AddVPC adds VPC id with its CIDR blocks, the first its primary block,
// the others associated later. A subnet added in a VPC the fake does not
// know makes one whose only block is the subnet's range.
func (s *Server) AddVPC(id string, cidrs ...netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	blocks := make([]netip.Prefix, len(cidrs))
	for i, c := range cidrs {
		blocks[i] = c.Masked()
	}
	s.vpcs[id] = blocks
}

func (s *Server) describeVpcsLocked(form map[string][]string) (any, *APIError) {
	type stateItem struct {
		State string `xml:"state"`
	}
	type blockItem struct {
		AssociationID string    `xml:"associationId"`
		CIDR          string    `xml:"cidrBlock"`
		State         stateItem `xml:"cidrBlockState"`
	}
	type vpcItem struct {
		ID     string      `xml:"vpcId"`
		CIDR   string      `xml:"cidrBlock"`
		State  string      `xml:"state"`
		Blocks []blockItem `xml:"cidrBlockAssociationSet>item"`
	}
	type response struct {
		XMLName   xml.Name  `xml:"DescribeVpcsResponse"`
		Xmlns     string    `xml:"xmlns,attr"`
		RequestID string    `xml:"requestId"`
		VPCs      []vpcItem `xml:"vpcSet>item"`
		NextToken string    `xml:"nextToken,omitempty"`
	}
	fs := filters(form)
	if e := checkFilters(fs); e != nil {
		return nil, e
	}
	ids := list(form, "VpcId")
	for _, id := range ids {
		if _, ok := s.vpcs[id]; !ok {
			return nil, &APIError{Code: "InvalidVpcID.NotFound", Message: fmt.Sprintf("The vpc ID '%s' does not exist", id)}
		}
	}
	var items []vpcItem
	for _, id := range slices.Sorted(maps.Keys(s.vpcs)) {
		if (len(ids) > 0 && !slices.Contains(ids, id)) || !matchTags(fs, nil) { // the fake's VPCs carry no tags
			continue
		}
		blocks := s.vpcs[id]
		it := vpcItem{ID: id, State: "available"}
		if len(blocks) > 0 {
			it.CIDR = blocks[0].String()
		}
		for i, b := range blocks {
			it.Blocks = append(it.Blocks, blockItem{AssociationID: fmt.Sprintf("vpc-cidr-assoc-%s-%d", id, i), CIDR: b.String(), State: stateItem{State: "associated"}})
		}
		items = append(items, it)
	}
	items, next, e := page(s, form, items, func(it vpcItem) string { return it.ID })
	if e != nil {
		return nil, e
	}
	return response{Xmlns: xmlns, RequestID: requestID, VPCs: items, NextToken: next}, nil
}
