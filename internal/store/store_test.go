// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/testclock"
	"github.com/ipam-dev/ipam/migrations"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Migrate)
}

// newClock returns the fixtures' clock, at a fixed start.
func newClock() *testclock.Clock {
	return testclock.New(time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC))
}

type fixture struct {
	t     *testing.T
	ctx   context.Context
	conn  string
	clock *testclock.Clock
	opts  Options
	s     *Store
}

// allocResult is the outcome of an allocation run in the background.
type allocResult struct {
	a   alloc.Allocation
	err error
}

// allocateAsync runs Allocate(r) in a goroutine; its result arrives on the
// channel, so a test can check that it waits for a lock another holds.
func (f *fixture) allocateAsync(r alloc.LeaseRequest) <-chan allocResult {
	done := make(chan allocResult, 1)
	go func() {
		a, err := f.s.Allocate(f.ctx, r)
		done <- allocResult{a, err}
	}()
	return done
}

// otherTx begins a transaction on a connection of its own, as another
// server's would be; it is rolled back and closed when the test ends.
func (f *fixture) otherTx(t *testing.T) pgx.Tx {
	t.Helper()
	other, err := pgx.Connect(f.ctx, f.conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close(f.ctx) })
	tx, err := other.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(f.ctx) })
	return tx
}

func newFixture(t *testing.T, tweak func(*Options)) *fixture {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), conn: pgtest.NewDatabase(t), clock: newClock()}
	f.opts = DefaultOptions()
	f.opts.Now = f.clock.Now
	if tweak != nil {
		tweak(&f.opts)
	}
	f.reopen()
	return f
}

// reopen closes the store and opens a new one on the same database, as a
// restart of the server does.
func (f *fixture) reopen() {
	f.t.Helper()
	if f.s != nil {
		f.s.Close()
	}
	s, err := Open(f.ctx, f.conn, f.opts)
	if err != nil {
		f.t.Fatal(err)
	}
	f.s = s
	f.t.Cleanup(s.Close)
}

func (f *fixture) pool(name string, spec alloc.PoolSpec) alloc.Pool {
	f.t.Helper()
	p, err := f.s.CreatePool(f.ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: name, Spec: spec})
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

func fam(mask int, cidrs ...string) *alloc.PoolFamily {
	pf := &alloc.PoolFamily{MaskSize: mask}
	for _, c := range cidrs {
		pf.CIDRs = append(pf.CIDRs, netip.MustParsePrefix(c))
	}
	return pf
}

func req(node, container string, families ...alloc.Family) alloc.LeaseRequest {
	return alloc.LeaseRequest{
		Space: alloc.DefaultSpace, Node: node,
		Owner:      alloc.Owner{Namespace: "default", Name: "pod-" + container, UID: "uid-" + container},
		Attachment: alloc.Attachment{ContainerID: container, Interface: "eth0"},
		Families:   families, Expire: true,
	}
}

func (f *fixture) allocate(r alloc.LeaseRequest) alloc.Allocation {
	f.t.Helper()
	a, err := f.s.Allocate(f.ctx, r)
	if err != nil {
		f.t.Fatalf("allocate %s/%s: %v", r.Node, r.Attachment.ContainerID, err)
	}
	return a
}

