// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"encoding/xml"
	"maps"
	"slices"
)

type securityGroup struct {
	id, vpc string
	tags    map[string]string
}

// AddSecurityGroup adds security group id of vpc with tags.
func (s *Server) AddSecurityGroup(id, vpc string, tags map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups[id] = &securityGroup{id: id, vpc: vpc, tags: maps.Clone(tags)}
}

func (s *Server) describeSecurityGroupsLocked(form map[string][]string) (any, *APIError) {
	type groupEntry struct {
		ID   string    `xml:"groupId"`
		Name string    `xml:"groupName"`
		VPC  string    `xml:"vpcId"`
		Tags []tagItem `xml:"tagSet>item"`
	}
	type response struct {
		XMLName   xml.Name     `xml:"DescribeSecurityGroupsResponse"`
		Xmlns     string       `xml:"xmlns,attr"`
		RequestID string       `xml:"requestId"`
		Groups    []groupEntry `xml:"securityGroupInfo>item"`
		NextToken string       `xml:"nextToken,omitempty"`
	}
	fs := filters(form)
	if e := checkFilters(fs, "vpc-id"); e != nil {
		return nil, e
	}
	var items []groupEntry
	for _, id := range slices.Sorted(maps.Keys(s.groups)) {
		g := s.groups[id]
		if !matches(fs, "vpc-id", g.vpc) || !matchTags(fs, g.tags) {
			continue
		}
		items = append(items, groupEntry{ID: g.id, Name: g.id, VPC: g.vpc, Tags: tagItems(g.tags)})
	}
	items, next, e := page(s, form, items, func(it groupEntry) string { return it.ID })
	if e != nil {
		return nil, e
	}
	return response{Xmlns: xmlns, RequestID: requestID, Groups: items, NextToken: next}, nil
}
