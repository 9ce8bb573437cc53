-- Released addresses by block, replacing the index of all released
-- addresses by cooldown.
--
-- Reusing a cooled address (the allocation's cooled step, the crd mode's
-- reserve) looks, per block of the node, for its released row whose
-- cooldown ended longest ago. leases_cooldown (cooldown_until, partial on
-- released rows) offered the planner a second way, a walk of every
-- released row of the database filtered by block, and a plan cached while
-- the statistics counted few released rows kept taking it once there were
-- many: 257,460 buffers and 450 ms per statement on a node with 44 blocks,
-- seen in the benchmark's hot-node run. leases_cooled leads with the block,
-- so every plan over released rows of a block is a probe per block; the
-- purge and the pools' cooling counts, which read every released row,
-- read this index whole instead.

-- +goose Up
CREATE INDEX leases_cooled ON leases (block_id, cooldown_until) WHERE state = 'released';
DROP INDEX leases_cooldown;

-- +goose Down
CREATE INDEX leases_cooldown ON leases (cooldown_until) WHERE state = 'released';
DROP INDEX leases_cooled;