func (f *fixture) count(sql string, args ...any) int64 {
	f.t.Helper()
	var n int64
	if err := f.s.db.QueryRow(f.ctx, sql, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

func wantKind(t *testing.T, err error, k alloc.Kind) *alloc.Error {
	t.Helper()
	var e *alloc.Error
	if !errors.As(err, &e) || e.Kind != k {
		t.Fatalf("got error %v, want kind %s", err, k)
	}
	return e
}

var lab1Spec = alloc.PoolSpec{IPv4: fam(28, "10.244.0.0/28"), NodeLocal: alloc.NodeLocal{Router: true, Health: true, Ingress: true}}

// Lab 1 of the seeds: a /28 with router, health and ingress reserved gives
// exactly 11 leases; the 12th answers pool-exhausted naming pool and family
// when the pool has no room for another block.
func TestLab1ElevenLeasesThenExhausted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", lab1Spec)
	seen := map[netip.Addr]bool{}
	for i := range 11 {
		a := f.allocate(req("node-a", fmt.Sprint("c", i)))
		l := a.Leases[0]
		if seen[l.Addr] {
			t.Fatalf("address %s leased twice", l.Addr)
		}
		seen[l.Addr] = true
		if l.Gateway.String() != "10.244.0.1" || l.Prefix().Bits() != 28 {
			t.Fatalf("lease %+v: want gateway 10.244.0.1 and /28", l)
		}
	}
	for _, never := range []string{"10.244.0.0", "10.244.0.1", "10.244.0.2", "10.244.0.3", "10.244.0.15"} {
		if seen[netip.MustParseAddr(never)] {
			t.Fatalf("reserved address %s was leased", never)
		}
	}
	_, err := f.s.Allocate(f.ctx, req("node-a", "c11"))
	e := wantKind(t, err, alloc.KindPoolExhausted)
	if e.Pool != "default" || e.Family != alloc.IPv4 {
		t.Fatalf("exhaustion names pool %q family %s", e.Pool, e.Family)
	}
	if n := f.count(`SELECT count(*) FROM leases`); n != 11 {
		t.Fatalf("%d lease rows after the failed 12th, want 11", n)
	}
}

// A node whose blocks are full gets a new block, the first free aligned one;
// other nodes get their own blocks.
func TestCarvesBlocksPerNodeInOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.244.0.0/26"), NodeLocal: alloc.DefaultNodeLocal})
	for i := range 13 { // 12 fit in a /28 with router+health; the 13th carves
		f.allocate(req("node-a", fmt.Sprint("a", i)))
	}
	b := f.allocate(req("node-b", "b0"))
	blocksA, err := f.s.ListBlocks(f.ctx, alloc.DefaultSpace, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(blocksA) != 2 || blocksA[0].Layout.Prefix.String() != "10.244.0.0/28" || blocksA[1].Layout.Prefix.String() != "10.244.0.16/28" {
		t.Fatalf("node-a blocks %+v", blocksA)
	}
	if blocksA[0].Leased != 12 || blocksA[1].Leased != 1 {
		t.Fatalf("leased per block %d %d", blocksA[0].Leased, blocksA[1].Leased)
	}
	if got := b.Leases[0].Block.String(); got != "10.244.0.32/28" {
		t.Fatalf("node-b block %s", got)
	}
	// Releasing node-b's only lease and its block makes that block the
	// first free again.
	if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "node-b", b.Attachment); err != nil {
		t.Fatal(err)
	}
	err = f.s.ReleaseBlock(f.ctx, alloc.DefaultSpace, "node-b", b.Leases[0].Block)
	wantKind(t, err, alloc.KindInUse) // still cooling
	f.clock.Advance(31 * time.Second)
	if err := f.s.ReleaseBlock(f.ctx, alloc.DefaultSpace, "node-b", b.Leases[0].Block); err != nil {
		t.Fatal(err)
	}
	c, err := f.s.CarveBlock(f.ctx, alloc.DefaultSpace, "node-a", "default", alloc.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if c.Layout.Prefix.String() != "10.244.0.32/28" {
		t.Fatalf("carved %s, want the freed 10.244.0.32/28", c.Layout.Prefix)
	}
}

// Pending leases are released after the expiry unless confirmed, and this
// state lives in the database: it survives a restart.
func TestPendingLeaseExpiry(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", lab1Spec)
	pending := f.allocate(req("node-a", "pending"))
	confirmed := f.allocate(req("node-a", "confirmed"))
	noExpire := req("node-a", "no-expire")
	noExpire.Expire = false
	if a := f.allocate(noExpire); a.State != alloc.StateActive || !a.ExpiresAt.IsZero() {
		t.Fatalf("expire=false lease %+v", a)
	}
	if pending.State != alloc.StatePending || !pending.ExpiresAt.Equal(f.clock.Now().Add(10*time.Minute)) {
		t.Fatalf("pending lease %+v", pending)
	}
	if c, err := f.s.Confirm(f.ctx, alloc.DefaultSpace, "node-a", confirmed.Attachment); err != nil || c.State != alloc.StateActive {
		t.Fatalf("confirm: %+v %v", c, err)
	}

	f.reopen() // a restart loses nothing
	f.clock.Advance(9*time.Minute + 59*time.Second)
	if n, err := f.s.ExpirePending(f.ctx); err != nil || n != 0 {
		t.Fatalf("expired %d before the deadline (%v)", n, err)
	}
	f.clock.Advance(time.Second)
	if n, err := f.s.ExpirePending(f.ctx); err != nil || n != 1 {
		t.Fatalf("expired %d at the deadline, want 1 (%v)", n, err)
	}
	l, err := f.s.GetAddress(f.ctx, alloc.DefaultSpace, pending.Leases[0].Addr)
	if err != nil || l.State != alloc.StateCooling {
		t.Fatalf("expired lease: %+v %v", l, err)
	}
	if _, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", pending.Attachment); !alloc.IsKind(err, alloc.KindNotFound) {
		t.Fatalf("expired attachment still held: %v", err)
	}
	for _, a := range []alloc.Attachment{confirmed.Attachment, noExpire.Attachment} {
		if _, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", a); err != nil {
			t.Fatalf("%v lost: %v", a, err)
		}
	}
}

