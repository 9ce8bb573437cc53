package api

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// stackStore is the real store recording the call stack of its Allocate
// callers: the allocation path from the HTTP server down to the store.
type stackStore struct {
	*store.Store
	mu     sync.Mutex
	frames []runtime.Frame // outermost first
}

func (s *stackStore) Allocate(ctx context.Context, r alloc.LeaseRequest) (alloc.Allocation, error) {
	pcs := make([]uintptr, 256)
	n := runtime.Callers(2, pcs)
	var frames []runtime.Frame
	it := runtime.CallersFrames(pcs[:n])
	for {
		f, more := it.Next()
		frames = append([]runtime.Frame{f}, frames...)
		if !more {
			break
		}
	}
	s.mu.Lock()
	s.frames = frames
	s.mu.Unlock()
	return s.Store.Allocate(ctx, r)
}

// ownFiles are the files of this module's hand-written code that frames
// run in, outermost first, one entry per run of frames in the same file.
// The generated adapter (api/ipamv1) is left out: its chi wrapper calls
// the middlewares, which call its strict handler, by design.
func ownFiles(frames []runtime.Frame) []string {
	var files []string
	for _, f := range frames {
		if !strings.HasPrefix(f.Function, "github.com/ipam-dev/ipam/") ||
			strings.HasPrefix(f.Function, "github.com/ipam-dev/ipam/api/ipamv1.") ||
			strings.HasSuffix(f.File, "_test.go") {
			continue
		}
		file := filepath.Base(filepath.Dir(f.File)) + "/" + filepath.Base(f.File)
		if len(files) == 0 || files[len(files)-1] != file {
			files = append(files, file)
		}
	}
	return files
}

// A walk of one allocation, from the HTTP server to the store's Allocate,
// never comes back to a file it left: each file of the path is one run of
// frames on the stack.
func TestAllocationPathNeverReturnsToAFile(t *testing.T) {
	rec := &stackStore{}
	e := newEnv(t, func(s *store.Store) Store { rec.Store = s; return rec })
	e.mustDo(201, "POST", "/v1/pools", pool4("default", 24, "10.0.0.0/16"), nil)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "web-0"), nil)
	rec.mu.Lock()
	frames := rec.frames
	rec.mu.Unlock()
	var sawEdge, sawHandler bool
	for _, f := range frames {
		sawEdge = sawEdge || strings.HasSuffix(f.Function, "(*edge).ServeHTTP")
		sawHandler = sawHandler || strings.HasSuffix(f.Function, ").AllocateLease")
	}
	if !sawEdge || !sawHandler {
		t.Fatalf("the stack at Allocate lacks the edge or the handler: %v", ownFiles(frames))
	}
	files := ownFiles(frames)
	seen := map[string]bool{}
	for _, f := range files {
		if seen[f] {
			t.Errorf("the allocation path comes back to %s: %s", f, strings.Join(files, " -> "))
		}
		seen[f] = true
	}
}
