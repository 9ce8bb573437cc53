// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package pgtest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/ipam-dev/ipam/migrations"
)

// Migrate applies every migration of package migrations to the database at
// connString and closes its connection: the migrate function of Main for
// every package whose tests use the service's schema,
//
//	func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Migrate) }
//
// It runs goose over the embedded files itself, not through store.Migrate,
// so that package store's own tests can use it without an import cycle. It
// takes no advisory lock: nothing else uses a template while Main builds it.
func Migrate(ctx context.Context, connString string) error {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return fmt.Errorf("pgtest: migrate: %w", err)
	}
	db := stdlib.OpenDB(*cfg)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS)
	if err != nil {
		return fmt.Errorf("pgtest: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("pgtest: migrate: %w", err)
	}
	return nil
}
