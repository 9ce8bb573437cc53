-- Special-purpose ranges (issue 33): VIP pools and CIDR groups refuse
-- blocks and CIDRs overlapping loopback, link-local, multicast, ... as
-- Pod pools have since 00007, unless the object allows it
-- (allowSpecialPurpose). The list is alloc.specialPurpose.

-- +goose Up
ALTER TABLE lb_pools ADD COLUMN allow_special_purpose boolean NOT NULL DEFAULT false;
ALTER TABLE cidr_groups ADD COLUMN allow_special_purpose boolean NOT NULL DEFAULT false;

-- Pools and groups created before the rule keep working: one holding such
-- a range is marked as allowing it, so it keeps giving and a
-- read-modify-write of it is accepted as before. The history's
-- lbpool-update of a marked pool says why (the reason is this
-- transaction's; updated_at dates the event).
SELECT set_config('ipam.reason', 'migration 00025: allowSpecialPurpose set, a block overlaps a special-purpose range', true);

-- A VIP block may be a start/stop range, so its span is compared with each
-- range's; IPv4 and IPv6 spans never overlap (inet orders every IPv4
-- address before every IPv6 one).
UPDATE lb_pools p SET allow_special_purpose = true, updated_at = now()
WHERE EXISTS (SELECT 1 FROM address_ranges r, unnest(ARRAY[
        '0.0.0.0/8', '127.0.0.0/8', '169.254.0.0/16', '224.0.0.0/4', '240.0.0.0/4',
        '::/128', '::1/128', '::ffff:0:0/96', 'fe80::/10', 'ff00::/8']::cidr[]) AS s(cidr)
    WHERE r.lb_pool_id = p.id
      AND r.span && inetrange(host(network(s.cidr))::inet, host(broadcast(s.cidr))::inet, '[]'));

UPDATE cidr_groups g SET allow_special_purpose = true, updated_at = now()
WHERE EXISTS (SELECT 1 FROM cidr_group_cidrs c WHERE c.group_id = g.id AND c.cidr && ANY (ARRAY[
    '0.0.0.0/8', '127.0.0.0/8', '169.254.0.0/16', '224.0.0.0/4', '240.0.0.0/4',
    '::/128', '::1/128', '::ffff:0:0/96', 'fe80::/10', 'ff00::/8']::cidr[]));

SELECT set_config('ipam.reason', '', true);

-- +goose Down
ALTER TABLE cidr_groups DROP COLUMN allow_special_purpose;
ALTER TABLE lb_pools DROP COLUMN allow_special_purpose;
