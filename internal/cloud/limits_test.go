// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud

import (
	"errors"
	"fmt"
	"testing"
)

// The instance types of the VPC CNI's and Cilium's examples, with EC2's
// limits (interfaces, IPv4 addresses per interface).
func TestLimitsPodAddresses(t *testing.T) {
	t3small := Limits{Interfaces: 3, IPv4PerInterface: 4, IPv6PerInterface: 4, Prefixes: true}
	m5large := Limits{Interfaces: 3, IPv4PerInterface: 10, IPv6PerInterface: 10, Prefixes: true}
	c5xlarge := Limits{Interfaces: 4, IPv4PerInterface: 15, IPv6PerInterface: 15, Prefixes: true}
	t2medium := Limits{Interfaces: 3, IPv4PerInterface: 6, IPv6PerInterface: 6}
	for _, c := range []struct {
		name                 string
		l                    Limits
		prefixes, usePrimary bool
		perInterface         int
		maxPods              int
	}{
		{"t3.small: 4 slots but the primary", t3small, false, false, 3, 11},
		{"t3.small with the primary address", t3small, false, true, 4, 11},
		{"t3.small with prefixes: 3 /28s", t3small, true, false, 48, 11},
		{"m5.large", m5large, false, false, 9, 29},
		{"c5.xlarge: the seed's 58 Pods", c5xlarge, false, false, 14, 58},
		{"c5.xlarge with prefixes", c5xlarge, true, false, 224, 58},
		{"t2.medium takes no prefixes", t2medium, true, false, 0, 17},
		{"t2.medium", t2medium, false, false, 5, 17},
		{"no slot at all", Limits{}, false, false, 0, 2},
	} {
		if got := c.l.PodAddressesPerInterface(c.prefixes, c.usePrimary); got != c.perInterface {
			t.Errorf("%s: PodAddressesPerInterface(%v, %v) = %d; want %d", c.name, c.prefixes, c.usePrimary, got, c.perInterface)
		}
		if got := c.l.MaxPods(); got != c.maxPods {
			t.Errorf("%s: MaxPods() = %d; want %d", c.name, got, c.maxPods)
		}
	}
}

func TestKindOf(t *testing.T) {
	err := &Error{Kind: KindSubnetFull, Code: "InsufficientFreeAddressesInSubnet", Message: "full"}
	if KindOf(err) != KindSubnetFull || KindOf(fmt.Errorf("assign: %w", err)) != KindSubnetFull {
		t.Fatalf("KindOf(%v) = %v", err, KindOf(err))
	}
	if KindOf(nil) != KindUnknown || KindOf(errors.New("x")) != KindUnknown {
		t.Fatal("a plain error has a kind")
	}
	if KindThrottled.String() != "throttled" || Kind(99).String() != "Kind(99)" {
		t.Fatalf("names %q %q", KindThrottled, Kind(99))
	}
}
