// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseGCMetrics(t *testing.T) {
	text := `# HELP ipam_gc_expired_total Pending leases released at expiry.
# TYPE ipam_gc_expired_total counter
ipam_gc_expired_total{otel_scope_name="ipam"} 3
ipam_gc_purged_total{otel_scope_name="ipam"} 1.2e+03
ipam_gc_errors_total 0
ipam_gc_purged_totals 99
`
	if got, want := parseGCMetrics(text), (gcCounts{Expired: 3, Purged: 1200}); got != want {
		t.Fatalf("parseGCMetrics = %+v; want %+v", got, want)
	}
}

func TestServerArgs(t *testing.T) {
	o := serverOptions{databaseURL: "postgres://db", certDir: "/c", cooldown: 30 * time.Second, leaseExpiry: time.Hour,
		maxConns: 16, extra: []string{"--gc-interval", "5s"}}
	got := strings.Join(o.args("127.0.0.1:9"), " ")
	want := "serve --database-url postgres://db --listen 127.0.0.1:9 --tls-cert-file /c/server.crt --tls-key-file /c/server.key " +
		"--client-ca-file /c/ca.crt --log-level warn --cooldown 30s --lease-expiry 1h0m0s --node-rate-limit 0 --client-rate-limit 0 --max-conns 16 --gc-interval 5s"
	if got != want {
		t.Fatalf("args\n%s\nwant\n%s", got, want)
	}
}

// TestParseWriteBatches reads the batcher's counters as the server exports
// them, and the difference over a run.
func TestParseWriteBatches(t *testing.T) {
	text := `# HELP ipam_store_write_batches_total Transactions...
# TYPE ipam_store_write_batches_total counter
ipam_store_write_batches_total{otel_scope_name="ipam"} 10
ipam_store_batched_writes_total{otel_scope_name="ipam"} 45
ipam_store_unbatched_writes_total{otel_scope_name="ipam"} 7
ipam_store_batch_fallbacks_total{otel_scope_name="ipam"} 2
`
	after, err := parseWriteBatches(text)
	if err != nil {
		t.Fatal(err)
	}
	got := after.plus(writeBatches{Batches: 5, Batched: 20, Alone: 3}, -1)
	if want := (writeBatches{Batches: 5, Batched: 25, Alone: 4, Fallbacks: 2, MeanSize: 5}); got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
