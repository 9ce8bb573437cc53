-- The address history: one append-only row per change of a lease, a block
-- or a pool, written by triggers in the transaction that makes the change,
-- so no code path (today's or a future one, or an operator's psql session)
-- can change an address without leaving its record, and a rolled-back
-- change leaves none.
--
-- Who and why reach the triggers through transaction-local settings, which
-- the store folds into statements it already sends (its BEGIN, or the
-- changing statement itself), so recording costs no extra round trip:
--   ipam.actor  who asked ("node:NAME", "cert:CN", "system", ...); a change
--               made without one is recorded as "db:<database user>";
--   ipam.reason why (release by attachment or address, reconcile, expiry,
--               purge, rebalance, node deletion, ...);
--   ipam.at     the service's clock, for changes whose rows carry no time
--               of their own (deletions); else the database's clock.
-- Times of lease changes come from the rows themselves (created_at,
-- confirmed_at, released_at, cooldown_until), which the service writes
-- from the same clock.

-- +goose Up
CREATE TABLE address_events (
    -- No primary key: the identity is unique by construction, and every
    -- index here is written on every lease and release. id orders events
    -- of the same instant (the pagination key is (at, id)).
    id              bigint GENERATED ALWAYS AS IDENTITY,
    at              timestamptz NOT NULL,
    kind            text NOT NULL CHECK (kind IN (
                        'lease', 'confirm', 'release', 'expire', 'cooldown-end',
                        'block-carve', 'block-adopt', 'block-release',
                        'pool-create', 'pool-update', 'pool-delete')),
    space           text NOT NULL,
    family          smallint CHECK (family IN (4, 6)),
    address         inet,  -- lease events
    block           cidr,  -- lease and block events
    pool            text,  -- names, not ids: a name outlives a deleted and
    node            text,  -- re-created object, and is what people ask about
    state           text,  -- the lease's state after the event
    owner_namespace text,
    owner_name      text,
    owner_uid       text,
    container_id    text,
    interface       text,
    actor           text NOT NULL,
    reason          text NOT NULL DEFAULT '',
    -- The lease's generation (leases.generation, when that column exists).
    generation      bigint,
    -- The database's clock when the event was written; at is the service's.
    recorded_at     timestamptz NOT NULL DEFAULT now()
);
-- The three questions: an address, an owner, a node, each over time.
CREATE INDEX address_events_address ON address_events (space, address, at, id) WHERE address IS NOT NULL;
CREATE INDEX address_events_owner ON address_events (space, owner_namespace, owner_name, at, id) WHERE owner_name IS NOT NULL;
CREATE INDEX address_events_node ON address_events (space, node, at, id) WHERE node IS NOT NULL;
-- Pruning by age. Rows arrive in time order and are never updated, so the
-- table is physically sorted by at: a BRIN index (a few pages, one summary
-- per 128 heap pages) finds the oldest rows, where a btree would add a
-- fourth index insertion to every lease and release for a once-a-pass query.
CREATE INDEX address_events_at ON address_events USING brin (at) WITH (autosummarize = on);

-- ipam_history_context sets who and why for the rest of the transaction.
-- The store calls it from a statement's WHERE clause, as an InitPlan that
-- runs before any row changes; AFTER triggers run after the statement, so
-- they see it.
-- +goose StatementBegin
CREATE FUNCTION ipam_history_context(actor text, reason text, at timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('ipam.actor', coalesce(actor, ''), true),
            set_config('ipam.reason', coalesce(reason, ''), true),
            set_config('ipam.at', coalesce(at::text, ''), true);
    RETURN true;
END
$$;

CREATE FUNCTION ipam_history_actor() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('ipam.actor', true), ''), 'db:' || session_user)
$$;

CREATE FUNCTION ipam_history_reason() RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(current_setting('ipam.reason', true), '')
$$;

CREATE FUNCTION ipam_history_at() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(current_setting('ipam.at', true), '')::timestamptz, now())
$$;

