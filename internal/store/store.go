// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Options tune lease lifetimes and node registration.
type Options struct {
	// LeaseExpiry is how long a pending lease lives unless confirmed.
	LeaseExpiry time.Duration
	// TracerProvider, when set, traces every statement (OpenTelemetry
	// spans, children of the context's span). Nil traces nothing.
	TracerProvider trace.TracerProvider
	// Cooldown is how long a released address rests before it is leased
	// again; 0 is allowed.
	Cooldown time.Duration
	// AutoRegisterNodes registers an unknown node on its first lease
	// request, as Cilium's agent creates its own CiliumNode.
	AutoRegisterNodes bool
	// Now is the clock; nil means time.Now. Tests pass a controllable one.
	Now func() time.Time
	// MaxConns bounds the connection pool; 0 means DefaultMaxConns.
	MaxConns int32
	// DefaultPool is the pool of the last selection rule; empty means
	// alloc.DefaultPool.
	DefaultPool string
	// BlockReleaseHoldOff is how long a multi-pool block must have been
	// completely free (and above the node's need) before it goes back to
	// the pool, so a node whose Pods churn does not flap blocks.
	BlockReleaseHoldOff time.Duration
	// AgentPoolsSpace names the space whose nodes' multi-pool blocks
	// Cilium's agents size themselves: the service plays Cilium's
	// multi-pool operator there (internal/cilium, SyncAgentPools), and
	// the agents ask for blocks and give them back through their
	// CiliumNodes. Rebalance neither pre-allocates nor returns blocks in
	// it: it would count no lease in them and take them from under the
	// agents' Pods. Empty: none.
	AgentPoolsSpace string
	// ReconcileMinAge: a reconcile never releases a lease younger than
	// this, whatever its valid list says (the list was taken before the
	// call; a lease made meanwhile is not in it).
	ReconcileMinAge time.Duration
	// StickyRetention is how long a released address stays bound to its
	// workload identity when the request names no retention; 0 means
	// alloc.DefaultStickyRetention.
	StickyRetention time.Duration
	// HistoryRetention is how long address history events are kept before
	// the maintenance loop prunes them; 0 keeps them forever.
	HistoryRetention time.Duration
	// BatchWriters is how many batches of concurrent single-statement
	// writes (see batcher) may be in flight at once; 0 means
	// DefaultBatchWriters, and a negative value runs every write as a
	// transaction of its own.
	BatchWriters int
	// TopUp makes every allocation note its node pool families for the
	// top-up (RunTopUps, TopUpPending), which keeps each node's multi-pool
	// capacity at its need right after its allocations, as Cilium keeps a
	// node's pre-allocation ahead of its Pods, instead of on the next
	// Rebalance: an allocation then carves a block only when it ran ahead
	// of the top-up. Off: nothing is noted.
	TopUp bool
}

// DefaultBatchWriters is one batch in flight per replica: the next batch
// forms while one commits, so batches grow with the load, and a second
// writer only splits them (more statements, more commits for the same
// writes). More writers keep writes moving while a batch waits for a row
// lock, which the batched statements rarely do (they skip locked blocks).
const DefaultBatchWriters = 1

// DefaultOptions are the defaults of Cilium (10 minute expiry) and the VPC
// CNI (30 second cooldown).
func DefaultOptions() Options {
	return Options{LeaseExpiry: 10 * time.Minute, Cooldown: 30 * time.Second, AutoRegisterNodes: true,
		DefaultPool: alloc.DefaultPool, BlockReleaseHoldOff: DefaultBlockReleaseHoldOff,
		ReconcileMinAge: DefaultReconcileMinAge, StickyRetention: alloc.DefaultStickyRetention,
		HistoryRetention: DefaultHistoryRetention}
}

// DefaultBlockReleaseHoldOff matches the release delay Cilium's ENI mode
// applies to excess addresses (180 s).
const DefaultBlockReleaseHoldOff = 3 * time.Minute

