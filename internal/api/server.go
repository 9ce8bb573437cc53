// Package api serves the IPAM's HTTP API (api/openapi.yaml) over a Store.
//
// Handlers only translate: each parses its strings once into netip and alloc
// values, validates them, calls one Store method and formats the answer.
// Every error, from a handler, the JSON decoder, parameter binding or
// routing, becomes an RFC 9457 problem in one place (problem.go).
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// Server implements the generated strict server interface over a Store.
// Handlers return errors unchanged; NewHandler's error mapper turns them into
// problems.
type Server struct {
	store       Store
	metrics     *metrics          // never nil
	podMetadata PodMetadataSource // nil: requests carry their metadata or have none
	ciliumNodes CiliumNodeSource  // nil: the Cilium operator role is off
	log         *slog.Logger
	liveness    func() error // nil: alive while serving HTTP
}

var _ ipamv1.StrictServerInterface = (*Server)(nil)

// NewServer returns a Server over store, without metrics. Most callers want
// NewHandler, which adds routing, error mapping, the HTTP middleware and
// metrics.
func NewServer(store Store) *Server {
	m, err := newMetrics(noop.Meter{})
	if err != nil { // a no-op meter takes any name
		panic(err)
	}
	return &Server{store: store, metrics: m}
}

// ---- health ----

// GetHealthz answers 200 while the process serves HTTP and its liveness
// check (Options.Liveness) passes, else a 503 problem.
func (s *Server) GetHealthz(context.Context, ipamv1.GetHealthzRequestObject) (ipamv1.GetHealthzResponseObject, error) {
	if s.liveness != nil {
		if err := s.liveness(); err != nil {
			return nil, &unavailableError{err: err}
		}
	}
	return ipamv1.GetHealthz200JSONResponse{Status: "ok"}, nil
}

// GetReadyz answers 200 with the schema version when the store is ready,
// else a 503 problem.
func (s *Server) GetReadyz(ctx context.Context, _ ipamv1.GetReadyzRequestObject) (ipamv1.GetReadyzResponseObject, error) {
	v, err := s.store.Ready(ctx)
	if err != nil {
		return nil, &unavailableError{err: err}
	}
	return ipamv1.GetReadyz200JSONResponse{Status: "ok", SchemaVersion: &v}, nil
}

// ---- spaces ----

