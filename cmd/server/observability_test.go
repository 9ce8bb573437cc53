// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/pgtest"
)

// metricNameRE finds the service's metric names in PromQL and prose.
var metricNameRE = regexp.MustCompile(`\b(?:ipam|process|go)_[a-z0-9_]+\b`)

// The alert rules and the Grafana dashboard in deploy/observability name
// only metrics the service exports: every name they use appears in a
// scrape after a sequence that makes every series exist (leases,
// releases, a growing pool with a forecast).
func TestOperationsKitUsesExportedMetrics(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	// With the AWS workers against the EC2 fake, so that their metrics
	// exist: a cloud pool and a node of it.
	_, cloudFlags, inst, _ := awsFake(t)
	base := startServer(t, dbURL, append([]string{"--usage-metrics-refresh", "1ms"}, cloudFlags...)...)
	mustCall(t, 201, "POST", base+"/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":28}}}`)
	mustCall(t, 201, "POST", base+"/v1/pools", `{"name":"eni","spec":{"ipv4":{"cidrs":["10.95.0.0/24"],"maskSize":28},"cloud":{"provider":"aws"}}}`)
	mustCall(t, 201, "PUT", base+"/v1/nodes/cloud-n1", `{"providerID":"aws:///eu-west-1a/`+inst+`"}`)
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(mustCall(t, 200, "GET", base+"/metrics", ""), "ipam_cloud_api_duration_seconds_count"); {
		if time.Now().After(deadline) {
			t.Fatal("no cloud call within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i := range 3 {
		mustCall(t, 201, "POST", base+"/v1/nodes/n1/leases",
			fmt.Sprintf(`{"containerID":"c%d","interface":"eth0","owner":{"namespace":"ns","name":"p%d"}}`, i, i))
	}
	mustCall(t, 204, "DELETE", base+"/v1/nodes/n1/attachments/c0/eth0", "")
	// VIP pools, one conflicting, and an owner without a pool: the
	// lbipam_* series exist.
	mustCall(t, 201, "POST", base+"/v1/lb-pools", `{"name":"vips","spec":{"blocks":[{"cidr":"192.168.5.0/24"}]}}`)
	mustCall(t, 201, "POST", base+"/v1/lb-pools", `{"name":"late","spec":{"blocks":[{"start":"192.168.5.9"}]}}`)
	mustCall(t, 200, "PUT", base+"/v1/vip-owners/ns/web", `{}`)
	mustCall(t, 200, "PUT", base+"/v1/vip-owners/ns/v6", `{"families":["ipv6"]}`)
	// A pool growing by 100 addresses every 25 minutes, so that the
	// forecast (and its gauge) exists.
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	now := time.Now()
	for i, used := range []int{0, 100, 200} {
		if _, err := conn.Exec(t.Context(), `INSERT INTO pool_usage_samples (pool_id, family, at, used, capacity)
			SELECT id, 4, $1, $2, 1000000 FROM pools WHERE name = 'default'`, now.Add(time.Duration(i-2)*25*time.Minute-time.Second), used); err != nil {
			t.Fatal(err)
		}
	}
	exposition := mustCall(t, 200, "GET", base+"/metrics", "")
	exported := map[string]bool{}
	for line := range strings.Lines(exposition) {
		if line == "" || line[0] == '#' {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		exported[name] = true
	}
	for _, want := range []string{"ipam_pool_exhaustion_forecast_hours", "ipam_release_duration_seconds_bucket", "ipam_available_ips",
		"lbipam_conflicting_pools", "lbipam_ips_available", "lbipam_ips_used", "lbipam_services_matching", "lbipam_services_unsatisfied"} {
		if !exported[want] {
			t.Fatalf("the sequence did not make %s exist; exposition:\n%s", want, exposition)
		}
	}
	for _, f := range []string{"../../deploy/observability/alerts.yaml", "../../deploy/observability/grafana-dashboard.json"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var used []string
		for _, name := range metricNameRE.FindAllString(string(b), -1) {
			if !slices.Contains(used, name) {
				used = append(used, name)
			}
		}
		if len(used) < 4 {
			t.Fatalf("%s names only %v", f, used)
		}
		for _, name := range used {
			if !exported[name] {
				t.Errorf("%s uses %s, which the service does not export", f, name)
			}
		}
		t.Logf("%s: %d metric names, all exported", f, len(used))
	}
}
