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

// The max Pods the EKS AMI gives a kubelet with the VPC CNI
// (max-pods-calculator.sh): the secondary addresses' count without
// prefixes (eni-max-pods.txt: m5.large 29, t2.medium 17, m5.metal 737);
// with prefixes the /28s' count capped at 110, or 250 above 30 vCPUs.
func TestLimitsDefaultMaxPods(t *testing.T) {
	m5large := Limits{Interfaces: 3, IPv4PerInterface: 10, Prefixes: true, VCPUs: 2}
	t3nano := Limits{Interfaces: 2, IPv4PerInterface: 2, Prefixes: true, VCPUs: 2}
	t2medium := Limits{Interfaces: 3, IPv4PerInterface: 6, VCPUs: 2}
	m5metal := Limits{Interfaces: 15, IPv4PerInterface: 50, Prefixes: true, VCPUs: 96}
	c5x9 := Limits{Interfaces: 8, IPv4PerInterface: 30, Prefixes: true, VCPUs: 36}
	for _, c := range []struct {
		name     string
		l        Limits
		prefixes bool
		want     int
	}{
		{"m5.large", m5large, false, 29},
		{"m5.large with prefixes", m5large, true, 110},
		{"t3.nano with prefixes: 2 /28s + 2", t3nano, true, 34},
		{"t2.medium takes no prefixes", t2medium, true, 17},
		{"m5.metal", m5metal, false, 737},
		{"m5.metal with prefixes", m5metal, true, 250},
		{"c5.9xlarge with prefixes", c5x9, true, 250},
		{"30 vCPUs are few", Limits{Interfaces: 8, IPv4PerInterface: 30, Prefixes: true, VCPUs: 30}, true, 110},
		{"vCPUs unknown", Limits{Interfaces: 8, IPv4PerInterface: 30, Prefixes: true}, true, 110},
	} {
		if got := c.l.DefaultMaxPods(c.prefixes); got != c.want {
			t.Errorf("%s: DefaultMaxPods(%v) = %d; want %d", c.name, c.prefixes, got, c.want)
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

// The pre-allocation Cilium's AWS operator writes for a node without one
// (GetMinimumAllocatableIPv4): 8, unless the interfaces from the first
// interface index hold fewer addresses.
func TestLimitsMinimumPreAllocate(t *testing.T) {
	t3nano := Limits{Interfaces: 2, IPv4PerInterface: 2, IPv6PerInterface: 2, Prefixes: true}
	t3small := Limits{Interfaces: 3, IPv4PerInterface: 4, IPv6PerInterface: 4, Prefixes: true}
	m5large := Limits{Interfaces: 3, IPv4PerInterface: 10, IPv6PerInterface: 10, Prefixes: true}
	for _, c := range []struct {
		name  string
		l     Limits
		first int
		want  int
	}{
		{"m5.large: 27 addresses, the default 8", m5large, 0, 8},
		{"t3.small: 9 addresses, the default 8", t3small, 0, 8},
		{"t3.small from interface 1: 2 x 3", t3small, 1, 6},
		{"t3.small from interface 2: 1 x 3", t3small, 2, 3},
		{"t3.nano: 2 x 1", t3nano, 0, 2},
		{"t3.nano from interface 1: 1", t3nano, 1, 1},
		{"the index at the type's interfaces: none", t3nano, 2, 0},
		{"the index beyond them: none", t3nano, 5, 0},
		{"a type of one address per interface (its primary): none", Limits{Interfaces: 2, IPv4PerInterface: 1}, 0, 0},
	} {
		if got := c.l.MinimumPreAllocate(c.first); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
