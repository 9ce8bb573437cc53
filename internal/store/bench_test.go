// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
)

// BenchmarkAllocateRelease measures one allocation plus one release through
// the store, without HTTP, spread over 50 nodes. Where PostgreSQL runs on
// this machine it also reports the server's CPU time per pair
// (pg-cpu-µs/op, see serverCPU).
func BenchmarkAllocateRelease(b *testing.B) { benchmarkAllocateRelease(b, true) }

// BenchmarkAllocateReleaseNoHistory is BenchmarkAllocateRelease with the
// history's triggers on leases and blocks disabled: the difference between
// the two is what recording the address history costs.
func BenchmarkAllocateReleaseNoHistory(b *testing.B) { benchmarkAllocateRelease(b, false) }

func benchmarkAllocateRelease(b *testing.B, history bool) {
	f := &fixture{ctx: b.Context(), conn: pgtest.NewDatabase(b), clock: newClock()}
	if !history {
		disableHistory(b, f.conn)
	}
	f.opts = DefaultOptions()
	f.opts.Cooldown = 0
	s, err := Open(f.ctx, f.conn, f.opts)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.CreatePool(f.ctx, alloc.Pool{Space: "default", Name: "default", Spec: alloc.PoolSpec{IPv4: fam(24, "10.0.0.0/16"), NodeLocal: alloc.DefaultNodeLocal}}); err != nil {
		b.Fatal(err)
	}
	cpu, err := serverCPUOf(f.ctx, s.db)
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	mark := cpu.start()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			r := req(fmt.Sprintf("node-%d", i%50), fmt.Sprint("c", i))
			if _, err := s.Allocate(f.ctx, r); err != nil {
				b.Fatal(err)
			}
			if _, err := s.ReleaseAttachment(f.ctx, "default", r.Node, r.Attachment); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.StopTimer()
	mark.report(b)
}

// disableHistory turns off the triggers that record lease and block
// changes in the database conn names.
func disableHistory(b *testing.B, conn string) {
	c, err := pgx.Connect(b.Context(), conn)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(b.Context())
	for _, q := range []string{
		`ALTER TABLE leases DISABLE TRIGGER address_events_lease_insert,
			DISABLE TRIGGER address_events_lease_update, DISABLE TRIGGER address_events_lease_delete`,
		`ALTER TABLE blocks DISABLE TRIGGER address_events_block`,
	} {
		if _, err := c.Exec(b.Context(), q); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCarveBlock: carving costs the same whether the pool CIDR already
// holds 0 or thousands of blocks (the carve cursor), so the time per carve
// after 4,000 blocks is the figure to compare with the first ones.
func BenchmarkCarveBlock(b *testing.B) {
	ctx := b.Context()
	s, err := Open(ctx, pgtest.NewDatabase(b), DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.CreatePool(ctx, alloc.Pool{Space: "default", Name: "default", Spec: alloc.PoolSpec{IPv4: fam(28, "10.0.0.0/8"), NodeLocal: alloc.DefaultNodeLocal}}); err != nil {
		b.Fatal(err)
	}
	if _, _, err := s.PutNode(ctx, alloc.Node{Space: "default", Name: "n"}); err != nil {
		b.Fatal(err)
	}
	for _, pre := range []int{0, 4000} {
		b.Run(fmt.Sprintf("after-%d", pre), func(b *testing.B) {
			for range pre {
				if _, err := s.CarveBlock(ctx, "default", "n", "default", alloc.IPv4); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				if _, err := s.CarveBlock(ctx, "default", "n", "default", alloc.IPv4); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
