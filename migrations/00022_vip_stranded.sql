-- A VIP holding is stranded when no pool that selects its owner offers
-- the address any more (a pool edit moved its blocks, its selector or its
-- reservations). The store marks it when the pools change, and the
-- history records each change of the mark, so "when did this Service's
-- address fall outside every pool" has an answer.

-- +goose Up
ALTER TABLE vip_holders ADD COLUMN stranded boolean NOT NULL DEFAULT false;

ALTER TABLE address_events DROP CONSTRAINT address_events_kind_check;
ALTER TABLE address_events ADD CONSTRAINT address_events_kind_check CHECK (kind IN (
    'lease', 'confirm', 'release', 'expire', 'cooldown-end',
    'block-carve', 'block-adopt', 'block-release',
    'pool-create', 'pool-update', 'pool-delete',
    'lbpool-create', 'lbpool-update', 'lbpool-delete',
    'vip-assign', 'vip-release', 'vip-stranded', 'vip-offered')) NOT VALID;

-- +goose StatementBegin
CREATE FUNCTION address_events_vip_stranded() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v vips := (SELECT v FROM vips v WHERE v.id = NEW.vip_id);
    o vip_owners := (SELECT o FROM vip_owners o WHERE o.id = NEW.owner_id);
BEGIN
    INSERT INTO address_events (at, kind, space, family, address, pool, state, owner_namespace, owner_name,
        actor, reason, generation)
    VALUES (ipam_history_at(), CASE WHEN NEW.stranded THEN 'vip-stranded' ELSE 'vip-offered' END,
        v.space, family(v.addr), v.addr, (SELECT name FROM lb_pools WHERE id = v.lb_pool_id),
        CASE WHEN NEW.stranded THEN 'stranded' ELSE 'held' END, o.namespace, o.name,
        ipam_history_actor(), ipam_history_reason(), v.generation);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER address_events_vip_stranded AFTER UPDATE ON vip_holders
    FOR EACH ROW WHEN (OLD.stranded IS DISTINCT FROM NEW.stranded) EXECUTE FUNCTION address_events_vip_stranded();

-- +goose Down
DROP TRIGGER address_events_vip_stranded ON vip_holders;
DROP FUNCTION address_events_vip_stranded();
DELETE FROM address_events WHERE kind IN ('vip-stranded', 'vip-offered');
ALTER TABLE address_events DROP CONSTRAINT address_events_kind_check;
ALTER TABLE address_events ADD CONSTRAINT address_events_kind_check CHECK (kind IN (
    'lease', 'confirm', 'release', 'expire', 'cooldown-end',
    'block-carve', 'block-adopt', 'block-release',
    'pool-create', 'pool-update', 'pool-delete',
    'lbpool-create', 'lbpool-update', 'lbpool-delete',
    'vip-assign', 'vip-release')) NOT VALID;
ALTER TABLE vip_holders DROP COLUMN stranded;
