// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package scaleout simulates a cluster scaling out on AWS through the
// server's own path: capacity.Worker passes over two cloud pools (one per
// node group, chosen by the pools' nodeSelectors, each with its subnet)
// on a real store, the real EC2 client behind the server's token bucket
// (cloud.NewBudget) and limited wrappers with a call timeout, talking
// over TLS to the EC2 fake failing as EC2 does: throttling, answers lost
// after the change was applied, stale reads, random free addresses, and
// instances terminated mid-run. Pods are leases: st.Allocate at start (a
// Pod without an address retries every pass, as a CNI's retries do),
// ReleaseAttachment at stop.
//
// Time is virtual for the store and the workers: one pass every
// Interval. The fake's stale reads are dated by the virtual time of the
// pass plus the real time spent in it (at most half an interval, so the
// fake's clock never runs back), so a describe can show the state of a
// few seconds ago within a pass and across passes.
// The token bucket runs on real time (it is the server's rate.Limiter):
// it paces the run, not the figures.
//
// After every pass it checks, against the fake's truth, that no block a
// Pod could lease (recorded, not drained) on a live node lies outside
// its instance's interfaces, and counts the calls that changed
// interfaces the workers do not own (no_manage-tagged).
package scaleout

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
	"github.com/ipam-dev/ipam/internal/cloud/capacity"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/testclock"
)

// Config is one simulation.
type Config struct {
	// DatabaseURL is a migrated database; the run works in Space (created
	// when missing).
	DatabaseURL string
	Space       string
	// Nodes are split over two node groups, each its pool and subnet.
	Nodes       int
	PodsPerNode int
	// InstanceType of every node (an ec2fake.Types key).
	InstanceType string
	// Spec is both pools' spec.cloud, less the subnets (each pool gets
	// its group's); it must pass alloc.CloudSpec.Validate.
	Spec alloc.CloudSpec
	// Interval is the virtual time between passes (--cloud-interval).
	Interval time.Duration
	// RampPasses spreads the Pods' first starts; ChurnPasses then
	// replace ChurnPerPass Pods a pass (a Pod stops and another starts on
	// the same node); SettlePasses follow with no new Pods.
	RampPasses, ChurnPasses, ChurnPerPass, SettlePasses int
	// Throttle and Lost are the fake's fault rates (ec2fake.FaultRates):
	// refused before the change, and the answer lost after it (held for
	// LostHold, then the connection cut: the SDK retries into the changed
	// state). StaleWindow and StaleRate are its eventually consistent
	// reads.
	Throttle, Lost float64
	LostHold       time.Duration
	StaleWindow    time.Duration
	StaleRate      float64
	// TerminateShare of the instances are terminated when the churn
	// starts (one at least).
	TerminateShare float64
	// UnmanagedEvery puts a no_manage-tagged interface on every n-th node.
	UnmanagedEvery int
	// QPS, Burst, CallTimeout and Parallel are the server's --cloud-qps,
	// --cloud-burst, --cloud-call-timeout and --cloud-parallel.
	QPS         float64
	Burst       int
	CallTimeout time.Duration
	Parallel    int
	Seed        uint64
	// Check runs the leasable-not-held check after every pass.
	Check bool
}

// Result is what a simulation measured.
type Result struct {
	Nodes, Terminated int
	Pods              int // Pods started, first starts and churn
	// Calls are the EC2 calls the fake received (refused ones and the
	// SDK's retries included), by action.
	Calls    map[string]int
	AllCalls int
	// ChangeCalls are those of AllCalls that are not describes: the
	// adding and giving back, which the floor counts. The describes are
	// a cost per pass (the inventory's listing, a few pages), not per
	// Pod, so only a large run amortizes them.
	ChangeCalls int
	// Floor is the fewest adding calls the Pods need, as before the
	// Worker drove this: per node one /28 per 16 of its most Pods at
	// once, plus its spare /28 on each interface holding prefixes, plus
	// one per interface created.
	Floor                              int
	CallsPerThousand, FloorPerThousand float64
	// SteadyStarts are the Pods started after the ramp, of which
	// SteadyWaited found no address at their first try.
	SteadyStarts, SteadyWaited int
	// Failed Pods had no address when the simulation ended.
	Failed int
	// LeasableNotHeld counts, over every pass, leasable blocks of live
	// nodes their instance's interfaces did not hold; DeadBlocks the
	// blocks terminated instances' nodes still held at the end.
	LeasableNotHeld, DeadBlocks int
	// UnownedCalls are the calls that changed interfaces the workers do
	// not own.
	UnownedCalls int
	Passes       int
	PassErrors   int
	// DescribesByPass are the describes (instances and interfaces) each
	// pass made: the inventory's listing, and the nodes described alone.
	DescribesByPass []int `json:",omitempty"`
	// Faults the fake injected.
	Throttled, LostAnswers, StaleReadsOn int
	Created                              int
}

