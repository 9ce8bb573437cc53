package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

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
}

// cloudColumn is c as pools.cloud stores it, nil for no cloud.
func cloudColumn(c *alloc.CloudSpec) ([]byte, error) {
	if c == nil {
		return nil, nil
	}
	j := cloudJSON{Provider: string(c.Provider), Prefixes: c.Prefixes, UsePrimaryAddress: c.UsePrimaryAddress,
		FirstInterfaceIndex: c.FirstInterfaceIndex, SubnetIDs: c.SubnetIDs, SubnetTags: c.SubnetTags,
		SecurityGroups: c.SecurityGroups, ReleaseDelaySeconds: c.ReleaseDelay.Seconds()}
	if w := c.Watermarks; w != nil {
		j.Watermarks = &watermarksJSON{PreAllocate: w.PreAllocate, MinAllocate: w.MinAllocate, MaxAllocate: w.MaxAllocate, MaxAboveWatermark: w.MaxAboveWatermark}
	}
	if t := c.WarmTargets; t != nil {
		j.WarmTargets = &warmTargetsJSON{WarmENI: t.WarmENI, WarmIP: t.WarmIP, MinimumIP: t.MinimumIP, WarmPrefix: t.WarmPrefix}
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
		SecurityGroups: slices.Clone(j.SecurityGroups), ReleaseDelay: time.Duration(j.ReleaseDelaySeconds * float64(time.Second))}
	if w := j.Watermarks; w != nil {
		c.Watermarks = &alloc.Watermarks{PreAllocate: w.PreAllocate, MinAllocate: w.MinAllocate, MaxAllocate: w.MaxAllocate, MaxAboveWatermark: w.MaxAboveWatermark}
	}
	if t := j.WarmTargets; t != nil {
		c.WarmTargets = &alloc.WarmTargets{WarmENI: t.WarmENI, WarmIP: t.WarmIP, MinimumIP: t.MinimumIP, WarmPrefix: t.WarmPrefix}
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
	if !prefix.Addr().Is4() {
		return alloc.Invalid("prefixes", "%s: a cloud pool takes IPv4 addresses only", prefix)
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
	size := int64(1) << (32 - prefix.Bits())
	tag, err := tx.Exec(ctx, `INSERT INTO blocks (space, pool_id, pool_cidr_id, parent_cidr, node_id, family, cidr,
			first_offset, last_offset, reserved, capacity, next_offset, created_at, source, cloud_interface)
		VALUES ($1, $2, $3, $4, $5, 4, $6, 0, $7, '{}', $8, 0, $9, $10, $11) ON CONFLICT DO NOTHING`,
		space, p.id, parentID, parent, nodeID, prefix, size-1, size, now, blockCloud, iface)
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
