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
