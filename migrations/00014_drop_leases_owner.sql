-- Drop the index of leases by owner.
--
-- Every statement that leases an address probes the (space, addr) key for
-- each candidate offset of a block. leases_owner (space, owner_namespace,
-- owner_name, addr) offered the planner a second way to answer that probe,
-- a walk of every lease of the space with addr checked in the index, and a
-- generic plan made while the statistics counted few leases took it and
-- kept it: 82 buffers per probe instead of 2. No statement reads leases by
-- owner through it (the lease list filters by owner with optional
-- parameters, which no index serves), so it only cost a btree insert per
-- lease written.

-- +goose Up
DROP INDEX leases_owner;

-- +goose Down
CREATE INDEX leases_owner ON leases (space, owner_namespace, owner_name, addr);