// DefaultReconcileMinAge covers the time between a runtime listing its
// attachments and the reconcile reaching the database, with a wide margin.
const DefaultReconcileMinAge = time.Minute

// Validate checks the options.
func (o Options) Validate() error {
	var errs []error
	if o.LeaseExpiry <= 0 {
		errs = append(errs, errors.New("lease expiry must be positive"))
	}
	if o.Cooldown < 0 {
		errs = append(errs, errors.New("cooldown must not be negative"))
	}
	if o.MaxConns < 0 {
		errs = append(errs, errors.New("max connections must not be negative"))
	}
	if o.BlockReleaseHoldOff < 0 {
		errs = append(errs, errors.New("block release hold-off must not be negative"))
	}
	if o.ReconcileMinAge < 0 {
		errs = append(errs, errors.New("reconcile minimum age must not be negative"))
	}
	if o.StickyRetention < 0 || o.StickyRetention > alloc.MaxStickyRetention {
		errs = append(errs, fmt.Errorf("sticky retention must be from 0 to %s", alloc.MaxStickyRetention))
	}
	if o.HistoryRetention < 0 {
		errs = append(errs, errors.New("history retention must not be negative"))
	}
	if o.DefaultPool != "" {
		if err := alloc.ValidateLabelName("default pool", o.DefaultPool); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DefaultMaxConns is the connection pool size of a replica. Allocations
// wait on commits (the WAL flush) more than on CPU, so more connections than
// cores let PostgreSQL group those commits (docs/performance.md has the
// measurements). Keep replicas x MaxConns under the server's
// max_connections.
func DefaultMaxConns() int32 { return int32(max(32, 8*runtime.NumCPU())) }

// Store is the PostgreSQL implementation of the IPAM's state.
type Store struct {
	db          *pgxpool.Pool
	opts        Options
	batch       *batcher        // nil: no batching
	lookups     *batcher        // the allocations' lookups; nil with batch
	pageSecrets pageSecretCache // the continue tokens' secret (page.go)
	topUps      *topUps         // nil without Options.TopUp (topup.go)
	carves      carveCounts
}

// Open connects to connString and checks the options. It does not migrate:
// call Migrate first (cmd/server does, under an advisory lock).
func Open(ctx context.Context, connString string, o Options) (*Store, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.DefaultPool == "" {
		o.DefaultPool = alloc.DefaultPool
	}
	cfg, err := parseConfig(connString)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = o.MaxConns
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns()
	}
	// Every statement of the store is meant to be an index lookup whose plan
	// does not depend on the parameter values, so each prepared statement is
	// planned once per connection instead of on every execution. A
	// connection often prepares its statements while the tables are still
	// nearly empty, when a sequential scan looks cheapest; frozen into the
	// cached plan, that scan would then run against hundreds of thousands of
	// leases. Hence no sequential scans where an index exists.
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	cfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	// A sequential scan that remains (a table without a usable index, such
	// as goose_db_version for /readyz) then costs over 10^10, far above
	// jit_above_cost, and PostgreSQL JIT-compiles it on every execution:
	// 0.25 s of CPU per readiness probe when idle, seconds under load. No
	// statement of this OLTP store gains from JIT.
	cfg.ConnConfig.RuntimeParams["jit"] = "off"
	// After a failover or switchover, no statement goes to a server that
	// takes no writes (replication.go).
	cfg.PrepareConn = writableServer
	if o.TracerProvider != nil {
		// A span per statement, connection acquire and batch, child of
		// the request's span. The statement text is recorded, never its
		// parameters (owners, container IDs).
		cfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(o.TracerProvider))
	}
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	st := &Store{db: db, opts: o, topUps: newTopUps(o.TopUp)}
	if o.BatchWriters >= 0 {
		st.batch = newBatcher(db, cmp.Or(o.BatchWriters, DefaultBatchWriters))
		// Apart from the writes, so that no lookup waits for a commit.
		st.lookups = newBatcher(db, 1)
	}
	return st, nil
}

