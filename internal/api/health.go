// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// HealthStore is what the probes ask of the store.
type HealthStore interface {
	// Ready answers the applied schema version, or an error when the
	// database is unreachable or its schema is older than the binary's.
	Ready(ctx context.Context) (int64, error)
}

// healthHandlers answer the probes: /healthz for the process, /readyz for
// its database.
type healthHandlers struct {
	store    HealthStore
	liveness func() error // nil: alive while serving HTTP
}

// GetHealthz answers 200 while the process serves HTTP and its liveness
// check (Options.Liveness) passes, else a 503 problem.
func (h *healthHandlers) GetHealthz(context.Context, ipamv1.GetHealthzRequestObject) (ipamv1.GetHealthzResponseObject, error) {
	if h.liveness != nil {
		if err := h.liveness(); err != nil {
			return nil, &unavailableError{err: err}
		}
	}
	return ipamv1.GetHealthz200JSONResponse{Status: "ok"}, nil
}

// GetReadyz answers 200 with the schema version when the store is ready,
// else a 503 problem.
func (h *healthHandlers) GetReadyz(ctx context.Context, _ ipamv1.GetReadyzRequestObject) (ipamv1.GetReadyzResponseObject, error) {
	v, err := h.store.Ready(ctx)
	if err != nil {
		return nil, &unavailableError{err: err}
	}
	return ipamv1.GetReadyz200JSONResponse{Status: "ok", SchemaVersion: &v}, nil
}
