-- Pool semantics of Cilium cluster-pool, multi-pool and Kubernetes host
-- scope: how a pool gives nodes blocks, its selectors, pre-allocation,
-- reserved ranges, disabling, skip-masquerade; where a block came from; and
-- usage samples for the exhaustion forecast.

-- +goose Up
ALTER TABLE pools
    ADD COLUMN mode text NOT NULL DEFAULT 'multi-pool' CHECK (mode IN ('multi-pool', 'cluster-pool')),
    -- NULL: the default rule (8 for the default pool, 0 for others).
    ADD COLUMN pre_allocate integer CHECK (pre_allocate BETWEEN 0 AND 65536),
    -- Kubernetes metav1.LabelSelector as JSON; NULL when unset.
    ADD COLUMN pod_selector jsonb,
    ADD COLUMN namespace_selector jsonb,
    ADD COLUMN disabled boolean NOT NULL DEFAULT false,
    ADD COLUMN skip_masquerade boolean NOT NULL DEFAULT false;
-- Pool selection reads the pools of a space that have a selector on every
-- allocation that no name decides.
CREATE INDEX pools_with_selector ON pools (space)
    WHERE pod_selector IS NOT NULL OR namespace_selector IS NOT NULL;

-- Reserved ranges of a pool CIDR: inclusive [start, end] pairs, same index.
-- No new block may overlap one; blocks carved before stay.
ALTER TABLE pool_cidrs
    ADD COLUMN reserved_start inet[] NOT NULL DEFAULT '{}',
    ADD COLUMN reserved_end inet[] NOT NULL DEFAULT '{}',
    ADD CHECK (cardinality(reserved_start) = cardinality(reserved_end));

-- carved: from the pool by this service; adopted: a CIDR Kubernetes (or an
-- operator) had already given the node, registered with it.
-- emptied_at: when the block last became empty (allocated reached 0, set
-- by the purge); a multi-pool block goes back to its pool only after it
-- stayed empty for the hold-off, so nodes do not flap blocks.
ALTER TABLE blocks
    ADD COLUMN source text NOT NULL DEFAULT 'carved' CHECK (source IN ('carved', 'adopted')),
    ADD COLUMN emptied_at timestamptz;

-- The selection rule that chose a lease's pool (request, pod-annotation,
-- namespace-annotation, selector, default): the answer to "why this pool".
-- '' for leases made before this migration; reset when the row is reused.
ALTER TABLE leases ADD COLUMN selected_by text NOT NULL DEFAULT '';

-- Used addresses (leased + cooling) of a pool family over time, sampled by
-- the maintenance loop; the forecast fits a line through the recent ones.
CREATE TABLE pool_usage_samples (
    pool_id  bigint NOT NULL REFERENCES pools (id) ON DELETE CASCADE,
    family   smallint NOT NULL CHECK (family IN (4, 6)),
    at       timestamptz NOT NULL,
    used     bigint NOT NULL CHECK (used >= 0),
    capacity bigint NOT NULL CHECK (capacity >= 0),
    PRIMARY KEY (pool_id, family, at)
);
CREATE INDEX pool_usage_samples_at ON pool_usage_samples (at);

-- +goose Down
DROP TABLE pool_usage_samples;
ALTER TABLE leases DROP COLUMN selected_by;
ALTER TABLE blocks DROP COLUMN source, DROP COLUMN emptied_at;
ALTER TABLE pool_cidrs DROP COLUMN reserved_start, DROP COLUMN reserved_end;
DROP INDEX pools_with_selector;
ALTER TABLE pools DROP COLUMN mode, DROP COLUMN pre_allocate, DROP COLUMN pod_selector,
    DROP COLUMN namespace_selector, DROP COLUMN disabled, DROP COLUMN skip_masquerade;
