// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Continue tokens carry the last key of the previous page (keyset
// pagination on an index, never OFFSET), sealed so that the key reaches a
// query only when this service made the token for the same list:
//
//	base64url(version || key || HMAC-SHA256(secret, version, list, filter..., key))
//
// The list is its kind ("pools", "leases", ...) and filter its parameters
// (space, node, state, time range, ...), so a token of one list or filter is
// refused by another instead of resuming it at a key of the wrong kind. The
// secret is one random row of the database (page_token_key, migration
// 00010), so every replica makes and accepts the same tokens; each replica
// reads it once. A token that does not verify, including every token made
// before version 1 (the plain base64url key), is KindInvalid on "continue":
// the client starts the list again.

// pageTokenVersion is the first byte of every token; a token of another
// version is refused.
const pageTokenVersion byte = 1

// pageKind names a list in the tokens' MAC.
type pageKind string

const (
	pageSpaces     pageKind = "spaces"
	pagePools      pageKind = "pools"
	pageLBPools    pageKind = "lb-pools"
	pageVIPOwners  pageKind = "vip-owners"
	pageCIDRGroups pageKind = "cidr-groups"
	pageNodes      pageKind = "nodes"
	pageTokens     pageKind = "tokens"
	pageLeases     pageKind = "leases"
	pagePoolBlocks pageKind = "pool-blocks"
	pageHistory    pageKind = "history"
)

// pageScope is one list with its filter: the token of a page of it is good
// for the next page of the same list with the same filter only.
type pageScope struct {
	kind   pageKind
	filter []string
}

func scopeOf(kind pageKind, filter ...string) pageScope { return pageScope{kind, filter} }

// mac answers the token's MAC over the version, the scope and the key, each
// length-prefixed so that no two inputs share an encoding.
func (sc pageScope) mac(secret []byte, key string) []byte {
	m := hmac.New(sha256.New, secret)
	var n [binary.MaxVarintLen64]byte
	put := func(s string) {
		m.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		m.Write([]byte(s))
	}
	m.Write([]byte{pageTokenVersion})
	put(string(sc.kind))
	m.Write(n[:binary.PutUvarint(n[:], uint64(len(sc.filter)))])
	for _, f := range sc.filter {
		put(f)
	}
	put(key)
	return m.Sum(nil)
}

// errBadContinue is the answer to every token that does not verify; it says
// not why, so a client learns nothing by forging.
var errBadContinue = alloc.Invalid("continue", "not a continue token of this list from this service; start the list again without it")

// encodeContinue seals the last key of a page of sc.
func (s *Store) encodeContinue(ctx context.Context, sc pageScope, lastKey string) (string, error) {
	secret, err := s.pageSecret(ctx)
	if err != nil {
		return "", err
	}
	b := make([]byte, 0, 1+len(lastKey)+sha256.Size)
	b = append(b, pageTokenVersion)
	b = append(b, lastKey...)
	b = append(b, sc.mac(secret, lastKey)...)
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// decodeContinue answers the key a token of sc carries, "" for no token,
// or errBadContinue.
func (s *Store) decodeContinue(ctx context.Context, sc pageScope, tok string) (string, error) {
	if tok == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < 1+1+sha256.Size || b[0] != pageTokenVersion {
		return "", errBadContinue
	}
	secret, err := s.pageSecret(ctx)
	if err != nil {
		return "", err
	}
	key, sum := string(b[1:len(b)-sha256.Size]), b[len(b)-sha256.Size:]
	if !hmac.Equal(sum, sc.mac(secret, key)) {
		return "", errBadContinue
	}
	return key, nil
}

// pageOf trims a result fetched with limit+1 rows to limit and returns the
// token of the next page, if any.
func pageOf[T any](ctx context.Context, s *Store, sc pageScope, items []T, limit int, key func(T) string) ([]T, string, error) {
	if len(items) <= limit {
		return items, "", nil
	}
	items = items[:limit]
	next, err := s.encodeContinue(ctx, sc, key(items[limit-1]))
	if err != nil {
		return nil, "", err
	}
	return items, next, nil
}

// pageSecretCache holds the database's token secret once read.
type pageSecretCache struct {
	mu     sync.Mutex
	secret []byte // nil until read
}

// pageSecretLen is the length of the secret, in bytes.
const pageSecretLen = 32

// pageSecret answers the secret of the continue tokens: the one row of
// page_token_key, read once per Store. When the row is missing (migration
// 00010 makes it; an operator may have deleted it to invalidate every
// token), the first replica to need it inserts a random one and every other
// reads that one: INSERT ... ON CONFLICT DO NOTHING, then read.
func (s *Store) pageSecret(ctx context.Context) ([]byte, error) {
	c := &s.pageSecrets
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.secret != nil {
		return c.secret, nil
	}
	const read = `SELECT secret FROM page_token_key`
	var secret []byte
	err := s.db.QueryRow(ctx, read).Scan(&secret)
	if errors.Is(err, pgx.ErrNoRows) {
		fresh := make([]byte, pageSecretLen)
		_, _ = rand.Read(fresh) // never fails (crypto/rand)
		// A concurrent insert makes this one wait for it and do nothing;
		// the read after it, a statement of its own, sees the winner's row.
		if _, err = s.db.Exec(ctx, `INSERT INTO page_token_key (secret) VALUES ($1) ON CONFLICT DO NOTHING`, fresh); err == nil {
			err = s.db.QueryRow(ctx, read).Scan(&secret)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("continue token secret: %w", err)
	}
	if len(secret) < pageSecretLen {
		return nil, fmt.Errorf("continue token secret: %d bytes, want %d or more", len(secret), pageSecretLen)
	}
	c.secret = secret
	return secret, nil
}
