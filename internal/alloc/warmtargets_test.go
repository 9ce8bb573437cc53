// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import "testing"

// instance is what the worked examples need of an EC2 instance type: the
// addresses (prefix mode: prefixes) one interface takes beyond its
// primary address, its interfaces, and its max Pods.
type instance struct {
	perInterface, interfaces, maxPods int
}

// t3.small: 3 interfaces of 4 IPv4 addresses each (3 for Pods); max
// Pods 3 x (4 - 1) + 2 = 11, or 110 with prefixes (the examples run 58
// Pods on it). p3dn.24xlarge: 15 interfaces of 50; Pods are never its
// bound in these examples.
var (
	t3small       = instance{perInterface: 3, interfaces: 3, maxPods: 11}
	t3smallPrefix = instance{perInterface: 3, interfaces: 3, maxPods: 110}
	p3dn          = instance{perInterface: 49, interfaces: 15, maxPods: 737}
)

// settle runs the warm pool as ipamd's reconcile loop would with pods
// Pods on the node, from nothing held, until it neither lacks nor holds
// too much: what Short asks for is added, a whole interface at a time when
// sized by WARM_ENI_TARGET, never past the instance's interfaces. It
// answers the addresses held (prefix mode: prefixes) and whether the end
// state is stable (Over and SurplusInterface both say no).
func settle(t *testing.T, w WarmTargets, in instance, pods int) (held int, stable bool) {
	t.Helper()
	unit := 1 // addresses per held unit
	if w.Prefixes {
		unit = PrefixSize
	}
	capacity := in.perInterface * in.interfaces
	pool := func() WarmPool {
		used := min(pods, held*unit)
		full := used / unit
		if used%unit != 0 {
			full++
		}
		return WarmPool{Total: held * unit, Used: used, Prefixes: held, FreePrefixes: held - full,
			PerInterface: in.perInterface, MaxPods: in.maxPods}
	}
	for range 100 {
		short := w.Short(pool())
		if short == 0 || held == capacity {
			break
		}
		if !w.ipTargets() && !w.Prefixes {
			// A whole interface's worth at a time.
			short = (short + in.perInterface - 1) / in.perInterface * in.perInterface
		}
		held = min(held+short, capacity)
	}
	if held*unit < pods {
		t.Fatalf("%+v on %+v: %d pods but only %d addresses held", w, in, pods, held*unit)
	}
	p := pool()
	return held, w.Over(p) == 0 && !w.SurplusInterface(p)
}

