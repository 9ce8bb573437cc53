// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// cloudJSON is a pool's spec.cloud as pools.cloud stores it: the names
// are the stored format's, apart from the Go names.
type cloudJSON struct {
	Provider            string            `json:"provider"`
	Prefixes            bool              `json:"prefixes,omitempty"`
	UsePrimaryAddress   bool              `json:"usePrimaryAddress,omitempty"`
	FirstInterfaceIndex int               `json:"firstInterfaceIndex,omitempty"`
	SubnetIDs           []string          `json:"subnetIDs,omitempty"`
	SubnetTags          map[string]string `json:"subnetTags,omitempty"`
	SecurityGroups      []string          `json:"securityGroups,omitempty"`
	SecurityGroupTags   map[string]string `json:"securityGroupTags,omitempty"`
	Watermarks          *watermarksJSON   `json:"watermarks,omitempty"`
	WarmTargets         *warmTargetsJSON  `json:"warmTargets,omitempty"`
	ReleaseDelaySeconds float64           `json:"releaseDelaySeconds,omitempty"`
}

type watermarksJSON struct {
	PreAllocate       int `json:"preAllocate,omitempty"`
	MinAllocate       int `json:"minAllocate,omitempty"`
	MaxAllocate       int `json:"maxAllocate,omitempty"`
	MaxAboveWatermark int `json:"maxAboveWatermark,omitempty"`
}

type warmTargetsJSON struct {
	WarmENI    int `json:"warmENI,omitempty"`
	WarmIP     int `json:"warmIP,omitempty"`
	MinimumIP  int `json:"minimumIP,omitempty"`
	WarmPrefix int `json:"warmPrefix,omitempty"`
	MaxPods    int `json:"maxPods,omitempty"`
}

// cloudColumn is c as pools.cloud stores it, nil for no cloud.
func cloudColumn(c *alloc.CloudSpec) ([]byte, error) {
	if c == nil {
		return nil, nil
	}
	j := cloudJSON{Provider: string(c.Provider), Prefixes: c.Prefixes, UsePrimaryAddress: c.UsePrimaryAddress,
		FirstInterfaceIndex: c.FirstInterfaceIndex, SubnetIDs: c.SubnetIDs, SubnetTags: c.SubnetTags,
		SecurityGroups: c.SecurityGroups, SecurityGroupTags: c.SecurityGroupTags, ReleaseDelaySeconds: c.ReleaseDelay.Seconds()}
	if w := c.Watermarks; w != nil {
		j.Watermarks = &watermarksJSON{PreAllocate: w.PreAllocate, MinAllocate: w.MinAllocate, MaxAllocate: w.MaxAllocate, MaxAboveWatermark: w.MaxAboveWatermark}
	}
	if t := c.WarmTargets; t != nil {
		j.WarmTargets = &warmTargetsJSON{WarmENI: t.WarmENI, WarmIP: t.WarmIP, MinimumIP: t.MinimumIP, WarmPrefix: t.WarmPrefix, MaxPods: t.MaxPods}
	}
	return json.Marshal(j)
}

// cloudSpecOf reads pools.cloud; nil for NULL.
func cloudSpecOf(b []byte) (*alloc.CloudSpec, error) {
	if b == nil {
		return nil, nil
	}
	var j cloudJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, err
	}
	c := &alloc.CloudSpec{Provider: alloc.CloudProvider(j.Provider), Prefixes: j.Prefixes, UsePrimaryAddress: j.UsePrimaryAddress,
		FirstInterfaceIndex: j.FirstInterfaceIndex, SubnetIDs: slices.Clone(j.SubnetIDs), SubnetTags: maps.Clone(j.SubnetTags),
		SecurityGroups: slices.Clone(j.SecurityGroups), SecurityGroupTags: maps.Clone(j.SecurityGroupTags), ReleaseDelay: time.Duration(j.ReleaseDelaySeconds * float64(time.Second))}
	if w := j.Watermarks; w != nil {
		c.Watermarks = &alloc.Watermarks{PreAllocate: w.PreAllocate, MinAllocate: w.MinAllocate, MaxAllocate: w.MaxAllocate, MaxAboveWatermark: w.MaxAboveWatermark}
	}
	if t := j.WarmTargets; t != nil {
		c.WarmTargets = &alloc.WarmTargets{WarmENI: t.WarmENI, WarmIP: t.WarmIP, MinimumIP: t.MinimumIP, WarmPrefix: t.WarmPrefix, MaxPods: t.MaxPods}
	}
	return c, nil
}

