-- Every change that can serve a waiting LoadBalancer Service is announced
-- on the channel ipam_lb_changed, the payload the space it concerns ('' for
-- any): a pool created, edited (widened, re-enabled, its conflict cleared)
-- or deleted, a CIDR group's CIDRs changed (pools reserve them), an address
-- freed, or a holder gone from a shared address (its ports free again).
-- The LB IPAM controller LISTENs and re-evaluates the Services it has
-- waiting at once, as Cilium's LB IPAM does on every pool and Service
-- event, instead of at its next resync; replicas of the REST API change
-- pools too, so the database, not a replica, is where the change is seen.
-- Row-level triggers fire only for rows a statement touched: an assignment
-- that changes nothing announces nothing (else every re-evaluation would
-- announce a change and start the next one). PostgreSQL folds equal
-- notifications of one transaction into one.

-- +goose Up
-- +goose StatementBegin
CREATE FUNCTION ipam_lb_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    row_space text := '';
BEGIN
    IF TG_ARGV[0] = 'space' AND TG_OP = 'DELETE' THEN
        row_space := OLD.space;
    ELSIF TG_ARGV[0] = 'space' THEN
        row_space := NEW.space;
    END IF;
    PERFORM pg_notify('ipam_lb_changed', row_space);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER lb_pools_changed AFTER INSERT OR UPDATE OR DELETE ON lb_pools
    FOR EACH ROW EXECUTE FUNCTION ipam_lb_changed('space');
CREATE TRIGGER cidr_group_cidrs_changed AFTER INSERT OR UPDATE OR DELETE ON cidr_group_cidrs
    FOR EACH ROW EXECUTE FUNCTION ipam_lb_changed('space');
CREATE TRIGGER vips_freed AFTER DELETE ON vips
    FOR EACH ROW EXECUTE FUNCTION ipam_lb_changed('space');
CREATE TRIGGER vip_holders_gone AFTER DELETE ON vip_holders
    FOR EACH ROW EXECUTE FUNCTION ipam_lb_changed('any');

-- +goose Down
DROP TRIGGER vip_holders_gone ON vip_holders;
DROP TRIGGER vips_freed ON vips;
DROP TRIGGER cidr_group_cidrs_changed ON cidr_group_cidrs;
DROP TRIGGER lb_pools_changed ON lb_pools;
DROP FUNCTION ipam_lb_changed();
