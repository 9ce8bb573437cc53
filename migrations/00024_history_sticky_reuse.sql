-- A reused address's cooldown ends when it is reused, if that is sooner.
--
-- 00015 dated the cooldown-end of a reuse at the released row's
-- cooldown_until. For an ordinary address that is right: nothing reuses
-- it earlier. A sticky address (00005) stays bound, and cooling, for the
-- longer of the cooldown and its retention, and the Pod that holds its
-- identity takes it back at any time before that: its cooldown-end was
-- then dated at the end of the binding, up to 720 hours after the change
-- that wrote it, and the address's history listed it after the lease
-- that followed it. The event now takes the earlier of the two instants,
-- which is the reusing lease's own time when the binding cut the
-- cooldown short, so the pair stays in order (cooldown-end, then lease).
--
-- Events already written that way and still dated in the future are
-- moved to the instant of the address's next event (the reusing lease,
-- written by the same statement: one address's events are serialized by
-- its lease row's lock, so the next id of that address is that lease).
-- Those whose wrong date has already passed stay: finding them would read
-- the whole history at start, and they are out of order only among their
-- own address's events of that day.

-- +goose Up
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_events_leases_updated() RETURNS trigger LANGUAGE plpgsql AS $$
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
        SELECT i, 1 AS k, least((o).cooldown_until, (n).created_at) AS at, 'cooldown-end' AS kind, (o).space AS space, (o).family AS family,
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

UPDATE address_events c SET at = f.next_at
FROM (
    SELECT e.ctid AS row, nx.at AS next_at
    FROM address_events e
    CROSS JOIN LATERAL (
        SELECT l.at FROM address_events l
        WHERE l.space = e.space AND l.address = e.address AND l.id > e.id
        ORDER BY l.id LIMIT 1
    ) nx
    WHERE e.at > now() AND e.kind = 'cooldown-end' AND e.reason = 'reused' AND nx.at < e.at
) f
WHERE c.ctid = f.row;

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_events_leases_updated() RETURNS trigger LANGUAGE plpgsql AS $$
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