// blockCloud is the source of a block a cloud gave (blocks.source).
const blockCloud = "cloud"

// RecordCloudBlocks records the addresses (a /32 each) and prefixes a
// cloud gave interface iface of node for cloud pool pool as the node's
// blocks, every address of them leasable, in one transaction. Each must
// lie in one of the pool's CIDRs (KindInvalid naming it otherwise); one
// the node already holds in the pool is skipped, one another block
// overlaps is KindOverlap and records nothing.
func (s *Store) RecordCloudBlocks(ctx context.Context, space, node, pool, iface string, prefixes []netip.Prefix) error {
	if iface == "" {
		return alloc.Invalid("interface", "a cloud block names the interface that holds it")
	}
	return s.inTx(ctx, func(tx querier) error {
		nodeID, p, err := s.nodeAndPool(ctx, tx, space, node, pool)
		if err != nil {
			return err
		}
		if !p.cloud {
			return alloc.Invalid("pool", "pool %q is no cloud pool: its blocks are carved", pool)
		}
		now := s.now()
		for _, prefix := range prefixes {
			if err := recordCloudBlock(ctx, tx, space, nodeID, p, iface, prefix.Masked(), now); err != nil {
				return err
			}
		}
		return nil
	})
}

func recordCloudBlock(ctx context.Context, tx querier, space string, nodeID int64, p allocPool, iface string, prefix netip.Prefix, now time.Time) error {
	family, bits := 4, 32
	if prefix.Addr().Is6() {
		family, bits = 6, 128
		if prefix.Bits() < MinIPv6CloudBits {
			return alloc.Invalid("prefixes", "%s: an IPv6 cloud block is a /%d or longer (a block holds at most 2^32 addresses)", prefix, MinIPv6CloudBits)
		}
	}
	var parentID int64
	var parent netip.Prefix
	err := tx.QueryRow(ctx, `SELECT id, cidr FROM pool_cidrs WHERE pool_id = $1 AND cidr >>= $2`, p.id, prefix).Scan(&parentID, &parent)
	if errors.Is(err, pgx.ErrNoRows) {
		return alloc.Invalid("prefixes", "%s lies in none of pool %q's CIDRs (its subnets')", prefix, p.name)
	} else if err != nil {
		return err
	}
	// Every address of a cloud block is the node's to lease: no network,
	// broadcast or node-local address is set aside.
	size := int64(1) << (bits - prefix.Bits())
	tag, err := tx.Exec(ctx, `INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr,
			first_offset, last_offset, reserved, capacity, next_offset, created_at, source, cloud_interface)
		VALUES (@space, @pool, @parent, @parentCIDR, @node, @family, @cidr,
			0, @last, '{}', @capacity, 0, @now, @source, @iface) ON CONFLICT DO NOTHING`,
		namedArgs{"space": space, "pool": p.id, "parent": parentID, "parentCIDR": parent, "node": nodeID, "family": family,
			"cidr": prefix, "last": size - 1, "capacity": size, "now": now, "source": blockCloud, "iface": iface})
	if err != nil || tag.RowsAffected() == 1 {
		return err
	}
	var sameNode, samePool bool
	var source string
	err = tx.QueryRow(ctx, `SELECT node_id = $3, pool_id = $4, source FROM blocks WHERE space = $1 AND cidr && $2 LIMIT 1`,
		space, prefix, nodeID, p.id).Scan(&sameNode, &samePool, &source)
	if err != nil {
		return err
	}
	if sameNode && samePool && source == blockCloud {
		return nil // recorded before: a retry
	}
	return &alloc.Error{Kind: alloc.KindOverlap, Field: "prefixes", Detail: fmt.Sprintf("%s overlaps a block another node or pool holds", prefix)}
}

