// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// batcher lets concurrent single-statement writes (a lease from a block
// with room, a release) share one transaction: one round trip, one commit,
// and for a node's leases one statement (see merging), whose start and
// constraint setup PostgreSQL then pays once for all of them. Each write
// keeps its own parameters, its own history context (set by the statement
// itself) and its own outcome; every invariant stays in the database's
// constraints, which check each row as they would alone.
//
// A worker takes the first waiting write, then every write that queued
// meanwhile (up to maxBatch), and sends them between a BEGIN and a COMMIT
// in one message. While a batch is in flight the next one forms, so a lone
// write waits for nobody and a busy replica's batches grow with its load.
//
// Each worker has its own queue, and the leases of one node always go to
// the same one: they lock the node's blocks, which a statement of the same
// transaction shares but a concurrent batch skips (and then carves a block
// more). So a busy node's allocations share its block in one batch instead
// of spreading over blocks, or queueing on one, across batches. Writes
// without such a key go to the queues in turn.
//
// One bad statement must not fail the others: when any statement of a
// batch fails, or the commit does, the batch rolls back and each of its
// writes runs again alone, with its own outcome (its own error, or its own
// rows when it only failed with the others).
type batcher struct {
	db      *pgxpool.Pool
	queues  []chan *batchItem
	seed    maphash.Seed
	turn    atomic.Uint64 // the queue of the next write without a key
	stop    chan struct{}
	stopped sync.Once
	workers sync.WaitGroup
	// onBatch, when set, observes the size of every batch sent (tests).
	onBatch func(size int)
	// stats counts what the batcher did, for the metrics.
	batches, writes, alone, fallbacks atomic.Int64
}

// WriteBatchStats counts the single-statement writes the store batched:
// transactions of two writes or more (Batches) and the writes in them
// (Batched), writes sent alone because nothing queued with them (Alone),
// and writes that ran again alone after their batch failed (Fallbacks).
type WriteBatchStats struct {
	Batches, Batched, Alone, Fallbacks int64
}

// WriteBatchStats reports the write batcher's counters; zero when the
// store does not batch.
func (s *Store) WriteBatchStats() WriteBatchStats { return s.batch.stats() }

// LookupBatchStats reports the same counters for the allocations' shared
// lookups (see lookupShared); zero when the store does not batch.
func (s *Store) LookupBatchStats() WriteBatchStats { return s.lookups.stats() }

func (b *batcher) stats() WriteBatchStats {
	if b == nil {
		return WriteBatchStats{}
	}
	return WriteBatchStats{Batches: b.batches.Load(), Batched: b.writes.Load(), Alone: b.alone.Load(), Fallbacks: b.fallbacks.Load()}
}

// maxBatch bounds the writes of one transaction: its locks are held until
// the last of them has run.
const maxBatch = 64

// batchTimeout bounds one batch's round trip: a batch runs on a context of
// its own, since no single caller's may end it for the others.
const batchTimeout = 30 * time.Second

// batchItem is one write waiting for its batch.
type batchItem struct {
	ctx  context.Context
	sql  string
	args []any
	// read consumes the statement's rows; it may run twice (in the batch,
	// then alone when the batch failed), and the second run must replace
	// what the first produced.
	read func(pgx.Rows) error
	done chan error
	// merge, when set, lets the write share one statement with the other
	// writes of its group in the batch (see merging).
	merge *merging
}

// merging is how a write joins others in one multi-row statement: the
// writes of a batch with the same group (at least two) are sent as the one
// statement combine makes of them, whose read hands each its own outcome.
// Alone, or when its batch fails, a write runs its own statement.
type merging struct {
	group   string
	combine func(group []*batchItem) (sql string, args []any, read func(pgx.Rows) error)
	payload any
	// slot and tag, when slot is set, keep apart writes the statement
	// cannot hold together: the writes of one statement that share a
	// slot share its tag (a node's writes, its history actor), and a
	// write whose slot has another tag there goes to the next statement
	// of its group.
	slot, tag string
}

// statement is one statement of a batch: a write's own, or the combined
// one of a group.
type statement struct {
	sql  string
	args []any
	read func(pgx.Rows) error
}

// statements makes the batch's statements: one per write, but one per
// group of two or more writes that merge.
func statements(items []*batchItem) []statement {
	type group struct {
		items []*batchItem
		tags  map[string]string // slot -> tag
	}
	groups := map[string][]*group{}
	var order []*group
	member := make(map[*batchItem]*group, len(items))
	for _, it := range items {
		m := it.merge
		if m == nil {
			continue
		}
		var g *group
		for _, c := range groups[m.group] {
			if tag, ok := c.tags[m.slot]; !ok || tag == m.tag {
				g = c
				break
			}
		}
		if g == nil {
			g = &group{tags: map[string]string{}}
			groups[m.group] = append(groups[m.group], g)
			order = append(order, g)
		}
		g.items = append(g.items, it)
		if m.slot != "" {
			g.tags[m.slot] = m.tag
		}
		member[it] = g
	}
	out := make([]statement, 0, len(items))
	for _, it := range items {
		if g := member[it]; g == nil || len(g.items) < 2 {
			out = append(out, statement{sql: it.sql, args: it.args, read: it.read})
		}
	}
	for _, g := range order {
		if len(g.items) >= 2 {
			sql, args, read := g.items[0].merge.combine(g.items)
			out = append(out, statement{sql: sql, args: args, read: read})
		}
	}
	return out
}

