// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// timeoutsReport is the timeouts phase: the mix at the same clients
// without and with a client timeout per attempt, in the same run.
type timeoutsReport struct {
	Concurrency int       `json:"concurrency"`
	Timeout     string    `json:"timeout"`
	Without     runResult `json:"without"`
	With        runResult `json:"with"`
	Ratio       float64   `json:"goodputRatio"` // With.OpsPerSec / Without.OpsPerSec
	Target      float64   `json:"target"`
}

// timeoutsTarget is the goodput the service should keep under client
// timeouts, as a share of its goodput without them.
const timeoutsTarget = 0.5

// timeoutsPhase runs the mix by -timeouts-concurrency clients over the
// measured nodes twice: without a client timeout, then with -client-timeout
// per attempt, as CNI plugins under a deadline behave: a call that timed
// out is sent again at once for the same attachment (on a new connection,
// since the timed-out one was closed: a new TLS handshake), and a 503 or
// 429 is sent again after its Retry-After. Both runs retry the same way;
// only the timeout differs. Goodput is successful calls per second
// (ops/s); a timed-out attempt may or may not have been done by the
// server, and its retry, which answers the same leases, settles it in the
// clients' books.
func (b *bench) timeoutsPhase(ctx context.Context) (*timeoutsReport, error) {
	cfg := b.cfg
	rep := &timeoutsReport{Concurrency: cfg.TimeoutsConcurrency, Timeout: cfg.ClientTimeout.String(), Target: timeoutsTarget}
	ws, err := b.fleet.workers(cfg.TimeoutsConcurrency, b.nodes)
	if err != nil {
		return nil, err
	}
	defer b.fleet.retire(ws)
	conn, err := pgx.Connect(ctx, b.db.url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for i, timeout := range []time.Duration{0, cfg.ClientTimeout} {
		phase := "timeouts=none"
		if timeout > 0 {
			phase = "timeouts=" + timeout.String()
		}
		for _, w := range ws {
			w.retry, w.timeout = true, timeout
		}
		before, err := sessionsOf(ctx, conn)
		if err != nil {
			return rep, err
		}
		r, err := b.measured(ctx, phase, ws, len(b.nodes), 1, cfg.TimeoutsDuration)
		if err != nil {
			return rep, err
		}
		after, err := sessionsOf(ctx, conn)
		if err != nil {
			return rep, err
		}
		r.DBSessions, r.DBSessionsAbandoned = after[0]-before[0], after[1]-before[1]
		fmt.Fprintf(b.out, "  database sessions opened %d, of which the server dropped %d (abandoned)\n", r.DBSessions, r.DBSessionsAbandoned)
		if i == 0 {
			rep.Without = r
		} else {
			rep.With = r
		}
	}
	for _, w := range ws {
		w.retry, w.timeout = false, 0
	}
	if rep.Without.OpsPerSec > 0 {
		rep.Ratio = rep.With.OpsPerSec / rep.Without.OpsPerSec
	}
	fmt.Fprintf(b.out, "timeouts clients=%d: goodput without a client timeout %.1f ops/s, with %v per attempt %.1f ops/s (%d attempts timed out, %d refused, %d TLS handshakes); ratio %.3f (target >= %.2f)\n",
		rep.Concurrency, rep.Without.OpsPerSec, cfg.ClientTimeout, rep.With.OpsPerSec, rep.With.TimedOut, rep.With.Refused, rep.With.Handshakes, rep.Ratio, timeoutsTarget)
	return rep, nil
}

// sessionsOf answers PostgreSQL's count of sessions of the database, and of
// sessions whose client dropped the connection (sessions_abandoned: the
// server's driver closes a connection whose statement's context ended).
func sessionsOf(ctx context.Context, conn *pgx.Conn) ([2]int64, error) {
	var n [2]int64
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return n, err
	}
	err := conn.QueryRow(ctx, `SELECT sessions, sessions_abandoned FROM pg_stat_database WHERE datname = current_database()`).Scan(&n[0], &n[1])
	return n, err
}