func parseConfig(connString string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	return cfg, nil
}

// Close releases the connections.
func (s *Store) Close() {
	if s.batch != nil {
		s.batch.close()
		s.lookups.close()
	}
	s.db.Close()
}

// Ready answers the applied schema version, or an error when the database is
// unreachable or behind this binary.
func (s *Store) Ready(ctx context.Context) (int64, error) {
	var v int64
	var standby bool
	err := s.db.QueryRow(ctx, `SELECT coalesce(max(version_id), 0), pg_is_in_recovery() FROM goose_db_version WHERE is_applied`).Scan(&v, &standby)
	if err != nil {
		return 0, fmt.Errorf("database: %w", err)
	}
	if standby {
		return v, fmt.Errorf("database: %w", errReadOnlyServer)
	}
	if want := SchemaVersion(); v < want {
		return v, fmt.Errorf("schema version %d is older than %d", v, want)
	}
	return v, nil
}

// now is the clock at PostgreSQL's precision (microseconds), so a value
// answered before and after a round trip through the database is the same.
func (s *Store) now() time.Time { return s.opts.Now().UTC().Truncate(time.Microsecond) }

// maxTxAttempts bounds retries of a transaction that failed on a typed,
// transient conflict (see retryable). A node deleted (forced) again and
// again while allocations register it anew makes each attempt collide with
// a fair chance; eight keep an allocation from failing on that churn.
const maxTxAttempts = 8

// inTx runs fn in one READ COMMITTED transaction, retrying it on a
// serialization failure, a deadlock, or a unique/exclusion violation raised
// by a concurrent writer of the same natural key (fn re-reads and then sees
// the winner's row). Other errors are returned as they are. The address
// history records its changes with the actor of ctx.
func (s *Store) inTx(ctx context.Context, fn func(tx querier) error) error {
	return s.inTxWhy(ctx, "", fn)
}

// inTxWhy is inTx recording reason in the address history.
func (s *Store) inTxWhy(ctx context.Context, reason string, fn func(tx querier) error) error {
	var err error
	for try := newTries(ctx); try.again(err); {
		err = s.txOnce(ctx, reason, fn)
	}
	return err
}

// tries counts the tries of a transaction that may collide with others,
// without a callback (which would take the caller's path back up into its
// own file):
//
//	for try := newTries(ctx); try.again(err); { err = once() }
//
// runs once, then again after a short backoff while err is a transient
// conflict (retryable), at most maxTxAttempts times in all.
type tries struct {
	ctx context.Context
	n   int
	// room also retries errNodeHasRoom: the node's room went to
	// concurrent allocations.
	room bool
}

func newTries(ctx context.Context) *tries { return &tries{ctx: ctx} }

// again reports whether to try (again) after err.
func (t *tries) again(err error) bool {
	t.n++
	switch {
	case t.n == 1:
		return true
	case err == nil, t.n > maxTxAttempts, !(retryable(err) || t.room && errors.Is(err, errNodeHasRoom)):
		return false
	}
	return retryWait(t.ctx, t.n-1)
}

// txOnce runs fn in one transaction (a pipelinedTx: its BEGIN and the
// history's context travel with its first statement) and commits it.
func (s *Store) txOnce(ctx context.Context, reason string, fn func(tx querier) error) error {
	tx, err := s.beginPipelined(ctx, reason)
	if err != nil {
		return err
	}
	defer tx.end(ctx)
	if err := fn(tx); err != nil {
		return err
	}
	return tx.commit(ctx)
}

// retryWait waits before attempt (1, 2, ...) of a transaction that
// collided with another: a jittered backoff (up to 1, 2, 4, then 8 ms) so
// the two do not collide again in lockstep. It is false when ctx ended.
func retryWait(ctx context.Context, attempt int) bool {
	t := time.NewTimer(time.Duration(rand.Int64N(int64(time.Millisecond) << min(attempt-1, 3))))
	select {
	case <-ctx.Done():
		t.Stop()
		return false
	case <-t.C:
		return true
	}
}

