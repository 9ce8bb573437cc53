// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/telemetry"
)

// What the server spends on the lease path beyond the database: an
// allocation and its release as ipam-bench's clients send them (a node's
// certificate, a pending lease), through the whole handler with the
// server's metrics, in-process (no network, no TLS), against a real
// store. -benchmem shows the allocations, which the server's GC pays for;
// the database's own time is in the ns/op as well.
func BenchmarkLeasePath(b *testing.B) {
	st, err := store.Open(b.Context(), pgtest.NewDatabase(b), store.DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	metrics, err := telemetry.New()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = metrics.Shutdown(context.Background()) })
	h := NewHandler(StoresOf(st), Options{Logger: slog.New(slog.DiscardHandler), Meter: metrics.Meter(),
		CiliumMeter: metrics.CiliumMeter(), IsUnavailable: store.IsUnavailable, AnonymousRole: alloc.RoleAdmin,
		RateLimits: DefaultRateLimits, Admission: DefaultAdmission(16)})
	serve := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	pool := `{"name":"default","spec":{"ipv4":{"cidrs":["10.0.0.0/8"],"maskSize":26}}}`
	r := httptest.NewRequest("POST", "/v1/pools", strings.NewReader(pool))
	r.Header.Set("Content-Type", "application/json")
	if w := serve(r); w.Code != 201 {
		b.Fatalf("create pool: %d %s", w.Code, w.Body)
	}
	const nodes = 256
	certs := make([]*tls.ConnectionState, nodes)
	for i := range certs {
		certs[i] = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{{
			Subject: pkix.Name{CommonName: fmt.Sprintf("system:node:bench-%03d", i), Organization: []string{"system:nodes"}}}}}
	}
	lease := func(n int64) {
		node, cid := fmt.Sprintf("bench-%03d", n%nodes), fmt.Sprintf("c%d", n)
		body := `{"containerID":"` + cid + `","interface":"eth0","owner":{"namespace":"bench","name":"` + cid + `"},"expire":true}`
		r := httptest.NewRequest("POST", "/v1/nodes/"+node+"/leases", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.TLS = certs[n%nodes]
		if w := serve(r); w.Code != 201 {
			b.Fatalf("allocate: %d %s", w.Code, w.Body)
		}
	}
	// Every node holds a lease and a block first, as after the
	// benchmark's prefill.
	var next atomic.Int64
	for range nodes {
		lease(next.Add(1))
	}
	b.ReportAllocs()
	before := processCPU(b)
	b.ResetTimer()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := next.Add(1)
			lease(n)
			node, cid := fmt.Sprintf("bench-%03d", n%nodes), fmt.Sprintf("c%d", n)
			r := httptest.NewRequest("DELETE", "/v1/nodes/"+node+"/attachments/"+cid+"/eth0", nil)
			r.TLS = certs[n%nodes]
			if w := serve(r); w.Code != 204 {
				b.Fatalf("release: %d %s", w.Code, w.Body)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-before)/float64(b.N), "cpu-ns/op")
}

// processCPU is the CPU time this process (the handler, the store and the
// driver, but not PostgreSQL) has used so far: the figure to compare, since
// an allocation's wall time is mostly the database's commit.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
