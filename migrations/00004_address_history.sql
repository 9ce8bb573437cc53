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
-- Pruning by age: a btree. A BRIN index would be nearly free to write
-- (rows arrive in about time order), but deletes never shrink its ranges'
-- summaries: once vacuum lets new rows into pruned pages, those ranges
-- still claim their old minimum, and every pruning pass would read them
-- again, until it reads the whole table every gc-interval. The btree costs
-- one more (rightmost, so cheap) insertion per event and keeps pruning
-- proportional to what it deletes.
CREATE INDEX address_events_at ON address_events (at);

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

-- Row-level triggers: on the allocation path each statement changes one
-- lease, and a row trigger with a WHEN clause costs less there than a
-- statement trigger's transition tables and joins (medians of 6 runs of the
-- store benchmark on a loaded machine, fsync off: +13% per allocate/release
-- pair against +22%).
-- generation is read through to_jsonb so this works before and after
-- leases gains that column.
CREATE FUNCTION address_events_lease_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
    VALUES (NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
        (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id), NEW.state,
        NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.container_id, NEW.interface,
        ipam_history_actor(), coalesce(nullif(ipam_history_reason(), ''), NEW.selected_by),
        (to_jsonb(NEW) ->> 'generation')::bigint);
    RETURN NULL;
END
$$;

-- A change of state: confirmation, release or expiry, or a cooled row
-- leased again in place (its cooldown ended when it did, then the new
-- holder leased it).
CREATE FUNCTION address_events_lease_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    pool_name text := (SELECT name FROM pools WHERE id = NEW.pool_id);
    node_name text := (SELECT name FROM nodes WHERE id = NEW.node_id);
    reason text := ipam_history_reason();
BEGIN
    IF OLD.state = 'released' THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
        VALUES (OLD.cooldown_until, 'cooldown-end', OLD.space, OLD.family, OLD.addr, OLD.block_cidr, pool_name, node_name, 'free',
            OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.container_id, OLD.interface,
            ipam_history_actor(), 'reused', (to_jsonb(OLD) ->> 'generation')::bigint),
           (NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr, pool_name, node_name, NEW.state,
            NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.container_id, NEW.interface,
            ipam_history_actor(), coalesce(nullif(reason, ''), NEW.selected_by), (to_jsonb(NEW) ->> 'generation')::bigint);
    ELSIF NEW.state = 'released' THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
        VALUES (NEW.released_at, CASE WHEN reason = 'expired' THEN 'expire' ELSE 'release' END,
            NEW.space, NEW.family, NEW.addr, NEW.block_cidr, pool_name, node_name, 'cooling',
            OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.container_id, OLD.interface,
            ipam_history_actor(), reason, (to_jsonb(OLD) ->> 'generation')::bigint);
    ELSIF OLD.state = 'pending' AND NEW.state = 'active' THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
        VALUES (coalesce(NEW.confirmed_at, ipam_history_at()), 'confirm', NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
            pool_name, node_name, NEW.state, NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.container_id, NEW.interface,
            ipam_history_actor(), reason, (to_jsonb(NEW) ->> 'generation')::bigint);
    END IF;
    RETURN NULL;
END
$$;

-- A held lease deleted outright (its node deleted with force) is released
-- and freed at once; a cooling one ends its cooldown: when it was due if
-- that has passed (the purge), else now.
CREATE FUNCTION address_events_lease_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
    VALUES (CASE WHEN OLD.state = 'released' THEN least(OLD.cooldown_until, ipam_history_at()) ELSE ipam_history_at() END,
        CASE WHEN OLD.state = 'released' THEN 'cooldown-end' ELSE 'release' END,
        OLD.space, OLD.family, OLD.addr, OLD.block_cidr,
        (SELECT name FROM pools WHERE id = OLD.pool_id), (SELECT name FROM nodes WHERE id = OLD.node_id), 'free',
        OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.container_id, OLD.interface,
        ipam_history_actor(), coalesce(nullif(ipam_history_reason(), ''), 'deleted'),
        (to_jsonb(OLD) ->> 'generation')::bigint);
    RETURN NULL;
END
$$;

CREATE FUNCTION address_events_block() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    b blocks;
BEGIN
    IF TG_OP = 'DELETE' THEN
        b := OLD;
    ELSE
        b := NEW;
    END IF;
    INSERT INTO address_events (at, kind, space, family, block, pool, node, actor, reason)
    VALUES (CASE TG_OP WHEN 'DELETE' THEN ipam_history_at() ELSE b.created_at END,
        CASE WHEN TG_OP = 'DELETE' THEN 'block-release' WHEN b.source = 'adopted' THEN 'block-adopt' ELSE 'block-carve' END,
        b.space, b.family, b.cidr, (SELECT name FROM pools WHERE id = b.pool_id), (SELECT name FROM nodes WHERE id = b.node_id),
        ipam_history_actor(), ipam_history_reason());
    RETURN NULL;
END
$$;

CREATE FUNCTION address_events_pool() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO address_events (at, kind, space, pool, actor, reason)
        VALUES (ipam_history_at(), 'pool-delete', OLD.space, OLD.name, ipam_history_actor(), ipam_history_reason());
    ELSE
        INSERT INTO address_events (at, kind, space, pool, actor, reason)
        VALUES (CASE TG_OP WHEN 'INSERT' THEN NEW.created_at ELSE NEW.updated_at END,
            CASE TG_OP WHEN 'INSERT' THEN 'pool-create' ELSE 'pool-update' END,
            NEW.space, NEW.name, ipam_history_actor(), ipam_history_reason());
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER address_events_lease_insert AFTER INSERT ON leases
    FOR EACH ROW EXECUTE FUNCTION address_events_lease_insert();
-- Only changes of state are events; the WHEN clause spares the function
-- call for any other update.
CREATE TRIGGER address_events_lease_update AFTER UPDATE ON leases
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION address_events_lease_update();
CREATE TRIGGER address_events_lease_delete AFTER DELETE ON leases
    FOR EACH ROW EXECUTE FUNCTION address_events_lease_delete();
-- Blocks: carving, adoption and release; their counters' updates are not
-- events.
CREATE TRIGGER address_events_block AFTER INSERT OR DELETE ON blocks
    FOR EACH ROW EXECUTE FUNCTION address_events_block();
CREATE TRIGGER address_events_pool AFTER INSERT OR UPDATE OR DELETE ON pools
    FOR EACH ROW EXECUTE FUNCTION address_events_pool();

-- +goose Down
DROP TRIGGER address_events_pool ON pools;
DROP TRIGGER address_events_block ON blocks;
DROP TRIGGER address_events_lease_delete ON leases;
DROP TRIGGER address_events_lease_update ON leases;
DROP TRIGGER address_events_lease_insert ON leases;
DROP FUNCTION address_events_pool();
DROP FUNCTION address_events_block();
DROP FUNCTION address_events_lease_delete();
DROP FUNCTION address_events_lease_update();
DROP FUNCTION address_events_lease_insert();
DROP FUNCTION ipam_history_at();
DROP FUNCTION ipam_history_reason();
DROP FUNCTION ipam_history_actor();
DROP FUNCTION ipam_history_context(text, text, timestamptz);
DROP TABLE address_events;
