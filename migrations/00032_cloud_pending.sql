-- The Pods a cloud pool's node refused for want of an address (issue 35):
-- the cloud capacity workers add those that refused recently to what they
-- allocate, as Cilium's operator adds a node's Pending Pods (its surge
-- allocation). One row per Pod (its owner) and interface, not per CNI
-- attachment: the runtime tears a sandbox whose network setup failed down
-- and the kubelet retries with a new sandbox, so a new container ID, for
-- the same Pod. refused_at is the last refusal; rows older than the window
-- do not count, and the next refusal on the node deletes them. The rows of
-- a node are capped (store.notePending): the API's callers write them.

-- +goose Up
CREATE TABLE cloud_refusals (
    node_id bigint NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    pool_id bigint NOT NULL REFERENCES pools (id) ON DELETE CASCADE,
    owner_namespace text NOT NULL,
    owner_name text NOT NULL,
    owner_uid text NOT NULL,
    interface text NOT NULL,
    refused_at timestamptz NOT NULL,
    PRIMARY KEY (node_id, pool_id, owner_namespace, owner_name, owner_uid, interface)
);

-- +goose Down
DROP TABLE cloud_refusals;
