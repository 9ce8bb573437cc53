// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"context"
	"crypto/sha256"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// TokenStore keeps API tokens; it never sees a secret, only its SHA-256.
type TokenStore interface {
	// CreateToken stores a token (spec resolved against the store's
	// clock); a live token of the same name is KindConflict on "name".
	CreateToken(ctx context.Context, spec alloc.TokenSpec, hash [sha256.Size]byte) (alloc.Token, error)
	// ListTokens pages through the live (not revoked) tokens by name.
	ListTokens(ctx context.Context, page alloc.Page) (items []alloc.Token, next string, err error)
	// RevokeToken revokes the live token of name, or answers KindNotFound.
	RevokeToken(ctx context.Context, name string) error
}

// tokenHandlers serve /v1/tokens.
type tokenHandlers struct {
	store TokenStore
}

// CreateToken makes a token and shows its secret, this once.
func (h *tokenHandlers) CreateToken(ctx context.Context, req ipamv1.CreateTokenRequestObject) (ipamv1.CreateTokenResponseObject, error) {
	spec, err := tokenSpecFromAPI(*req.Body, alloc.ActorFrom(ctx))
	if err != nil {
		return nil, err
	}
	secret, hash := alloc.NewTokenSecret()
	t, err := h.store.CreateToken(ctx, spec, hash)
	if err != nil {
		return nil, err
	}
	return ipamv1.CreateToken201JSONResponse(tokenCreatedToAPI(t, secret)), nil
}

// ListTokens lists live tokens without secrets or hashes (the store has no
// secret, and the hash stays in it).
func (h *tokenHandlers) ListTokens(ctx context.Context, req ipamv1.ListTokensRequestObject) (ipamv1.ListTokensResponseObject, error) {
	page, err := parsePage(req.Params.Limit, req.Params.Continue)
	if err != nil {
		return nil, err
	}
	items, next, err := h.store.ListTokens(ctx, page)
	if err != nil {
		return nil, err
	}
	return ipamv1.ListTokens200JSONResponse(tokenListToAPI(items, next)), nil
}

// RevokeToken revokes a live token.
func (h *tokenHandlers) RevokeToken(ctx context.Context, req ipamv1.RevokeTokenRequestObject) (ipamv1.RevokeTokenResponseObject, error) {
	if err := alloc.ValidateLabelName("name", req.Name); err != nil {
		return nil, err
	}
	if err := h.store.RevokeToken(ctx, req.Name); err != nil {
		return nil, err
	}
	return ipamv1.RevokeToken204Response{}, nil
}