// TestWarmTargetsSettle checks the steady states of the VPC CNI's
// documented examples (docs/eni-and-ip-target.md and
// docs/prefix-and-ip-target.md of aws/amazon-vpc-cni-k8s): the addresses
// or prefixes a node holds for a number of Pods under each setting, and
// that the pool then stays as it is.
func TestWarmTargetsSettle(t *testing.T) {
	for _, c := range []struct {
		name string
		w    WarmTargets
		in   instance
		pods int
		want int // addresses held, or prefixes in prefix mode
	}{
		// WARM_ENI_TARGET=1 (the default): a spare interface's worth.
		{"t3.small eni 0 pods", WarmTargets{}, t3small, 0, 3},
		{"t3.small eni 5 pods", WarmTargets{WarmENI: 1}, t3small, 5, 9},
		{"t3.small eni 9 pods: every interface full", WarmTargets{}, t3small, 9, 9},
		{"p3dn eni 0 pods", WarmTargets{}, p3dn, 0, 49},
		{"p3dn eni 3 pods", WarmTargets{}, p3dn, 3, 98},
		{"p3dn eni 95 pods", WarmTargets{}, p3dn, 95, 147},
		// WARM_IP_TARGET and MINIMUM_IP_TARGET.
		{"t3.small ip 1/1 0 pods", WarmTargets{WarmIP: 1, MinimumIP: 1}, t3small, 0, 1},
		{"t3.small ip 1/1 5 pods", WarmTargets{WarmIP: 1, MinimumIP: 1}, t3small, 5, 6},
		{"t3.small ip 1/1 9 pods", WarmTargets{WarmIP: 1, MinimumIP: 1}, t3small, 9, 9},
		{"t3.small ip 2/5 0 pods", WarmTargets{WarmIP: 2, MinimumIP: 5}, t3small, 0, 5},
		{"t3.small ip 2/5 5 pods", WarmTargets{WarmIP: 2, MinimumIP: 5}, t3small, 5, 7},
		{"t3.small ip 2/5 9 pods", WarmTargets{WarmIP: 2, MinimumIP: 5}, t3small, 9, 9},
		{"p3dn ip 5/10 0 pods", WarmTargets{WarmIP: 5, MinimumIP: 10}, p3dn, 0, 10},
		{"p3dn ip 5/10 7 pods", WarmTargets{WarmIP: 5, MinimumIP: 10}, p3dn, 7, 12},
		{"p3dn ip 5/10 15 pods", WarmTargets{WarmIP: 5, MinimumIP: 10}, p3dn, 15, 20},
		{"p3dn ip 5/10 45 pods", WarmTargets{WarmIP: 5, MinimumIP: 10}, p3dn, 45, 50},
		// Prefix delegation, WARM_PREFIX_TARGET=1: a spare /28.
		{"t3.small prefix 0 pods", WarmTargets{Prefixes: true, WarmPrefix: 1}, t3smallPrefix, 0, 1},
		{"t3.small prefix 5 pods", WarmTargets{Prefixes: true, WarmPrefix: 1}, t3smallPrefix, 5, 2},
		{"t3.small prefix 16 pods", WarmTargets{Prefixes: true, WarmPrefix: 1}, t3smallPrefix, 16, 2},
		{"t3.small prefix 17 pods", WarmTargets{Prefixes: true, WarmPrefix: 1}, t3smallPrefix, 17, 3},
		{"t3.small prefix 58 pods", WarmTargets{Prefixes: true, WarmPrefix: 1}, t3smallPrefix, 58, 5},
		{"p3dn prefix 3 pods", WarmTargets{Prefixes: true, WarmPrefix: 1}, p3dn, 3, 2},
		{"p3dn prefix 95 pods", WarmTargets{Prefixes: true, WarmPrefix: 1}, p3dn, 95, 7},
		// Prefix delegation with address targets, counted in /28s.
		{"t3.small prefix ip 1/1 0 pods", WarmTargets{Prefixes: true, WarmIP: 1, MinimumIP: 1}, t3smallPrefix, 0, 1},
		{"t3.small prefix ip 1/1 5 pods", WarmTargets{Prefixes: true, WarmIP: 1, MinimumIP: 1}, t3smallPrefix, 5, 1},
		{"t3.small prefix ip 1/1 17 pods", WarmTargets{Prefixes: true, WarmIP: 1, MinimumIP: 1}, t3smallPrefix, 17, 2},
		{"t3.small prefix ip 1/1 58 pods", WarmTargets{Prefixes: true, WarmIP: 1, MinimumIP: 1}, t3smallPrefix, 58, 4},
		// The document's row for 0 Pods says 1 prefix attached but 2 per
		// interface, "0,0" Pods per prefix: a minimum of 20 is 2 /28s.
		{"t3.small prefix ip 7/20 0 pods", WarmTargets{Prefixes: true, WarmIP: 7, MinimumIP: 20}, t3smallPrefix, 0, 2},
		{"t3.small prefix ip 7/20 5 pods", WarmTargets{Prefixes: true, WarmIP: 7, MinimumIP: 20}, t3smallPrefix, 5, 2},
		{"t3.small prefix ip 7/20 17 pods", WarmTargets{Prefixes: true, WarmIP: 7, MinimumIP: 20}, t3smallPrefix, 17, 2},
		{"t3.small prefix ip 7/20 58 pods", WarmTargets{Prefixes: true, WarmIP: 7, MinimumIP: 20}, t3smallPrefix, 58, 5},
		{"p3dn prefix ip 5/10 0 pods", WarmTargets{Prefixes: true, WarmIP: 5, MinimumIP: 10}, p3dn, 0, 1},
		{"p3dn prefix ip 5/10 7 pods", WarmTargets{Prefixes: true, WarmIP: 5, MinimumIP: 10}, p3dn, 7, 1},
		{"p3dn prefix ip 5/10 15 pods", WarmTargets{Prefixes: true, WarmIP: 5, MinimumIP: 10}, p3dn, 15, 2},
		{"p3dn prefix ip 5/10 45 pods", WarmTargets{Prefixes: true, WarmIP: 5, MinimumIP: 10}, p3dn, 45, 4},
	} {
		held, stable := settle(t, c.w, c.in, c.pods)
		if held != c.want || !stable {
			t.Errorf("%s: holds %d (stable %v); want %d, stable", c.name, held, stable, c.want)
		}
	}
}

