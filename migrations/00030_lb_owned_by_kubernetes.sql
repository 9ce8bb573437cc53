-- Who owns a VIP pool or a CIDR group (issue 36): the database (made
-- through the REST API, mirrored into the cluster read-only) or a
-- CiliumLoadBalancerIPPool / CiliumCIDRGroup of the cluster, imported by
-- the LB IPAM controller. An object-owned row changes only as its object
-- does; source_uid is the object's metadata.uid, so that a deletion seen
-- late (the object re-created under the same name since) does not delete
-- what the new object imported.

-- +goose Up
ALTER TABLE lb_pools
    ADD COLUMN source text NOT NULL DEFAULT 'database' CHECK (source IN ('database', 'kubernetes')),
    ADD COLUMN source_uid text NOT NULL DEFAULT '',
    ADD CONSTRAINT lb_pools_source_uid CHECK ((source = 'kubernetes') = (source_uid <> ''));
ALTER TABLE cidr_groups
    ADD COLUMN source text NOT NULL DEFAULT 'database' CHECK (source IN ('database', 'kubernetes')),
    ADD COLUMN source_uid text NOT NULL DEFAULT '',
    ADD CONSTRAINT cidr_groups_source_uid CHECK ((source = 'kubernetes') = (source_uid <> ''));

-- +goose Down
ALTER TABLE cidr_groups DROP COLUMN source_uid, DROP COLUMN source;
ALTER TABLE lb_pools DROP COLUMN source_uid, DROP COLUMN source;
