// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// tokenColumns are read by every token query, in scanToken's order; the
// state is computed against @now so that the store's clock decides expiry.
const tokenColumns = `name, role, created_at, created_by, expires_at, revoked_at, last_used_at,
	CASE WHEN revoked_at IS NOT NULL THEN 'revoked' WHEN expires_at <= @now THEN 'expired' ELSE 'active' END`

func scanToken(r pgx.Row) (alloc.Token, error) {
	var t alloc.Token
	var role, state string
	err := r.Scan(&t.Name, &role, &t.CreatedAt, &t.CreatedBy, &t.ExpiresAt, &t.RevokedAt, &t.LastUsedAt, &state)
	t.Role, t.State = alloc.Role(role), alloc.TokenState(state)
	return t, err
}

// errTokenNameTaken is the answer to a second live token of one name.
func errTokenNameTaken(name string) error {
	return &alloc.Error{Kind: alloc.KindConflict, Field: "name",
		Detail: fmt.Sprintf("a token named %q exists; revoke it first (an expired token keeps its name until revoked)", name)}
}

// CreateToken stores a token of spec whose secret hashes to hash. A live
// (not revoked) token of the same name is a KindConflict on "name"; spec is
// checked against the store's clock (KindInvalid).
func (s *Store) CreateToken(ctx context.Context, spec alloc.TokenSpec, hash [sha256.Size]byte) (alloc.Token, error) {
	now := s.now()
	spec, err := spec.Resolve(now)
	if err != nil {
		return alloc.Token{}, err
	}
	t, err := insertToken(ctx, s.db, spec, hash, now)
	if tokenTaken(err) {
		return alloc.Token{}, errTokenNameTaken(spec.Name)
	}
	return t, err
}

// ReplaceToken revokes the live token of spec's name, if any, and stores
// the new one, in one transaction: the bootstrap token is replaced this
// way when its file is lost or it expired.
func (s *Store) ReplaceToken(ctx context.Context, spec alloc.TokenSpec, hash [sha256.Size]byte) (alloc.Token, error) {
	now := s.now()
	spec, err := spec.Resolve(now)
	if err != nil {
		return alloc.Token{}, err
	}
	var t alloc.Token
	err = s.inTx(ctx, func(tx querier) error {
		if _, err := tx.Exec(ctx, `UPDATE api_tokens SET revoked_at = $2 WHERE name = $1 AND revoked_at IS NULL`,
			spec.Name, now); err != nil {
			return err
		}
		var err error
		t, err = insertToken(ctx, tx, spec, hash, now)
		return err
	})
	if tokenTaken(err) {
		// Another replica replaced it at the same moment; theirs stands.
		return alloc.Token{}, errTokenNameTaken(spec.Name)
	}
	return t, err
}

// tokenTaken reports a concurrent writer's token: the live name, or the
// same secret (replicas registering one bootstrap file at once). A random
// secret of another token never collides.
func tokenTaken(err error) bool {
	code, constraint := pgCode(err)
	return code == codeUniqueViolation && (constraint == constraintTokenLiveName || constraint == constraintTokenSecret)
}

func insertToken(ctx context.Context, q querier, spec alloc.TokenSpec, hash [sha256.Size]byte, now time.Time) (alloc.Token, error) {
	return scanToken(q.QueryRow(ctx, `INSERT INTO api_tokens (name, role, secret_sha256, created_at, created_by, expires_at)
		VALUES (@name, @role, @hash, @now, @by, @expires) RETURNING `+tokenColumns,
		namedArgs{"name": spec.Name, "role": string(spec.Role), "hash": hash[:], "now": now,
			"by": spec.CreatedBy, "expires": spec.ExpiresAt.UTC().Truncate(time.Microsecond)}))
}

// TokenBySecret answers the token whose secret hashes to hash, in whatever
// state (the caller refuses expired and revoked ones), or KindNotFound. A
// live token's last use is recorded at most once a minute, in the same
// statement, so that checking a token costs one round trip and rarely a
// write.
func (s *Store) TokenBySecret(ctx context.Context, hash [sha256.Size]byte) (alloc.Token, error) {
	t, err := scanToken(s.db.QueryRow(ctx, `WITH used AS (
			UPDATE api_tokens SET last_used_at = @now
			WHERE secret_sha256 = @hash AND revoked_at IS NULL AND expires_at > @now
			  AND (last_used_at IS NULL OR last_used_at < @now - interval '1 minute'))
		SELECT `+tokenColumns+` FROM api_tokens WHERE secret_sha256 = @hash`,
		namedArgs{"hash": hash[:], "now": s.now()}))
	if errors.Is(err, pgx.ErrNoRows) {
		return alloc.Token{}, &alloc.Error{Kind: alloc.KindNotFound, Detail: "no such token"}
	}
	return t, err
}

// ListTokens pages through the live (not revoked) tokens by name.
func (s *Store) ListTokens(ctx context.Context, page alloc.Page) ([]alloc.Token, string, error) {
	sc := scopeOf(pageTokens)
	after, err := s.decodeContinue(ctx, sc, page.Continue)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.db.Query(ctx, `SELECT `+tokenColumns+` FROM api_tokens
		WHERE revoked_at IS NULL AND name > @after ORDER BY name LIMIT @limit`,
		namedArgs{"now": s.now(), "after": after, "limit": page.Limit + 1})
	if err != nil {
		return nil, "", err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (alloc.Token, error) { return scanToken(r) })
	if err != nil {
		return nil, "", err
	}
	return pageOf(ctx, s, sc, items, page.Limit, func(t alloc.Token) string { return t.Name })
}

// RevokeToken revokes the live token of name; it refuses every request
// from then on, on every replica (each request reads the row). An unknown
// or already revoked name is KindNotFound.
func (s *Store) RevokeToken(ctx context.Context, name string) error {
	tag, err := s.db.Exec(ctx, `UPDATE api_tokens SET revoked_at = $2 WHERE name = $1 AND revoked_at IS NULL`, name, s.now())
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return alloc.NotFound("name", "token", name)
	}
	return nil
}
