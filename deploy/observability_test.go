// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The alert rules are valid Prometheus rules and behave as their unit
// tests say (promtool, from Debian's prometheus package: `make test`
// unpacks it into .tools/bin when missing; a missing promtool fails the
// test, it never skips it).
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		// Where scripts/ensure-promtool.sh (make tools) unpacks it.
		if promtool, err = filepath.Abs("../.tools/bin/promtool"); err == nil {
			_, err = os.Stat(promtool)
		}
	}
	if err != nil {
		t.Fatalf("promtool is neither on PATH nor in .tools/bin (run scripts/ensure-promtool.sh, or make tools): %v", err)
	}
	for _, args := range [][]string{
		{"check", "rules", "alerts.yaml"},
		{"test", "rules", "alerts_test.yaml"},
	} {
		cmd := exec.CommandContext(t.Context(), promtool, args...)
		cmd.Dir = "observability"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// The dashboard is valid Grafana JSON: panels with PromQL targets on the
// dashboard's datasource variable. (cmd/server's
// TestOperationsKitUsesExportedMetrics checks that the metrics exist.)
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("observability/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Title  string `json:"title"`
		Panels []struct {
			ID         int    `json:"id"`
			Title      string `json:"title"`
			Type       string `json:"type"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name, Type string
			} `json:"list"`
		} `json:"templating"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard uid %q title %q with %d panels", d.UID, d.Title, len(d.Panels))
	}
	if len(d.Templating.List) == 0 || d.Templating.List[0].Name != "datasource" || d.Templating.List[0].Type != "datasource" {
		t.Errorf("the dashboard has no datasource variable: %+v", d.Templating.List)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %q, %d targets", p.Title, p.Datasource.UID, len(p.Targets))
		}
		for _, tg := range p.Targets {
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") || !strings.Contains(tg.Expr, "_") {
				t.Errorf("panel %q: expression %q", p.Title, tg.Expr)
			}
		}
	}
}
