-- The CNI network of each attachment (issue 12, part F).
--
-- network: the name of the CNI network configuration the attachment was
-- made through ('' for callers that name none). The CNI specification keys
-- an attachment by (network name, container ID, interface name) and lists
-- a runtime's valid attachments per network in GC, so the lease key
-- includes it: a reconcile for one network releases that network's leases
-- only, never another network's on the same node, and one network's DEL
-- never releases another's leases of the same container and interface.
--
-- address_events records the network of lease events, and one more
-- event pair: a held lease handed over in place to another attachment (a
-- node's reserve address given to a Pod the node started while the
-- service was unreachable) is a 'release' by the old attachment (state
-- 'active': the address never cools) and a 'lease' by the new one. The
-- store gives a handed-over lease a new generation, which is what the
-- update trigger's WHEN clause looks for.

-- +goose Up
ALTER TABLE leases ADD COLUMN network text NOT NULL DEFAULT ''
    CHECK (length(network) <= 253);
ALTER TABLE address_events ADD COLUMN network text;

DROP INDEX leases_attachment;
CREATE UNIQUE INDEX leases_attachment ON leases (node_id, network, container_id, interface, family)
    WHERE state <> 'released';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_events_lease_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
        owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
    VALUES (NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
        (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id), NEW.state,
        NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
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
            OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
            actor, 'reused', OLD.generation
        FROM c
        UNION ALL
        SELECT NEW.created_at, 'lease', NEW.space, NEW.family, NEW.addr, NEW.block_cidr, c.pool_name, c.node_name, NEW.state,
            NEW.owner_namespace, NEW.owner_name, NEW.owner_uid, NEW.network, NEW.container_id, NEW.interface,
            actor, coalesce(nullif(reason, ''), NEW.selected_by), NEW.generation
        FROM c;
    ELSIF NEW.state = 'released' THEN
        INSERT INTO address_events (at, kind, space, family, address, block, pool, node, state,
            owner_namespace, owner_name, owner_uid, network, container_id, interface, actor, reason, generation)
        VALUES (NEW.released_at, CASE WHEN reason = 'expired' THEN 'expire' ELSE 'release' END,
            NEW.space, NEW.family, NEW.addr, NEW.block_cidr,
            (SELECT name FROM pools WHERE id = NEW.pool_id), (SELECT name FROM nodes WHERE id = NEW.node_id), 'cooling',
            OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
            actor, reason, OLD.generation);
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
        OLD.owner_namespace, OLD.owner_name, OLD.owner_uid, OLD.network, OLD.container_id, OLD.interface,
        ipam_history_actor(), coalesce(nullif(ipam_history_reason(), ''), 'deleted'), OLD.generation);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

DROP TRIGGER address_events_lease_update ON leases;
CREATE TRIGGER address_events_lease_update AFTER UPDATE ON leases
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.generation <> NEW.generation)
    EXECUTE FUNCTION address_events_lease_update();

-- +goose Down
DROP TRIGGER address_events_lease_update ON leases;
CREATE TRIGGER address_events_lease_update AFTER UPDATE ON leases
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION address_events_lease_update();

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

-- Two attachments that differ only in network cannot both be held under
-- the old key: release the later ones' leases before restoring it.
UPDATE leases l SET state = 'released', expires_at = NULL, released_at = now(), cooldown_until = now()
WHERE l.state <> 'released' AND EXISTS (
    SELECT 1 FROM leases o WHERE o.state <> 'released' AND o.node_id = l.node_id AND o.container_id = l.container_id
      AND o.interface = l.interface AND o.family = l.family AND o.network < l.network);
DROP INDEX leases_attachment;
CREATE UNIQUE INDEX leases_attachment ON leases (node_id, container_id, interface, family)
    WHERE state <> 'released';
ALTER TABLE address_events DROP COLUMN network;
ALTER TABLE leases DROP COLUMN network;
