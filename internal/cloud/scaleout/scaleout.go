// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package scaleout simulates a cluster scaling out on AWS: nodes that
// reach a number of Pods each, then churn, with the capacity rounds of
// cloud.Reconciler keeping each node's warm pool, the real EC2 client
// talking to the EC2 fake over TLS, one token bucket over every call,
// and throttling injected. Time is virtual: one step is one second of the
// workers' time (the bucket refills by it), however long the calls take
// here.
//
// It reports the three figures of the cloud capacity workers: EC2 calls
// per 1,000 Pods against their floor (one /28 per 16 Pods of each node,
// and one per interface created), the share of the Pods started after the
// ramp whose address was not there yet (the steady state, where the warm
// target should hold), and the Pods that never got an address.
package scaleout

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sort"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"golang.org/x/time/rate"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// Config is one simulation.
type Config struct {
	Nodes       int
	PodsPerNode int
	// InstanceType of every node (an ec2fake.Types key).
	InstanceType string
	// Options size the nodes; Prefixes for /28s.
	Options cloud.PlanOptions
	// RampSteps spreads the Pods' first starts over this many steps;
	// ChurnSteps then replace ChurnPerStep Pods a step (a Pod stops and
	// another starts on the same node).
	RampSteps, ChurnSteps, ChurnPerStep int
	// ThrottleRate is the share of calls EC2 refuses for its rate.
	ThrottleRate float64
	// QPS and Burst are the workers' bucket.
	QPS   float64
	Burst int
	// Parallel bounds the nodes served in one step.
	Parallel int
	// ReleaseDelay is how long an address stays excess before it goes.
	ReleaseDelay time.Duration
	Seed         uint64
}

// Result is what a simulation measured.
type Result struct {
	Pods int // Pods started, first starts and churn
	// Calls are the EC2 calls made (refused ones and the SDK's retries
	// included), by action.
	Calls    map[string]int
	AllCalls int
	// Floor is the fewest adding calls the Pods need: per node, one /28
	// per 16 of its most Pods at once (one call per address without
	// prefixes), plus one per interface holding prefixes (its spare /28,
	// which a warm target keeps) or created.
	Floor int
	// CallsPerThousand and FloorPerThousand are per 1,000 Pods started.
	CallsPerThousand, FloorPerThousand float64
	// SteadyStarts are the Pods started after the ramp (churn), of which
	// SteadyWaited found no free address on their node at once.
	SteadyStarts, SteadyWaited int
	// Failed Pods had no address when the simulation ended.
	Failed int
	// RampSeconds is the virtual time until every first start had an
	// address.
	RampSeconds int
	// Created interfaces; Released addresses and prefixes given back.
	Created, Released int
}

func (r Result) String() string {
	ratio := 0.0
	if r.Floor > 0 {
		ratio = float64(r.AllCalls) / float64(r.Floor)
	}
	return fmt.Sprintf("pods=%d ec2_calls=%d (%.1f per 1,000 Pods) floor=%d (%.1f) ratio=%.2f steady_waited=%d/%d pods_failed=%d ramp_s=%d interfaces_created=%d released=%d",
		r.Pods, r.AllCalls, r.CallsPerThousand, r.Floor, r.FloorPerThousand, ratio, r.SteadyWaited, r.SteadyStarts, r.Failed, r.RampSeconds, r.Created, r.Released)
}

// node is one simulated node: its instance as last seen, the Pods' addresses.
type node struct {
	name    string
	inst    cloud.Instance
	used    map[netip.Addr]bool
	waiting int                // Pods without an address
	peak    int                // most Pods at once
	excess  map[netip.Addr]int // unused address -> step it became excess
}

