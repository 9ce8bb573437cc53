-- The lease history triggers, once per statement instead of once per row.
--
-- 00004 chose row triggers because each statement of the allocation path
-- changed one lease. Since the store batches, one statement leases or
-- releases the addresses of many requests, and a row trigger paid, per
-- lease, a function call and an INSERT of one event (its executor start
-- and end). These statement triggers insert the events of a whole
-- statement with one INSERT over its transition tables. They record the
-- same events, field for field, as 00012's row triggers; an update's old
-- and new rows are paired by the primary key (space, addr), which no
-- update of a lease changes. The events of one lease keep their order
-- (a cooldown's end before the lease that reuses the address, a release
-- before the lease that takes over); those of different leases of one
-- statement are in no particular order.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION address_events_leases_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
    SELECT n.created_at, 'lease', n.space, n.family, n.addr, n.block_cidr,
        (SELECT name FROM pools WHERE id = n.pool_id), (SELECT name FROM nodes WHERE id = n.node_id), n.state,
        nullif(n.owner_namespace, ''), nullif(n.owner_name, ''), n.owner_uid, n.network, n.container_id, n.interface,
        ipam_history_actor_of(n.node_id), coalesce(nullif(ipam_history_reason(), ''), n.selected_by), n.generation
    FROM inserted n;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- One SELECT per branch of 00012's address_events_lease_update, in its
-- order, each also excluding the branches before it; k orders the events
-- of one lease.
-- +goose StatementBegin
CREATE FUNCTION address_events_leases_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
    WITH ch AS MATERIALIZED (
        SELECT row_number() OVER () AS i, o, n,
            ipam_history_actor_of(n.node_id) AS actor, ipam_history_reason() AS reason,
            (SELECT name FROM pools WHERE id = n.pool_id) AS pool_name,
            (SELECT name FROM nodes WHERE id = n.node_id) AS node_name,
            CASE
                WHEN o.state = 'released' THEN 'reused'
                WHEN n.state = 'released' THEN 'released'
                WHEN n.network = 'cilium:crd' THEN 'crd'
                WHEN o.state = 'pending' AND n.state = 'active' AND o.generation = n.generation THEN 'confirmed'
                WHEN o.generation <> n.generation THEN 'handed-over'
            END AS change
        FROM updated n JOIN replaced o ON o.space = n.space AND o.addr = n.addr
        -- 00008's WHEN clause of the row trigger.
        WHERE o.state IS DISTINCT FROM n.state OR o.generation <> n.generation
    ), e AS (
        SELECT i, 1 AS k, (o).cooldown_until AS at, 'cooldown-end' AS kind, (o).space AS space, (o).family AS family,
            (o).addr AS addr, (o).block_cidr AS block, pool_name, node_name, 'free' AS state,
            nullif((o).owner_namespace, '') AS owner_namespace, nullif((o).owner_name, '') AS owner_name, (o).owner_uid AS owner_uid,
            (o).network AS network, (o).container_id AS container_id, (o).interface AS interface,
            actor, 'reused' AS reason, (o).generation AS generation
        FROM ch WHERE change = 'reused'
        UNION ALL
        SELECT i, 2, (n).created_at, 'lease', (n).space, (n).family, (n).addr, (n).block_cidr, pool_name, node_name, (n).state,
            nullif((n).owner_namespace, ''), nullif((n).owner_name, ''), (n).owner_uid, (n).network, (n).container_id, (n).interface,
            actor, coalesce(nullif(reason, ''), (n).selected_by), (n).generation
        FROM ch WHERE change = 'reused'
        UNION ALL
        SELECT i, 1, (n).released_at, CASE WHEN reason = 'expired' THEN 'expire' ELSE 'release' END,
            (n).space, (n).family, (n).addr, (n).block_cidr, pool_name, node_name, 'cooling',
            nullif((o).owner_namespace, ''), nullif((o).owner_name, ''), (o).owner_uid, (o).network, (o).container_id, (o).interface,
            actor, reason, (o).generation
        FROM ch WHERE change = 'released'
        UNION ALL
        -- A node's address for Cilium: a Pod started using it (reserved to
        -- active: a lease), stopped (active to reserved: a release, the
        -- address stays with the node), or another Pod took it over
        -- (active, a new generation: both).
        SELECT i, 1, (n).created_at, 'release', (o).space, (o).family, (o).addr, (o).block_cidr, pool_name, node_name, 'reserved',
            nullif((o).owner_namespace, ''), nullif((o).owner_name, ''), (o).owner_uid, (o).network, (o).container_id, (o).interface,
            actor, reason, (o).generation
        FROM ch WHERE change = 'crd' AND (o).state = 'active'
        UNION ALL
        SELECT i, 2, (n).created_at, 'lease', (n).space, (n).family, (n).addr, (n).block_cidr, pool_name, node_name, (n).state,
            nullif((n).owner_namespace, ''), nullif((n).owner_name, ''), (n).owner_uid, (n).network, (n).container_id, (n).interface,
            actor, coalesce(nullif(reason, ''), (n).selected_by), (n).generation
        FROM ch WHERE change = 'crd' AND (n).state = 'active'
        UNION ALL
        SELECT i, 1, coalesce((n).confirmed_at, ipam_history_at()), 'confirm',
            (n).space, (n).family, (n).addr, (n).block_cidr, pool_name, node_name,
            (n).state, (n).owner_namespace, (n).owner_name, (n).owner_uid, (n).network, (n).container_id, (n).interface,
            actor, reason, (n).generation
        FROM ch WHERE change = 'confirmed'
        UNION ALL
        -- Handed over in place: the old holder lets go, the new one leases.
        SELECT i, 1, (n).created_at, 'release', (o).space, (o).family, (o).addr, (o).block_cidr, pool_name, node_name, 'active',
            (o).owner_namespace, (o).owner_name, (o).owner_uid, (o).network, (o).container_id, (o).interface,
            actor, 'handed-over', (o).generation
        FROM ch WHERE change = 'handed-over'
        UNION ALL
        SELECT i, 2, (n).created_at, 'lease', (n).space, (n).family, (n).addr, (n).block_cidr, pool_name, node_name, (n).state,
            (n).owner_namespace, (n).owner_name, (n).owner_uid, (n).network, (n).container_id, (n).interface,
            actor, coalesce(nullif(reason, ''), (n).selected_by), (n).generation
        FROM ch WHERE change = 'handed-over'
    )
    SELECT at, kind, space, family, addr, block, pool_name, node_name, state, owner_namespace, owner_name, owner_uid,
        network, container_id, interface, actor, reason, generation
    FROM e ORDER BY i, k;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION address_events_leases_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    now_at timestamptz := ipam_history_at();
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
    SELECT CASE WHEN o.state = 'released' THEN least(o.cooldown_until, now_at) ELSE now_at END,
        CASE WHEN o.state = 'released' THEN 'cooldown-end' ELSE 'release' END,
        o.space, o.family, o.addr, o.block_cidr,
        (SELECT name FROM pools WHERE id = o.pool_id), (SELECT name FROM nodes WHERE id = o.node_id), 'free',
        nullif(o.owner_namespace, ''), nullif(o.owner_name, ''), o.owner_uid, o.network, o.container_id, o.interface,
        ipam_history_actor_of(o.node_id), coalesce(nullif(ipam_history_reason(), ''), 'deleted'), o.generation
    FROM deleted o;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER address_events_lease_insert ON leases;
