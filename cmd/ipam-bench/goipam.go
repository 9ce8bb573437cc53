// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The go-ipam phase runs a peer library on the same PostgreSQL: go-ipam
// (metal-stack), the Go IPAM library whose PostgreSQL storage keeps each
// prefix as a row updated under optimistic locking, in a process of its
// own (goipampeer/main.go) with the lease path's workload shape: 256
// prefixes holding 32 addresses each, clients allocating and releasing.
// The line it prints compares the mixed phase's ops/s at the same number
// of clients with go-ipam's.
const (
	goipamModule  = "github.com/metal-stack/go-ipam"
	goipamVersion = "v1.14.14"
	// goipamDatabase is the database of the benchmark's PostgreSQL that
	// go-ipam creates its table in, made and dropped by the phase.
	goipamDatabase = "ipam_bench_goipam"
	// goipamRatioTarget: the lease path at least 5 times go-ipam's ops/s.
	goipamRatioTarget = 5.0
)

//go:embed goipampeer/main.go
var goipamPeerMain []byte

// goipamReport is the go-ipam phase in the -out file.
type goipamReport struct {
	Version   string  `json:"version"`
	Source    string  `json:"source"` // the module proxy, or -goipam-src
	Clients   int     `json:"clients"`
	Prefixes  int     `json:"prefixes"`
	Seconds   float64 `json:"seconds"`
	OpsPerSec float64 `json:"opsPerSec"`
	Errors    int64   `json:"errors"`
	// ServiceOpsPerSec is the mixed phase's median at Clients; Ratio is
	// it over OpsPerSec.
	ServiceOpsPerSec float64  `json:"serviceOpsPerSec"`
	Ratio            float64  `json:"ratio"`
	ErrorSamples     []string `json:"errorSamples,omitempty"`
	Skipped          string   `json:"skipped,omitempty"`
}

// goipamPeerOutput is what goipampeer prints.
type goipamPeerOutput struct {
	Seconds  float64  `json:"seconds"`
	Allocs   int64    `json:"allocs"`
	Releases int64    `json:"releases"`
	Errors   int64    `json:"errors"`
	Samples  []string `json:"errorSamples"`
}

// goipamGoMod is the go.mod of the peer's module: go-ipam at the pinned
// version, or replaced by a checkout of it (src) where the module proxy
// does not serve it.
func goipamGoMod(src string) string {
	m := "module goipampeer\n\ngo 1.25\n\nrequire " + goipamModule + " " + goipamVersion + "\n"
	if src != "" {
		m += "\nreplace " + goipamModule + " => " + src + "\n"
	}
	return m
}

// buildGoipamPeer builds the peer in a module of its own under dir, so
// go-ipam's dependencies (its other storages' clients among them) never
// enter the project's go.mod, and answers the binary's path.
func buildGoipamPeer(ctx context.Context, dir, src string) (string, error) {
	tool, err := goTool()
	if err != nil {
		return "", fmt.Errorf("go tool: %w", err)
	}
	if src != "" {
		if src, err = filepath.Abs(src); err != nil {
			return "", err
		}
	}
	mod := filepath.Join(dir, "goipampeer")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte(goipamGoMod(src)), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(mod, "main.go"), goipamPeerMain, 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "goipampeer-bin")
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, tool, append(append([]string{"build", "-tags", "goipampeer", "-o", bin}, releaseBuild...), ".")...)
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = append(releaseEnv(), "GOFLAGS=-mod=mod", "GOWORK=off"), mod, io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s@%s: %w: %s", goipamModule, goipamVersion, err, strings.TrimSpace(stderr.String()))
	}
	return bin, nil
}