-- Leases. One statement-level trigger per operation, reading the statement's
-- transition tables: one INSERT ... SELECT per statement, whether it
-- changed one lease (an allocation) or a thousand (a purge batch).
-- generation is read through to_jsonb so this works before and after
-- leases gains that column.
CREATE FUNCTION address_events_lease_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
    SELECT l.created_at, 'lease', l.space, l.family, l.addr, l.block_cidr, p.name, n.name, l.state,
        l.owner_namespace, l.owner_name, l.owner_uid, l.container_id, l.interface,
        ipam_history_actor(), coalesce(nullif(ipam_history_reason(), ''), l.selected_by),
        (to_jsonb(l) ->> 'generation')::bigint
    FROM new_leases l
    LEFT JOIN nodes n ON n.id = l.node_id
    LEFT JOIN pools p ON p.id = l.pool_id;
    RETURN NULL;
END
$$;

CREATE FUNCTION address_events_lease_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
    SELECT e.at, e.kind, l.space, l.family, l.addr, l.block_cidr, p.name, n.name, e.state,
        e.owner_namespace, e.owner_name, e.owner_uid, e.container_id, e.interface,
        ipam_history_actor(), e.reason, e.generation
    FROM old_leases o
    JOIN new_leases l USING (space, addr)
    LEFT JOIN nodes n ON n.id = l.node_id
    LEFT JOIN pools p ON p.id = l.pool_id
    CROSS JOIN LATERAL (
        -- A released row leased again in place: its cooldown ended (when
        -- it did), then the new holder leased it.
        SELECT o.cooldown_until AS at, 'cooldown-end' AS kind, 'free' AS state,
               o.owner_namespace, o.owner_name, o.owner_uid, o.container_id, o.interface,
               'reused' AS reason, (to_jsonb(o) ->> 'generation')::bigint AS generation, 1 AS ord
        WHERE o.state = 'released' AND l.state <> 'released'
        UNION ALL
        SELECT l.created_at, 'lease', l.state, l.owner_namespace, l.owner_name, l.owner_uid, l.container_id, l.interface,
               coalesce(nullif(ipam_history_reason(), ''), l.selected_by), (to_jsonb(l) ->> 'generation')::bigint, 2
        WHERE o.state = 'released' AND l.state <> 'released'
        UNION ALL
        SELECT l.confirmed_at, 'confirm', l.state, l.owner_namespace, l.owner_name, l.owner_uid, l.container_id, l.interface,
               ipam_history_reason(), (to_jsonb(l) ->> 'generation')::bigint, 1
        WHERE o.state = 'pending' AND l.state = 'active'
        UNION ALL
        SELECT l.released_at, CASE WHEN ipam_history_reason() = 'expired' THEN 'expire' ELSE 'release' END, 'cooling',
               o.owner_namespace, o.owner_name, o.owner_uid, o.container_id, o.interface,
               ipam_history_reason(), (to_jsonb(o) ->> 'generation')::bigint, 1
        WHERE o.state <> 'released' AND l.state = 'released'
    ) e
    ORDER BY l.addr, e.ord;
    RETURN NULL;
END
$$;

CREATE FUNCTION address_events_lease_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- A held lease deleted outright (its node deleted with force) is
    -- released and freed at once; a cooling one ends its cooldown: when it
    -- was due if that has passed (the purge), else now.
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
    SELECT e.at, e.kind, o.space, o.family, o.addr, o.block_cidr, p.name, n.name, 'free',
        o.owner_namespace, o.owner_name, o.owner_uid, o.container_id, o.interface,
        ipam_history_actor(), coalesce(nullif(ipam_history_reason(), ''), 'deleted'),
        (to_jsonb(o) ->> 'generation')::bigint
    FROM old_leases o
    LEFT JOIN nodes n ON n.id = o.node_id
    LEFT JOIN pools p ON p.id = o.pool_id
    CROSS JOIN LATERAL (
        SELECT CASE WHEN o.state = 'released' THEN least(o.cooldown_until, ipam_history_at()) ELSE ipam_history_at() END AS at,
               CASE WHEN o.state = 'released' THEN 'cooldown-end' ELSE 'release' END AS kind
    ) e
    ORDER BY o.addr;
    RETURN NULL;
END
$$;

CREATE FUNCTION address_events_block_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, block, pool, node, actor, reason)
    SELECT b.created_at, CASE b.source WHEN 'adopted' THEN 'block-adopt' ELSE 'block-carve' END,
        b.space, b.family, b.cidr, p.name, n.name, ipam_history_actor(), ipam_history_reason()
    FROM new_blocks b
    LEFT JOIN nodes n ON n.id = b.node_id
    LEFT JOIN pools p ON p.id = b.pool_id
    ORDER BY b.id;
    RETURN NULL;
