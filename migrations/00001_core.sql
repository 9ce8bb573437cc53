-- The core schema: address spaces, pools, nodes, blocks, leases.
-- The invariants of DESIGN.md section 3 live here as constraints, so no code
-- path (or replica) can break them:
--   * no two pool CIDRs and no two blocks overlap within a space (GiST exclusion);
--   * no block leaves its pool CIDR, no lease leaves its block (composite FK + CHECK);
--   * no address is held twice within a space (unique), whatever its state,
--     so a cooling address cannot be leased before its row is reused or purged;
--   * one pending/active lease per (node, container, interface, family).

-- +goose Up
CREATE EXTENSION IF NOT EXISTS btree_gist;

CREATE TABLE address_spaces (
    name       text PRIMARY KEY CHECK (name <> ''),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO address_spaces (name) VALUES ('default');

CREATE TABLE pools (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    space           text NOT NULL REFERENCES address_spaces (name),
    name            text NOT NULL CHECK (name <> ''),
    labels          jsonb NOT NULL DEFAULT '{}',
    allow_first_ip  boolean NOT NULL,
    allow_last_ip   boolean NOT NULL,
    reserve_router  boolean NOT NULL,
    reserve_health  boolean NOT NULL,
    reserve_ingress boolean NOT NULL,
    ipv4_mask_size  smallint CHECK (ipv4_mask_size BETWEEN 0 AND 32),
    ipv6_mask_size  smallint CHECK (ipv6_mask_size BETWEEN 0 AND 128),
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    CHECK (ipv4_mask_size IS NOT NULL OR ipv6_mask_size IS NOT NULL),
    UNIQUE (space, name),
    UNIQUE (id, space)
);

CREATE TABLE pool_cidrs (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pool_id   bigint NOT NULL,
    space     text NOT NULL,
    family    smallint NOT NULL CHECK (family IN (4, 6)),
    cidr      cidr NOT NULL CHECK (family(cidr) = family),
    mask_size smallint NOT NULL,
    position  smallint NOT NULL,
    -- Carve cursor: every block index below it is taken, so carving the
    -- first free aligned block probes from here instead of reading every
    -- block of the CIDR. Releasing a block lowers it to that block's index.
    carve_hint bigint NOT NULL DEFAULT 0 CHECK (carve_hint >= 0),
    CHECK (mask_size >= masklen(cidr) AND mask_size <= CASE family WHEN 4 THEN 32 ELSE 128 END),
    FOREIGN KEY (pool_id, space) REFERENCES pools (id, space) ON DELETE CASCADE,
    UNIQUE (id, cidr),
    CONSTRAINT pool_cidrs_no_overlap EXCLUDE USING gist (space WITH =, cidr inet_ops WITH &&)
);
CREATE INDEX pool_cidrs_pool ON pool_cidrs (pool_id, family, position);

CREATE TABLE nodes (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    space       text NOT NULL REFERENCES address_spaces (name),
    name        text NOT NULL CHECK (name <> ''),
    labels      jsonb NOT NULL DEFAULT '{}',
    addresses   jsonb NOT NULL DEFAULT '[]',
    provider_id text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    UNIQUE (space, name),
    UNIQUE (id, space)
);

-- A block is a prefix a node owns in a pool. Its layout (leasable offsets,
-- node-local addresses) is fixed when it is carved, so later pool edits can
-- never move a gateway under running Pods. `allocated` counts the lease rows
-- of the block (pending, active and released-but-not-purged); it lets the
-- allocator skip full blocks without counting.
CREATE TABLE blocks (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    space        text NOT NULL,
    pool_id      bigint NOT NULL,
    pool_cidr_id bigint NOT NULL,
    parent_cidr  cidr NOT NULL,
    node_id      bigint NOT NULL,
    family       smallint NOT NULL CHECK (family IN (4, 6)),
    cidr         cidr NOT NULL CHECK (family(cidr) = family),
    first_offset bigint NOT NULL,
    last_offset  bigint NOT NULL,
    reserved     bigint[] NOT NULL,
    router       inet,
    health       inet,
    ingress      inet,
    capacity     bigint NOT NULL CHECK (capacity >= 0),
    allocated    bigint NOT NULL DEFAULT 0,
    next_offset  bigint NOT NULL,
    created_at   timestamptz NOT NULL,
    CHECK (cidr <<= parent_cidr),
    CHECK (allocated BETWEEN 0 AND capacity),
    CHECK (0 <= first_offset AND first_offset <= next_offset AND next_offset <= last_offset + 1),
    FOREIGN KEY (pool_cidr_id, parent_cidr) REFERENCES pool_cidrs (id, cidr),
    FOREIGN KEY (pool_id, space) REFERENCES pools (id, space),
    FOREIGN KEY (node_id, space) REFERENCES nodes (id, space),
    UNIQUE (id, cidr),
    CONSTRAINT blocks_no_overlap EXCLUDE USING gist (space WITH =, cidr inet_ops WITH &&)
) WITH (fillfactor = 50); -- room for HOT updates of allocated/next_offset, once per lease
CREATE INDEX blocks_node_pool ON blocks (node_id, pool_id, family, id);
CREATE INDEX blocks_pool_cidr ON blocks (pool_cidr_id);

-- One row per address that is leased or cooling. A released row keeps the
-- address until its cooldown ends; then it is reused in place or purged.
CREATE TABLE leases (
    space           text NOT NULL,
    addr            inet NOT NULL,
    block_id        bigint NOT NULL,
    block_cidr      cidr NOT NULL,
    node_id         bigint NOT NULL,
    pool_id         bigint NOT NULL,
    family          smallint NOT NULL CHECK (family IN (4, 6)),
    state           text NOT NULL CHECK (state IN ('pending', 'active', 'released')),
    container_id    text NOT NULL,
    interface       text NOT NULL,
    owner_namespace text NOT NULL,
    owner_name      text NOT NULL,
    owner_uid       text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL,
    expires_at      timestamptz,
    confirmed_at    timestamptz,
    released_at     timestamptz,
    cooldown_until  timestamptz,
    CHECK (masklen(addr) = CASE family WHEN 4 THEN 32 ELSE 128 END),
    CHECK (addr <<= block_cidr),
    CHECK ((state = 'pending') = (expires_at IS NOT NULL)),
    CHECK ((state = 'released') = (released_at IS NOT NULL AND cooldown_until IS NOT NULL)),
    FOREIGN KEY (block_id, block_cidr) REFERENCES blocks (id, cidr),
    FOREIGN KEY (node_id, space) REFERENCES nodes (id, space),
    -- The address is the key: no surrogate id, one index fewer to write on
    -- every lease and release.
    CONSTRAINT leases_one_holder_per_address PRIMARY KEY (space, addr)
);
CREATE UNIQUE INDEX leases_attachment ON leases (node_id, container_id, interface, family)
    WHERE state <> 'released';
-- Per block: foreign-key checks, counts, and "the address whose cooldown
-- ended longest ago" (held rows have a NULL cooldown_until and sort last).
CREATE INDEX leases_block ON leases (block_id, cooldown_until);
CREATE INDEX leases_expiry ON leases (expires_at) WHERE state = 'pending';
CREATE INDEX leases_cooldown ON leases (cooldown_until) WHERE state = 'released';
-- Who holds what, by Pod. Leases of a node or a pool are reached through
-- their blocks (blocks_node_pool, leases_block): every index here is paid
-- for twice per lease, on insert and on release.
CREATE INDEX leases_owner ON leases (space, owner_namespace, owner_name, addr);

-- A released address is leased again (its row reused in place) only once
-- its cooldown has ended, judged by the new lease's created_at: the
-- allocator's query already asks for that, and the database holds it too.
-- +goose StatementBegin
CREATE FUNCTION leases_cooldown_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.created_at < OLD.cooldown_until THEN
        RAISE EXCEPTION 'address % is cooling down until %', OLD.addr, OLD.cooldown_until
            USING ERRCODE = 'check_violation', CONSTRAINT = 'leases_cooldown';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER leases_cooldown BEFORE UPDATE ON leases FOR EACH ROW
    WHEN (OLD.state = 'released' AND NEW.state <> 'released')
    EXECUTE FUNCTION leases_cooldown_guard();

-- +goose Down
DROP TRIGGER leases_cooldown ON leases;
DROP FUNCTION leases_cooldown_guard();
DROP TABLE leases;
DROP TABLE blocks;
DROP TABLE nodes;
DROP TABLE pool_cidrs;
DROP TABLE pools;
DROP TABLE address_spaces;