func (s *Server) ListSpaces(ctx context.Context, req ipamv1.ListSpacesRequestObject) (ipamv1.ListSpacesResponseObject, error) {
	page, err := parsePage(req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := s.store.ListSpaces(ctx, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListSpaces200JSONResponse(spaceListToAPI(items, next)), nil
}

func (s *Server) CreateSpace(ctx context.Context, req ipamv1.CreateSpaceRequestObject) (ipamv1.CreateSpaceResponseObject, error) {
	if err := alloc.ValidateLabelName("name", req.Body.Name); err != nil {
		return nil, err
	}
	sp, err := s.store.CreateSpace(ctx, req.Body.Name)
	if err != nil {
		return nil, err
	}
	return ipamv1.CreateSpace201JSONResponse(spaceToAPI(sp)), nil
}

func (s *Server) GetSpace(ctx context.Context, req ipamv1.GetSpaceRequestObject) (ipamv1.GetSpaceResponseObject, error) {
	if err := alloc.ValidateLabelName("space", req.Space); err != nil {
		return nil, err
	}
	sp, err := s.store.GetSpace(ctx, req.Space)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetSpace200JSONResponse(spaceToAPI(sp)), nil
}

func (s *Server) DeleteSpace(ctx context.Context, req ipamv1.DeleteSpaceRequestObject) (ipamv1.DeleteSpaceResponseObject, error) {
	if err := alloc.ValidateLabelName("space", req.Space); err != nil {
		return nil, err
	}
	if err := s.store.DeleteSpace(ctx, req.Space); err != nil {
		return nil, err
	}
	return ipamv1.DeleteSpace204Response{}, nil
}

// ---- pools ----

func (s *Server) ListPools(ctx context.Context, req ipamv1.ListPoolsRequestObject) (ipamv1.ListPoolsResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	page, err := parsePage(req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := s.store.ListPools(ctx, space, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListPools200JSONResponse(poolListToAPI(items, next)), nil
}

func (s *Server) CreatePool(ctx context.Context, req ipamv1.CreatePoolRequestObject) (ipamv1.CreatePoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	p, err := poolFromAPI(space, *req.Body)
	if err != nil {
		return nil, err
	}
	dry := deref(req.Params.DryRun, false)
	p, err = s.store.CreatePool(ctx, p, alloc.DryRun(dry))
	if err != nil {
		return nil, err
	}
	if dry {
		return ipamv1.CreatePool200JSONResponse(poolToAPI(p)), nil
	}
	return ipamv1.CreatePool201JSONResponse(poolToAPI(p)), nil
}

func (s *Server) GetPool(ctx context.Context, req ipamv1.GetPoolRequestObject) (ipamv1.GetPoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	p, err := s.store.GetPool(ctx, space, req.Pool)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetPool200JSONResponse(poolToAPI(p)), nil
}

// UpdatePool replaces labels and spec; absent labels replace the pool's
// labels with none.
func (s *Server) UpdatePool(ctx context.Context, req ipamv1.UpdatePoolRequestObject) (ipamv1.UpdatePoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	labels, spec, err := poolUpdateFromAPI(req.Pool, *req.Body)
	if err != nil {
		return nil, err
	}
	p, err := s.store.UpdatePool(ctx, space, req.Pool, labels, spec, alloc.DryRun(deref(req.Params.DryRun, false)))
	if err != nil {
		return nil, err
	}
	return ipamv1.UpdatePool200JSONResponse(poolToAPI(p)), nil
}

func (s *Server) DeletePool(ctx context.Context, req ipamv1.DeletePoolRequestObject) (ipamv1.DeletePoolResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	dry := deref(req.Params.DryRun, false)
	p, err := s.store.DeletePool(ctx, space, req.Pool, alloc.DryRun(dry))
	if err != nil {
		return nil, err
	}
	if dry {
		return ipamv1.DeletePool200JSONResponse(poolToAPI(p)), nil
	}
	return ipamv1.DeletePool204Response{}, nil
}

// GetPoolCapacity reports a pool's capacity and forecast.
func (s *Server) GetPoolCapacity(ctx context.Context, req ipamv1.GetPoolCapacityRequestObject) (ipamv1.GetPoolCapacityResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Pool); err != nil {
		return nil, err
	}
	window, err := parseWindow(req.Params.Window)
	if err != nil {
		return nil, err
	}
	c, err := s.store.PoolCapacity(ctx, space, req.Pool, window)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetPoolCapacity200JSONResponse(poolCapacityToAPI(req.Pool, window, c)), nil
}

// ---- nodes ----

func (s *Server) ListNodes(ctx context.Context, req ipamv1.ListNodesRequestObject) (ipamv1.ListNodesResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	page, err := parsePage(req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := s.store.ListNodes(ctx, space, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListNodes200JSONResponse(nodeListToAPI(items, next)), nil
}

func (s *Server) GetNode(ctx context.Context, req ipamv1.GetNodeRequestObject) (ipamv1.GetNodeResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	n, err := s.store.GetNode(ctx, space, req.Node)
	if err != nil {
		return nil, err
	}
	out := nodeToAPI(n)
	if s.ciliumNodes != nil {
		st, ok, err := s.ciliumNodes.CiliumNodeState(ctx, space, req.Node)
		if err != nil {
			// The API server is the operator's business, not this
			// request's: the node is answered without it.
			s.log.WarnContext(ctx, "reading the node's CiliumNode", "node", req.Node, "err", err)
		} else if ok {
			out.Cilium = ciliumNodeToAPI(st)
		}
	}
	return ipamv1.GetNode200JSONResponse(out), nil
}

func (s *Server) GetNodeUsage(ctx context.Context, req ipamv1.GetNodeUsageRequestObject) (ipamv1.GetNodeUsageResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	only, err := usageFilterFromAPI(req.Params)
	if err != nil {
		return nil, err
	}
	u, err := s.store.NodeUsage(ctx, space, req.Node, only)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetNodeUsage200JSONResponse(nodeUsageToAPI(req.Node, u)), nil
}

// PutNode answers 201 when it registered the node, 200 when it replaced it.
func (s *Server) PutNode(ctx context.Context, req ipamv1.PutNodeRequestObject) (ipamv1.PutNodeResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	n, err := nodeFromAPI(space, req.Node, *req.Body)
	if err != nil {
		return nil, err
	}
	n, created, err := s.store.PutNode(ctx, n)
	if err != nil {
		return nil, err
	}
	if created {
		return ipamv1.PutNode201JSONResponse(nodeToAPI(n)), nil
	}
	return ipamv1.PutNode200JSONResponse(nodeToAPI(n)), nil
}

func (s *Server) DeleteNode(ctx context.Context, req ipamv1.DeleteNodeRequestObject) (ipamv1.DeleteNodeResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	if err := s.store.DeleteNode(ctx, space, req.Node, deref(req.Params.Force, false)); err != nil {
		return nil, err
	}
	return ipamv1.DeleteNode204Response{}, nil
}

// ---- blocks ----

func (s *Server) ListBlocks(ctx context.Context, req ipamv1.ListBlocksRequestObject) (ipamv1.ListBlocksResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	items, err := s.store.ListBlocks(ctx, space, req.Node)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListBlocks200JSONResponse(blockListToAPI(items)), nil
}

func (s *Server) CarveBlock(ctx context.Context, req ipamv1.CarveBlockRequestObject) (ipamv1.CarveBlockResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	if err := alloc.ValidateLabelName("pool", req.Body.Pool); err != nil {
		return nil, err
	}
	f, err := parseFamily("family", req.Body.Family)
	if err != nil {
		return nil, err
	}
	b, err := s.store.CarveBlock(ctx, space, req.Node, req.Body.Pool, f)
	if err != nil {
		return nil, err
	}
	return ipamv1.CarveBlock201JSONResponse(blockToAPI(b)), nil
}

func (s *Server) ReleaseBlock(ctx context.Context, req ipamv1.ReleaseBlockRequestObject) (ipamv1.ReleaseBlockResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	cidr, err := parsePrefix("cidr", req.Params.Cidr)
	if err != nil {
		return nil, err
	}
	if err := s.store.ReleaseBlock(ctx, space, req.Node, cidr); err != nil {
		return nil, err
	}
	return ipamv1.ReleaseBlock204Response{}, nil
}

// ---- leases ----

// AllocateLease is the hot path (one call per Pod interface): parse,
// validate, one store transaction, format. It answers 201 for a new
// allocation and 200 for a retry of the same attachment, and counts every
// call by its outcome.
func (s *Server) AllocateLease(ctx context.Context, req ipamv1.AllocateLeaseRequestObject) (ipamv1.AllocateLeaseResponseObject, error) {
	a, err := s.allocate(ctx, req)
	s.metrics.countAllocation(ctx, a, err)
	if err != nil {
		return nil, err
	}
	if mayReadEveryNode(ctx) {
		showOperatorReasons(a)
	}
	if a.Created {
		return ipamv1.AllocateLease201JSONResponse(allocationToAPI(a)), nil
	}
	return ipamv1.AllocateLease200JSONResponse(allocationToAPI(a)), nil
}

func (s *Server) allocate(ctx context.Context, req ipamv1.AllocateLeaseRequestObject) (alloc.Allocation, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return alloc.Allocation{}, err
	}
	r, err := leaseRequestFromAPI(space, req.Node, *req.Body)
	if err != nil {
		return alloc.Allocation{}, err
	}
	if s.podMetadata != nil && req.Body.Pod == nil && req.Body.Namespace == nil {
		r.Pod, r.Namespace, err = s.podMetadata.PodMetadata(ctx, r.Owner.Namespace, r.Owner.Name)
		switch {
		case errors.Is(err, ErrPodNotFound):
			return alloc.Allocation{}, alloc.NotFound("owner", "pod", r.Owner.Namespace+"/"+r.Owner.Name+" in Kubernetes")
		case err != nil:
			return alloc.Allocation{}, &unavailableError{err: fmt.Errorf("kubernetes lookup: %w", err)}
		}
	}
	return s.store.Allocate(ctx, r)
}

func (s *Server) GetAttachment(ctx context.Context, req ipamv1.GetAttachmentRequestObject) (ipamv1.GetAttachmentResponseObject, error) {
	space, node, a, err := parseAttachmentPath(req.Params.Space, req.Params.Network, req.Node, req.ContainerID, req.Interface)
	if err != nil {
		return nil, err
	}
	got, err := s.store.GetAttachment(ctx, space, node, a)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetAttachment200JSONResponse(allocationToAPI(got)), nil
}

func (s *Server) ConfirmAttachment(ctx context.Context, req ipamv1.ConfirmAttachmentRequestObject) (ipamv1.ConfirmAttachmentResponseObject, error) {
	space, node, a, err := parseAttachmentPath(req.Params.Space, req.Params.Network, req.Node, req.ContainerID, req.Interface)
	if err != nil {
		return nil, err
	}
	var got alloc.Allocation
	if g := req.Params.Generation; g != nil {
		got, err = s.store.ConfirmAt(ctx, space, node, a, *g)
	} else {
		got, err = s.store.Confirm(ctx, space, node, a)
	}
	if err != nil {
		return nil, err
	}
	return ipamv1.ConfirmAttachment200JSONResponse(allocationToAPI(got)), nil
}

// ReleaseAttachment answers 204 whether or not anything was held, and counts
// the leases it released.
func (s *Server) ReleaseAttachment(ctx context.Context, req ipamv1.ReleaseAttachmentRequestObject) (ipamv1.ReleaseAttachmentResponseObject, error) {
	space, node, a, err := parseAttachmentPath(req.Params.Space, req.Params.Network, req.Node, req.ContainerID, req.Interface)
	if err != nil {
		return nil, err
	}
	var released []alloc.Lease
	if g := req.Params.Generation; g != nil {
		released, err = s.store.ReleaseAttachmentAt(ctx, space, node, a, *g)
	} else {
		released, err = s.store.ReleaseAttachment(ctx, space, node, a)
	}
	if err != nil {
		return nil, err
	}
	s.metrics.countReleases(ctx, released)
	return ipamv1.ReleaseAttachment204Response{}, nil
}

// ReconcileNode releases the node's leases that no valid attachment holds,
// and counts them and those it kept.
func (s *Server) ReconcileNode(ctx context.Context, req ipamv1.ReconcileNodeRequestObject) (ipamv1.ReconcileNodeResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	if err := alloc.ValidateNodeName("node", req.Node); err != nil {
		return nil, err
	}
	valid, err := attachmentsFromAPI(*req.Body)
	if err != nil {
		return nil, err
	}
	var released []alloc.Lease
	if g := req.Body.Generation; g != nil {
		if err := alloc.ValidateWatermark("generation", *g); err != nil {
			return nil, err
		}
		released, err = s.store.ReconcileUpTo(ctx, space, req.Node, deref(req.Body.Network, ""), valid, *g)
	} else {
		released, err = s.store.Reconcile(ctx, space, req.Node, deref(req.Body.Network, ""), valid)
	}
	if err != nil {
		return nil, err
	}
	s.metrics.countReleases(ctx, released)
	// What the list left out but the call kept, so a runtime can say why a
	// GC released nothing.
	kept, err := s.store.ReconcileKept(ctx, space, req.Node, deref(req.Body.Network, ""), valid)
	if err != nil {
		return nil, err
	}
	return ipamv1.ReconcileNode200JSONResponse{Released: leasesToAPI(released), Kept: kept}, nil
}

func (s *Server) ListLeases(ctx context.Context, req ipamv1.ListLeasesRequestObject) (ipamv1.ListLeasesResponseObject, error) {
	f, err := leaseFilterFromAPI(req.Params)
	if err != nil {
		return nil, err
	}
	page, err := parsePage(req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := s.store.ListLeases(ctx, f, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListLeases200JSONResponse{Items: leasesToAPI(items), Continue: optString(next)}, nil
}

func (s *Server) GetAddress(ctx context.Context, req ipamv1.GetAddressRequestObject) (ipamv1.GetAddressResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	addr, err := parseAddr("address", req.Address)
	if err != nil {
		return nil, err
	}
	l, err := s.store.GetAddress(ctx, space, addr)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetAddress200JSONResponse(leaseToAPI(l)), nil
}

// ReleaseAddress answers 204 whether or not the address was held, and counts
// the lease it released.
func (s *Server) ReleaseAddress(ctx context.Context, req ipamv1.ReleaseAddressRequestObject) (ipamv1.ReleaseAddressResponseObject, error) {
	space, err := parseSpace(req.Params.Space)
	if err != nil {
		return nil, err
	}
	addr, err := parseAddr("address", req.Address)
	if err != nil {
		return nil, err
	}
	var released []alloc.Lease
	if g := req.Params.Generation; g != nil {
		released, err = s.store.ReleaseAddressAt(ctx, space, addr, *g)
	} else {
		released, err = s.store.ReleaseAddress(ctx, space, addr)
	}
	if err != nil {
		return nil, err
	}
	s.metrics.countReleases(ctx, released)
	return ipamv1.ReleaseAddress204Response{}, nil
}

// ---- sizing ----

// GetSizing is pure arithmetic; it does not touch the store.
func (s *Server) GetSizing(_ context.Context, req ipamv1.GetSizingRequestObject) (ipamv1.GetSizingResponseObject, error) {
	sz, err := sizingFromAPI(req.Params)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetSizing200JSONResponse(sizingToAPI(sz)), nil
}
