// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/store"
)

// findingsError is check's answer when the database breaks an invariant:
// main exits 2 for it, so a script tells "inconsistent" from "could not
// check" (1).
type findingsError struct{ n int }

func (e findingsError) Error() string {
	return fmt.Sprintf("consistency check: %d findings", e.n)
}

// check is `ipam-server check`: the consistency check of GET
// /v1/consistency (store.CheckConsistency, one read-only snapshot, no lock
// a writer waits for) from the command line, for cron jobs and incidents.
// It takes serve's database flags, prints the report as JSON on out, and
// answers a findingsError when anything is found. It never migrates: it
// checks the database as it is.
func check(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	cfg, err := parseConfig("check", args, getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	dbURL, _, stopDB, err := database(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer stopDB()
	o := store.DefaultOptions()
	o.MaxConns = 2
	st, err := store.Open(ctx, dbURL, o)
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := st.Ready(ctx); err != nil {
		return err
	}
	r, err := st.CheckConsistency(alloc.WithActor(ctx, alloc.ActorSystem))
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(api.ConsistencyReportToAPI(r)); err != nil {
		return err
	}
	if len(r.Findings) > 0 {
		return findingsError{n: len(r.Findings)}
	}
	return nil
}
