-- Fencing and sticky addresses (issue 5, points 3 and 4).
--
-- generation: every lease lifetime gets a number from one sequence, so a
-- client that names a lease by it (release, confirm) can never act on a
-- later lease of the same address or attachment. The leases of one
-- allocation (both families of a dual-stack attachment) share one number;
-- re-leasing a row in place takes a new one. Numbers only grow: a
-- reconcile can tell a lease made after its list was taken by its number.
--
-- sticky_identity: the workload identity (StatefulSet name + ordinal, VM
-- name) the address is bound to. The binding lives in the lease row, so
-- everything that keeps a row from being reused or purged keeps the bound
-- address from others: on release a bound row cools for the longer of the
-- cooldown and its retention, and only its identity may lease it again
-- before that. One binding per identity and family, one identity per
-- address (the row's primary key), both held here.

-- +goose Up
CREATE SEQUENCE lease_generations AS bigint;

ALTER TABLE leases
    ADD COLUMN generation bigint,
    ADD COLUMN sticky_identity text
        CHECK (sticky_identity ~ '^[A-Za-z0-9]([A-Za-z0-9._:/-]{0,251}[A-Za-z0-9])?$'),
    ADD COLUMN sticky_retention interval
        CHECK (sticky_retention > interval '0' AND sticky_retention <= interval '30 days'),
    ADD CHECK ((sticky_identity IS NULL) = (sticky_retention IS NULL));

-- Leases already held get one number per attachment, as new allocations do;
-- released rows one each.
WITH a AS (
    SELECT node_id, container_id, interface, nextval('lease_generations') AS g
    FROM (SELECT DISTINCT node_id, container_id, interface FROM leases WHERE state <> 'released') d
)
UPDATE leases l SET generation = a.g FROM a
WHERE l.state <> 'released' AND l.node_id = a.node_id AND l.container_id = a.container_id AND l.interface = a.interface;
UPDATE leases SET generation = nextval('lease_generations') WHERE generation IS NULL;

-- The default is a safety net for rows written by hand or by code that does
-- not set the number; the store always sets it.
ALTER TABLE leases
    ALTER COLUMN generation SET NOT NULL,
    ALTER COLUMN generation SET DEFAULT nextval('lease_generations');
ALTER SEQUENCE lease_generations OWNED BY leases.generation;

CREATE UNIQUE INDEX leases_sticky_identity ON leases (space, sticky_identity, family)
    WHERE sticky_identity IS NOT NULL;

-- The cooldown guard of 00001, with one exception: the identity an address
-- is bound to may lease it again before its cooldown ends (a StatefulSet
-- Pod recreated at once gets its address back; nobody else can).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION leases_cooldown_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.created_at < OLD.cooldown_until
       AND (OLD.sticky_identity IS NULL OR NEW.sticky_identity IS DISTINCT FROM OLD.sticky_identity) THEN
        RAISE EXCEPTION 'address % is cooling down until %', OLD.addr, OLD.cooldown_until
            USING ERRCODE = 'check_violation', CONSTRAINT = 'leases_cooldown';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION leases_cooldown_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.created_at < OLD.cooldown_until THEN
        RAISE EXCEPTION 'address % is cooling down until %', OLD.addr, OLD.cooldown_until
            USING ERRCODE = 'check_violation', CONSTRAINT = 'leases_cooldown';
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd
DROP INDEX leases_sticky_identity;
ALTER TABLE leases DROP COLUMN sticky_retention, DROP COLUMN sticky_identity, DROP COLUMN generation;
