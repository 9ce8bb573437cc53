-- What a node says of its own cloud interfaces (issue 34): a CiliumNode's
-- spec.eni.first-interface-index and spec.eni.exclude-interface-tags, as
-- the crd-mode controller last read them. The capacity workers put no Pod
-- address on an interface below the index or carrying every one of the
-- tags, and count and give back none of what such an interface holds, as
-- Cilium's AWS operator does (ENI.IsExcludedBySpec). NULL: unset, the
-- pool's spec.cloud decides.

-- +goose Up
ALTER TABLE nodes
    ADD COLUMN first_interface_index integer CHECK (first_interface_index >= 0),
    ADD COLUMN exclude_interface_tags jsonb CHECK (jsonb_typeof(exclude_interface_tags) = 'object');

-- +goose Down
ALTER TABLE nodes DROP COLUMN first_interface_index, DROP COLUMN exclude_interface_tags;
