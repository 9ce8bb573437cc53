// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
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
	e := newEnv(t, func(s *store.Store) Stores { rec.Store = s; st := StoresOf(s); st.Leases = rec; return st })
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

// maxParams bounds the parameters of every function of this package.
const maxParams = 5

// No function or method of this package (its tests aside) takes more than
// maxParams parameters: a longer list is a struct waiting to be named.
func TestFunctionsTakeAtMostFiveParameters(t *testing.T) {
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var ft *ast.FuncType
			what := "a function literal"
			switch x := n.(type) {
			case *ast.FuncDecl:
				ft, what = x.Type, x.Name.Name
			case *ast.FuncLit:
				ft = x.Type
			default:
				return true
			}
			if c := paramCount(ft); c > maxParams {
				t.Errorf("%s: %s takes %d parameters, more than %d", fset.Position(ft.Pos()), what, c, maxParams)
			}
			return true
		})
	}
}

func paramCount(ft *ast.FuncType) int {
	c := 0
	for _, p := range ft.Params.List {
		c += max(len(p.Names), 1)
	}
	return c
}
