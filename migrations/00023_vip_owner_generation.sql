-- Fencing for VIP owners: each owner's lifetime gets a number from the
-- lease generation sequence, answered with what it holds; a release that
-- names another generation (a caller that outlived the owner it knew) is
-- refused and changes nothing.

-- +goose Up
ALTER TABLE vip_owners ADD COLUMN generation bigint NOT NULL DEFAULT nextval('lease_generations');

-- +goose Down
ALTER TABLE vip_owners DROP COLUMN generation;
