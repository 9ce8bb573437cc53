-- The history triggers of 00004 on leases, cheaper per row (they run on
-- every allocation and release), recording the same events with the same
-- values:
--   - generation is read from the row (leases.generation exists since
--     00005) instead of through to_jsonb, which serialized the whole row to
--     read one column;
--   - the update trigger no longer looks the pool's and node's names up in
--     statements of their own before it knows whether it records anything:
--     the statement that inserts the event does, and the two events of a
--     reuse in place share one lookup;
--   - a setting used more than once per row (the actor and reason of an
--     update, the clock of a delete) is read into a variable once. The
--     ipam_history_*() calls themselves cost nothing to keep: they are SQL
--     functions the planner inlines into current_setting expressions.
-- The triggers are not recreated. The update trigger's WHEN clause already
-- skips every update of leases the store makes that records nothing (a
-- binding set or ended: sticky.go); the only other one, active back to
-- pending, no code path makes.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_events_lease_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
    VALUES (NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
        (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id), NEW.state,
        NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.container_id, NEW.interface,
        ipam_history_actor(), coalesce(nullif(ipam_history_reason(), ''), NEW.selected_by), NEW.generation);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION address_events_lease_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    actor text := ipam_history_actor();
    reason text := ipam_history_reason();
BEGIN
    IF OLD.state = 'released' THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
        WITH c AS (
            SELECT (SELECT name FROM pools WHERE id = NEW.pool_id) AS pool_name,
                (SELECT name FROM nodes WHERE id = NEW.node_id) AS node_name
        )
        SELECT OLD.cooldown_until, 'cooldown-end', OLD.space, OLD.family, OLD.addr, OLD.block_cidr, c.pool_name, c.node_name, 'free',
            OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.container_id, OLD.interface,
            actor, 'reused', OLD.generation
        FROM c
        UNION ALL
        SELECT NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr, c.pool_name, c.node_name, NEW.state,
            NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.container_id, NEW.interface,
            actor, coalesce(nullif(reason, ''), NEW.selected_by), NEW.generation
        FROM c;
    ELSIF NEW.state = 'released' THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
        VALUES (NEW.released_at, CASE WHEN reason = 'expired' THEN 'expire' ELSE 'release' END,
            NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
            (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id), 'cooling',
            OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.container_id, OLD.interface,
            actor, reason, OLD.generation);
    ELSIF OLD.state = 'pending' AND NEW.state = 'active' THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
        VALUES (coalesce(NEW.confirmed_at, ipam_history_at()), 'confirm',
            NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
            (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id),
            NEW.state, NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.container_id, NEW.interface,
            actor, reason, NEW.generation);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION address_events_lease_delete() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    now_at timestamptz := ipam_history_at();
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, container_id, interface, actor, reason, generation)
    VALUES (CASE WHEN OLD.state = 'released' THEN least(OLD.cooldown_until, now_at) ELSE now_at END,
        CASE WHEN OLD.state = 'released' THEN 'cooldown-end' ELSE 'release' END,
        OLD.space, OLD.family, OLD.addr, OLD.block_cidr,
        (SELECT name FROM pools WHERE id = OLD.pool_id), (SELECT name FROM nodes WHERE id = OLD.node_id), 'free',
        OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.container_id, OLD.interface,
        ipam_history_actor(), coalesce(nullif(ipam_history_reason(), ''), 'deleted'), OLD.generation);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- The definitions of 00004, which read generation through to_jsonb, so they
-- work again once 00005's down drops the column.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_events_lease_insert() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE OR REPLACE FUNCTION address_events_lease_update() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE OR REPLACE FUNCTION address_events_lease_delete() RETURNS trigger LANGUAGE plpgsql AS $$
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
-- +goose StatementEnd
