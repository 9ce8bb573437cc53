// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"context"
	"maps"
	"slices"
	"strings"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// groupsTTL is how long an answer of SecurityGroups is reused: a new
// interface per node round would otherwise cost one more call each, and
// a group tagged or untagged shows within it.
const groupsTTL = 5 * time.Minute

type groupsEntry struct {
	ids []string
	at  time.Time
}

// SecurityGroups answers the security groups of vpc carrying every tag of
// tags exactly, every page of DescribeSecurityGroups, cached groupsTTL.
// EC2 reads * and ? in the tag filters as wildcards: its answer is only
// narrowed by them, and each group checked against tags here.
func (p *Provider) SecurityGroups(ctx context.Context, vpc string, tags map[string]string) ([]string, error) {
	key := groupsKey(vpc, tags)
	now := p.opts.Now()
	p.mu.Lock()
	e, ok := p.groups[key]
	p.mu.Unlock()
	if ok && now.Sub(e.at) < groupsTTL {
		return slices.Clone(e.ids), nil
	}
	filters := []types.Filter{{Name: sdkaws.String("vpc-id"), Values: []string{vpc}}}
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		filters = append(filters, types.Filter{Name: sdkaws.String("tag:" + k), Values: []string{tags[k]}})
	}
	pages := ec2.NewDescribeSecurityGroupsPaginator(p.ec2, &ec2.DescribeSecurityGroupsInput{Filters: filters, MaxResults: sdkaws.Int32(PageSize)})
	var ids []string
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify(err)
		}
		for _, g := range page.SecurityGroups {
			have := map[string]string{}
			for _, t := range g.Tags {
				have[sdkaws.ToString(t.Key)] = sdkaws.ToString(t.Value)
			}
			if sdkaws.ToString(g.VpcId) == vpc && carries(have, tags) {
				ids = append(ids, sdkaws.ToString(g.GroupId))
			}
		}
	}
	slices.Sort(ids)
	p.mu.Lock()
	p.groups[key] = groupsEntry{ids: ids, at: now}
	p.mu.Unlock()
	return slices.Clone(ids), nil
}

// groupsKey is the cache key of a SecurityGroups question; NUL separates
// what no tag holds.
func groupsKey(vpc string, tags map[string]string) string {
	var b strings.Builder
	b.WriteString(vpc)
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		b.WriteString("\x00" + k + "\x00" + tags[k])
	}
	return b.String()
}
