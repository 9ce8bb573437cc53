-- CIDR groups (Cilium's CiliumCIDRGroup): named sets of CIDRs of an
-- address space, for network policies and for answering which groups hold
-- an address. Nothing is allocated from them, so they may overlap
-- anything. A GiST index answers "which groups contain this address" in
-- as many steps as groups contain it.

-- +goose Up
CREATE TABLE cidr_groups (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    space      text NOT NULL REFERENCES address_spaces (name),
    name       text NOT NULL,
    labels     jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT cidr_groups_space_name UNIQUE (space, name)
);

CREATE TABLE cidr_group_cidrs (
    group_id bigint NOT NULL REFERENCES cidr_groups (id) ON DELETE CASCADE,
    space    text NOT NULL,
    position integer NOT NULL,
    cidr     cidr NOT NULL,
    PRIMARY KEY (group_id, position),
    CONSTRAINT cidr_group_cidrs_once UNIQUE (group_id, cidr)
);
CREATE INDEX cidr_group_cidrs_contains ON cidr_group_cidrs USING gist (space, cidr inet_ops);

-- +goose Down
DROP TABLE cidr_group_cidrs;
DROP TABLE cidr_groups;
