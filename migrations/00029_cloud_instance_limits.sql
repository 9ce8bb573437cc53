-- The limits of a node's instance type as the cloud capacity workers last
-- read them (EC2 DescribeInstanceTypes) with its interfaces (issue 34):
-- the crd-mode controller seeds an unset spec.ipam.pre-allocate from them
-- as Cilium's AWS operator does (GetMinimumAllocatableIPv4), lowering it
-- to what a small type can hold. NULL: never read.

-- +goose Up
ALTER TABLE nodes
    ADD COLUMN instance_type text,
    ADD COLUMN instance_max_interfaces integer CHECK (instance_max_interfaces >= 0),
    ADD COLUMN instance_ipv4_per_interface integer CHECK (instance_ipv4_per_interface >= 0);

-- +goose Down
ALTER TABLE nodes DROP COLUMN instance_type, DROP COLUMN instance_max_interfaces, DROP COLUMN instance_ipv4_per_interface;