// goipamPhase builds and runs the peer with clients for duration on the
// benchmark's PostgreSQL (a database of its own there) and compares it
// with serviceOps, the mixed phase's median ops/s at clients. When the
// peer cannot be built (the module proxy refuses it and no -goipam-src
// is given) or its database cannot be made, the phase is skipped with
// the reason.
func goipamPhase(ctx context.Context, dbURL, src, dir string, clients int, duration time.Duration, serviceOps float64, out io.Writer) (*goipamReport, error) {
	rep := &goipamReport{Version: goipamVersion, Source: "the Go module proxy", Clients: clients, Prefixes: 256, ServiceOpsPerSec: serviceOps}
	if src != "" {
		rep.Source = "a checkout (-goipam-src " + src + ")"
	}
	skip := func(why string) (*goipamReport, error) {
		rep.Skipped = why
		fmt.Fprintf(out, "go-ipam: skipped: %s\n", why)
		return rep, nil
	}
	began := time.Now()
	bin, err := buildGoipamPeer(ctx, dir, src)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return skip(err.Error())
	}
	built := time.Since(began)
	cfg, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	drop := func() error {
		_, err := conn.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+goipamDatabase+" WITH (FORCE)")
		return err
	}
	if err := drop(); err != nil {
		return skip(fmt.Sprintf("dropping a former %s: %v", goipamDatabase, err))
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+goipamDatabase); err != nil {
		return skip(fmt.Sprintf("CREATE DATABASE %s: %v", goipamDatabase, err))
	}
	defer func() {
		if err := drop(); err != nil {
			fmt.Fprintln(os.Stderr, "ipam-bench: go-ipam:", err)
		}
	}()
	fmt.Fprintf(out, "go-ipam: %s %s from %s built in %.1fs; PostgreSQL storage in database %s of the benchmark's PostgreSQL; %d prefixes (/24) holding 32 addresses each, %d clients allocating and releasing for %v\n",
		goipamModule, goipamVersion, rep.Source, built.Seconds(), goipamDatabase, rep.Prefixes, clients, duration)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "-host", cfg.Host, "-port", strconv.Itoa(int(cfg.Port)), "-user", cfg.User, "-dbname", goipamDatabase,
		"-clients", strconv.Itoa(clients), "-prefixes", strconv.Itoa(rep.Prefixes), "-held", "32", "-duration", duration.String())
	// The password, if any, through lib/pq's environment, not argv.
	cmd.Env = append(os.Environ(), "PGPASSWORD="+cfg.Password)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go-ipam peer: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var o goipamPeerOutput
	if err := json.Unmarshal(stdout.Bytes(), &o); err != nil || o.Seconds <= 0 {
		return nil, fmt.Errorf("go-ipam peer printed %q: %v", stdout.String(), err)
	}
	rep.Seconds, rep.Errors, rep.ErrorSamples = o.Seconds, o.Errors, o.Samples
	rep.OpsPerSec = float64(o.Allocs+o.Releases) / o.Seconds
	if rep.OpsPerSec > 0 {
		rep.Ratio = serviceOps / rep.OpsPerSec
	}
	fmt.Fprintln(out, rep.line())
	for _, s := range rep.ErrorSamples {
		fmt.Fprintf(out, "  error sample: %s\n", s)
	}
	return rep, nil
}

// verdict judges the ratio against the target.
func (r *goipamReport) verdict() string {
	switch {
	case r.Ratio == 0:
		return "no figures"
	case r.Ratio < goipamRatioTarget:
		return "under"
	}
	return "ok"
}

// line is the printed line of r, in the run and in the summary.
func (r *goipamReport) line() string {
	if r.Skipped != "" {
		return "go-ipam: skipped: " + r.Skipped
	}
	return fmt.Sprintf("go-ipam clients=%d ops/s=%.1f errors=%d; lease path (mixed, median) ops/s=%.1f; ratio lease path/go-ipam=%.2f (target >= %.0f) %s",
		r.Clients, r.OpsPerSec, r.Errors, r.ServiceOpsPerSec, r.Ratio, goipamRatioTarget, r.verdict())
}
