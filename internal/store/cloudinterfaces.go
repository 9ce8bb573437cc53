// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"encoding/json"
	"net/netip"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// CloudInterface is one network interface of a node's instance as the
// cloud capacity workers last read it: what Cilium's agent needs to route
// a Pod's traffic out of the interface holding its address (its ENI or
// NIC, MAC, subnet and network), and what the interface holds.
type CloudInterface struct {
	ID          string `json:"id"`
	MAC         string `json:"mac,omitempty"`
	DeviceIndex int    `json:"deviceIndex"`
	// Name is the interface's name where the cloud has one besides its ID
	// (Azure's NIC name).
	Name       string         `json:"name,omitempty"`
	SubnetID   string         `json:"subnetID,omitempty"`
	SubnetCIDR netip.Prefix   `json:"subnetCIDR,omitzero"`
	VPC        string         `json:"vpc,omitempty"`
	VPCCIDRs   []netip.Prefix `json:"vpcCIDRs,omitempty"`
	Zone       string         `json:"zone,omitempty"`
	// Gateway is the subnet's gateway (Azure's first address of the
	// subnet).
	Gateway        netip.Addr        `json:"gateway,omitzero"`
	Primary        netip.Addr        `json:"primary,omitzero"`
	Addresses      []netip.Addr      `json:"addresses,omitempty"`
	Prefixes       []netip.Prefix    `json:"prefixes,omitempty"`
	IPv6Addresses  []netip.Addr      `json:"ipv6Addresses,omitempty"`
	IPv6Prefixes   []netip.Prefix    `json:"ipv6Prefixes,omitempty"`
	SecurityGroups []string          `json:"securityGroups,omitempty"`
	Tags           map[string]string `json:"tags,omitempty"`
}

// CloudInterfaces is a node's interfaces of one reading.
type CloudInterfaces struct {
	// Instance is the cloud's id of the node's instance.
	Instance string
	// Limits are those of the instance's type; zero when unknown.
	Limits     InstanceLimits
	Interfaces []CloudInterface
	// ReadAt is when the cloud was read; zero when never.
	ReadAt time.Time
}

// InstanceLimits are an instance type's limits on interfaces and their
// addresses, as the workers read them with an instance.
type InstanceLimits struct {
	Type string
	// Interfaces is how many interfaces the type takes, IPv4PerInterface
	// how many IPv4 addresses each, its primary included.
	Interfaces, IPv4PerInterface int
}

// Known says whether l was read (a type takes at least one interface).
func (l InstanceLimits) Known() bool { return l.Interfaces > 0 }

// SetCloudInterfaces replaces what is recorded of node's interfaces with
// one reading of instance (ifaces, read at readAt) of a type of limits,
// in one transaction: an interface no longer in the reading goes.
func (s *Store) SetCloudInterfaces(ctx context.Context, space, node, instance string, limits InstanceLimits, ifaces []CloudInterface, readAt time.Time) error {
	if instance == "" {
		return alloc.Invalid("instance", "a reading of interfaces names its instance")
	}
	ids := make([]string, len(ifaces))
	docs := make([][]byte, len(ifaces))
	for i, f := range ifaces {
		if f.ID == "" {
			return alloc.Invalid("interfaces", "interface %d has no id", i)
		}
		b, err := json.Marshal(f)
		if err != nil {
			return err
		}
		ids[i], docs[i] = f.ID, b
	}
	return s.inTx(ctx, func(tx querier) error {
		nodeID, err := s.nodeID(ctx, tx, space, node)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM cloud_interfaces WHERE node_id = $1 AND id <> ALL ($2::text[])`, nodeID, ids); err != nil {
			return err
		}
		// Unknown limits (zero) are NULL; written only when they change, as
		// a node's row is every lease's.
		if _, err := tx.Exec(ctx, `UPDATE nodes SET instance_type = nullif(@type::text, ''),
				instance_max_interfaces = nullif(@interfaces::int, 0), instance_ipv4_per_interface = nullif(@ipv4PerInterface::int, 0)
			WHERE id = @node AND (instance_type, instance_max_interfaces, instance_ipv4_per_interface)
				IS DISTINCT FROM (nullif(@type::text, ''), nullif(@interfaces::int, 0), nullif(@ipv4PerInterface::int, 0))`,
			namedArgs{"node": nodeID, "type": limits.Type, "interfaces": limits.Interfaces, "ipv4PerInterface": limits.IPv4PerInterface}); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO cloud_interfaces (node_id, id, instance, doc, read_at)
			SELECT @node, i.id, @instance, i.doc, @readAt FROM unnest(@ids::text[], @docs::jsonb[]) AS i (id, doc)
			ON CONFLICT (node_id, id) DO UPDATE SET instance = excluded.instance, doc = excluded.doc, read_at = excluded.read_at`,
			namedArgs{"node": nodeID, "ids": ids, "instance": instance, "docs": docs, "readAt": readAt})
		return err
	})
}

// CloudInterfaces answers node's interfaces of the last reading, by device
// index; none (and a zero ReadAt) when the workers never read them.
func (s *Store) CloudInterfaces(ctx context.Context, space, node string) (CloudInterfaces, error) {
	var out CloudInterfaces
	rows, err := s.db.Query(ctx, `SELECT c.instance, c.doc, c.read_at, coalesce(n.instance_type, ''),
			coalesce(n.instance_max_interfaces, 0), coalesce(n.instance_ipv4_per_interface, 0)
		FROM cloud_interfaces c JOIN nodes n ON n.id = c.node_id
		WHERE n.space = $1 AND n.name = $2 ORDER BY (c.doc->>'deviceIndex')::int, c.id`, space, node)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var f CloudInterface
		var doc []byte
		if err := rows.Scan(&out.Instance, &doc, &out.ReadAt, &out.Limits.Type, &out.Limits.Interfaces, &out.Limits.IPv4PerInterface); err != nil {
			return out, err
		}
		if err := json.Unmarshal(doc, &f); err != nil {
			return out, err
		}
		out.Interfaces = append(out.Interfaces, f)
	}
	if err := rows.Err(); err != nil {
		return out, err
	}
	if out.Instance == "" {
		// No reading: say whether the node exists at all.
		if _, err := s.nodeID(ctx, s.db, space, node); err != nil {
			return out, err
		}
	}
	return out, nil
}
