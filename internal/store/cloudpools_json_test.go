// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"reflect"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// TestCloudColumnRoundTrip: every field of a cloud spec survives
// pools.cloud, the security group tags and max Pods among them.
func TestCloudColumnRoundTrip(t *testing.T) {
	in := &alloc.CloudSpec{Provider: alloc.CloudAWS, Prefixes: true, FirstInterfaceIndex: 1,
		SubnetTags: map[string]string{"tier": "pods"}, SecurityGroupTags: map[string]string{"role": "pods", "cluster": "prod-?"},
		WarmTargets: &alloc.WarmTargets{WarmPrefix: 1, MaxPods: 110}, ReleaseDelay: 90 * time.Second}
	b, err := cloudColumn(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cloudSpecOf(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("stored %+v\nread   %+v", in, out)
	}
}