// Run runs the simulation.
func Run(ctx context.Context, cfg Config) (Result, error) {
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	fake := ec2fake.New()
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-pods", VPC: "vpc-sim", Zone: "sim-1a", CIDR: netip.MustParsePrefix("10.128.0.0/14")})
	nodes := make([]*node, cfg.Nodes)
	for i := range nodes {
		if _, _, err := fake.AddInstance(cfg.InstanceType, "subnet-pods"); err != nil {
			return Result{}, err
		}
		nodes[i] = &node{name: fmt.Sprintf("node-%04d", i), used: map[netip.Addr]bool{}, excess: map[netip.Addr]int{}}
	}
	srv := httptest.NewTLSServer(fake)
	defer srv.Close()
	client := ec2.New(ec2.Options{Region: "sim-1", BaseEndpoint: sdkaws.String(srv.URL), HTTPClient: aws.SafeBodies(srv.Client()),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDSIM", "secret", ""),
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 3
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
			o.RateLimiter = noQuota{}
		})})
	provider := aws.New(client, aws.Options{Wait: func(int) time.Duration { return 0 }})
	inventory, err := provider.Instances(ctx, "vpc-sim")
	if err != nil {
		return Result{}, err
	}
	ids := make([]string, 0, len(inventory))
	for id := range inventory {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for i, id := range ids {
		nodes[i].inst = inventory[id]
	}
	// Throttling starts once the inventory is in: the refusals fall on the
	// workers' calls.
	fake.SetFault(func(string) *ec2fake.APIError {
		if rng.Float64() < cfg.ThrottleRate {
			return ec2fake.Throttled()
		}
		return nil
	})
	rec := &cloud.Reconciler{Provider: provider, Interfaces: provider,
		Tags: map[string]string{cloud.TagCluster: "sim"}}
	bucket := rate.NewLimiter(rate.Limit(cfg.QPS), cfg.Burst)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

	res := Result{}
	firstStarts := cfg.Nodes * cfg.PodsPerNode
	started := 0
	steps := cfg.RampSteps + cfg.ChurnSteps
	for step := 0; ; step++ {
		now := start.Add(time.Duration(step) * time.Second)
		rec.Now = func() time.Time { return now }
		// Pods start: the ramp's share of this step, then churn.
		if step < cfg.RampSteps {
			want := firstStarts * (step + 1) / cfg.RampSteps
			for ; started < want; started++ {
				nodes[started%cfg.Nodes].waiting++
				res.Pods++
			}
		} else if step < steps {
			for range cfg.ChurnPerStep {
				n := nodes[rng.IntN(len(nodes))]
				if len(n.used) == 0 {
					continue
				}
				stopPod(n, rng)
				n.waiting++
				res.Pods++
				res.SteadyStarts++
				if !hasFree(n) {
					res.SteadyWaited++
				}
			}
		}
		for _, n := range nodes {
			place(n)
		}
		if res.RampSeconds == 0 && started == firstStarts && allPlaced(nodes) {
			res.RampSeconds = step
		}
		if step >= steps && allPlaced(nodes) {
			break
		}
		if step >= steps+3600 {
			break // an hour past the end: what waits now never gets one
		}
		// The workers' round: the nodes lacking most first, as many as
		// the bucket and the parallelism allow.
		order := make([]planned, len(nodes))
		for i, n := range nodes {
			plan, err := cloud.PlanNode(state(n), cfg.Options)
			if err != nil {
				return res, err
			}
			order[i] = planned{n, plan, need(n, plan)}
		}
		slices.SortStableFunc(order, func(a, b planned) int { return cmp.Compare(b.need, a.need) })
		served := 0
		for _, o := range order {
			if served == cfg.Parallel {
				break
			}
			n, plan := o.n, o.plan
			cost := 0
			switch {
			case plan.Assign != nil:
				cost = 1
			case plan.Create != nil:
				cost = 5 // subnets, describe, create, attach, attribute
			case plan.Release != nil && releasable(n, plan.Release, step, cfg.ReleaseDelay):
				cost = 1
			}
			trackExcess(n, plan.Release, step)
			if cost == 0 {
				continue
			}
			if !bucket.AllowN(now, cost) {
				break
			}
			served++
			if cost == 1 && plan.Assign == nil {
				if err := provider.Unassign(ctx, plan.Release.Interface, plan.Release.Addresses, plan.Release.Prefixes); err == nil {
					dropHeld(n, plan.Release)
					res.Released += len(plan.Release.Addresses) + len(plan.Release.Prefixes)
				}
				continue
			}
			_, added, err := rec.Round(ctx, n.name, state(n), cfg.Options)
			if err != nil {
				continue // tried again at a later step, as the workers do
			}
			addHeld(n, added)
			if added.Created {
				res.Created++
			}
		}
	}
	for _, n := range nodes {
		res.Failed += n.waiting
		per := 1
		if cfg.Options.Prefixes {
			per = cloud.IPv4PrefixSize
		}
		res.Floor += (n.peak + per - 1) / per
		for _, f := range n.inst.Interfaces {
			if len(f.Prefixes) > 0 && f.DeviceIndex == 0 {
				res.Floor++ // a created one counts below
			}
		}
	}
	res.Floor += res.Created
	res.Calls = map[string]int{}
	for _, a := range []string{"AssignPrivateIpAddresses", "UnassignPrivateIpAddresses", "CreateNetworkInterface", "AttachNetworkInterface",
		"ModifyNetworkInterfaceAttribute", "DeleteNetworkInterface", "DescribeInstances", "DescribeNetworkInterfaces", "DescribeSubnets", "DescribeInstanceTypes"} {
		if c := fake.Calls(a); c > 0 {
			res.Calls[a] = c
			res.AllCalls += c
		}
	}
	res.CallsPerThousand = 1000 * float64(res.AllCalls) / float64(res.Pods)
	res.FloorPerThousand = 1000 * float64(res.Floor) / float64(res.Pods)
	return res, nil
}

// noQuota lets the SDK retry every throttled call: the bucket in front of
// the calls, not the SDK's retry quota, paces them.
type noQuota struct{}

func (noQuota) GetToken(context.Context, uint) (func() error, error) {
	return func() error { return nil }, nil
}
func (noQuota) AddTokens(uint) error { return nil }

// state is what the workers know of n.
func state(n *node) cloud.NodeState {
	return cloud.NodeState{Instance: n.inst, Used: n.used, Pending: n.waiting}
}

