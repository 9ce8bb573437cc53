// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import "github.com/jackc/pgx/v5/pgxpool"

// Stat is a snapshot of the connection pool's counters: connections
// acquired, idle and in total, and the cumulative acquire counts and waits.
// It takes no connection and is cheap enough for every metrics scrape.
func (s *Store) Stat() *pgxpool.Stat { return s.db.Stat() }
