-- Cloud pools: a pool whose addresses come from a cloud (AWS ENI
-- secondary addresses and /28 prefixes, Azure NIC IP configurations).
-- The capacity workers assign them on the nodes' interfaces and record
-- each as a block of its node (a /32 per address, a /28 per prefix,
-- source 'cloud', with the interface that holds it); the service carves
-- none of the pool's CIDRs, which are the cloud subnets'.
--
-- cloud is the pool's spec.cloud (store/cloudpools.go), NULL for a pool
-- that carves.

-- +goose Up
ALTER TABLE pools ADD COLUMN cloud jsonb CHECK (cloud IS NULL OR jsonb_typeof(cloud) = 'object');

ALTER TABLE blocks DROP CONSTRAINT blocks_source_check;
ALTER TABLE blocks ADD CONSTRAINT blocks_source_check CHECK (source IN ('carved', 'adopted', 'cloud'));
ALTER TABLE blocks ADD COLUMN cloud_interface text,
    ADD CONSTRAINT blocks_cloud_interface CHECK ((source = 'cloud') = (cloud_interface IS NOT NULL));

-- A cloud block is recorded, as an adopted one is: the history says
-- block-adopt for both.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_events_block() RETURNS trigger LANGUAGE plpgsql AS $$
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
        CASE WHEN TG_OP = 'DELETE' THEN 'block-release' WHEN b.source IN ('adopted', 'cloud') THEN 'block-adopt' ELSE 'block-carve' END,
        b.space, b.family, b.cidr, (SELECT name FROM pools WHERE id = b.pool_id), (SELECT name FROM nodes WHERE id = b.node_id),
        ipam_history_actor(), ipam_history_reason());
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_events_block() RETURNS trigger LANGUAGE plpgsql AS $$
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
-- +goose StatementEnd
DELETE FROM leases WHERE block_id IN (SELECT id FROM blocks WHERE source = 'cloud');
DELETE FROM blocks WHERE source = 'cloud';
ALTER TABLE blocks DROP CONSTRAINT blocks_cloud_interface, DROP COLUMN cloud_interface;
ALTER TABLE blocks DROP CONSTRAINT blocks_source_check;
ALTER TABLE blocks ADD CONSTRAINT blocks_source_check CHECK (source IN ('carved', 'adopted'));
ALTER TABLE pools DROP COLUMN cloud;