// Giving a cloud address back must never take one a Pod holds. A block is
// first drained: its capacity drops to 0, which every statement that
// leases reads as full (allocated < capacity), in a statement that does so
// only while the block holds no lease row, held or cooling. The row lock
// that statement takes serializes it with a lease in flight on the block
// (which locks the block too), and READ COMMITTED re-reads the row after
// the wait, so of the two exactly one wins. Only then does the worker ask
// the cloud, and drop the block after, or restore it when the cloud
// refused.

// DrainCloudBlocks drains the node's cloud blocks of pool among prefixes
// that hold no lease row, and answers those it drained; the others stay
// as they are (a Pod took an address meanwhile).
func (s *Store) DrainCloudBlocks(ctx context.Context, space, node, pool string, prefixes []netip.Prefix) ([]netip.Prefix, error) {
	var drained []netip.Prefix
	err := s.inTx(ctx, func(tx querier) error {
		nodeID, p, err := s.nodeAndPool(ctx, tx, space, node, pool)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `UPDATE blocks SET capacity = 0
			WHERE node_id = $1 AND pool_id = $2 AND source = 'cloud' AND cidr = ANY ($3::cidr[]) AND allocated = 0 AND capacity > 0
			RETURNING cidr`, nodeID, p.id, masked(prefixes))
		if err != nil {
			return err
		}
		drained, err = pgx.CollectRows(rows, pgx.RowTo[netip.Prefix])
		return err
	})
	return drained, err
}

