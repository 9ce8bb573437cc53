-- LoadBalancer VIPs given from VIP pools (00018) to owners: a Service's
-- namespace and name, or anything named the same way through the API.
--
--   vip_owners   one row per owner: its last request and whether it was
--                satisfied (Cilium's cilium.io/IPAMRequestSatisfied);
--                locking it serializes one owner's requests;
--   vips         one row per address given, unique per space, so no
--                address is given twice whatever the pools' overlaps;
--   vip_holders  who holds each address: owners with one sharing key and
--                compatible terms share one.
--
-- An address goes when its last holder does. lb_pool_id is the pool the
-- address was given from; a pool that still has addresses out is not
-- deleted (the foreign key holds without ON DELETE).

-- +goose Up
CREATE TABLE vip_owners (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    space      text NOT NULL REFERENCES address_spaces (name),
    namespace  text NOT NULL,
    name       text NOT NULL,
    -- The request as alloc.VIPRequest marshals it (labels, families,
    -- addresses, requireAll, sharing).
    request    jsonb NOT NULL CHECK (jsonb_typeof(request) = 'object'),
    satisfied  boolean NOT NULL,
    reason     text NOT NULL,
    message    text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT vip_owners_space_name UNIQUE (space, namespace, name)
);
CREATE INDEX vip_owners_unsatisfied ON vip_owners (space) WHERE NOT satisfied;

CREATE TABLE vips (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    space       text NOT NULL REFERENCES address_spaces (name),
    addr        inet NOT NULL CHECK (masklen(addr) = CASE family(addr) WHEN 4 THEN 32 ELSE 128 END),
    lb_pool_id  bigint NOT NULL REFERENCES lb_pools (id),
    sharing_key text NOT NULL DEFAULT '',
    generation  bigint NOT NULL DEFAULT nextval('lease_generations'),
    created_at  timestamptz NOT NULL,
    CONSTRAINT vips_space_addr UNIQUE (space, addr)
);
CREATE INDEX vips_pool ON vips (lb_pool_id);
CREATE INDEX vips_sharing ON vips (space, sharing_key, id) WHERE sharing_key <> '';

CREATE TABLE vip_holders (
    vip_id     bigint NOT NULL REFERENCES vips (id) ON DELETE CASCADE,
    owner_id   bigint NOT NULL REFERENCES vip_owners (id) ON DELETE CASCADE,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (vip_id, owner_id)
);
CREATE INDEX vip_holders_owner ON vip_holders (owner_id);

ALTER TABLE address_events DROP CONSTRAINT address_events_kind_check;
ALTER TABLE address_events ADD CONSTRAINT address_events_kind_check CHECK (kind IN (
    'lease', 'confirm', 'release', 'expire', 'cooldown-end',
    'block-carve', 'block-adopt', 'block-release',
    'pool-create', 'pool-update', 'pool-delete',
    'lbpool-create', 'lbpool-update', 'lbpool-delete',
    'vip-assign', 'vip-release')) NOT VALID;

-- Each holding is an event of the address and of its owner: vip-assign
-- (a new address or a share of one) and vip-release, with the pool the
-- address came from and its generation.
-- +goose StatementBegin
CREATE FUNCTION address_events_vip_holder() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    h vip_holders;
    v vips;
    o vip_owners;
BEGIN
    IF TG_OP = 'DELETE' THEN
        h := OLD;
    ELSE
        h := NEW;
    END IF;
    SELECT * INTO v FROM vips WHERE id = h.vip_id;
    SELECT * INTO o FROM vip_owners WHERE id = h.owner_id;
    -- A cascade from the address or the owner leaves no row to name;
    -- the store deletes holders first, so that happens only by hand.
    IF v.id IS NULL OR o.id IS NULL THEN
        RETURN NULL;
    END IF;
    INSERT INTO address_events (at, kind, space, family, address, pool, state, owner_namespace, owner_name,
        actor, reason, generation)
    VALUES (CASE TG_OP WHEN 'DELETE' THEN ipam_history_at() ELSE h.created_at END,
        CASE TG_OP WHEN 'DELETE' THEN 'vip-release' ELSE 'vip-assign' END,
        v.space, family(v.addr), v.addr, (SELECT name FROM lb_pools WHERE id = v.lb_pool_id),
        CASE TG_OP WHEN 'DELETE' THEN 'released' ELSE 'held' END, o.namespace, o.name,
        ipam_history_actor(), ipam_history_reason(), v.generation);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER address_events_vip_holder AFTER INSERT OR DELETE ON vip_holders
    FOR EACH ROW EXECUTE FUNCTION address_events_vip_holder();

-- A held address outside every VIP block (stranded by a pool edit) is
-- still held, so no Pod pool CIDR may take it: the trigger that claims a
-- Pod pool CIDR's range refuses one holding a VIP, as the exclusion
-- constraint refuses one overlapping a VIP block. (A VIP is always given
-- inside a block, which the constraint keeps off Pod CIDRs, so only a
-- stranded one can lie where a Pod CIDR is created.)
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_ranges_pool_cidr() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    held inet := (SELECT addr FROM vips WHERE space = NEW.space AND addr <<= NEW.cidr ORDER BY addr LIMIT 1);
BEGIN
    IF held IS NOT NULL THEN
        RAISE EXCEPTION 'pool CIDR % holds the VIP %', NEW.cidr, host(held)
            USING ERRCODE = 'exclusion_violation', CONSTRAINT = 'vips_off_pod_cidrs';
    END IF;
    INSERT INTO address_ranges (space, kind, first_addr, last_addr, pool_cidr_id)
    VALUES (NEW.space, 'pod', host(network(NEW.cidr))::inet, host(broadcast(NEW.cidr))::inet, NEW.id);
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION address_ranges_pool_cidr() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO address_ranges (space, kind, first_addr, last_addr, pool_cidr_id)
    VALUES (NEW.space, 'pod', host(network(NEW.cidr))::inet, host(broadcast(NEW.cidr))::inet, NEW.id);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
DROP TRIGGER address_events_vip_holder ON vip_holders;
DROP FUNCTION address_events_vip_holder();
DELETE FROM address_events WHERE kind LIKE 'vip-%';
ALTER TABLE address_events DROP CONSTRAINT address_events_kind_check;
ALTER TABLE address_events ADD CONSTRAINT address_events_kind_check CHECK (kind IN (
    'lease', 'confirm', 'release', 'expire', 'cooldown-end',
    'block-carve', 'block-adopt', 'block-release',
    'pool-create', 'pool-update', 'pool-delete',
    'lbpool-create', 'lbpool-update', 'lbpool-delete')) NOT VALID;
DROP TABLE vip_holders;
DROP TABLE vips;
DROP TABLE vip_owners;