// Ratio is AllCalls over Floor.
func (r Result) Ratio() float64 {
	if r.Floor == 0 {
		return 0
	}
	return float64(r.AllCalls) / float64(r.Floor)
}

// Met reports whether r meets issue 35's acceptance: every call within
// 1.2 times the floor, and no Pod waiting or failed, no leasable block
// the interface lacks, no call on an interface not the workers', no
// block left to an ended instance.
func (r Result) Met() bool {
	return r.Floor > 0 && r.Ratio() <= 1.2 && r.Clean()
}

// Clean reports whether r's figures other than the calls meet the
// acceptance.
func (r Result) Clean() bool {
	return r.SteadyWaited == 0 && r.Failed == 0 && r.LeasableNotHeld == 0 && r.UnownedCalls == 0 && r.DeadBlocks == 0
}

func (r Result) String() string {
	return fmt.Sprintf("nodes=%d terminated=%d pods=%d ec2_calls=%d (%.1f per 1,000 Pods) floor=%d (%.1f) ratio=%.2f change_calls=%d steady_waited=%d/%d pods_failed=%d leasable_not_held=%d dead_blocks=%d unowned_calls=%d passes=%d pass_errors=%d throttled=%d lost=%d interfaces_created=%d",
		r.Nodes, r.Terminated, r.Pods, r.AllCalls, r.CallsPerThousand, r.Floor, r.FloorPerThousand, r.Ratio(), r.ChangeCalls, r.SteadyWaited, r.SteadyStarts, r.Failed,
		r.LeasableNotHeld, r.DeadBlocks, r.UnownedCalls, r.Passes, r.PassErrors, r.Throttled, r.LostAnswers, r.Created)
}

// DefaultConfig is the acceptance's scale-out: 1,000 m5.large nodes in
// two groups reaching 30 Pods each over five minutes, then five minutes
// of churn, /28 prefixes with WARM_PREFIX_TARGET=1 and EKS's max pods
// for the type (110), the server's defaults for the interval, parallelism
// and call timeout, 10% of the calls throttled, 2% of the answers lost,
// stale reads in a 5 s window and 1% of the instances terminated.
func DefaultConfig() Config {
	return Config{Space: "scaleout", Nodes: 1000, PodsPerNode: 30, InstanceType: "m5.large",
		Spec: alloc.CloudSpec{Provider: alloc.CloudAWS, Prefixes: true, WarmTargets: &alloc.WarmTargets{WarmPrefix: 1, MaxPods: 110},
			ReleaseDelay: 3 * time.Minute},
		Interval: 10 * time.Second, RampPasses: 30, ChurnPasses: 30, ChurnPerPass: 200, SettlePasses: 6,
		Throttle: 0.10, Lost: 0.02, LostHold: 100 * time.Millisecond, StaleWindow: 5 * time.Second, StaleRate: 0.5,
		TerminateShare: 0.01, UnmanagedEvery: 50,
		QPS: 200, Burst: 200, CallTimeout: cloud.DefaultCallTimeout, Parallel: capacity.DefaultParallel, Seed: 1, Check: true}
}

// group is a node group: its pool, subnet and label.
type group struct {
	pool, subnet string
	cidr         netip.Prefix
}

var groups = []group{
	{"group-a", "subnet-0a0000000000000a", netip.MustParsePrefix("10.64.0.0/14")},
	{"group-b", "subnet-0b0000000000000b", netip.MustParsePrefix("10.68.0.0/14")},
}

