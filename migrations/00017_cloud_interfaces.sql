-- The network interfaces the cloud capacity workers last read for each
-- node of a cloud pool, with what each holds: the crd-mode controller
-- publishes them in the node's CiliumNode (status.eni.enis on AWS,
-- status.azure.interfaces on Azure), which Cilium's agent reads to route
-- a Pod's traffic out of the interface holding its address.
--
-- doc is one interface as store.CloudInterface marshals it; read_at is
-- when the cloud was read. The workers replace a node's rows as a whole
-- at each reading, so the set is always one reading's.

-- +goose Up
CREATE TABLE cloud_interfaces (
    node_id  bigint NOT NULL REFERENCES nodes (id) ON DELETE CASCADE,
    id       text NOT NULL CHECK (id <> ''),
    instance text NOT NULL CHECK (instance <> ''),
    doc      jsonb NOT NULL CHECK (jsonb_typeof(doc) = 'object'),
    read_at  timestamptz NOT NULL,
    PRIMARY KEY (node_id, id)
);

-- +goose Down
DROP TABLE cloud_interfaces;