// A released address is not leased again before its cooldown ends, even
// when it is the only address left; the cooldown survives a restart.
func TestCooldown(t *testing.T) {
	t.Parallel()
	for _, cooldown := range []time.Duration{30 * time.Second, 0} {
		t.Run(cooldown.String(), func(t *testing.T) {
			f := newFixture(t, func(o *Options) { o.Cooldown = cooldown })
			f.pool("default", lab1Spec)
			var last alloc.Allocation
			for i := range 11 {
				last = f.allocate(req("node-a", fmt.Sprint("c", i)))
			}
			released, err := f.s.ReleaseAddress(f.ctx, alloc.DefaultSpace, last.Leases[0].Addr)
			if err != nil || len(released) != 1 || !released[0].CooldownUntil.Equal(f.clock.Now().Add(cooldown)) {
				t.Fatalf("release: %+v %v", released, err)
			}
			if cooldown > 0 {
				f.reopen()
				f.clock.Advance(cooldown - time.Second)
				_, err = f.s.Allocate(f.ctx, req("node-a", "new"))
				wantKind(t, err, alloc.KindPoolExhausted)
				f.clock.Advance(time.Second)
			}
			again := f.allocate(req("node-a", "new"))
			if again.Leases[0].Addr != last.Leases[0].Addr {
				t.Fatalf("got %s, want the cooled %s", again.Leases[0].Addr, last.Leases[0].Addr)
			}
		})
	}
}

// Cooled rows are purged and their block counts come back; expired
// cooldowns are not listed as cooling.
func TestPurgeCooled(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", lab1Spec)
	a := f.allocate(req("node-a", "c0"))
	if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "node-a", a.Attachment); err != nil {
		t.Fatal(err)
	}
	if n, _ := f.s.PurgeCooled(f.ctx); n != 0 {
		t.Fatalf("purged %d during cooldown", n)
	}
	p, _ := f.s.GetPool(f.ctx, alloc.DefaultSpace, "default")
	if st := p.Status[alloc.IPv4]; st.Cooling != 1 || st.Leased != 0 || st.Free() != 10 {
		t.Fatalf("status during cooldown %+v", st)
	}
	f.clock.Advance(30 * time.Second)
	if n, err := f.s.PurgeCooled(f.ctx); err != nil || n != 1 {
		t.Fatalf("purged %d (%v)", n, err)
	}
	if n := f.count(`SELECT allocated FROM blocks`); n != 0 {
		t.Fatalf("block count %d after purge", n)
	}
	p, _ = f.s.GetPool(f.ctx, alloc.DefaultSpace, "default")
	if st := p.Status[alloc.IPv4]; st.Cooling != 0 || st.Free() != 11 {
		t.Fatalf("status after purge %+v", st)
	}
}

