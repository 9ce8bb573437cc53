// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// sizingHandlers answer the sizing arithmetic, which needs no store.
type sizingHandlers struct{}

// GetSizing is pure arithmetic; it does not touch the store.
func (h *sizingHandlers) GetSizing(_ context.Context, req ipamv1.GetSizingRequestObject) (ipamv1.GetSizingResponseObject, error) {
	sz, err := sizingFromAPI(req.Params)
	if err != nil {
		return nil, err
	}
	return ipamv1.GetSizing200JSONResponse(sizingToAPI(sz)), nil
}
