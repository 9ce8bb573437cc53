// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package migrations holds the goose migrations of the IPAM schema, embedded
// in the binary. A migration is never edited once it has landed: add a new
// file instead.
package migrations

import "embed"

// FS holds every *.sql migration.
//
//go:embed *.sql
var FS embed.FS