// Allocation is idempotent by (node, containerID, interface): a retry gets
// the same addresses; another owner gets a lease-conflict; release is
// idempotent too.
func TestIdempotentAllocateAndRelease(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.244.0.0/16"), IPv6: fam(112, "fd00:10:244::/96"), NodeLocal: alloc.DefaultNodeLocal})
	r := req("node-a", "c0")
	first := f.allocate(r)
	if !first.Created || len(first.Leases) != 2 {
		t.Fatalf("first %+v", first)
	}
	f.clock.Advance(time.Second)
	retry := f.allocate(r)
	if retry.Created || retry.Leases[0].Addr != first.Leases[0].Addr || retry.Leases[1].Addr != first.Leases[1].Addr ||
		!retry.ExpiresAt.Equal(first.ExpiresAt) {
		t.Fatalf("retry %+v differs from first %+v", retry, first)
	}
	other := r
	other.Owner.Name = "someone-else"
	_, err := f.s.Allocate(f.ctx, other)
	if e := wantKind(t, err, alloc.KindLeaseConflict); e.Field != "owner" {
		t.Fatalf("field %q", e.Field)
	}
	v4only := r
	v4only.Families = []alloc.Family{alloc.IPv4}
	_, err = f.s.Allocate(f.ctx, v4only)
	wantKind(t, err, alloc.KindLeaseConflict)

	// Concurrent retries of one new attachment: one address per family.
	var wg sync.WaitGroup
	results := make([]alloc.Allocation, 16)
	errs := make([]error, 16)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = f.s.Allocate(f.ctx, req("node-b", "racer"))
		}()
	}
	wg.Wait()
	created := 0
	for i := range results {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if results[i].Created {
			created++
		}
		if results[i].Leases[0].Addr != results[0].Leases[0].Addr {
			t.Fatalf("racing retries got different addresses")
		}
	}
	if created != 1 {
		t.Fatalf("%d of the racing requests created leases, want 1", created)
	}

	for range 2 {
		rel, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "node-a", r.Attachment)
		if err != nil {
			t.Fatal(err)
		}
		_ = rel
	}
	if n := f.count(`SELECT count(*) FROM leases WHERE state = 'released'`); n != 2 {
		t.Fatalf("%d released rows, want 2", n)
	}
	// Releasing what was never held succeeds.
	if rel, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "no-such-node", r.Attachment); err != nil || len(rel) != 0 {
		t.Fatalf("release of nothing: %v %v", rel, err)
	}
	if rel, err := f.s.ReleaseAddress(f.ctx, alloc.DefaultSpace, netip.MustParseAddr("192.0.2.1")); err != nil || len(rel) != 0 {
		t.Fatalf("release of a free address: %v %v", rel, err)
	}
}

