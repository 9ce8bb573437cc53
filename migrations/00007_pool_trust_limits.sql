-- Trust boundaries of pools (issue 12): how many blocks one node may hold
-- of each family of a pool, and whether the pool's CIDRs may overlap
-- special-purpose ranges (loopback, link-local, multicast, ...).

-- +goose Up
ALTER TABLE pools
    -- NULL: the default, enough blocks for 1,024 leasable addresses
    -- (alloc.BlockLimit); carving refuses a node at its limit.
    ADD COLUMN max_blocks_per_node integer CHECK (max_blocks_per_node BETWEEN 1 AND 16777216),
    ADD COLUMN allow_special_purpose boolean NOT NULL DEFAULT false;

-- Pools created before the rule keep working: a pool whose CIDRs overlap a
-- special-purpose range is marked as allowing it, so a read-modify-write
-- of its spec is accepted as before. The list is alloc.specialPurpose.
UPDATE pools p SET allow_special_purpose = true
WHERE EXISTS (SELECT 1 FROM pool_cidrs c WHERE c.pool_id = p.id AND c.cidr && ANY (ARRAY[
    '0.0.0.0/8', '127.0.0.0/8', '169.254.0.0/16', '224.0.0.0/4', '240.0.0.0/4',
    '::/128', '::1/128', '::ffff:0:0/96', 'fe80::/10', 'ff00::/8']::cidr[]));

-- +goose Down
ALTER TABLE pools DROP COLUMN max_blocks_per_node, DROP COLUMN allow_special_purpose;
