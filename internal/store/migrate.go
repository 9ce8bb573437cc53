// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/ipam-dev/ipam/migrations"
)

// Migrate applies every pending migration under a PostgreSQL session
// advisory lock, so replicas starting together apply each migration once and
// the others wait. It returns the schema version reached.
func Migrate(ctx context.Context, connString string) (int64, error) {
	cfg, err := parseConfig(connString)
	if err != nil {
		return 0, err
	}
	db := stdlib.OpenDB(*cfg.ConnConfig)
	defer db.Close()
	return migrateDB(ctx, db)
}

func migrateDB(ctx context.Context, db *sql.DB) (int64, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return 0, err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations.FS, goose.WithSessionLocker(locker))
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	return p.GetDBVersion(ctx)
}

// SchemaVersion is the newest migration embedded in this binary.
func SchemaVersion() int64 {
	entries, err := fs.ReadDir(migrations.FS, ".")
	if err != nil {
		panic(err) // embedded at build time: cannot fail
	}
	var v int64
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		if n, err := strconv.ParseInt(num, 10, 64); ok && err == nil && n > v {
			v = n
		}
	}
	return v
}
