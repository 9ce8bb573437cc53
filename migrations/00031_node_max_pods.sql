-- The max Pods of a node as its Kubernetes Node says (status.capacity.pods,
-- what the VPC CNI's ipamd reads): the cloud capacity workers bound the
-- node's addresses by it when its pool sets no maxPods (issue 35). NULL:
-- not known.

-- +goose Up
ALTER TABLE nodes ADD COLUMN max_pods integer CHECK (max_pods > 0);

-- +goose Down
ALTER TABLE nodes DROP COLUMN max_pods;
