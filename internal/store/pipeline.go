// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pipelinedTx is a READ COMMITTED transaction on a connection of its own
// whose BEGIN (with the history's actor, reason and clock, as bound
// parameters) travels in one message with its first QueryRow. Every inTx
// transaction and the allocation's general path use it.
//
// Round trips are what a write costs most besides PostgreSQL's own work:
// each one is a write that wakes the backend and a read that waits for it,
// on both sides of the socket.
//
// It is a querier; a statement that fails aborts the transaction, and the
// caller must call end, which rolls back whatever did not commit.
type pipelinedTx struct {
	conn *pgxpool.Conn
	// begin is the history context of the BEGIN: actor, reason, clock.
	begin       []any
	begun, done bool
}

// beginPipelined acquires a connection for a pipelined transaction that
// records its changes in the history with ctx's actor and reason.
func (s *Store) beginPipelined(ctx context.Context, reason string) (*pipelinedTx, error) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &pipelinedTx{conn: conn, begin: []any{historyActor(ctx), reason, s.now()}}, nil
}

// sendBegin makes the BEGIN and the history context the first statements of
// batch b.
func (t *pipelinedTx) sendBegin(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	t.begun = true
	all := &pgx.Batch{}
	all.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	all.Queue("SELECT ipam_history_context($1, $2, $3)", t.begin...)
	all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
	return t.conn.SendBatch(ctx, all)
}

func (t *pipelinedTx) ensureBegun(ctx context.Context) error {
	if t.begun {
		return nil
	}
	br := t.sendBegin(ctx, &pgx.Batch{})
	return errors.Join(execAll(br, 2), br.Close())
}

// execAll reads the results of the first n statements of br.
func execAll(br pgx.BatchResults, n int) error {
	for range n {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	return nil
}

func (t *pipelinedTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.ensureBegun(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *pipelinedTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ensureBegun(ctx); err != nil {
		return nil, err
	}
	return t.conn.Query(ctx, sql, args...)
}

// QueryRow runs sql; the transaction's first one carries the BEGIN with it.
func (t *pipelinedTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.begun {
		return t.conn.QueryRow(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	return &batchRow{br: t.sendBegin(ctx, b), skip: 2}
}

// commit commits the transaction.
func (t *pipelinedTx) commit(ctx context.Context) error {
	if err := t.ensureBegun(ctx); err != nil {
		return err
	}
	tag, err := t.conn.Exec(ctx, "COMMIT")
	return t.committed(tag, err)
}

// committed records the outcome of a COMMIT: PostgreSQL answers a COMMIT of
// a transaction that a failed statement aborted with ROLLBACK, and no error.
func (t *pipelinedTx) committed(tag pgconn.CommandTag, err error) error {
	if err != nil {
		return err
	}
	if tag.String() != "COMMIT" {
		return pgx.ErrTxCommitRollback
	}
	t.done = true
	return nil
}

// end rolls back unless the transaction committed, and returns the
// connection to the pool (which closes it if the rollback failed).
func (t *pipelinedTx) end(ctx context.Context) {
	if t.begun && !t.done {
		// A fresh context: the rollback must run even when ctx has ended.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if _, err := t.conn.Exec(rctx, "ROLLBACK"); err != nil {
			_ = t.conn.Conn().Close(rctx)
		}
		cancel()
	}
	t.conn.Release()
}

// batchRow is the row of one statement of a batch: it skips the results of
// the skip statements before it.
type batchRow struct {
	br   pgx.BatchResults
	skip int
}

func (r *batchRow) Scan(dest ...any) error {
	err := execAll(r.br, r.skip)
	if err == nil {
		err = r.br.QueryRow().Scan(dest...)
	}
	if cerr := r.br.Close(); err == nil || errors.Is(err, pgx.ErrNoRows) {
		if cerr != nil {
			err = cerr
		}
	}
	return err
}