// RestoreCloudBlocks gives drained cloud blocks of the node back their
// capacity (every address of the prefix), when the cloud kept them.
func (s *Store) RestoreCloudBlocks(ctx context.Context, space, node, pool string, prefixes []netip.Prefix) error {
	return s.inTx(ctx, func(tx querier) error {
		nodeID, p, err := s.nodeAndPool(ctx, tx, space, node, pool)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE blocks SET capacity = last_offset - first_offset + 1
			WHERE node_id = $1 AND pool_id = $2 AND source = 'cloud' AND cidr = ANY ($3::cidr[]) AND capacity = 0`,
			nodeID, p.id, masked(prefixes))
		return err
	})
}

// DropCloudBlocks deletes drained cloud blocks of the node, once the
// cloud took their addresses back. A block among prefixes that is not
// drained is KindInUse and deletes nothing.
func (s *Store) DropCloudBlocks(ctx context.Context, space, node, pool string, prefixes []netip.Prefix) error {
	return s.inTx(ctx, func(tx querier) error {
		nodeID, p, err := s.nodeAndPool(ctx, tx, space, node, pool)
		if err != nil {
			return err
		}
		var live []netip.Prefix
		rows, err := tx.Query(ctx, `SELECT cidr FROM blocks
			WHERE node_id = $1 AND pool_id = $2 AND source = 'cloud' AND cidr = ANY ($3::cidr[]) AND (capacity > 0 OR allocated > 0)`,
			nodeID, p.id, masked(prefixes))
		if err != nil {
			return err
		}
		if live, err = pgx.CollectRows(rows, pgx.RowTo[netip.Prefix]); err != nil {
			return err
		}
		if len(live) > 0 {
			return &alloc.Error{Kind: alloc.KindInUse, Field: "prefixes", Detail: fmt.Sprintf("%s is not drained: drain it before the cloud takes it back", live[0])}
		}
		_, err = tx.Exec(ctx, `DELETE FROM blocks WHERE node_id = $1 AND pool_id = $2 AND source = 'cloud' AND cidr = ANY ($3::cidr[])`,
			nodeID, p.id, masked(prefixes))
		return err
	})
}

// reasonCloudInstanceGone is the history's reason for what
// DropGoneCloudNode deletes.
const reasonCloudInstanceGone = "cloud-instance-gone"

// DropGoneCloudNode deletes every cloud block of the node, of every
// pool, with every lease row in them (held, reserved or cooling), once
// the cloud confirmed that its instance, named by providerID, is gone:
// the instance's interfaces went with it, and so did its Pods, while the
// cloud may already have handed the addresses to another instance. No
// cooldown holds them back: it keeps a released address from a new Pod
// while the old one may still answer on it, and the old one is gone with
// its instance; the other node the cloud gave one of them to needs it
// recorded now. A node whose providerID is no longer providerID (it came
// back on another instance under the same name) or that is gone is left
// alone. It answers how many blocks and lease rows it deleted.
func (s *Store) DropGoneCloudNode(ctx context.Context, space, node, providerID string) (blocks, leases int64, err error) {
	err = s.inTxWhy(ctx, reasonCloudInstanceGone, func(tx querier) error {
		blocks, leases = 0, 0
		var id int64
		err := tx.QueryRow(ctx, `SELECT id FROM nodes WHERE space = $1 AND name = $2`, space, node).Scan(&id)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		} else if err != nil {
			return err
		}
		// The blocks first, then the node, in the order allocations and
		// DeleteNode lock them.
		if _, err := tx.Exec(ctx, `SELECT id FROM blocks WHERE node_id = $1 AND source = 'cloud' ORDER BY family, id FOR UPDATE`, id); err != nil {
			return err
		}
		var same bool
		err = tx.QueryRow(ctx, `SELECT provider_id = $2 FROM nodes WHERE id = $1 FOR SHARE`, id, providerID).Scan(&same)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && !same {
			return nil
		} else if err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `DELETE FROM leases WHERE block_id IN (SELECT id FROM blocks WHERE node_id = $1 AND source = 'cloud')`, id)
		if err != nil {
			return err
		}
		leases = tag.RowsAffected()
		tag, err = tx.Exec(ctx, `DELETE FROM blocks WHERE node_id = $1 AND source = 'cloud'`, id)
		blocks = tag.RowsAffected()
		return err
	})
	return blocks, leases, err
}

// CloudHolder is the holder of a block that overlaps a cloud address.
type CloudHolder struct {
	Node, ProviderID, Pool string
	Block                  netip.Prefix
	// Cloud reports a cloud block; Interface is then the one it was
	// recorded on.
	Cloud     bool
	Interface string
}

// CloudBlockHolder answers the node and pool of a block of space that
// overlaps prefix: what a RecordCloudBlocks refused as KindOverlap ran
// into. KindNotFound when none does (any more).
func (s *Store) CloudBlockHolder(ctx context.Context, space string, prefix netip.Prefix) (CloudHolder, error) {
	var h CloudHolder
	err := s.db.QueryRow(ctx, `SELECT n.name, n.provider_id, p.name, b.cidr, b.source = 'cloud', coalesce(b.cloud_interface, '')
		FROM blocks b JOIN nodes n ON n.id = b.node_id JOIN pools p ON p.id = b.pool_id
		WHERE b.space = $1 AND b.cidr && $2 ORDER BY b.cidr LIMIT 1`, space, prefix.Masked()).
		Scan(&h.Node, &h.ProviderID, &h.Pool, &h.Block, &h.Cloud, &h.Interface)
	if errors.Is(err, pgx.ErrNoRows) {
		return h, alloc.NotFound("prefix", "block overlapping", prefix.String())
	}
	return h, err
}

func masked(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		out[i] = p.Masked()
	}
	return out
}

// CloudNode is a node of a cloud pool as the capacity workers see it.
type CloudNode struct {
	Name       string
	ProviderID string
	// Blocks are its blocks of the pool, with the interface holding each.
	Blocks []CloudBlock
	// Used are the addresses of those blocks a Pod's lease row holds
	// (pending, active, or released and still cooling down). An address
	// whose cooldown ended is leasable at once, so the sizing counts it
	// free; its row still keeps its block from draining until the purge,
	// so it cannot go back to the cloud before then either.
	Used []netip.Addr
	// Reserved are those the node itself holds, used by no Pod: a
	// CiliumNode's spec.ipam.pool in crd mode. The crd-mode controller
	// sizes them by the node's own watermarks, so the cloud's sizing
	// counts them free (else the cloud would hold Pods plus both
	// pre-allocations); their rows keep them from going back.
	Reserved []netip.Addr
	// Pending is how many of its Pods wait for an address of the pool:
	// those whose allocation the pool refused as exhausted within
	// PendingWindow and that no lease of the node has served since (see
	// notePending), one per Pod and interface. The server watches no Pods
	// outside crd mode; the refusals are what it sees of them everywhere.
	Pending int
	// PodInterfaces is what the node says of its own interfaces (a
	// CiliumNode's spec.eni), to be honoured over the pool's spec.cloud.
	PodInterfaces PodInterfaces
	// Conflict, when set, names every cloud pool that claims the node
	// (two node selectors match its labels, or none does and two pools
	// have none): no pool serves it until its labels or the pools'
	// selectors are fixed.
	Conflict []string
}

// PodInterfaces say which of a node's cloud interfaces hold Pod
// addresses, as a CiliumNode's spec.eni says it (Cilium's
// ENI.IsExcludedBySpec): those from FirstIndex on that do not carry every
// one of ExcludeTags.
type PodInterfaces struct {
	// FirstIndex is the first device index for Pods; nil when the node
	// does not say (the pool's spec.cloud decides).
	FirstIndex *int
	// ExcludeTags leave out the interfaces carrying all of them, with
	// these values; none when empty.
	ExcludeTags map[string]string
	// MaxPods is the node's max Pods as its Kubernetes Node says
	// (status.capacity.pods, as the VPC CNI's ipamd reads it); 0 when
	// not known. Not of the interfaces, but what the node says of its
	// Pods, recorded with them.
	MaxPods int
}

// CloudBlock is one recorded cloud block.
type CloudBlock struct {
	Prefix    netip.Prefix
	Interface string
	Drained   bool
}

// CloudNodes answers, by name, the nodes of cloud pool pool: those of
// the space that hold blocks of the pool or whose providerID names the
// pool's cloud (aws:// or azure://), and that the pool's node selector
// takes (cloudPoolOf), with their blocks of the pool and the addresses
// leases hold in them and its Pods waiting (Pending), in one snapshot.
// A node two pools claim is answered by the first of them by name only,
// with Conflict set.
func (s *Store) CloudNodes(ctx context.Context, space, pool string) ([]CloudNode, error) {
	var out []CloudNode
	err := pgx.BeginTxFunc(ctx, s.db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var id int64
		var cloud []byte
		out = nil
		err := tx.QueryRow(ctx, `SELECT id, cloud FROM pools WHERE space = $1 AND name = $2`, space, pool).Scan(&id, &cloud)
		if errors.Is(err, pgx.ErrNoRows) {
			return s.notFoundIn(ctx, tx, space, "pool", "pool", pool)
		} else if err != nil {
			return err
		}
		spec, err := cloudSpecOf(cloud)
		if err != nil {
			return err
		}
		if spec == nil {
			return alloc.Invalid("pool", "pool %q is no cloud pool", pool)
		}
		pools, err := cloudPoolSelectors(ctx, tx, space, spec.Provider)
		if err != nil {
			return err
		}
		now := s.now()
		rows, err := tx.Query(ctx, `SELECT n.name, n.labels, n.provider_id, n.first_interface_index, n.exclude_interface_tags, coalesce(n.max_pods, 0),
				coalesce((SELECT json_agg(json_build_object('prefix', b.cidr, 'iface', b.cloud_interface, 'drained', b.capacity = 0) ORDER BY b.cidr)
					FROM blocks b WHERE b.node_id = n.id AND b.pool_id = $2), '[]'),
				coalesce((SELECT array_agg(l.addr ORDER BY l.addr) FROM leases l JOIN blocks b ON b.id = l.block_id
					WHERE l.node_id = n.id AND b.pool_id = $2 AND l.state <> 'reserved' AND NOT (l.state = 'released' AND l.cooldown_until <= $4)), '{}'),
				coalesce((SELECT array_agg(l.addr ORDER BY l.addr) FROM leases l JOIN blocks b ON b.id = l.block_id
					WHERE l.node_id = n.id AND b.pool_id = $2 AND l.state = 'reserved'), '{}'),
				(SELECT count(*) FROM cloud_refusals r WHERE r.node_id = n.id AND r.pool_id = $2 AND r.refused_at > $5
					AND NOT EXISTS (SELECT 1 FROM blocks b JOIN leases l ON l.block_id = b.id WHERE b.node_id = n.id
						AND l.owner_namespace = r.owner_namespace AND l.owner_name = r.owner_name AND l.owner_uid = r.owner_uid
						AND l.interface = r.interface AND l.created_at >= r.refused_at))
			FROM nodes n WHERE n.space = $1
			  AND (n.provider_id LIKE $3 OR EXISTS (SELECT 1 FROM blocks b WHERE b.node_id = n.id AND b.pool_id = $2))
			ORDER BY n.name`, space, id, string(spec.Provider)+"://%", now, now.Add(-PendingWindow))
		if err != nil {
			return err
		}
		var n CloudNode
		var nodeLabels map[string]string
		var blocks []struct {
			Prefix  netip.Prefix `json:"prefix"`
			Iface   string       `json:"iface"`
			Drained bool         `json:"drained"`
		}
		_, err = pgx.ForEachRow(rows, []any{&n.Name, &nodeLabels, &n.ProviderID, &n.PodInterfaces.FirstIndex, &n.PodInterfaces.ExcludeTags,
			&n.PodInterfaces.MaxPods, &blocks, &n.Used, &n.Reserved, &n.Pending}, func() error {
			claim := cloudPoolOf(nodeLabels, pools)
			if len(claim) > 0 && claim[0] == pool {
				if len(claim) > 1 {
					n.Conflict = claim
				}
				for _, b := range blocks {
					n.Blocks = append(n.Blocks, CloudBlock{Prefix: b.Prefix, Interface: b.Iface, Drained: b.Drained})
				}
				out = append(out, n)
			}
			n, nodeLabels, blocks = CloudNode{}, nil, nil
			return nil
		})
		return err
	})
	return out, err
}

// cloudPoolSelector is a cloud pool's name and node selector (nil when
// it has none).
type cloudPoolSelector struct {
	name     string
	selector labels.Selector
}

// cloudPoolSelectors answers the cloud pools of provider in space, by
// name, with their node selectors.
func cloudPoolSelectors(ctx context.Context, q querier, space string, provider alloc.CloudProvider) ([]cloudPoolSelector, error) {
	rows, err := q.Query(ctx, `SELECT name, node_selector FROM pools
		WHERE space = $1 AND cloud IS NOT NULL AND cloud->>'provider' = $2 ORDER BY name`, space, string(provider))
	if err != nil {
		return nil, err
	}
	var out []cloudPoolSelector
	var name string
	var sel *metav1.LabelSelector
	_, err = pgx.ForEachRow(rows, []any{&name, &sel}, func() error {
		ns, err := alloc.LabelSelector("nodeSelector", sel)
		if err != nil {
			return fmt.Errorf("pool %q: %w", name, err) // edited by hand: the API refuses it
		}
		out = append(out, cloudPoolSelector{name: name, selector: ns})
		sel = nil
		return nil
	})
	return out, err
}

// cloudPoolOf answers the cloud pools (of one cloud, by name) that claim
// a node with labels nodeLabels: those whose node selector matches the
// labels, else those with no node selector, as a node's pool is chosen
// in crd mode (alloc.SelectNodePool: the matching selectors, else the
// default pool). The first one serves the node when it is the only one;
// two or more is a conflict no pool serves, as two matching pools are
// for alloc.SelectNodePool: each would record the instance's addresses
// as its own, and the other's records would overlap them.
func cloudPoolOf(nodeLabels map[string]string, pools []cloudPoolSelector) []string {
	set := labels.Set(nodeLabels)
	var matched, open []string
	for _, p := range pools {
		switch {
		case p.selector == nil:
			open = append(open, p.name)
		case p.selector.Matches(set):
			matched = append(matched, p.name)
		}
	}
	if len(matched) > 0 {
		return matched
	}
	return open
}

// CloudPool is a cloud pool and its spec.cloud.
type CloudPool struct {
	Space, Name string
	Cloud       alloc.CloudSpec
	// IPv6: the pool lists IPv6 CIDRs, so its nodes get the cloud's IPv6
	// prefixes too.
	IPv6 bool
}

// CloudPools answers every cloud pool, by space and name.
func (s *Store) CloudPools(ctx context.Context) ([]CloudPool, error) {
	rows, err := s.db.Query(ctx, `SELECT space, name, cloud,
			EXISTS (SELECT 1 FROM pool_cidrs c WHERE c.pool_id = pools.id AND family(c.cidr) = 6)
		FROM pools WHERE cloud IS NOT NULL ORDER BY space, name`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (CloudPool, error) {
		var p CloudPool
		var b []byte
		if err := r.Scan(&p.Space, &p.Name, &b, &p.IPv6); err != nil {
			return p, err
		}
		c, err := cloudSpecOf(b)
		if err != nil || c == nil {
			return p, fmt.Errorf("pool %s/%s: spec.cloud: %v", p.Space, p.Name, err)
		}
		p.Cloud = *c
		return p, nil
	})
}

// cloudLockKey is the advisory lock key of the cloud capacity passes
// ("ipamcld" in ASCII).
const cloudLockKey = 0x69_70_61_6d_63_6c_64

// WithCloudLock runs pass while this replica holds the cloud capacity
// workers' session advisory lock, and answers whether it ran: one replica
// at a time calls the clouds, the others find the lock taken and skip.
// The lock goes with the pass's end, or with the connection if the
// unlock fails.
func (s *Store) WithCloudLock(ctx context.Context, pass func(context.Context) error) (bool, error) {
	return s.withSessionLock(ctx, cloudLockKey, pass)
}

// withSessionLock runs fn while this replica holds session advisory lock
// key, on a connection of its own, and answers whether it ran: taken
// elsewhere, fn does not run. The lock goes when fn returns (with a fresh
// context, even when ctx has ended), or with the connection if the unlock
// fails.
func (s *Store) withSessionLock(ctx context.Context, key int64, fn func(context.Context) error) (bool, error) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	var mine bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&mine); err != nil || !mine {
		return false, err
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, key); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx)) // the session, and its lock, end with the connection
		}
	}()
	return true, fn(ctx)
}

// MinIPv6CloudBits is the shortest IPv6 cloud block: a block holds at
// most 2^32 addresses (alloc.BlockLayout), so of an IPv6 /80 EC2
// delegates the workers record its first /96.
const MinIPv6CloudBits = 96

// maxProviderIDLen bounds a providerID, as the API does.
const maxProviderIDLen = 512

// SetCiliumNodeProviderID records providerID (the Kubernetes Node's
// spec.providerID, or one the crd-mode controller made of the
// CiliumNode's instance id) as the node's when the pool its labels select
// (as ReserveNodeAddresses selects it) is a cloud pool of that
// providerID's cloud, and answers whether it is. Recorded, the node is one
// of the pool's CloudNodes: the capacity workers give it the cloud's
// addresses the CiliumNode's pool then reserves, on the interfaces ifaces
// (the CiliumNode's spec.eni) says hold Pod addresses, recorded with it,
// and with the labels the pool was chosen by. A node of a carved pool
// gets no providerID from here, so no cloud addresses. A node the store
// does not know yet is left alone (false); so is one whose providerID is
// already that.
func (s *Store) SetCiliumNodeProviderID(ctx context.Context, space, node string, nodeLabels map[string]string, defaultPool, providerID string,
	ifaces PodInterfaces) (bool, error) {
	if defaultPool == "" {
		defaultPool = s.opts.DefaultPool
	}
	for _, err := range []error{
		alloc.ValidateLabelName("space", space),
		alloc.ValidateNodeName("node", node),
		alloc.ValidateKubernetesLabels("labels", nodeLabels),
		alloc.ValidateLabelName("defaultPool", defaultPool),
	} {
		if err != nil {
			return false, err
		}
	}
	if providerID == "" || len(providerID) > maxProviderIDLen || strings.ContainsFunc(providerID, unicode.IsControl) {
		return false, alloc.Invalid("providerID", "must be 1 to %d characters, none a control character", maxProviderIDLen)
	}
	if ifaces.FirstIndex != nil && *ifaces.FirstIndex < 0 {
		return false, alloc.Invalid("firstInterfaceIndex", "must not be negative")
	}
	if ifaces.MaxPods < 0 {
		return false, alloc.Invalid("maxPods", "must not be negative")
	}
	var maxPods *int
	if ifaces.MaxPods > 0 {
		maxPods = &ifaces.MaxPods
	}
	var excludeTags []byte
	if len(ifaces.ExcludeTags) > 0 {
		b, err := json.Marshal(ifaces.ExcludeTags)
		if err != nil {
			return false, err
		}
		excludeTags = b
	}
	var isCloud bool
	err := s.inTx(ctx, func(tx querier) error {
		isCloud = false
		var nodeID int64
		err := tx.QueryRow(ctx, `SELECT id FROM nodes WHERE space = $1 AND name = $2`, space, node).Scan(&nodeID)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		} else if err != nil {
			return err
		}
		p, _, ok, err := s.nodePool(ctx, tx, space, node, nodeLabels, defaultPool, alloc.IPv4)
		if err != nil || !ok || !p.cloud {
			return err
		}
		var b []byte
		if err := tx.QueryRow(ctx, `SELECT cloud FROM pools WHERE id = $1`, p.id).Scan(&b); err != nil {
			return err
		}
		spec, err := cloudSpecOf(b)
		if err != nil || spec == nil || !strings.HasPrefix(providerID, string(spec.Provider)+"://") {
			return err
		}
		isCloud = true
		// The labels too, as ReserveNodeAddresses records them: the
		// cloud pool's node selector takes the node by its stored labels
		// (CloudNodes), which must be those the pool was chosen by.
		_, err = tx.Exec(ctx, `UPDATE nodes SET provider_id = @providerID, first_interface_index = @firstIndex,
				exclude_interface_tags = @excludeTags::jsonb, labels = @labels, max_pods = @maxPods, updated_at = @now
			WHERE id = @node AND (provider_id IS DISTINCT FROM @providerID OR first_interface_index IS DISTINCT FROM @firstIndex
				OR exclude_interface_tags IS DISTINCT FROM @excludeTags::jsonb OR labels IS DISTINCT FROM @labels::jsonb
				OR max_pods IS DISTINCT FROM @maxPods::integer)`,
			namedArgs{"node": nodeID, "providerID": providerID, "firstIndex": ifaces.FirstIndex, "excludeTags": excludeTags, "maxPods": maxPods,
				"labels": labelsOrEmpty(nodeLabels), "now": s.now()})
		return err
	})
	return isCloud, err
}