// PostgreSQL error codes the store reacts to.
const (
	codeUniqueViolation    = "23505"
	codeExclusionViolation = "23P01"
	codeForeignKey         = "23503"
	codeSerialization      = "40001"
	codeDeadlock           = "40P01"
)

// Constraints whose violations the store tells apart, by the names the
// migrations give them (TestConstraintNamesExist checks each exists).
const (
	// A second request for one attachment, one node name, or one workload
	// identity's binding raced the first.
	constraintLeaseAttachment = "leases_attachment"
	constraintNodeName        = "nodes_space_name_key"
	constraintStickyIdentity  = "leases_sticky_identity"
	// Two carves of one prefix raced.
	constraintBlockOverlap = "blocks_no_overlap"
	// The node was deleted (forced) while a block or a lease was taken.
	constraintBlockNode = "blocks_node_id_space_fkey"
	constraintLeaseNode = "leases_node_id_space_fkey"
	// The space was deleted while a pool or a node was written.
	constraintPoolSpace = "pools_space_fkey"
	constraintNodeSpace = "nodes_space_fkey"
	// A token name taken by a live token, or a secret drawn twice.
	constraintTokenLiveName = "api_tokens_live_name"
	constraintTokenSecret   = "api_tokens_secret_sha256_key"
)

// constraintNames lists the constants above, for the test.
var constraintNames = []string{constraintLeaseAttachment, constraintNodeName, constraintStickyIdentity, constraintBlockOverlap,
	constraintBlockNode, constraintLeaseNode, constraintPoolSpace, constraintNodeSpace, constraintTokenLiveName, constraintTokenSecret,
	constraintRangesPodVIP, constraintLBPoolName, constraintVIPAddr, constraintVIPPool}

func pgCode(err error) (code, constraint string) {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code, pe.ConstraintName
	}
	return "", ""
}

// retryable reports transient conflicts between concurrent transactions.
func retryable(err error) bool {
	code, constraint := pgCode(err)
	switch code {
	case codeSerialization, codeDeadlock:
		return true
	case codeUniqueViolation:
		// Two requests for one attachment raced; the retry finds the winner.
		// Two requests of one workload identity raced to bind it; the
		// retry finds the winner's binding.
		// Two owners raced for one named VIP; the retry finds it taken.
		return constraint == constraintLeaseAttachment || constraint == constraintNodeName || constraint == constraintStickyIdentity ||
			constraint == constraintVIPAddr
	case codeExclusionViolation:
		// Two carves of one prefix raced; the retry picks the next one.
		return constraint == constraintBlockOverlap
	case codeForeignKey:
		// The node was deleted (forced) while a lease was being taken;
		// the retry registers it again or reports it missing.
		return constraint == constraintBlockNode || constraint == constraintLeaseNode
	}
	return false
}

// spaceExists turns a missing object into the more useful "space not found"
// when the space itself is missing.
func (s *Store) spaceExists(ctx context.Context, q querier, space string) (bool, error) {
	var ok bool
	err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM address_spaces WHERE name = $1)`, space).Scan(&ok)
	return ok, err
}

// emptyListOf tells an empty list of a space (n == 0) from a list of a
// space that does not exist, which is not found.
func (s *Store) emptyListOf(ctx context.Context, space string, n int) error {
	if n > 0 {
		return nil
	}
	ok, err := s.spaceExists(ctx, s.db, space)
	if err == nil && !ok {
		err = alloc.NotFound("space", "address space", space)
	}
	return err
}

// notFoundIn answers the not-found error for what/name, or space-not-found
// when the space is missing.
func (s *Store) notFoundIn(ctx context.Context, q querier, space, field, what, name string) error {
	ok, err := s.spaceExists(ctx, q, space)
	if err != nil {
		return err
	}
	if !ok {
		return alloc.NotFound("space", "address space", space)
	}
	return alloc.NotFound(field, what, name)
}

// querier is what both a pool and a transaction offer.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}