func TestWarmTargetsShort(t *testing.T) {
	for _, c := range []struct {
		name string
		w    WarmTargets
		p    WarmPool
		want int
	}{
		{"warm addresses missing", WarmTargets{WarmIP: 5}, WarmPool{Total: 10, Used: 8}, 3},
		{"the minimum weighs more", WarmTargets{WarmIP: 2, MinimumIP: 20}, WarmPool{Total: 10, Used: 8}, 10},
		{"only the minimum set: no spare once it is held", WarmTargets{MinimumIP: 10}, WarmPool{Total: 10, Used: 10}, 0},
		{"max Pods held: never low", WarmTargets{WarmIP: 5}, WarmPool{Total: 11, Used: 11, MaxPods: 11}, 0},
		{"an interface's worth missing", WarmTargets{WarmENI: 2}, WarmPool{Total: 9, Used: 7, PerInterface: 3}, 4},
		{"prefix mode rounds up to /28s", WarmTargets{Prefixes: true, WarmIP: 20}, WarmPool{Total: 16, Used: 10}, 1},
		{"prefix mode, 17 addresses short: two /28s", WarmTargets{Prefixes: true, MinimumIP: 33}, WarmPool{Total: 16, Used: 0}, 2},
		{"warm prefix 0 keeps one when none is unused", WarmTargets{Prefixes: true}, WarmPool{Total: 32, Used: 32, Prefixes: 2}, 1},
		{"warm prefix 0 asks nothing while one is unused", WarmTargets{Prefixes: true}, WarmPool{Total: 32, Used: 31, Prefixes: 2}, 0},
	} {
		if got := c.w.Short(c.p); got != c.want {
			t.Errorf("%s: %+v.Short(%+v) = %d; want %d", c.name, c.w, c.p, got, c.want)
		}
	}
}

func TestWarmTargetsOver(t *testing.T) {
	for _, c := range []struct {
		name string
		w    WarmTargets
		p    WarmPool
		want int
	}{
		{"unused beyond the warm target", WarmTargets{WarmIP: 5, MinimumIP: 10}, WarmPool{Total: 50, Used: 10}, 35},
		{"the minimum stays", WarmTargets{WarmIP: 0, MinimumIP: 40}, WarmPool{Total: 50, Used: 5}, 10},
		{"nothing over", WarmTargets{WarmIP: 5}, WarmPool{Total: 10, Used: 5}, 0},
		{"interface mode never gives addresses back", WarmTargets{}, WarmPool{Total: 147, Used: 0, PerInterface: 49}, 0},
		{"prefixes: only unused ones, beyond what the targets fill", WarmTargets{Prefixes: true, WarmIP: 5, MinimumIP: 10},
			WarmPool{Total: 64, Used: 10, Prefixes: 4, FreePrefixes: 3}, 3},
		{"prefixes: used addresses spread over three /28s", WarmTargets{Prefixes: true, WarmIP: 15},
			WarmPool{Total: 64, Used: 3, Prefixes: 4, FreePrefixes: 1}, 1},
		{"prefixes: the minimum's /28s stay", WarmTargets{Prefixes: true, MinimumIP: 40},
			WarmPool{Total: 64, Used: 0, Prefixes: 4, FreePrefixes: 4}, 1},
		{"warm prefix target: the unused /28s beyond it", WarmTargets{Prefixes: true, WarmPrefix: 1},
			WarmPool{Total: 64, Used: 10, Prefixes: 4, FreePrefixes: 3}, 2},
	} {
		if got := c.w.Over(c.p); got != c.want {
			t.Errorf("%s: %+v.Over(%+v) = %d; want %d", c.name, c.w, c.p, got, c.want)
		}
	}
}

