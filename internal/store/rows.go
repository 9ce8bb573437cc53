// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// readRows hands rows (or the error of the query that made them) to read,
// then closes them and answers the first error.
func readRows(rows pgx.Rows, err error) func(read func(pgx.Rows) error) error {
	return func(read func(pgx.Rows) error) error {
		if err != nil {
			return err
		}
		defer rows.Close()
		if err := read(rows); err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	}
}

// rowsRow reads the first row of rows as a pgx.Row: pgx.ErrNoRows when
// there is none.
type rowsRow struct{ rows pgx.Rows }

func (r rowsRow) Scan(dest ...any) error {
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	return r.rows.Scan(dest...)
}

// writeOne runs one statement as a transaction of its own, in a batch with
// concurrent ones unless the store was opened without batching, and hands
// its rows to read (which may run twice: see batchItem). Writes of one key
// (a node's leases) share their batches (see batcher); "" is no key.
func (s *Store) writeOne(ctx context.Context, key, sql string, read func(pgx.Rows) error, args ...any) error {
	return s.writeItem(ctx, key, &batchItem{sql: sql, args: args, read: read})
}

// writeItem is writeOne for a write that may also merge with others
// (it.merge).
func (s *Store) writeItem(ctx context.Context, key string, it *batchItem) error {
	if s.batch == nil {
		return readRows(s.db.Query(ctx, it.sql, it.args...))(it.read)
	}
	return s.batch.write(ctx, key, it)
}
