// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// tokenSpecFromAPI parses a token request made by createdBy; the expiry is
// resolved against the store's clock (expiresIn) or taken as given
// (expiresAt).
func tokenSpecFromAPI(b ipamv1.TokenRequest, createdBy string) (alloc.TokenSpec, error) {
	spec := alloc.TokenSpec{Name: b.Name, Role: alloc.Role(b.Role), CreatedBy: createdBy}
	if err := alloc.ValidateLabelName("name", b.Name); err != nil {
		return alloc.TokenSpec{}, err
	}
	if _, err := alloc.ParseTokenRole("role", string(b.Role)); err != nil {
		return alloc.TokenSpec{}, err
	}
	if b.ExpiresIn != nil {
		ttl, err := alloc.ParseTokenTTL("expiresIn", *b.ExpiresIn)
		if err != nil {
			return alloc.TokenSpec{}, err
		}
		spec.TTL = ttl
	}
	if b.ExpiresAt != nil {
		at, err := time.Parse(time.RFC3339, *b.ExpiresAt)
		if err != nil {
			return alloc.TokenSpec{}, alloc.Invalid("expiresAt", "%.64q is not an RFC 3339 date-time such as 2030-01-02T15:04:05Z", *b.ExpiresAt)
		}
		spec.ExpiresAt = at
	}
	return spec, nil
}

func tokenToAPI(t alloc.Token) ipamv1.Token {
	return ipamv1.Token{Name: t.Name, Role: ipamv1.TokenRole(t.Role), State: string(t.State),
		CreatedAt: t.CreatedAt, CreatedBy: t.CreatedBy, ExpiresAt: t.ExpiresAt, LastUsedAt: t.LastUsedAt}
}

// tokenCreatedToAPI is a new token with its secret, the one answer that
// shows it.
func tokenCreatedToAPI(t alloc.Token, secret string) ipamv1.TokenCreated {
	a := tokenToAPI(t)
	return ipamv1.TokenCreated{Name: a.Name, Role: a.Role, State: a.State, CreatedAt: a.CreatedAt,
		CreatedBy: a.CreatedBy, ExpiresAt: a.ExpiresAt, LastUsedAt: a.LastUsedAt, Secret: secret}
}

func tokenListToAPI(items []alloc.Token, next string) ipamv1.TokenList {
	out := ipamv1.TokenList{Items: make([]ipamv1.Token, 0, len(items)), Continue: optString(next)}
	for _, t := range items {
		out.Items = append(out.Items, tokenToAPI(t))
	}
	return out
}
