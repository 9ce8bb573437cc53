package store

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
)

// BenchmarkAllocateRelease measures one allocation plus one release through
// the store, without HTTP, spread over 50 nodes.
func BenchmarkAllocateRelease(b *testing.B) {
	f := &fixture{ctx: b.Context(), conn: pgtest.NewDatabase(b), clock: newClock()}
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
	var n atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
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
}