END
$$;

CREATE FUNCTION address_events_block_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, block, pool, node, actor, reason)
    SELECT ipam_history_at(), 'block-release', b.space, b.family, b.cidr, p.name, n.name,
        ipam_history_actor(), ipam_history_reason()
    FROM old_blocks b
    LEFT JOIN nodes n ON n.id = b.node_id
    LEFT JOIN pools p ON p.id = b.pool_id
    ORDER BY b.id;
    RETURN NULL;
END
$$;

CREATE FUNCTION address_events_pool_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, pool, actor, reason)
    SELECT p.created_at, 'pool-create', p.space, p.name, ipam_history_actor(), ipam_history_reason()
    FROM new_pools p ORDER BY p.id;
    RETURN NULL;
END
$$;

CREATE FUNCTION address_events_pool_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, pool, actor, reason)
    SELECT p.updated_at, 'pool-update', p.space, p.name, ipam_history_actor(), ipam_history_reason()
    FROM new_pools p ORDER BY p.id;
    RETURN NULL;
END
$$;

CREATE FUNCTION address_events_pool_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, pool, actor, reason)
    SELECT ipam_history_at(), 'pool-delete', p.space, p.name, ipam_history_actor(), ipam_history_reason()
    FROM old_pools p ORDER BY p.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER address_events_lease_insert AFTER INSERT ON leases
    REFERENCING NEW TABLE AS new_leases FOR EACH STATEMENT EXECUTE FUNCTION address_events_lease_insert();
CREATE TRIGGER address_events_lease_update AFTER UPDATE ON leases
    REFERENCING OLD TABLE AS old_leases NEW TABLE AS new_leases FOR EACH STATEMENT EXECUTE FUNCTION address_events_lease_update();
CREATE TRIGGER address_events_lease_delete AFTER DELETE ON leases
    REFERENCING OLD TABLE AS old_leases FOR EACH STATEMENT EXECUTE FUNCTION address_events_lease_delete();
CREATE TRIGGER address_events_block_insert AFTER INSERT ON blocks
    REFERENCING NEW TABLE AS new_blocks FOR EACH STATEMENT EXECUTE FUNCTION address_events_block_insert();
CREATE TRIGGER address_events_block_delete AFTER DELETE ON blocks
    REFERENCING OLD TABLE AS old_blocks FOR EACH STATEMENT EXECUTE FUNCTION address_events_block_delete();
CREATE TRIGGER address_events_pool_insert AFTER INSERT ON pools
    REFERENCING NEW TABLE AS new_pools FOR EACH STATEMENT EXECUTE FUNCTION address_events_pool_insert();
CREATE TRIGGER address_events_pool_update AFTER UPDATE ON pools
    REFERENCING OLD TABLE AS old_pools NEW TABLE AS new_pools FOR EACH STATEMENT EXECUTE FUNCTION address_events_pool_update();
CREATE TRIGGER address_events_pool_delete AFTER DELETE ON pools
    REFERENCING OLD TABLE AS old_pools FOR EACH STATEMENT EXECUTE FUNCTION address_events_pool_delete();

-- +goose Down
DROP TRIGGER address_events_pool_delete ON pools;
DROP TRIGGER address_events_pool_update ON pools;
DROP TRIGGER address_events_pool_insert ON pools;
DROP TRIGGER address_events_block_delete ON blocks;
DROP TRIGGER address_events_block_insert ON blocks;
DROP TRIGGER address_events_lease_delete ON leases;
DROP TRIGGER address_events_lease_update ON leases;
DROP TRIGGER address_events_lease_insert ON leases;
DROP FUNCTION address_events_pool_delete();
DROP FUNCTION address_events_pool_update();
DROP FUNCTION address_events_pool_insert();
DROP FUNCTION address_events_block_delete();
DROP FUNCTION address_events_block_insert();
DROP FUNCTION address_events_lease_delete();
DROP FUNCTION address_events_lease_update();
DROP FUNCTION address_events_lease_insert();
DROP FUNCTION ipam_history_at();
DROP FUNCTION ipam_history_reason();
DROP FUNCTION ipam_history_actor();
DROP FUNCTION ipam_history_context(text, text, timestamptz);
DROP TABLE address_events;
