// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ceilingResult is what db-ceiling.sh prints: the database's own rate for a
// comparable allocate/release mix, and its p99 latency.
type ceilingResult struct {
	TPS   float64 `json:"tps"`
	P99ms float64 `json:"p99ms"`
}

// ceiling runs db-ceiling.sh against the benchmark's PostgreSQL.
type ceiling struct {
	script string
	env    []string
}

// newCeiling prepares script to run against the database of connString:
// PGHOST, PGPORT, PGUSER and PGPASSWORD come from it; with binDir (a private
// cluster), PGBIN and PATH point at the binaries of the running server.
func newCeiling(script, connString, binDir string) (*ceiling, error) {
	abs, err := filepath.Abs(script)
	if err != nil {
		return nil, err
	}
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("ceiling: database URL: %w", err)
	}
	// Drop the libpq variables that could point the script elsewhere.
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch name {
		case "PGHOST", "PGHOSTADDR", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGSERVICE", "PGBIN":
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "PGHOST="+cfg.Host, "PGPORT="+strconv.Itoa(int(cfg.Port)), "PGUSER="+cfg.User)
	if cfg.Password != "" {
		env = append(env, "PGPASSWORD="+cfg.Password)
	}
	if binDir != "" {
		env = append(env, "PGBIN="+binDir, "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	return &ceiling{script: abs, env: env}, nil
}

// run runs the script once with clients and seconds.
func (c *ceiling) run(ctx context.Context, clients, seconds int) (ceilingResult, error) {
	cmd := exec.CommandContext(ctx, c.script, strconv.Itoa(clients), strconv.Itoa(seconds))
	cmd.Env = c.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return ceilingResult{}, fmt.Errorf("%s: %w: %s", filepath.Base(c.script), err, lastLines(stderr.String()+stdout.String(), 5))
	}
	return parseCeiling(stdout.String())
}

// parseCeiling reads the script's last line of the form
// "ceiling_tps=N clients=C seconds=S p99_ms=P".
func parseCeiling(out string) (ceilingResult, error) {
	var line string
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, "ceiling_tps=") {
			line = strings.TrimSpace(l)
		}
	}
	if line == "" {
		return ceilingResult{}, fmt.Errorf("no ceiling_tps line in %q", lastLines(out, 5))
	}
	var r ceilingResult
	var errs []error
	for field := range strings.FieldsSeq(line) {
		k, v, _ := strings.Cut(field, "=")
		var dst *float64
		switch k {
		case "ceiling_tps":
			dst = &r.TPS
		case "p99_ms":
			dst = &r.P99ms
		default:
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
		}
		*dst = f
	}
	if r.TPS <= 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("ceiling_tps is not positive in %q", line))
	}
	return r, errors.Join(errs...)
}

// lastLines answers the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
