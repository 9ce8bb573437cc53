// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package migrations holds the goose migrations of the IPAM schema, embedded
// in the binary. A migration is never edited once it has landed: add a new
// file instead.
package migrations

import "embed"

// FS holds every migration: the numbered *.sql files (schema.sql, the
// schema they build in one piece, is for readers and never applied).
//
//go:embed [0-9]*.sql
var FS embed.FS
