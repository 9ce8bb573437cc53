-- LoadBalancer VIP pools (Cilium's CiliumLoadBalancerIPPool): blocks of
-- CIDRs or start/stop ranges in the same address spaces as Pod pools.
--
-- Two rules hold in the database, not only in the service:
--   * no VIP block overlaps a Pod pool CIDR of its space;
--   * no two VIP blocks overlap unless one of them belongs to a pool marked
--     conflicting (Cilium's cilium.io/PoolConflict: the later of two
--     overlapping pools is marked and gives nothing).
-- Both are exclusion constraints on one table, address_ranges, which holds
-- every range a pool claims: a row per Pod pool CIDR (kept by a trigger on
-- pool_cidrs, so no code path can add a CIDR without its claim) and a row
-- per VIP block (written with the block). A range type rather than CIDRs
-- lets a start/stop block be one row instead of its decomposition into up
-- to 254 prefixes.

-- +goose Up
CREATE TYPE inetrange AS RANGE (subtype = inet);

CREATE TABLE lb_pools (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    space            text NOT NULL REFERENCES address_spaces (name),
    name             text NOT NULL,
    labels           jsonb NOT NULL DEFAULT '{}',
    -- A Kubernetes label selector over a Service's labels plus its
    -- namespace and name; null selects every Service.
    service_selector jsonb,
    -- allowFirstLastIPs: No keeps the first and last address of each CIDR
    -- block out.
    reserve_first_last boolean NOT NULL DEFAULT false,
    disabled         boolean NOT NULL DEFAULT false,
    -- Why the pool is conflicting (it gives nothing); null when it is not.
    -- Mirrored on its address_ranges rows, where the constraint reads it.
    conflict         text,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    CONSTRAINT lb_pools_space_name UNIQUE (space, name)
);

CREATE TABLE address_ranges (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    space        text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('pod', 'vip')),
    -- Host addresses (/32, /128), first <= last, one family.
    first_addr   inet NOT NULL,
    last_addr    inet NOT NULL,
    span         inetrange GENERATED ALWAYS AS (inetrange(first_addr, last_addr, '[]')) STORED,
    pool_cidr_id bigint REFERENCES pool_cidrs (id) ON DELETE CASCADE,
    lb_pool_id   bigint REFERENCES lb_pools (id) ON DELETE CASCADE,
    -- VIP blocks: their place in the pool's spec and, for a CIDR block,
    -- the CIDR as written (null for a start/stop range).
    position     integer,
    cidr         cidr,
    conflicting  boolean NOT NULL DEFAULT false,
    CHECK ((kind = 'pod') = (pool_cidr_id IS NOT NULL)),
    CHECK ((kind = 'vip') = (lb_pool_id IS NOT NULL AND position IS NOT NULL)),
    CHECK (kind = 'vip' OR NOT conflicting),
    CHECK (family(first_addr) = family(last_addr) AND first_addr <= last_addr),
    CHECK (masklen(first_addr) = CASE family(first_addr) WHEN 4 THEN 32 ELSE 128 END
       AND masklen(last_addr) = masklen(first_addr)),
    CONSTRAINT address_ranges_pod_vip EXCLUDE USING gist (space WITH =, span WITH &&, kind WITH <>),
    CONSTRAINT address_ranges_vip EXCLUDE USING gist (space WITH =, span WITH &&)
        WHERE (kind = 'vip' AND NOT conflicting)
);
CREATE UNIQUE INDEX address_ranges_pool_cidr ON address_ranges (pool_cidr_id) WHERE pool_cidr_id IS NOT NULL;
CREATE UNIQUE INDEX address_ranges_lb_block ON address_ranges (lb_pool_id, position) WHERE lb_pool_id IS NOT NULL;

-- +goose StatementBegin
CREATE FUNCTION address_ranges_pool_cidr() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_ranges (space, kind, first_addr, last_addr, pool_cidr_id)
    VALUES (NEW.space, 'pod', host(network(NEW.cidr))::inet, host(broadcast(NEW.cidr))::inet, NEW.id);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER address_ranges_pool_cidr AFTER INSERT ON pool_cidrs
    FOR EACH ROW EXECUTE FUNCTION address_ranges_pool_cidr();

INSERT INTO address_ranges (space, kind, first_addr, last_addr, pool_cidr_id)
SELECT space, 'pod', host(network(cidr))::inet, host(broadcast(cidr))::inet, id FROM pool_cidrs;

-- The history records VIP pools as it records Pod pools. The kinds only
-- widen, so the rows already there satisfy the new check: NOT VALID spares
-- a scan of the whole history at upgrade.
ALTER TABLE address_events DROP CONSTRAINT address_events_kind_check;
ALTER TABLE address_events ADD CONSTRAINT address_events_kind_check CHECK (kind IN (
    'lease', 'confirm', 'release', 'expire', 'cooldown-end',
    'block-carve', 'block-adopt', 'block-release',
    'pool-create', 'pool-update', 'pool-delete',
    'lbpool-create', 'lbpool-update', 'lbpool-delete')) NOT VALID;

-- +goose StatementBegin
CREATE FUNCTION address_events_lb_pool() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO address_events (at, kind, space, pool, actor, reason)
        VALUES (ipam_history_at(), 'lbpool-delete', OLD.space, OLD.name, ipam_history_actor(), ipam_history_reason());
    ELSE
        INSERT INTO address_events (at, kind, space, pool, actor, reason)
        VALUES (CASE TG_OP WHEN 'INSERT' THEN NEW.created_at ELSE NEW.updated_at END,
            CASE TG_OP WHEN 'INSERT' THEN 'lbpool-create' ELSE 'lbpool-update' END,
            NEW.space, NEW.name, ipam_history_actor(),
            CASE WHEN TG_OP = 'UPDATE' AND OLD.conflict IS DISTINCT FROM NEW.conflict
                THEN coalesce('conflict: ' || NEW.conflict, 'conflict resolved')
                ELSE ipam_history_reason() END);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER address_events_lb_pool AFTER INSERT OR UPDATE OR DELETE ON lb_pools
    FOR EACH ROW EXECUTE FUNCTION address_events_lb_pool();

-- +goose Down
DROP TRIGGER address_events_lb_pool ON lb_pools;
DROP FUNCTION address_events_lb_pool();
DELETE FROM address_events WHERE kind LIKE 'lbpool-%';
ALTER TABLE address_events DROP CONSTRAINT address_events_kind_check;
ALTER TABLE address_events ADD CONSTRAINT address_events_kind_check CHECK (kind IN (
    'lease', 'confirm', 'release', 'expire', 'cooldown-end',
    'block-carve', 'block-adopt', 'block-release',
    'pool-create', 'pool-update', 'pool-delete')) NOT VALID;
DROP TRIGGER address_ranges_pool_cidr ON pool_cidrs;
DROP FUNCTION address_ranges_pool_cidr();
DROP TABLE address_ranges;
DROP TABLE lb_pools;
DROP TYPE inetrange;