DROP TRIGGER address_events_lease_update ON leases;
DROP TRIGGER address_events_lease_delete ON leases;
CREATE TRIGGER address_events_leases_insert AFTER INSERT ON leases
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION address_events_leases_inserted();
CREATE TRIGGER address_events_leases_update AFTER UPDATE ON leases
    REFERENCING OLD TABLE AS replaced NEW TABLE AS updated
    FOR EACH STATEMENT EXECUTE FUNCTION address_events_leases_updated();
CREATE TRIGGER address_events_leases_delete AFTER DELETE ON leases
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION address_events_leases_deleted();

-- +goose Down
DROP TRIGGER address_events_leases_insert ON leases;
DROP TRIGGER address_events_leases_update ON leases;
DROP TRIGGER address_events_leases_delete ON leases;
DROP FUNCTION address_events_leases_inserted();
DROP FUNCTION address_events_leases_updated();
DROP FUNCTION address_events_leases_deleted();
CREATE TRIGGER address_events_lease_insert AFTER INSERT ON leases
    FOR EACH ROW EXECUTE FUNCTION address_events_lease_insert();
CREATE TRIGGER address_events_lease_update AFTER UPDATE ON leases
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.generation <> NEW.generation)
    EXECUTE FUNCTION address_events_lease_update();
CREATE TRIGGER address_events_lease_delete AFTER DELETE ON leases
    FOR EACH ROW EXECUTE FUNCTION address_events_lease_delete();