func newBatcher(db *pgxpool.Pool, workers int) *batcher {
	b := &batcher{db: db, seed: maphash.MakeSeed(), stop: make(chan struct{})}
	for range workers {
		q := make(chan *batchItem)
		b.queues = append(b.queues, q)
		b.workers.Add(1)
		go b.run(q)
	}
	return b
}

// queueFor answers the queue of writes with key: always the same one for a
// key, the next in turn without one.
func (b *batcher) queueFor(key string) chan *batchItem {
	n := uint64(len(b.queues))
	if key == "" {
		return b.queues[b.turn.Add(1)%n]
	}
	return b.queues[maphash.String(b.seed, key)%n]
}

// close stops the workers once their batches are done; writes not yet
// taken run alone.
func (b *batcher) close() {
	b.stopped.Do(func() { close(b.stop) })
	b.workers.Wait()
}

// write runs sql with args as part of a batch of the queue of key (see
// queueFor) and hands its rows to read.
func (b *batcher) write(ctx context.Context, key string, it *batchItem) error {
	it.ctx, it.done = ctx, make(chan error, 1)
	select {
	case b.queueFor(key) <- it:
	case <-b.stop:
		return writeAlone(ctx, b.db, it)
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-it.done:
		return err
	case <-ctx.Done():
		// The write may still commit: the callers of the store are
		// idempotent (a retry answers what an earlier attempt made).
		return ctx.Err()
	}
}

func (b *batcher) run(queue chan *batchItem) {
	defer b.workers.Done()
	items := make([]*batchItem, 0, maxBatch)
	for {
		select {
		case it := <-queue:
			items = append(items[:0], it)
		case <-b.stop:
			return
		}
	more:
		for len(items) < maxBatch {
			select {
			case it := <-queue:
				items = append(items, it)
			default:
				break more
			}
		}
		b.send(items)
	}
}

// send runs items in one transaction, or each alone when that fails.
func (b *batcher) send(items []*batchItem) {
	live := items[:0:0]
	for _, it := range items {
		if err := it.ctx.Err(); err != nil {
			it.done <- err
			continue
		}
		live = append(live, it)
	}
	if b.onBatch != nil && len(live) > 0 {
		b.onBatch(len(live))
	}
	switch len(live) {
	case 0:
		return
	case 1:
		b.alone.Add(1)
		live[0].done <- writeAlone(live[0].ctx, b.db, live[0])
		return
	}
	b.batches.Add(1)
	b.writes.Add(int64(len(live)))
	if err := b.together(live); err != nil {
		b.fallbacks.Add(int64(len(live)))
		for _, it := range live {
			it.done <- writeAlone(it.ctx, b.db, it)
		}
		return
	}
	for _, it := range live {
		it.done <- nil
	}
}

// together runs items between one BEGIN and COMMIT in one round trip. An
// error means nothing committed.
func (b *batcher) together(items []*batchItem) error {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	conn, err := b.db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	stmts := statements(items)
	batch := &pgx.Batch{QueuedQueries: make([]*pgx.QueuedQuery, 0, len(stmts)+2)}
	batch.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	for _, st := range stmts {
		batch.Queue(st.sql, st.args...)
	}
	batch.Queue("COMMIT")
	br := conn.SendBatch(ctx, batch)
	_, err = br.Exec()
	for _, st := range stmts {
		if err != nil {
			break
		}
		err = readRows(br.Query())(st.read)
	}
	if err == nil {
		tag, cerr := br.Exec()
		if err = cerr; err == nil && tag.String() != "COMMIT" {
			err = pgx.ErrTxCommitRollback
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && !conn.Conn().IsClosed() {
		// The connection may be left in the aborted transaction.
		if _, rerr := conn.Exec(ctx, "ROLLBACK"); rerr != nil {
			_ = conn.Conn().Close(ctx)
		}
	}
	return err
}

// writeAlone runs one write as a transaction of its own, again after a
// deadlock or a serialization failure (up to maxTxAttempts in all): the
// statement rolled back whole, and every item's read replaces what an
// earlier run read. Such conflicts are those of batches: a batch that
// failed is written item by item here, while another replica's batch,
// merging the same rows in another order (a CNI plugin retrying a release
// across replicas), is still running; answered as they were, they were
// 500s (internal/faulttest TestRandomRetriesOneAddressPerAttachment).
func writeAlone(ctx context.Context, db *pgxpool.Pool, it *batchItem) error {
	for attempt := 1; ; attempt++ {
		err := readRows(db.Query(ctx, it.sql, it.args...))(it.read)
		if code, _ := pgCode(err); (code != codeDeadlock && code != codeSerialization) || attempt == maxTxAttempts {
			return err
		}
		if !retryWait(ctx, attempt) {
			return err
		}
	}
}
