package api

import (
	"context"
	"net/netip"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// FenceStore is what the fenced calls (lease generations) and sticky
// addresses need of the store, part of Store.
type FenceStore interface {
	// ConfirmAt, ReleaseAttachmentAt and ReleaseAddressAt act only on
	// leases of generation gen: a lease of another generation is a
	// KindStaleGeneration error and nothing changes. Nothing held (or
	// already released at gen) is success, as without a generation.
	ConfirmAt(ctx context.Context, space, node string, a alloc.Attachment, gen int64) (alloc.Allocation, error)
	ReleaseAttachmentAt(ctx context.Context, space, node string, a alloc.Attachment, gen int64) ([]alloc.Lease, error)
	ReleaseAddressAt(ctx context.Context, space string, addr netip.Addr, gen int64) ([]alloc.Lease, error)
	// ReconcileUpTo is Reconcile keeping the leases above generation upTo
	// (0 or more; 0 keeps every lease).
	ReconcileUpTo(ctx context.Context, space, node, network string, valid []alloc.Attachment, upTo int64) ([]alloc.Lease, error)
	// GenerationHighWater answers the highest generation issued so far.
	GenerationHighWater(ctx context.Context) (int64, error)

	// Bindings answers the addresses bound to identity (held, or released
	// within their retention); Unbind ends those bindings and answers them.
	Bindings(ctx context.Context, space, identity string) ([]alloc.Lease, error)
	Unbind(ctx context.Context, space, identity string) ([]alloc.Lease, error)
}

// GetReconcileWatermark answers the generation a runtime reads before
// listing its attachments, to name it in the reconcile that follows.
func (s *Server) GetReconcileWatermark(ctx context.Context, req ipamv1.GetReconcileWatermarkRequestObject) (ipamv1.GetReconcileWatermarkResponseObject, error) {
	if _, err := parseSpace(req.Params.Space); err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	g, err := s.store.GenerationHighWater(ctx)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetReconcileWatermark200JSONResponse{Generation: g}, nil
}

func (s *Server) GetStickyBindings(ctx context.Context, req ipamv1.GetStickyBindingsRequestObject) (ipamv1.GetStickyBindingsResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	items, err := s.store.Bindings(ctx, space, req.Params.Identity)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetStickyBindings200JSONResponse{Items: leasesToAPI(items)}, nil
}

func (s *Server) DeleteStickyBindings(ctx context.Context, req ipamv1.DeleteStickyBindingsRequestObject) (ipamv1.DeleteStickyBindingsResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	items, err := s.store.Unbind(ctx, space, req.Params.Identity)
	if err != nil {
		return nil, err
	}
	return ipamv1.DeleteStickyBindings200JSONResponse{Items: leasesToAPI(items)}, nil
}