// held lists every Pod address of n: secondary addresses and the
// addresses of its prefixes.
func held(n *node) []netip.Addr {
	var out []netip.Addr
	for _, f := range n.inst.Interfaces {
		out = append(out, f.Addresses...)
		for _, p := range f.Prefixes {
			for a := p.Addr(); p.Contains(a); a = a.Next() {
				out = append(out, a)
			}
		}
	}
	return out
}

func hasFree(n *node) bool {
	for _, a := range held(n) {
		if !n.used[a] {
			return true
		}
	}
	return false
}

// place gives waiting Pods of n the free addresses it holds.
func place(n *node) {
	if n.waiting == 0 {
		return
	}
	for _, a := range held(n) {
		if n.waiting == 0 {
			break
		}
		if !n.used[a] {
			n.used[a] = true
			delete(n.excess, a)
			n.waiting--
		}
	}
	n.peak = max(n.peak, len(n.used))
}

func allPlaced(nodes []*node) bool {
	for _, n := range nodes {
		if n.waiting > 0 {
			return false
		}
	}
	return true
}

// stopPod frees a random used address of n.
func stopPod(n *node, rng *rand.Rand) {
	addrs := make([]netip.Addr, 0, len(n.used))
	for a := range n.used {
		addrs = append(addrs, a)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	delete(n.used, addrs[rng.IntN(len(addrs))])
}

// planned is a node and its plan at one step.
type planned struct {
	n    *node
	plan cloud.Plan
	need int
}

// need is how much n lacks by its plan p, to order the round.
func need(n *node, p cloud.Plan) int {
	switch {
	case p.Assign != nil:
		return p.Assign.Count + n.waiting
	case p.Create != nil:
		return p.Create.Count + n.waiting
	}
	return 0
}

// trackExcess notes since when each address of r has been excess; an
// address no longer excess forgets it.
func trackExcess(n *node, r *cloud.Release, step int) {
	now := map[netip.Addr]bool{}
	if r != nil {
		for _, a := range r.Addresses {
			now[a] = true
		}
		for _, p := range r.Prefixes {
			now[p.Addr()] = true
		}
	}
	for a := range n.excess {
		if !now[a] {
			delete(n.excess, a)
		}
	}
	for a := range now {
		if _, ok := n.excess[a]; !ok {
			n.excess[a] = step
		}
	}
}

// releasable reports whether every address of r has been excess for the
// delay.
func releasable(n *node, r *cloud.Release, step int, delay time.Duration) bool {
	keys := slices.Clone(r.Addresses)
	for _, p := range r.Prefixes {
		keys = append(keys, p.Addr())
	}
	for _, a := range keys {
		since, ok := n.excess[a]
		if !ok || time.Duration(step-since)*time.Second < delay {
			return false
		}
	}
	return len(keys) > 0
}

func addHeld(n *node, a cloud.Added) {
	if a.Created {
		n.inst.Interfaces = append(n.inst.Interfaces, a.NewInterface)
		return
	}
	for i, f := range n.inst.Interfaces {
		if f.ID == a.Interface {
			n.inst.Interfaces[i].Addresses = append(n.inst.Interfaces[i].Addresses, a.Addresses...)
			n.inst.Interfaces[i].Prefixes = append(n.inst.Interfaces[i].Prefixes, a.Prefixes...)
		}
	}
}

func dropHeld(n *node, r *cloud.Release) {
	for i, f := range n.inst.Interfaces {
		if f.ID != r.Interface {
			continue
		}
		n.inst.Interfaces[i].Addresses = slices.DeleteFunc(f.Addresses, func(a netip.Addr) bool { return slices.Contains(r.Addresses, a) })
		n.inst.Interfaces[i].Prefixes = slices.DeleteFunc(f.Prefixes, func(p netip.Prefix) bool { return slices.Contains(r.Prefixes, p) })
	}
	for _, a := range r.Addresses {
		delete(n.excess, a)
	}
	for _, p := range r.Prefixes {
		delete(n.excess, p.Addr())
	}
}

// DefaultConfig is the acceptance's scale-out: 1,000 m5.large nodes
// reaching 30 Pods each over five minutes, then five minutes of churn,
// with /28 prefixes and the VPC CNI's WARM_PREFIX_TARGET=1, Cilium's
// bucket (4 per second, burst 20) and 10% of the calls throttled.
func DefaultConfig() Config {
	return Config{Nodes: 1000, PodsPerNode: 30, InstanceType: "m5.large",
		Options:   cloud.PlanOptions{Prefixes: true, Sizing: cloud.Sizing{WarmTargets: &alloc.WarmTargets{WarmPrefix: 1}}, MaxPods: 110},
		RampSteps: 300, ChurnSteps: 300, ChurnPerStep: 20, ThrottleRate: 0.1, QPS: cloud.DefaultQPS, Burst: cloud.DefaultBurst,
		Parallel: 50, ReleaseDelay: 180 * time.Second, Seed: 1}
}
