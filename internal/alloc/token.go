// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"time"
)

// Role is what a caller may do. Admin, operator and viewer are ordered
// (each may do what the next may, and more); node stands apart: a node may
// act on its own node's leases and blocks only, whatever an operator may.
type Role string

const (
	// RoleAdmin may do everything, including managing tokens and spaces.
	RoleAdmin Role = "admin"
	// RoleOperator manages pools, nodes, blocks and leases.
	RoleOperator Role = "operator"
	// RoleViewer reads.
	RoleViewer Role = "viewer"
	// RoleNode is a node certificate (CN=system:node:NAME): its own node's
	// leases and blocks. Tokens never carry it.
	RoleNode Role = "node"
)

// TokenRoles are the roles a token (or an operator certificate) may carry.
var TokenRoles = []Role{RoleAdmin, RoleOperator, RoleViewer}

// rank orders the roles a token may carry; node and unknown roles rank 0,
// below viewer, so they never pass a rank check.
func (r Role) rank() int {
	switch r {
	case RoleAdmin:
		return 3
	case RoleOperator:
		return 2
	case RoleViewer:
		return 1
	}
	return 0
}

// AtLeast reports whether r may do what min may. Node is at least nothing
// (its access is decided per node, not by rank).
func (r Role) AtLeast(min Role) bool { return r.rank() > 0 && r.rank() >= min.rank() }

// ParseTokenRole checks a role a token may carry.
func ParseTokenRole(field, s string) (Role, error) {
	r := Role(s)
	if r.rank() == 0 {
		return "", Invalid(field, "must be admin, operator or viewer, not %q", s)
	}
	return r, nil
}

// TokenSecretPrefix starts every token secret, so that a leaked token is
// recognizable (secret scanners, grep) and never mistaken for a password.
const TokenSecretPrefix = "ipam_"

// tokenSecretBytes is the randomness of a secret: 256 bits, so its SHA-256
// need not be slow to resist guessing.
const tokenSecretBytes = 32

// TokenSecretLen is the length of a secret: the prefix and 32 bytes in
// unpadded base64url.
var TokenSecretLen = len(TokenSecretPrefix) + base64.RawURLEncoding.EncodedLen(tokenSecretBytes)

// NewTokenSecret returns a fresh secret and its hash, the only form the
// store keeps.
func NewTokenSecret() (secret string, hash [sha256.Size]byte) {
	b := make([]byte, tokenSecretBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	secret = TokenSecretPrefix + base64.RawURLEncoding.EncodeToString(b)
	return secret, HashTokenSecret(secret)
}

// HashTokenSecret is the stored form of a secret.
func HashTokenSecret(secret string) [sha256.Size]byte { return sha256.Sum256([]byte(secret)) }

// LooksLikeTokenSecret reports whether s has the shape of a secret (prefix,
// length, alphabet), so that garbage is refused without a database lookup.
func LooksLikeTokenSecret(s string) bool {
	rest, ok := strings.CutPrefix(s, TokenSecretPrefix)
	if !ok || len(s) != TokenSecretLen {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(rest)
	return err == nil
}

// Token lifetimes: a token always expires, within a year, so that a
// forgotten one does not stay valid forever.
const (
	MinTokenTTL     = time.Minute
	MaxTokenTTL     = 366 * 24 * time.Hour
	DefaultTokenTTL = 30 * 24 * time.Hour
)

// TokenState is a token's state at the time it was read.
type TokenState string

const (
	TokenActive  TokenState = "active"
	TokenExpired TokenState = "expired"
	TokenRevoked TokenState = "revoked"
)

// Token is an API token without its secret (the store never has it).
type Token struct {
	Name       string
	Role       Role
	CreatedAt  time.Time
	CreatedBy  string
	ExpiresAt  time.Time
	RevokedAt  *time.Time
	LastUsedAt *time.Time
	// State is computed by the store with its clock when it reads the row.
	State TokenState
}

// TokenSpec is what creating a token asks for: its lifetime as ExpiresAt,
// or as TTL from the store's clock (neither: DefaultTokenTTL).
type TokenSpec struct {
	Name      string
	Role      Role
	ExpiresAt time.Time
	TTL       time.Duration
	CreatedBy string
}

// Resolve checks the spec against now (the store's clock) and answers it
// with ExpiresAt set.
func (s TokenSpec) Resolve(now time.Time) (TokenSpec, error) {
	if err := ValidateLabelName("name", s.Name); err != nil {
		return s, err
	}
	if _, err := ParseTokenRole("role", string(s.Role)); err != nil {
		return s, err
	}
	field := "expiresAt"
	switch {
	case !s.ExpiresAt.IsZero() && s.TTL != 0:
		return s, Invalid("expiresIn", "give expiresIn or expiresAt, not both")
	case s.ExpiresAt.IsZero():
		field = "expiresIn"
		if s.TTL == 0 {
			s.TTL = DefaultTokenTTL
		}
		s.ExpiresAt = now.Add(s.TTL)
	}
	switch ttl := s.ExpiresAt.Sub(now); {
	case ttl < MinTokenTTL:
		return s, Invalid(field, "must be at least %s in the future", MinTokenTTL)
	case ttl > MaxTokenTTL:
		return s, Invalid(field, "must be at most %s in the future", MaxTokenTTL)
	}
	return s, nil
}

// ParseTokenTTL reads a token lifetime (a Go duration such as 720h) and
// bounds it.
func ParseTokenTTL(field, s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || len(s) > 32 { // 32: the spec's maxLength
		return 0, Invalid(field, "%.32q is not a duration such as 720h", s)
	}
	if d < MinTokenTTL || d > MaxTokenTTL {
		return 0, Invalid(field, "must be between %s and %s", MinTokenTTL, MaxTokenTTL)
	}
	return d, nil
}
