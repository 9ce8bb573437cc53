// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package pgembed

import "errors"

// ErrNoPostgres reports that no PostgreSQL server binaries (initdb and
// postgres) were found. FindBinDir wraps it with where it looked and the
// command that installs them.
var ErrNoPostgres = errors.New("pgembed: PostgreSQL server binaries (initdb, postgres) not found")

// ErrDataDirInUse reports that processes still run in the cluster's data
// directory: another postmaster, or backends orphaned by a crashed one.
// Start returns it, wrapped with their process ids, instead of starting a
// second server on the same files.
var ErrDataDirInUse = errors.New("pgembed: data directory is in use")
