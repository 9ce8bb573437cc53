// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"context"
	"testing"
)

// TestListingsPaginated: on an account EC2 refuses unpaginated listings
// for (OperationNotPermitted, even filtered by VPC), every listing the
// workers make asks for pages (MaxResults) and follows NextToken.
func TestListingsPaginated(t *testing.T) {
	fake, inst, _ := world(t, "m5.large", "10.0.0.0/24")
	if _, err := fake.AttachInterface(inst, "subnet-a", 1); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"DescribeNetworkInterfaces", "DescribeInstances"} {
		fake.SetUnpaginatedLimit(a, 0)
	}
	fake.SetPageSize(1)
	p := newProvider(t, fake, 1)
	ctx := context.Background()
	got, err := p.Instances(ctx, "vpc-1")
	if err != nil {
		t.Fatalf("listing the VPC: %v", err)
	}
	if len(got) != 1 || len(got[inst].Interfaces) != 2 {
		t.Fatalf("listing: %+v", got)
	}
	if f, err := p.Instance(ctx, inst); err != nil || len(f.Interfaces) != 2 {
		t.Fatalf("describing %s: %+v, %v", inst, f, err)
	}
	if _, err := p.Detached(ctx, map[string]string{"cluster": "test"}); err != nil {
		t.Fatalf("listing the detached interfaces: %v", err)
	}
	if s, err := p.Subnets(ctx, "vpc-1", "eu-west-1a"); err != nil || len(s) != 1 {
		t.Fatalf("listing the subnets: %v, %v", s, err)
	}
	if _, err := p.SecurityGroups(ctx, "vpc-1", map[string]string{"cluster": "test"}); err != nil {
		t.Fatalf("listing the security groups: %v", err)
	}
}
