package api

import (
	"context"
	"net/netip"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Store is what the handlers need from persistence: the method set of the
// PostgreSQL store (internal/store.Store, which cmd/server passes in),
// declared here so that this package depends on behaviour, not on the
// implementation.
//
// Errors are *alloc.Error for anything the client can fix; the handlers
// return them unchanged and the error mapper turns them into problems. Any
// other error is internal: it is logged and answered as a 500 without its
// text.
type Store interface {
	// TokenStore keeps the API tokens (tokens.go).
	TokenStore

	// Ready answers the applied schema version, or an error when the
	// database is unreachable or its schema is older than the binary's.
	Ready(ctx context.Context) (int64, error)

	CreateSpace(ctx context.Context, name string) (alloc.Space, error)
	GetSpace(ctx context.Context, name string) (alloc.Space, error)
	ListSpaces(ctx context.Context, page alloc.Page) (items []alloc.Space, next string, err error)
	// DeleteSpace refuses (KindInUse) a space that still has pools or nodes.
	DeleteSpace(ctx context.Context, name string) error

	// CreatePool refuses overlap with any pool CIDR of the space
	// (KindOverlap naming the CIDR's field).
	// Pool writes take alloc.DryRun(true) to check and answer without
	// writing.
	CreatePool(ctx context.Context, p alloc.Pool, opts ...alloc.WriteOption) (alloc.Pool, error)
	GetPool(ctx context.Context, space, name string) (alloc.Pool, error)
	ListPools(ctx context.Context, space string, page alloc.Page) (items []alloc.Pool, next string, err error)
	// UpdatePool replaces labels and spec; it refuses changes of immutable
	// fields (KindImmutable) and the removal of a CIDR or family that has
	// blocks (KindInUse).
	UpdatePool(ctx context.Context, space, name string, labels map[string]string, spec alloc.PoolSpec, opts ...alloc.WriteOption) (alloc.Pool, error)
	// DeletePool refuses (KindInUse, naming the nodes) a pool that has
	// blocks; it answers the pool as it was.
	DeletePool(ctx context.Context, space, name string, opts ...alloc.WriteOption) (alloc.Pool, error)
	// PoolCapacity reports each family's capacity, fragmentation, nodes at
	// capacity or in deficit, and the forecast over window.
	PoolCapacity(ctx context.Context, space, name string, window time.Duration) (map[alloc.Family]alloc.FamilyCapacity, error)

	// PutNode registers n or replaces its labels, addresses and provider ID;
	// created reports a registration.
	PutNode(ctx context.Context, n alloc.Node) (node alloc.Node, created bool, err error)
	GetNode(ctx context.Context, space, name string) (alloc.Node, error)
	ListNodes(ctx context.Context, space string, page alloc.Page) (items []alloc.Node, next string, err error)
	// DeleteNode refuses (KindInUse) a node with pending or active leases,
	// or with addresses bound to workload identities, unless force; force
	// releases its leases (and bindings) and blocks first.
	DeleteNode(ctx context.Context, space, name string, force bool) error

	// NodeUsage reports the node's use of each pool family it holds blocks
	// of or pre-allocates from, or of exactly the pools the filter names
	// (KindNotFound for one the space lacks; a node not registered yet
	// holds no blocks), in one snapshot.
	NodeUsage(ctx context.Context, space, node string, only alloc.UsageFilter) (alloc.NodeUsage, error)

	ListBlocks(ctx context.Context, space, node string) ([]alloc.Block, error)
	// CarveBlock carves the first free aligned block of the pool's mask.
	CarveBlock(ctx context.Context, space, node, pool string, f alloc.Family) (alloc.Block, error)
	// ReleaseBlock returns an empty block (no lease in any state) to its pool.
	ReleaseBlock(ctx context.Context, space, node string, cidr netip.Prefix) error

	// Allocate leases one address per family in one transaction; a retry of
	// the same attachment answers the existing leases with Created=false.
	Allocate(ctx context.Context, r alloc.LeaseRequest) (alloc.Allocation, error)
	GetAttachment(ctx context.Context, space, node string, a alloc.Attachment) (alloc.Allocation, error)
	Confirm(ctx context.Context, space, node string, a alloc.Attachment) (alloc.Allocation, error)
	// ReleaseAttachment and ReleaseAddress succeed when nothing is held and
	// return what they released.
	ReleaseAttachment(ctx context.Context, space, node string, a alloc.Attachment) ([]alloc.Lease, error)
	ReleaseAddress(ctx context.Context, space string, addr netip.Addr) ([]alloc.Lease, error)
	// GetAddress answers the pending, active or cooling lease of addr.
	GetAddress(ctx context.Context, space string, addr netip.Addr) (alloc.Lease, error)
	ListLeases(ctx context.Context, f alloc.LeaseFilter, page alloc.Page) (items []alloc.Lease, next string, err error)
	// Reconcile releases every pending or active lease of the node's
	// network whose attachment is not in valid (all of that network), and
	// returns them; other networks' leases are kept.
	Reconcile(ctx context.Context, space, node, network string, valid []alloc.Attachment) ([]alloc.Lease, error)
	// ReconcileKept counts the node's pending and active leases of network
	// that no attachment of valid holds: after Reconcile, the ones it kept.
	ReconcileKept(ctx context.Context, space, node, network string, valid []alloc.Attachment) (int64, error)

	FenceStore
	// History pages through the events of one address, owner or node,
	// oldest first; HolderAt answers the holding of addr that contains
	// instant at, KindNotFound when nobody held it then.
	History(ctx context.Context, f alloc.HistoryFilter, page alloc.Page) (items []alloc.Event, next string, err error)
	HolderAt(ctx context.Context, space string, addr netip.Addr, at time.Time) (alloc.Holding, error)
	// CheckConsistency verifies every invariant in one snapshot.
	CheckConsistency(ctx context.Context) (alloc.ConsistencyReport, error)
}
