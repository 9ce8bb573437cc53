// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// errReadOnlyServer is the error of a statement the store did not send
// because its connection is to a server that takes no writes: a standby,
// or a primary that its failover manager made read-only while it demotes
// it. IsUnavailable reports it: the API answers 503 and the client retries
// once the failover manager has promoted another server.
var errReadOnlyServer = errors.New("the database server is read-only (a standby, or a primary being demoted): no primary reachable")

// writableServer is the pool's PrepareConn: it refuses a connection whose
// server says, in the parameters PostgreSQL 14+ reports to the client as
// they change (in_hot_standby, default_transaction_read_only), that it
// takes no writes. Such a connection is closed and the statement fails as
// unavailable, instead of failing later with a read-only error while the
// pool keeps the connection. A URL with target_session_attrs=read-write
// already makes every new connection go to the primary; this also covers a
// single-host URL (a Kubernetes -rw Service, a virtual IP) that still
// points at the old primary, and connections opened before a switchover.
func writableServer(_ context.Context, c *pgx.Conn) (bool, error) {
	pc := c.PgConn()
	if pc.ParameterStatus("in_hot_standby") == "on" || pc.ParameterStatus("default_transaction_read_only") == "on" {
		return false, errReadOnlyServer
	}
	return true, nil
}

// Durability is what the database the store writes to does with a commit
// before it answers: whether it waits for a synchronous standby, and how
// many are attached. With one synchronous standby and synchronous_commit
// on (or remote_apply), a commit the service answered is on two machines
// and survives the loss of the primary.
type Durability struct {
	// SynchronousCommit is synchronous_commit as the store's sessions
	// have it: on, remote_apply, remote_write, local or off.
	SynchronousCommit string
	// SynchronousStandbyNames is the primary's synchronous_standby_names
	// (empty: no commit waits for a standby).
	SynchronousStandbyNames string
	// SyncStandbys counts the standbys that are attached and synchronous
	// (pg_stat_replication.sync_state sync or quorum), when Visible.
	SyncStandbys int
	// Standbys counts every attached standby (synchronous or not).
	Standbys int
	// Visible is false when the store's role may not read the state of
	// pg_stat_replication (it needs pg_monitor or pg_read_all_stats):
	// then SyncStandbys is unknown, and 0.
	Visible bool
}

// Synchronous reports whether a commit waits for a standby: standby names
// are set and synchronous_commit is one of the levels that waits
// (remote_write waits for the standby's write, not its flush: weaker).
func (d Durability) Synchronous() bool {
	if strings.TrimSpace(d.SynchronousStandbyNames) == "" {
		return false
	}
	switch d.SynchronousCommit {
	case "on", "remote_apply", "remote_write":
		return true
	}
	return false
}

// Durability reads the durability settings of the database the store
// writes to (its primary).
func (s *Store) Durability(ctx context.Context) (Durability, error) {
	var d Durability
	var hidden int
	err := s.db.QueryRow(ctx, `SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
			count(*) FILTER (WHERE sync_state IN ('sync', 'quorum')), count(*), count(*) FILTER (WHERE sync_state IS NULL)
		FROM pg_stat_replication`).Scan(&d.SynchronousCommit, &d.SynchronousStandbyNames, &d.SyncStandbys, &d.Standbys, &hidden)
	if err != nil {
		return Durability{}, fmt.Errorf("durability settings: %w", err)
	}
	// Without the privilege PostgreSQL shows each standby's row with every
	// column but the pid NULL.
	d.Visible = hidden == 0
	return d, nil
}
