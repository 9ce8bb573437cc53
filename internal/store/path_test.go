// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// stackTracer records, at every statement the store sends (otelpgx starts a
// span there), the files of this module on the call stack, outermost first,
// each run of frames in one file collapsed into one.
type stackTracer struct {
	noop.Tracer
	mu     sync.Mutex
	stacks [][]string
}

func (s *stackTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	pcs := make([]uintptr, 256)
	n := runtime.Callers(2, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	var files []string
	for {
		f, more := frames.Next()
		if strings.Contains(f.Function, "ipam-dev/ipam/internal/store.") && !strings.HasSuffix(f.File, "_test.go") {
			file := filepath.Base(f.File)
			if len(files) == 0 || files[len(files)-1] != file {
				files = append(files, file)
			}
		}
		if !more {
			break
		}
	}
	for i, j := 0, len(files)-1; i < j; i, j = i+1, j-1 {
		files[i], files[j] = files[j], files[i]
	}
	s.mu.Lock()
	s.stacks = append(s.stacks, files)
	s.mu.Unlock()
	return trace.ContextWithSpan(ctx, recordingSpan{}), recordingSpan{}
}

// recordingSpan makes otelpgx trace the statements under it (it skips
// those without a recording span).
type recordingSpan struct{ noop.Span }

func (recordingSpan) IsRecording() bool { return true }

type stackTracerProvider struct {
	noop.TracerProvider
	t *stackTracer
}

func (p stackTracerProvider) Tracer(string, ...trace.TracerOption) trace.Tracer { return p.t }

// TestAllocationPathGoesOnlyDown walks allocations down to their SQL (the
// fast path, the general path that carves, a workload identity, a retry, a
// reserve handover), with and without write batching, and checks that no
// statement is sent from a call stack that comes back to a file of the
// store it left: the path from Allocate to the database only goes down.
func TestAllocationPathGoesOnlyDown(t *testing.T) {
	t.Parallel()
	for _, writers := range []int{-1, 2} {
		t.Run(fmt.Sprintf("batch-writers=%d", writers), func(t *testing.T) {
			t.Parallel()
			st := &stackTracer{}
			f := newFixture(t, func(o *Options) {
				o.BatchWriters = writers
				o.TracerProvider = stackTracerProvider{t: st}
			})
			f.pool("default", alloc.PoolSpec{IPv4: fam(28, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
			ctx := trace.ContextWithSpan(f.ctx, recordingSpan{})
			allocate := func(r alloc.LeaseRequest) alloc.Allocation {
				a, err := f.s.Allocate(ctx, r)
				if err != nil {
					t.Fatalf("allocate %s: %v", r.Attachment.ContainerID, err)
				}
				return a
			}
			for i := range 20 { // 14 leasable per /28: the general path carves
				allocate(req("n1", fmt.Sprint("c", i)))
			}
			allocate(req("n1", "c0")) // a retry
			sticky := req("n1", "s1")
			sticky.Sticky = &alloc.StickyRequest{Identity: "statefulset/default/web/0"}
			allocate(sticky)
			reserve := req("n1", "reserve")
			reserve.Expire = false
			held := allocate(reserve)
			from := req("n1", "pod")
			from.FromReserve = &alloc.ReserveHandover{ContainerID: "reserve", Interface: "eth0", Generation: held.Generation}
			allocate(from)

			st.mu.Lock()
			defer st.mu.Unlock()
			var checked int
			for _, files := range st.stacks {
				if len(files) == 0 || files[0] != "allocate.go" {
					continue // the batcher's own goroutine, or not an allocation
				}
				checked++
				seen := map[string]bool{}
				for _, file := range files {
					if seen[file] {
						t.Fatalf("a statement was sent from %s: it comes back to %s", strings.Join(files, " -> "), file)
					}
					seen[file] = true
				}
			}
			if checked < 20 {
				t.Fatalf("only %d statements seen from Allocate", checked)
			}
		})
	}
}
