-- Cilium's crd mode (issue 13): the service plays Cilium's operator and
-- writes single addresses into each node's CiliumNode (spec.ipam.pool);
-- the node's agent hands them to Pods and reports them in
-- status.ipam.used.
--
-- Every address in a node's pool is a lease row held by the node, so no
-- address is in two nodes' pools or leased to anything else (the primary
-- key (space, addr)):
--   reserved  held by the node, used by no Pod (owner empty); after a Pod
--             stopped using it, cooldown_until says until when it stays
--             with the node (the agent's view of it trails by up to 15 s);
--   active    used by the Pod the agent names (the owner);
--   released  given back to the pool: cooling, then reused or purged as
--             every released row.
-- The rows are attachments of their own (internal/alloc/nodepool.go):
-- network 'cilium:crd', which no CNI network name can be, so no CNI plugin
-- or REST call can name them; container_id the address's text (host());
-- interface 'pool'.
--
-- nodes.cilium_crd marks the nodes the operator serves this way: their
-- capacity follows their CiliumNode's watermarks, so the multi-pool
-- pre-allocation of blocks (Rebalance) does not apply to them.
-- pools.node_selector chooses a node's pool by its labels.
--
-- The history triggers record the node's holding: a reserved row's insert
-- is a 'lease' (state reserved, no owner); a Pod starting to use it a
-- 'lease' by the Pod; a Pod stopping a 'release' by the Pod (state
-- reserved); another Pod taking it over a release and a lease; a release
-- to the pool a 'release' (state cooling). Empty owners are recorded as
-- none. Everything else records what 00008 recorded.

-- +goose Up
ALTER TABLE leases
    DROP CONSTRAINT leases_state_check,
    ADD CONSTRAINT leases_state_check CHECK (state IN ('pending', 'active', 'reserved', 'released')),
    -- 00001's (state = 'released') = (released_at and cooldown_until set),
    -- with room for a reserved row's cooldown.
    DROP CONSTRAINT leases_check3,
    ADD CONSTRAINT leases_release_times CHECK ((state = 'released') = (released_at IS NOT NULL)),
    ADD CONSTRAINT leases_cooldown_times CHECK (CASE state
        WHEN 'released' THEN cooldown_until IS NOT NULL
        WHEN 'reserved' THEN true
        ELSE cooldown_until IS NULL END),
    ADD CONSTRAINT leases_reserved_on_node CHECK (state <> 'reserved' OR network = 'cilium:crd'),
    ADD CONSTRAINT leases_node_address CHECK (network <> 'cilium:crd'
        OR (state <> 'pending' AND interface = 'pool' AND container_id = host(addr)));

ALTER TABLE nodes ADD COLUMN cilium_crd boolean NOT NULL DEFAULT false;

-- A Kubernetes metav1.LabelSelector as JSON, matched against node labels;
-- NULL when unset. Selecting a node's pool reads the pools that have one.
ALTER TABLE pools ADD COLUMN node_selector jsonb;
CREATE INDEX pools_with_node_selector ON pools (space) WHERE node_selector IS NOT NULL;

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

-- +goose Down
-- The addresses nodes hold in reserve go back to their pools (cooling
-- from now); those Pods use stay leased, as active leases of the network
-- 'cilium:crd'.
UPDATE leases SET state = 'released', released_at = now(), cooldown_until = greatest(cooldown_until, now())
WHERE state = 'reserved';
ALTER TABLE leases
    DROP CONSTRAINT leases_node_address,
    DROP CONSTRAINT leases_reserved_on_node,
    DROP CONSTRAINT leases_cooldown_times,
    DROP CONSTRAINT leases_release_times,
    ADD CONSTRAINT leases_check3 CHECK ((state = 'released') = (released_at IS NOT NULL AND cooldown_until IS NOT NULL)),
    DROP CONSTRAINT leases_state_check,
    ADD CONSTRAINT leases_state_check CHECK (state IN ('pending', 'active', 'released'));
DROP INDEX pools_with_node_selector;
ALTER TABLE pools DROP COLUMN node_selector;
ALTER TABLE nodes DROP COLUMN cilium_crd;

-- The functions of 00008.
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