func TestWarmTargetsSurplusInterface(t *testing.T) {
	w := WarmTargets{} // WARM_ENI_TARGET=1
	if w.SurplusInterface(WarmPool{Total: 9, Used: 4, PerInterface: 3}) {
		t.Error("5 unused of 3 per interface is no second spare interface")
	}
	if !w.SurplusInterface(WarmPool{Total: 9, Used: 3, PerInterface: 3}) {
		t.Error("6 unused of 3 per interface is a spare interface too many")
	}
	if (WarmTargets{WarmIP: 1}).SurplusInterface(WarmPool{Total: 9, PerInterface: 3}) {
		t.Error("address targets give back addresses, not interfaces")
	}
	if (WarmTargets{Prefixes: true, WarmPrefix: 1}).SurplusInterface(WarmPool{Total: 96, Prefixes: 6, FreePrefixes: 6, PerInterface: 3}) {
		t.Error("prefix mode gives back prefixes, not interfaces")
	}
}

// TestShortAddresses: what a prefix node asks as single addresses when
// its subnet has no free aligned /28: the address targets' exact need,
// else the prefixes' worth.
func TestShortAddresses(t *testing.T) {
	for _, c := range []struct {
		name string
		t    WarmTargets
		p    WarmPool
		want int
	}{
		{"addresses: Short itself", WarmTargets{WarmIP: 5}, WarmPool{Total: 3, Used: 1}, 3},
		{"prefixes, WARM_IP_TARGET 5 with 2 free: 3 addresses, not a /28's 16", WarmTargets{WarmIP: 5, Prefixes: true}, WarmPool{Total: 16, Used: 14, Prefixes: 1}, 3},
		{"prefixes, MINIMUM_IP_TARGET 20 with 16 held: 4", WarmTargets{MinimumIP: 20, Prefixes: true}, WarmPool{Total: 16, Used: 0, Prefixes: 1, FreePrefixes: 1}, 4},
		{"prefixes, WARM_PREFIX_TARGET 1 with none free: a prefix's worth", WarmTargets{WarmPrefix: 1, Prefixes: true}, WarmPool{Total: 16, Used: 16, Prefixes: 1}, 16},
		{"nothing short", WarmTargets{WarmIP: 2, Prefixes: true}, WarmPool{Total: 16, Used: 3, Prefixes: 1}, 0},
	} {
		if got := c.t.ShortAddresses(c.p); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// TestOverAddresses: what a prefix node may give back of the single
// addresses a fallback gave it, counted in addresses.
func TestOverAddresses(t *testing.T) {
	for _, c := range []struct {
		name string
		t    WarmTargets
		p    WarmPool
		want int
	}{
		{"no prefixes: Over", WarmTargets{WarmIP: 2}, WarmPool{Total: 10, Used: 3}, 5},
		{"prefix mode, address targets", WarmTargets{WarmIP: 2, MinimumIP: 4, Prefixes: true}, WarmPool{Total: 12, Used: 1}, 8},
		{"prefix mode, the minimum keeps them", WarmTargets{WarmIP: 2, MinimumIP: 12, Prefixes: true}, WarmPool{Total: 12, Used: 1}, 0},
		{"prefix target: beyond a prefix's worth", WarmTargets{WarmPrefix: 1, Prefixes: true}, WarmPool{Total: 20, Used: 0}, 4},
		{"prefix target: nothing beyond", WarmTargets{WarmPrefix: 1, Prefixes: true}, WarmPool{Total: 20, Used: 6}, 0},
	} {
		if got := c.t.OverAddresses(c.p); got != c.want {
			t.Errorf("%s: OverAddresses = %d, want %d", c.name, got, c.want)
		}
	}
}