// A dual-stack request gets both families in one transaction, or neither:
// when IPv6 is exhausted, no IPv4 lease (and no IPv4 block) is left behind.
func TestDualStackAllOrNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{
		IPv4:      fam(24, "10.244.0.0/16"),
		IPv6:      fam(124, "fd00:10:244::/124"), // one block of 16, 12 leasable
		NodeLocal: alloc.DefaultNodeLocal,
	})
	for i := range 12 {
		f.allocate(req("node-a", fmt.Sprint("v6-", i), alloc.IPv6))
	}
	before := f.count(`SELECT count(*) FROM leases`)
	_, err := f.s.Allocate(f.ctx, req("node-b", "dual", alloc.IPv4, alloc.IPv6))
	if e := wantKind(t, err, alloc.KindPoolExhausted); e.Family != alloc.IPv6 {
		t.Fatalf("exhausted family %s", e.Family)
	}
	if n := f.count(`SELECT count(*) FROM leases`); n != before {
		t.Fatalf("lease rows %d -> %d: a half allocation was kept", before, n)
	}
	if n := f.count(`SELECT count(*) FROM blocks WHERE family = 4`); n != 0 {
		t.Fatalf("%d IPv4 blocks carved by a failed dual-stack request", n)
	}
	// Both succeed together once there is room.
	if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "node-a", alloc.Attachment{ContainerID: "v6-0", Interface: "eth0"}); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(30 * time.Second)
	// node-a owns the only IPv6 block, so node-a gets the dual-stack pair.
	if a := f.allocate(req("node-a", "dual", alloc.IPv4, alloc.IPv6)); len(a.Leases) != 2 {
		t.Fatalf("dual-stack %+v", a)
	}
}

