// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// PendingWindow is how long a Pod a cloud pool's node refused for want of
// an address counts as waiting on the node (CloudNode.Pending). The
// kubelet retries a failed sandbox within seconds (its back-off grows to
// a few minutes only after many failures), and each refusal starts the
// window again; a Pod deleted meanwhile stops retrying and stops counting
// once the window has passed.
const PendingWindow = 2 * time.Minute

// maxPendingPerNode bounds the refusals recorded of a node whose
// Kubernetes Node says no max Pods: the callers of the API write them, so
// one that asks for addresses the pool does not have, under ever new
// names, must not grow the table without bound.
const maxPendingPerNode = 256

// notePending records that the allocation r was refused because cloud
// pool pool had no address for it on its node: a Pod waits there, and the
// kubelet retries it. The record is of the Pod (its owner) and interface,
// not of the attachment: a sandbox whose network setup failed is torn
// down (a CNI DEL) and the retry comes in a new sandbox, a new container
// ID, for the same Pod. A retry refreshes the record's time. Records of
// the node older than PendingWindow go in the same statement; a node
// holding as many recent records as its max Pods (else
// maxPendingPerNode) records no new Pod, only refreshes those it has
// (concurrent refusals may each pass the bound once). Nothing is recorded
// for a pool with no spec.cloud, a node not registered, or the node's own
// reserve (no Pod waits on it).
//
// The record is not deleted when the Pod is leased: that would put a
// statement on the success path of Allocate, the hot path. CloudNodes
// instead counts only the records no lease of the node made since
// answers, and the record ages out. A failure to record is ignored, as
// explainCooling's is: the allocation's answer is the refusal all the same.
func (s *Store) notePending(ctx context.Context, r alloc.LeaseRequest, pool string) {
	if r.Owner.IsReserve() {
		return
	}
	now := s.now()
	_, _ = s.db.Exec(ctx, `WITH n AS (SELECT id, coalesce(max_pods, @cap) AS cap FROM nodes WHERE space = @space AND name = @node),
			p AS (SELECT id FROM pools WHERE space = @space AND name = @pool AND cloud IS NOT NULL),
			aged AS (DELETE FROM cloud_refusals r USING n WHERE r.node_id = n.id AND r.refused_at <= @since
				AND NOT (r.owner_namespace = @ns AND r.owner_name = @name AND r.owner_uid = @uid AND r.interface = @iface))
		INSERT INTO cloud_refusals (node_id, pool_id, owner_namespace, owner_name, owner_uid, interface, refused_at)
		SELECT n.id, p.id, @ns, @name, @uid, @iface, @now FROM n, p
		WHERE (SELECT count(*) FROM cloud_refusals r WHERE r.node_id = n.id AND r.refused_at > @since) < n.cap
		   OR EXISTS (SELECT 1 FROM cloud_refusals r WHERE r.node_id = n.id AND r.pool_id = p.id
				AND r.owner_namespace = @ns AND r.owner_name = @name AND r.owner_uid = @uid AND r.interface = @iface)
		ON CONFLICT (node_id, pool_id, owner_namespace, owner_name, owner_uid, interface) DO UPDATE SET refused_at = excluded.refused_at`,
		namedArgs{"space": r.Space, "node": r.Node, "pool": pool, "cap": maxPendingPerNode, "now": now, "since": now.Add(-PendingWindow),
			"ns": r.Owner.Namespace, "name": r.Owner.Name, "uid": r.Owner.UID, "iface": r.Attachment.Interface})
}
