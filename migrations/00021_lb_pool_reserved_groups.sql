-- A VIP pool may keep the CIDRs of CIDR groups of its space out of what it
-- gives (spec.reservedCIDRGroups): the groups are named, so an edit of a
-- group moves the reservation of every pool naming it. A group a pool
-- names is not deleted (the store refuses it).

-- +goose Up
ALTER TABLE lb_pools ADD COLUMN reserved_groups text[] NOT NULL DEFAULT '{}';
CREATE INDEX lb_pools_reserved_groups ON lb_pools USING gin (reserved_groups) WHERE cardinality(reserved_groups) > 0;

-- +goose Down
DROP INDEX lb_pools_reserved_groups;
ALTER TABLE lb_pools DROP COLUMN reserved_groups;