// Reconcile releases every lease of the node not held by a valid
// attachment, leaves other nodes alone, and keeps leases made after the call
// started.
func TestReconcile(t *testing.T) {
	t.Parallel()
	// The minimum age is tested through the API (fence_test.go); here the
	// list alone decides.
	f := newFixture(t, func(o *Options) { o.ReconcileMinAge = 0 })
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	for _, c := range []string{"keep", "gone-1", "gone-2"} {
		f.allocate(req("node-a", c))
	}
	f.allocate(req("node-b", "gone-1"))
	keepOther := req("node-a", "keep")
	keepOther.Attachment.Interface = "net1" // same container, other interface: not valid
	f.allocate(keepOther)

	released, err := f.s.Reconcile(f.ctx, alloc.DefaultSpace, "node-a", "", []alloc.Attachment{{ContainerID: "keep", Interface: "eth0"}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, l := range released {
		got[l.Attachment.ContainerID+"/"+l.Attachment.Interface] = true
		if l.State != alloc.StateCooling || l.Node != "node-a" {
			t.Fatalf("released %+v", l)
		}
	}
	if len(got) != 3 || !got["gone-1/eth0"] || !got["gone-2/eth0"] || !got["keep/net1"] {
		t.Fatalf("released %v", got)
	}
	if _, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-b", alloc.Attachment{ContainerID: "gone-1", Interface: "eth0"}); err != nil {
		t.Fatalf("other node's lease touched: %v", err)
	}
	if _, err := f.s.GetAttachment(f.ctx, alloc.DefaultSpace, "node-a", alloc.Attachment{ContainerID: "keep", Interface: "eth0"}); err != nil {
		t.Fatalf("valid attachment released: %v", err)
	}
	// Reconciling again releases nothing more.
	if again, err := f.s.Reconcile(f.ctx, alloc.DefaultSpace, "node-a", "", []alloc.Attachment{{ContainerID: "keep", Interface: "eth0"}}); err != nil || len(again) != 0 {
		t.Fatalf("second reconcile %v %v", again, err)
	}
	// A lease made "after" the reconcile started is kept.
	f.clock.Advance(time.Second)
	f.allocate(req("node-a", "late"))
	f.clock.Advance(-time.Second)
	if again, err := f.s.Reconcile(f.ctx, alloc.DefaultSpace, "node-a", "", nil); err != nil || len(again) != 1 {
		t.Fatalf("reconcile racing an ADD released %d (%v), want only keep/eth0", len(again), err)
	}
}

// A node with leases is not deleted unless forced; forced deletion releases
// its leases and blocks.
func TestDeleteNode(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", lab1Spec)
	f.allocate(req("node-a", "c0"))
	wantKind(t, f.s.DeleteNode(f.ctx, alloc.DefaultSpace, "node-a", false), alloc.KindInUse)
	if err := f.s.DeleteNode(f.ctx, alloc.DefaultSpace, "node-a", true); err != nil {
		t.Fatal(err)
	}
	if n := f.count(`SELECT count(*) FROM blocks`) + f.count(`SELECT count(*) FROM leases`); n != 0 {
		t.Fatalf("%d rows left", n)
	}
	wantKind(t, f.s.DeleteNode(f.ctx, alloc.DefaultSpace, "node-a", false), alloc.KindNotFound)
	// Its block is free for the next node.
	if a := f.allocate(req("node-b", "c0")); a.Leases[0].Block.String() != "10.244.0.0/28" {
		t.Fatalf("block %s", a.Leases[0].Block)
	}
}

// Auto-registration can be turned off: an unknown node is then not found.
func TestAutoRegisterOff(t *testing.T) {
	t.Parallel()
	f := newFixture(t, func(o *Options) { o.AutoRegisterNodes = false })
	f.pool("default", lab1Spec)
	_, err := f.s.Allocate(f.ctx, req("node-a", "c0"))
	if e := wantKind(t, err, alloc.KindNotFound); e.Field != "node" {
		t.Fatalf("field %q", e.Field)
	}
	if _, _, err := f.s.PutNode(f.ctx, alloc.Node{Space: alloc.DefaultSpace, Name: "node-a"}); err != nil {
		t.Fatal(err)
	}
	f.allocate(req("node-a", "c0"))
}

// Address spaces isolate names and ranges: two spaces reuse one CIDR, and a
// lease in one is invisible in the other.
func TestAddressSpaces(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	if _, err := f.s.CreateSpace(f.ctx, "cluster-b"); err != nil {
		t.Fatal(err)
	}
	spec := alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/8"), NodeLocal: alloc.DefaultNodeLocal}
	f.pool("default", spec)
	if _, err := f.s.CreatePool(f.ctx, alloc.Pool{Space: "cluster-b", Name: "default", Spec: spec}); err != nil {
		t.Fatal(err)
	}
	a := f.allocate(req("node-a", "c0"))
	rb := req("node-a", "c0")
	rb.Space = "cluster-b"
	b := f.allocate(rb)
	if a.Leases[0].Addr != b.Leases[0].Addr {
		t.Fatalf("spaces should allocate independently: %s vs %s", a.Leases[0].Addr, b.Leases[0].Addr)
	}
	_, err := f.s.CreatePool(f.ctx, alloc.Pool{Space: "default", Name: "other", Spec: alloc.PoolSpec{IPv4: fam(24, "10.1.0.0/16")}})
	if e := wantKind(t, err, alloc.KindOverlap); e.Field != "spec.ipv4.cidrs[0]" {
		t.Fatalf("field %q", e.Field)
	}
	wantKind(t, f.s.DeleteSpace(f.ctx, "cluster-b"), alloc.KindInUse)
	rb.Space = "nope"
	_, err = f.s.Allocate(f.ctx, rb)
	if e := wantKind(t, err, alloc.KindNotFound); e.Field != "space" {
		t.Fatalf("field %q", e.Field)
	}
}

// Pool updates: CIDRs can be added; mask and reservations are immutable;
// a CIDR with blocks cannot be removed; a pool with blocks cannot be deleted.
func TestUpdateAndDeletePool(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	p := f.pool("default", lab1Spec)
	f.allocate(req("node-a", "c0"))
	spec := p.Spec
	spec.IPv4 = fam(28, "10.244.0.0/28", "10.245.0.0/24")
	got, err := f.s.UpdatePool(f.ctx, alloc.DefaultSpace, "default", map[string]string{"team": "net"}, spec)
	if err != nil || len(got.Spec.IPv4.CIDRs) != 2 || got.Status[alloc.IPv4].BlocksPossible != 17 || got.Labels["team"] != "net" {
		t.Fatalf("update: %+v %v", got, err)
	}
	spec.IPv4 = fam(29, "10.244.0.0/28")
	_, err = f.s.UpdatePool(f.ctx, alloc.DefaultSpace, "default", nil, spec)
	wantKind(t, err, alloc.KindImmutable)
	spec.IPv4 = fam(28, "10.245.0.0/24")
	_, err = f.s.UpdatePool(f.ctx, alloc.DefaultSpace, "default", nil, spec)
	wantKind(t, err, alloc.KindInUse)
	_, err = f.s.DeletePool(f.ctx, alloc.DefaultSpace, "default")
	wantKind(t, err, alloc.KindInUse)
	// The 12th lease now carves from the added CIDR instead of failing.
	for i := 1; i < 12; i++ {
		f.allocate(req("node-a", fmt.Sprint("c", i)))
	}
	if n := f.count(`SELECT count(*) FROM blocks WHERE cidr <<= '10.245.0.0/24'`); n != 1 {
		t.Fatalf("%d blocks in the added CIDR", n)
	}
}

// List leases with filters and keyset pagination.
func TestListLeases(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	for i := range 7 {
		f.allocate(req("node-a", fmt.Sprint("a", i)))
	}
	for i := range 3 {
		f.allocate(req("node-b", fmt.Sprint("b", i)))
	}
	var all []alloc.Lease
	tok := ""
	pages := 0
	for {
		items, next, err := f.s.ListLeases(f.ctx, alloc.LeaseFilter{Space: alloc.DefaultSpace, Node: "node-a"}, alloc.Page{Limit: 3, Continue: tok})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, items...)
		pages++
		if next == "" {
			break
		}
		tok = next
	}
	if len(all) != 7 || pages != 3 {
		t.Fatalf("%d leases in %d pages", len(all), pages)
	}
	for i := 1; i < len(all); i++ {
		if !all[i-1].Addr.Less(all[i].Addr) {
			t.Fatalf("not ordered by address")
		}
	}
	if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "node-b", alloc.Attachment{ContainerID: "b0", Interface: "eth0"}); err != nil {
		t.Fatal(err)
	}
	cooling, _, err := f.s.ListLeases(f.ctx, alloc.LeaseFilter{Space: alloc.DefaultSpace, State: alloc.StateCooling}, alloc.Page{Limit: 100})
	if err != nil || len(cooling) != 1 || cooling[0].Node != "node-b" {
		t.Fatalf("cooling: %+v %v", cooling, err)
	}
	owned, _, err := f.s.ListLeases(f.ctx, alloc.LeaseFilter{Space: alloc.DefaultSpace, OwnerNamespace: "default", OwnerName: "pod-a3"}, alloc.Page{Limit: 100})
	if err != nil || len(owned) != 1 || owned[0].Attachment.ContainerID != "a3" {
		t.Fatalf("by owner: %+v %v", owned, err)
	}
}