// groupLabel is the label choosing a node's pool.
const groupLabel = "eks.amazonaws.com/nodegroup"

// node is one simulated node.
type node struct {
	name, inst string
	group      int
	pods       []string // containers holding an address
	waiting    []string // containers still without one
	peak       int
	dead       bool
	unmanaged  string
}

// Run runs the simulation.
func Run(ctx context.Context, cfg Config) (Result, error) {
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	clk := testclock.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	st, err := store.Open(ctx, cfg.DatabaseURL, store.Options{LeaseExpiry: time.Hour, Cooldown: time.Second, Now: clk.Now})
	if err != nil {
		return Result{}, err
	}
	defer st.Close()
	if _, err := st.CreateSpace(ctx, cfg.Space); err != nil {
		return Result{}, fmt.Errorf("space %s: %w", cfg.Space, err)
	}

	fake := ec2fake.New()
	defer fake.Close()
	for _, g := range groups {
		fake.AddSubnet(ec2fake.Subnet{ID: g.subnet, VPC: "vpc-sim", Zone: "sim-1a", CIDR: g.cidr})
		spec := cfg.Spec
		spec.SubnetIDs = []string{g.subnet}
		if err := spec.Validate("spec.cloud"); err != nil {
			return Result{}, fmt.Errorf("a setting the server refuses: %w", err)
		}
		p := alloc.Pool{Space: cfg.Space, Name: g.pool, Spec: alloc.PoolSpec{
			IPv4:         &alloc.PoolFamily{CIDRs: []netip.Prefix{g.cidr}, MaskSize: 28},
			NodeLocal:    alloc.DefaultNodeLocal,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{groupLabel: g.pool}},
			Cloud:        &spec}}
		if err := p.Spec.Validate(); err != nil {
			return Result{}, fmt.Errorf("a pool the server refuses: %w", err)
		}
		if _, err := st.CreatePool(ctx, p); err != nil {
			return Result{}, fmt.Errorf("pool %s: %w", g.pool, err)
		}
	}
	nodes := make([]*node, cfg.Nodes)
	for i := range nodes {
		g := i % len(groups)
		inst, _, err := fake.AddInstance(cfg.InstanceType, groups[g].subnet)
		if err != nil {
			return Result{}, err
		}
		n := &node{name: fmt.Sprintf("ip-node-%04d", i), inst: inst, group: g}
		if cfg.UnmanagedEvery > 0 && i%cfg.UnmanagedEvery == cfg.UnmanagedEvery/2 {
			n.unmanaged, err = fake.AttachTypedInterface(ec2fake.TypedInterface{Instance: inst, Subnet: groups[g].subnet, Device: 1,
				Tags: map[string]string{cloud.TagNoManage: "true"}, Addresses: 2})
			if err != nil {
				return Result{}, err
			}
		}
		if _, _, err := st.PutNode(ctx, alloc.Node{Space: cfg.Space, Name: n.name, ProviderID: "aws:///sim-1a/" + inst,
			Labels: map[string]string{groupLabel: groups[g].pool}}); err != nil {
			return Result{}, err
		}
		nodes[i] = n
	}

	// The fake's clock: the pass's virtual time plus the real time spent
	// in it, so stale reads show a few seconds ago; at most half an
	// interval, so that it never runs back (a pass slower than the
	// interval on a loaded machine dated its changes after the next
	// pass's listing, whose readings then lacked blocks added long
	// before: the figures followed the machine's load).
	var passStart atomic.Int64
	fake.SetClock(func() time.Time {
		return clk.Now().Add(min(time.Duration(time.Now().UnixNano()-passStart.Load()), cfg.Interval/2))
	})
	passStart.Store(time.Now().UnixNano())
	fake.SetRandomAddresses(cfg.Seed)
	fake.SetStaleReads(cfg.StaleWindow, cfg.StaleRate, cfg.Seed)
	fake.SetFaultRates(cfg.Seed, ec2fake.FaultRates{Throttle: cfg.Throttle, Lost: cfg.Lost, Hold: cfg.LostHold})

	srv := httptest.NewTLSServer(fake)
	defer srv.Close()
	bucket := rate.NewLimiter(rate.Limit(cfg.QPS), cfg.Burst)
	// The SDK's standard retryer, as the server's; its backoff waits are
	// dropped because time stands still within a virtual pass (they
	// would only cost real time here).
	client := ec2.New(ec2.Options{Region: "sim-1", BaseEndpoint: sdkaws.String(srv.URL),
		HTTPClient:  aws.SafeBodies(cloud.NewBudget(srv.Client(), bucket)),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDSIM", "secret", ""),
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		})})
	p := aws.New(client, aws.Options{Now: clk.Now, Wait: func(int) time.Duration { return 0 }})
	wrap := []cloud.Option{cloud.WithCallTimeout(cfg.CallTimeout)}
	w := &capacity.Worker{Store: st, Provider: alloc.CloudAWS, Cloud: cloud.NewLimited(p, nil, wrap...),
		Interfaces: cloud.NewLimitedInterfaces(p, nil, wrap...), Inventory: cloud.NewLimitedInventory(p, nil, wrap...),
		Tags: map[string]string{cloud.TagCluster: "sim"}, Now: clk.Now, Parallel: cfg.Parallel,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}

	res := Result{Nodes: cfg.Nodes}
	live := slices.Clone(nodes)
	seq := 0
	start := func(n *node) bool {
		seq++
		c := fmt.Sprintf("pod-%07d", seq)
		res.Pods++
		if err := allocate(ctx, st, cfg.Space, n, c); err != nil {
			n.waiting = append(n.waiting, c)
			return false
		}
		return true
	}
	firstStarts := cfg.Nodes * cfg.PodsPerNode
	started := 0
	total := cfg.RampPasses + cfg.ChurnPasses + cfg.SettlePasses
	for pass := 0; pass < total; pass++ {
		// Pods waiting retry, as the CNI's retries do.
		for _, n := range live {
			w := n.waiting
			n.waiting = nil
			for _, c := range w {
				if err := allocate(ctx, st, cfg.Space, n, c); err != nil {
					n.waiting = append(n.waiting, c)
				}
			}
		}
		switch {
		case pass < cfg.RampPasses:
			want := firstStarts * (pass + 1) / cfg.RampPasses
			for ; started < want; started++ {
				start(nodes[started%cfg.Nodes])
			}
		case pass < cfg.RampPasses+cfg.ChurnPasses:
			if pass == cfg.RampPasses {
				k := max(1, int(float64(cfg.Nodes)*cfg.TerminateShare))
				for _, i := range rng.Perm(len(live))[:k] {
					fake.TerminateInstance(live[i].inst)
					live[i].dead = true
					res.Terminated++
				}
				live = slices.DeleteFunc(live, func(n *node) bool { return n.dead })
			}
			for range cfg.ChurnPerPass {
				n := live[rng.IntN(len(live))]
				if len(n.pods) == 0 {
					continue
				}
				i := rng.IntN(len(n.pods))
				if _, err := st.ReleaseAttachment(ctx, cfg.Space, n.name, alloc.Attachment{ContainerID: n.pods[i], Interface: "eth0"}); err != nil {
					return res, fmt.Errorf("stopping a Pod: %w", err)
				}
				n.pods = slices.Delete(n.pods, i, i+1)
				res.SteadyStarts++
				if !start(n) {
					res.SteadyWaited++
				}
			}
		}
		for _, n := range live {
			n.peak = max(n.peak, len(n.pods))
		}
		passStart.Store(time.Now().UnixNano())
		before := fake.Calls("DescribeInstances") + fake.Calls("DescribeNetworkInterfaces")
		if err := w.Pass(ctx); err != nil {
			res.PassErrors++
		}
		res.Passes++
		res.DescribesByPass = append(res.DescribesByPass, fake.Calls("DescribeInstances")+fake.Calls("DescribeNetworkInterfaces")-before)
		if cfg.Check {
			bad, err := leasableNotHeld(ctx, st, fake, cfg.Space, live)
			if err != nil {
				return res, err
			}
			res.LeasableNotHeld += bad
		}
		clk.Advance(cfg.Interval)
	}
	for _, n := range live {
		res.Failed += len(n.waiting)
	}
	// What the terminated nodes' pools still hold of them.
	for _, g := range groups {
		cn, err := st.CloudNodes(ctx, cfg.Space, g.pool)
		if err != nil {
			return res, err
		}
		for _, c := range cn {
			for _, n := range nodes {
				if n.dead && n.name == c.Name {
					res.DeadBlocks += len(c.Blocks)
				}
			}
		}
	}
	for _, n := range nodes {
		if n.unmanaged != "" {
			res.UnownedCalls += fake.Changes(n.unmanaged)
		}
	}
	// The floor, per node from its peak and what its interfaces hold.
	byInst := map[string][]ec2fake.Interface{}
	for _, f := range fake.Interfaces() {
		byInst[f.Instance] = append(byInst[f.Instance], f)
	}
	for _, n := range nodes {
		res.Floor += (n.peak + cloud.IPv4PrefixSize - 1) / cloud.IPv4PrefixSize
		if n.dead {
			res.Floor++ // its spare /28, before it ended
			continue
		}
		for _, f := range byInst[n.inst] {
			if f.ID == n.unmanaged {
				continue
			}
			if f.Device > 0 {
				res.Created++ // one create (with its prefixes)
				res.Floor++
			} else if len(f.Prefixes) > 0 {
				res.Floor++
			}
		}
	}
	res.Calls = map[string]int{}
	for _, a := range actions {
		if c := fake.Calls(a); c > 0 {
			res.Calls[a] = c
			res.AllCalls += c
			if !strings.HasPrefix(a, "Describe") {
				res.ChangeCalls += c
			}
		}
	}
	res.Throttled, res.LostAnswers = fake.Faults(ec2fake.FaultThrottled), fake.Faults(ec2fake.FaultLost)
	res.CallsPerThousand = 1000 * float64(res.AllCalls) / float64(res.Pods)
	res.FloorPerThousand = 1000 * float64(res.Floor) / float64(res.Pods)
	return res, nil
}

