-- The address history's actor per node, for statements that change the
-- leases of several nodes at once.
--
-- A statement that writes one caller's changes sets the history's context
-- (actor, reason, time) with ipam_history_context, and the lease triggers
-- record that actor. A statement that merges the writes of several callers
-- (the store's write batcher: concurrent allocations and releases of
-- different nodes, each node's by its own certificate) sets
-- ipam_history_context_nodes instead: a JSON object from node id to actor,
-- which ipam_history_actor_of reads for each row's node. Each sets the
-- other's part empty, so a later statement of the same transaction never
-- inherits an earlier one's actors.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION ipam_history_context(actor text, reason text, at timestamptz) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT set_config('ipam.actor', coalesce(actor, ''), true) IS NOT NULL
       AND set_config('ipam.actors', '', true) IS NOT NULL
       AND set_config('ipam.reason', coalesce(reason, ''), true) IS NOT NULL
       AND set_config('ipam.at', coalesce(at::text, ''), true) IS NOT NULL
$$;

CREATE FUNCTION ipam_history_context_nodes(actors jsonb, reason text, at timestamptz) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT set_config('ipam.actor', '', true) IS NOT NULL
       AND set_config('ipam.actors', coalesce(actors::text, ''), true) IS NOT NULL
       AND set_config('ipam.reason', coalesce(reason, ''), true) IS NOT NULL
       AND set_config('ipam.at', coalesce(at::text, ''), true) IS NOT NULL
$$;

-- The actor of a change to a lease of node node: the node's in the
-- context's map when a merged statement set one, else the context's actor,
-- else the database user.
CREATE FUNCTION ipam_history_actor_of(node bigint) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce(nullif(nullif(current_setting('ipam.actors', true), '')::jsonb ->> node::text, ''),
        nullif(current_setting('ipam.actor', true), ''), 'db:' || session_user)
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_events_lease_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
    VALUES (NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
        (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id), NEW.state,
        nullif(NEW.owner_namespace, ''), nullif(NEW.owner_name, ''), NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
        ipam_history_actor_of(NEW.node_id), coalesce(nullif(ipam_history_reason(), ''), NEW.selected_by), NEW.generation);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION address_events_lease_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    actor text := ipam_history_actor_of(NEW.node_id);
    reason text := ipam_history_reason();
BEGIN
    IF OLD.state = 'released' THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        WITH c AS (
            SELECT (SELECT name FROM pools WHERE id = NEW.pool_id) AS pool_name,
                (SELECT name FROM nodes WHERE id = NEW.node_id) AS node_name
        )
        SELECT OLD.cooldown_until, 'cooldown-end', OLD.space, OLD.family, OLD.addr, OLD.block_cidr, c.pool_name, c.node_name, 'free',
            nullif(OLD.owner_namespace, ''), nullif(OLD.owner_name, ''), OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
            actor, 'reused', OLD.generation
        FROM c
        UNION ALL
        SELECT NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr, c.pool_name, c.node_name, NEW.state,
            nullif(NEW.owner_namespace, ''), nullif(NEW.owner_name, ''), NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
            actor, coalesce(nullif(reason, ''), NEW.selected_by), NEW.generation
        FROM c;
    ELSIF NEW.state = 'released' THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        VALUES (NEW.released_at, CASE WHEN reason = 'expired' THEN 'expire' ELSE 'release' END,
            NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
            (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id), 'cooling',
            nullif(OLD.owner_namespace, ''), nullif(OLD.owner_name, ''), OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
            actor, reason, OLD.generation);
    ELSIF NEW.network = 'cilium:crd' THEN
        -- A node's address for Cilium: a Pod started using it (reserved to
        -- active: a lease), stopped (active to reserved: a release, the
        -- address stays with the node), or another Pod took it over
        -- (active, a new generation: both). The store sets created_at to
        -- the instant of the change.
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        WITH c AS (
            SELECT (SELECT name FROM pools WHERE id = NEW.pool_id) AS pool_name,
                (SELECT name FROM nodes WHERE id = NEW.node_id) AS node_name
        )
        SELECT NEW.created_at, 'release', OLD.space, OLD.family, OLD.addr, OLD.block_cidr, c.pool_name, c.node_name, 'reserved',
            nullif(OLD.owner_namespace, ''), nullif(OLD.owner_name, ''), OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
            actor, reason, OLD.generation
        FROM c WHERE OLD.state = 'active'
        UNION ALL
        SELECT NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr, c.pool_name, c.node_name, NEW.state,
            nullif(NEW.owner_namespace, ''), nullif(NEW.owner_name, ''), NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
            actor, coalesce(nullif(reason, ''), NEW.selected_by), NEW.generation
        FROM c WHERE NEW.state = 'active';
    ELSIF OLD.state = 'pending' AND NEW.state = 'active' AND OLD.generation = NEW.generation THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        VALUES (coalesce(NEW.confirmed_at, ipam_history_at()), 'confirm',
            NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
            (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id),
            NEW.state, NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
            actor, reason, NEW.generation);
    ELSIF OLD.generation <> NEW.generation THEN
        -- Handed over in place: the old holder lets go, the new one leases.
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        WITH c AS (
            SELECT (SELECT name FROM pools WHERE id = NEW.pool_id) AS pool_name,
                (SELECT name FROM nodes WHERE id = NEW.node_id) AS node_name
        )
        SELECT NEW.created_at, 'release', OLD.space, OLD.family, OLD.addr, OLD.block_cidr, c.pool_name, c.node_name, 'active',
            OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
            actor, 'handed-over', OLD.generation
        FROM c
        UNION ALL
        SELECT NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr, c.pool_name, c.node_name, NEW.state,
            NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
            actor, coalesce(nullif(reason, ''), NEW.selected_by), NEW.generation
        FROM c;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION address_events_lease_delete() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    now_at timestamptz := ipam_history_at();
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
    VALUES (CASE WHEN OLD.state = 'released' THEN least(OLD.cooldown_until, now_at) ELSE now_at END,
        CASE WHEN OLD.state = 'released' THEN 'cooldown-end' ELSE 'release' END,
        OLD.space, OLD.family, OLD.addr, OLD.block_cidr,
        (SELECT name FROM pools WHERE id = OLD.pool_id), (SELECT name FROM nodes WHERE id = OLD.node_id), 'free',
        nullif(OLD.owner_namespace, ''), nullif(OLD.owner_name, ''), OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
        ipam_history_actor_of(OLD.node_id), coalesce(nullif(ipam_history_reason(), ''), 'deleted'), OLD.generation);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_events_lease_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
    VALUES (NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
        (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id), NEW.state,
        nullif(NEW.owner_namespace, ''), nullif(NEW.owner_name, ''), NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
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
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        WITH c AS (
            SELECT (SELECT name FROM pools WHERE id = NEW.pool_id) AS pool_name,
                (SELECT name FROM nodes WHERE id = NEW.node_id) AS node_name
        )
        SELECT OLD.cooldown_until, 'cooldown-end', OLD.space, OLD.family, OLD.addr, OLD.block_cidr, c.pool_name, c.node_name, 'free',
            nullif(OLD.owner_namespace, ''), nullif(OLD.owner_name, ''), OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
            actor, 'reused', OLD.generation
        FROM c
        UNION ALL
        SELECT NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr, c.pool_name, c.node_name, NEW.state,
            nullif(NEW.owner_namespace, ''), nullif(NEW.owner_name, ''), NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
            actor, coalesce(nullif(reason, ''), NEW.selected_by), NEW.generation
        FROM c;
    ELSIF NEW.state = 'released' THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        VALUES (NEW.released_at, CASE WHEN reason = 'expired' THEN 'expire' ELSE 'release' END,
            NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
            (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id), 'cooling',
            nullif(OLD.owner_namespace, ''), nullif(OLD.owner_name, ''), OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
            actor, reason, OLD.generation);
    ELSIF NEW.network = 'cilium:crd' THEN
        -- A node's address for Cilium: a Pod started using it (reserved to
        -- active: a lease), stopped (active to reserved: a release, the
        -- address stays with the node), or another Pod took it over
        -- (active, a new generation: both). The store sets created_at to
        -- the instant of the change.
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        WITH c AS (
            SELECT (SELECT name FROM pools WHERE id = NEW.pool_id) AS pool_name,
                (SELECT name FROM nodes WHERE id = NEW.node_id) AS node_name
        )
        SELECT NEW.created_at, 'release', OLD.space, OLD.family, OLD.addr, OLD.block_cidr, c.pool_name, c.node_name, 'reserved',
            nullif(OLD.owner_namespace, ''), nullif(OLD.owner_name, ''), OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
            actor, reason, OLD.generation
        FROM c WHERE OLD.state = 'active'
        UNION ALL
        SELECT NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr, c.pool_name, c.node_name, NEW.state,
            nullif(NEW.owner_namespace, ''), nullif(NEW.owner_name, ''), NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
            actor, coalesce(nullif(reason, ''), NEW.selected_by), NEW.generation
        FROM c WHERE NEW.state = 'active';
    ELSIF OLD.state = 'pending' AND NEW.state = 'active' AND OLD.generation = NEW.generation THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        VALUES (coalesce(NEW.confirmed_at, ipam_history_at()), 'confirm',
            NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
            (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id),
            NEW.state, NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
            actor, reason, NEW.generation);
    ELSIF OLD.generation <> NEW.generation THEN
        -- Handed over in place: the old holder lets go, the new one leases.
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        WITH c AS (
            SELECT (SELECT name FROM pools WHERE id = NEW.pool_id) AS pool_name,
                (SELECT name FROM nodes WHERE id = NEW.node_id) AS node_name
        )
        SELECT NEW.created_at, 'release', OLD.space, OLD.family, OLD.addr, OLD.block_cidr, c.pool_name, c.node_name, 'active',
            OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
            actor, 'handed-over', OLD.generation
        FROM c
        UNION ALL
        SELECT NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr, c.pool_name, c.node_name, NEW.state,
            NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
            actor, coalesce(nullif(reason, ''), NEW.selected_by), NEW.generation
        FROM c;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION address_events_lease_delete() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    now_at timestamptz := ipam_history_at();
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
    VALUES (CASE WHEN OLD.state = 'released' THEN least(OLD.cooldown_until, now_at) ELSE now_at END,
        CASE WHEN OLD.state = 'released' THEN 'cooldown-end' ELSE 'release' END,
        OLD.space, OLD.family, OLD.addr, OLD.block_cidr,
        (SELECT name FROM pools WHERE id = OLD.pool_id), (SELECT name FROM nodes WHERE id = OLD.node_id), 'free',
        nullif(OLD.owner_namespace, ''), nullif(OLD.owner_name, ''), OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
        ipam_history_actor(), coalesce(nullif(ipam_history_reason(), ''), 'deleted'), OLD.generation);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DROP FUNCTION ipam_history_actor_of(bigint);
DROP FUNCTION ipam_history_context_nodes(jsonb, text, timestamptz);
DROP FUNCTION ipam_history_context(text, text, timestamptz);
CREATE FUNCTION ipam_history_context(actor text, reason text, at timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('ipam.actor', coalesce(actor, ''), true),
            set_config('ipam.reason', coalesce(reason, ''), true),
            set_config('ipam.at', coalesce(at::text, ''), true);
    RETURN true;
END
$$;
-- +goose StatementEnd
