// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ipam-dev/ipam/internal/store"
)

// durabilityWatch reads what the database does with a commit before it
// answers (store.Durability) at start and every interval after, logs it at
// start and whenever it changes (a failover manager lowers and raises it:
// pg_auto_failover's wait_primary, Patroni's synchronous_mode), and keeps
// the last reading for the metrics. A commit the service answered is on
// two machines only while a synchronous standby is attached.
type durabilityWatch struct {
	read func(context.Context) (store.Durability, error)
	log  *slog.Logger

	mu    sync.Mutex
	last  store.Durability
	known bool // last holds a reading
}

// check reads the durability once and logs it when it is new.
func (w *durabilityWatch) check(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	d, err := w.read(rctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("reading the database's durability settings", "err", err)
		}
		return
	}
	w.mu.Lock()
	changed := !w.known || d != w.last
	w.last, w.known = d, true
	w.mu.Unlock()
	if !changed {
		return
	}
	attrs := []any{"synchronous", d.Synchronous(), "synchronousCommit", d.SynchronousCommit,
		"synchronousStandbyNames", d.SynchronousStandbyNames, "standbys", d.Standbys}
	if d.Visible {
		attrs = append(attrs, "syncStandbys", d.SyncStandbys)
	}
	switch {
	case !d.Synchronous():
		w.log.Warn("database durability: commits do not wait for a synchronous standby, so a lease answered 201 is on one machine only until it is replicated; "+
			"set synchronous_standby_names and synchronous_commit=on (README: High availability)", attrs...)
	case !d.Visible:
		w.log.Info("database durability: commits wait for a synchronous standby (the database role cannot read pg_stat_replication, so whether one is attached is unknown: grant pg_monitor)", attrs...)
	case d.SyncStandbys == 0:
		w.log.Warn("database durability: commits wait for a synchronous standby, but none is attached: writes wait until one is", attrs...)
	default:
		w.log.Info("database durability: commits wait for a synchronous standby", attrs...)
	}
}

// run checks every interval until ctx ends.
func (w *durabilityWatch) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.check(ctx)
		}
	}
}

func (w *durabilityWatch) get() (store.Durability, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last, w.known
}

// observeDurability exports the watch's last reading: ipam_db_synchronous
// (1 when commits wait for a synchronous standby, with synchronous_commit
// as an attribute), ipam_db_standbys, and ipam_db_sync_standbys when the
// role may see it. Nothing is exported before the first reading.
func observeDurability(meter metric.Meter, w *durabilityWatch) (metric.Registration, error) {
	var err, e error
	synchronous, e := meter.Int64ObservableGauge("ipam.db.synchronous",
		metric.WithDescription("1 when the database's commits wait for a synchronous standby (synchronous_standby_names set, synchronous_commit on, remote_apply or remote_write), so an answered write is on two machines; 0 when not."))
	err = errors.Join(err, e)
	standbys, e := meter.Int64ObservableGauge("ipam.db.standbys", metric.WithUnit("{standby}"),
		metric.WithDescription("Standbys attached to the database's primary (pg_stat_replication)."))
	err = errors.Join(err, e)
	syncStandbys, e := meter.Int64ObservableGauge("ipam.db.sync_standbys", metric.WithUnit("{standby}"),
		metric.WithDescription("Attached standbys whose confirmation a commit waits for (sync_state sync or quorum); absent when the database role cannot read it (grant pg_monitor)."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("durability metrics: %w", err)
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		d, ok := w.get()
		if !ok {
			return nil
		}
		var sync int64
		if d.Synchronous() {
			sync = 1
		}
		o.ObserveInt64(synchronous, sync, metric.WithAttributes(attribute.String("synchronous_commit", d.SynchronousCommit)))
		o.ObserveInt64(standbys, int64(d.Standbys))
		if d.Visible {
			o.ObserveInt64(syncStandbys, int64(d.SyncStandbys))
		}
		return nil
	}, synchronous, standbys, syncStandbys)
}
