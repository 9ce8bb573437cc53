-- nodes.cilium_cluster_pool marks the nodes Cilium's cluster-pool operator
-- role serves: their agents allocate Pod addresses only inside the
-- podCIDRs of the cluster pool, so no multi-pool pool of their space
-- pre-allocates blocks for them (they would be held for nobody). Nodes of
-- the REST API in the same space keep their pre-allocations. Nodes served
-- before this migration are marked at their next round.

-- +goose Up
ALTER TABLE nodes ADD COLUMN cilium_cluster_pool boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE nodes DROP COLUMN cilium_cluster_pool;