// Allocations racing forced deletions of their node never fail with an
// internal error: each either leases from the node (registered again if
// needed) or is refused by the deletion's transaction order, never both.
func TestAllocateRacesForcedNodeDelete(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(26, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	ctx, cancel := context.WithTimeout(f.ctx, 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				if _, err := f.s.Allocate(ctx, req("node-x", fmt.Sprintf("w%d-%d", w, i))); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 20 {
			err := f.s.DeleteNode(ctx, alloc.DefaultSpace, "node-x", true)
			if err != nil && !alloc.IsKind(err, alloc.KindNotFound) {
				errc <- err
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if n := f.count(`SELECT count(*) FROM blocks b WHERE b.allocated <> (SELECT count(*) FROM leases l WHERE l.block_id = b.id)`); n != 0 {
		t.Fatalf("%d blocks with a wrong count", n)
	}
}

// A store whose database is unreachable fails with errors IsUnavailable
// recognises; a failed statement is not such an error.
func TestIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := Open(ctx, "host=127.0.0.1 port=1 user=nobody dbname=none connect_timeout=2 sslmode=disable", DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Allocate(ctx, req("node-a", "c0"))
	if err == nil || !IsUnavailable(err) {
		t.Fatalf("unreachable database: %v, IsUnavailable=false", err)
	}
	f := newFixture(t, nil)
	_, err = f.s.db.Exec(ctx, `SELECT 1/0`)
	if err == nil || IsUnavailable(err) {
		t.Fatalf("division by zero classified as unavailable: %v", err)
	}
	if IsUnavailable(nil) || IsUnavailable(errors.New("other")) {
		t.Fatal("nil or a plain error classified as unavailable")
	}
}

// The database itself refuses to lease a cooling address again before its
// cooldown ends, whatever the query that tries.
func TestDatabaseEnforcesCooldown(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("default", lab1Spec)
	a := f.allocate(req("node-a", "c0"))
	if _, err := f.s.ReleaseAttachment(f.ctx, alloc.DefaultSpace, "node-a", a.Attachment); err != nil {
		t.Fatal(err)
	}
	reuse := `UPDATE leases SET state = 'active', container_id = 'early', created_at = $2,
		released_at = NULL, cooldown_until = NULL WHERE addr = $1`
	_, err := f.s.db.Exec(f.ctx, reuse, a.Leases[0].Addr, f.clock.Now().Add(29*time.Second))
	if code, constraint := pgCode(err); code != "23514" || constraint != "leases_cooldown" {
		t.Fatalf("early reuse: %v", err)
	}
	if _, err := f.s.db.Exec(f.ctx, reuse, a.Leases[0].Addr, f.clock.Now().Add(30*time.Second)); err != nil {
		t.Fatalf("reuse after the cooldown: %v", err)
	}
}

// migrationProvider migrates the database at conn by hand, for the tests
// that step through migrations; its connection closes when t ends.
func migrationProvider(t *testing.T, conn string) *goose.Provider {
	t.Helper()
	cfg, err := parseConfig(conn)
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*cfg.ConnConfig)
	t.Cleanup(func() { db.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Every migration goes down and up again cleanly, and Migrate is a no-op on
// a current schema.
func TestMigrationsRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := pgtest.NewDatabase(t)
	p := migrationProvider(t, conn)
	if _, err := p.DownTo(ctx, 0); err != nil {
		t.Fatalf("down: %v", err)
	}
	if v, err := Migrate(ctx, conn); err != nil || v != SchemaVersion() {
		t.Fatalf("up again: version %d, %v", v, err)
	}
	if v, err := Migrate(ctx, conn); err != nil || v != SchemaVersion() {
		t.Fatalf("migrate on a current schema: version %d, %v", v, err)
	}
}

// Creating a pool again with the same labels and spec is a retry that gets
// the first answer; with another spec it is a conflict.
func TestCreatePoolIsIdempotent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	spec := alloc.PoolSpec{IPv4: fam(24, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal}
	first := f.pool("default", spec)
	f.clock.Advance(time.Minute)
	again := f.pool("default", spec)
	if !again.CreatedAt.Equal(first.CreatedAt) {
		t.Fatalf("retry answered a pool created at %s, first at %s", again.CreatedAt, first.CreatedAt)
	}
	other := spec
	other.IPv4 = fam(25, "10.244.0.0/16")
	_, err := f.s.CreatePool(f.ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: "default", Spec: other})
	if e := wantKind(t, err, alloc.KindConflict); e.Field != "name" {
		t.Fatalf("field %q", e.Field)
	}
	if n := f.count(`SELECT count(*) FROM pool_cidrs`); n != 1 {
		t.Fatalf("%d pool CIDR rows", n)
	}
}

// TestConstraintNamesExist: every constraint name the store matches in its
// error handling names a constraint (or a unique index) of the migrated
// schema, so a renamed constraint cannot silently turn a retried conflict
// into a 500.
func TestConstraintNamesExist(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	for _, name := range constraintNames {
		var n int
		if err := f.s.db.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM pg_constraint WHERE conname = $1)
			+ (SELECT count(*) FROM pg_indexes WHERE schemaname = 'public' AND indexname = $1)`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Errorf("constraint %q is not in the migrated schema", name)
		}
	}
}
