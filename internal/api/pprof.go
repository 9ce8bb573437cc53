// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"net/http"
	"net/http/pprof"
	"strings"
)

// pprofRoute is where Options.Pprof serves the Go profiler.
const pprofRoute = "/debug/pprof/*"

// pprofHandler serves net/http/pprof's pages without touching
// http.DefaultServeMux (importing net/http/pprof registers there, but the
// server never serves the default mux).
func pprofHandler(w http.ResponseWriter, r *http.Request) {
	switch strings.TrimPrefix(r.URL.Path, "/debug/pprof/") {
	case "cmdline":
		pprof.Cmdline(w, r)
	case "profile":
		pprof.Profile(w, r)
	case "symbol":
		pprof.Symbol(w, r)
	case "trace":
		pprof.Trace(w, r)
	default: // the index, and heap, goroutine, allocs, block, mutex, threadcreate by name
		pprof.Index(w, r)
	}
}
