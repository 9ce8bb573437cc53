// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// IsUnavailable reports whether err means the database could not be
// reached, dropped the connection, is shutting down or refused more
// connections, as opposed to a statement that failed. Such errors are
// transient for the caller: the API answers them 503 with Retry-After.
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errReadOnlyServer) {
		return true
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08: connection exception; 57P01-03: admin/crash shutdown,
		// cannot connect now; 53300: too many connections; 25006: a
		// write on a server that is (now) read-only, a primary being
		// demoted or a standby, which a failover replaces with a primary.
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" ||
			pe.Code == "57P03" || pe.Code == "53300" || pe.Code == "25006"
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	// ErrConnClosed: a statement on a connection that an earlier failure
	// (the server went away mid-transaction) already closed.
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.Timeout(err) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, pgconn.ErrConnClosed)
}
