// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// ConsistencyStore checks the invariants of the database.
type ConsistencyStore interface {
	// CheckConsistency verifies every invariant in one snapshot while
	// allocation goes on; what it finds is in the report, not an error.
	CheckConsistency(ctx context.Context) (alloc.ConsistencyReport, error)
}

// consistencyHandlers serve /v1/consistency.
type consistencyHandlers struct {
	store ConsistencyStore
}

// CheckConsistency runs the check and answers what it found; findings are
// a 200 like a clean report (the check itself succeeded).
func (h *consistencyHandlers) CheckConsistency(ctx context.Context, _ ipamv1.CheckConsistencyRequestObject) (ipamv1.CheckConsistencyResponseObject, error) {
	r, err := h.store.CheckConsistency(ctx)
	if err != nil {
		return nil, err
	}
	return ipamv1.CheckConsistency200JSONResponse(ConsistencyReportToAPI(r)), nil
}