// actions are the EC2 actions the workers may call.
var actions = []string{"AssignPrivateIpAddresses", "UnassignPrivateIpAddresses", "CreateNetworkInterface", "AttachNetworkInterface",
	"ModifyNetworkInterfaceAttribute", "DetachNetworkInterface", "DeleteNetworkInterface", "DescribeInstances", "DescribeNetworkInterfaces",
	"DescribeSubnets", "DescribeInstanceTypes", "DescribeSecurityGroups", "AssignIpv6Addresses", "UnassignIpv6Addresses"}

// allocate leases an address for container on n; on success the Pod runs.
func allocate(ctx context.Context, st *store.Store, space string, n *node, container string) error {
	_, err := st.Allocate(ctx, alloc.LeaseRequest{Space: space, Node: n.name, Pool: groups[n.group].pool,
		Owner: alloc.Owner{Namespace: "sim", Name: container}, Attachment: alloc.Attachment{ContainerID: container, Interface: "eth0"}})
	if err != nil {
		return err
	}
	n.pods = append(n.pods, container)
	return nil
}

// leasableNotHeld counts the blocks of live nodes a Pod could lease
// (recorded, not drained) that no interface of the node's instance holds
// in the fake's truth.
func leasableNotHeld(ctx context.Context, st *store.Store, fake *ec2fake.Server, space string, live []*node) (int, error) {
	held := map[string]map[netip.Prefix]bool{}
	for _, f := range fake.Interfaces() {
		if f.Instance == "" || f.Status == "detaching" {
			continue
		}
		h := held[f.Instance]
		if h == nil {
			h = map[netip.Prefix]bool{}
			held[f.Instance] = h
		}
		for _, a := range f.Addresses {
			h[netip.PrefixFrom(a, 32)] = true
		}
		for _, p := range f.Prefixes {
			h[p] = true
		}
	}
	byName := map[string]*node{}
	for _, n := range live {
		byName[n.name] = n
	}
	bad := 0
	for _, g := range groups {
		cn, err := st.CloudNodes(ctx, space, g.pool)
		if err != nil {
			return 0, err
		}
		for _, c := range cn {
			n := byName[c.Name]
			if n == nil {
				continue
			}
			for _, b := range c.Blocks {
				if !b.Drained && !held[n.inst][b.Prefix] {
					bad++
				}
			}
		}
	}
	return bad, nil
}
