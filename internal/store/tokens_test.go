// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// Replicas registering one bootstrap secret at the same moment (a
// Kubernetes Secret mounted in each) leave exactly one live token of the
// name; every loser is told KindConflict, never a raw database error, so
// it can read the winner's token. Replicas that each bring another secret
// leave one live token too: the database holds one live token per name.
func TestReplaceTokenConcurrently(t *testing.T) {
	f := newFixture(t, nil)
	spec := alloc.TokenSpec{Name: "bootstrap-admin", Role: alloc.RoleAdmin, TTL: time.Hour, CreatedBy: "bootstrap"}
	for _, sameSecret := range []bool{true, false} {
		_, shared := alloc.NewTokenSecret()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hash := shared
				if !sameSecret {
					_, hash = alloc.NewTokenSecret()
				}
				if _, err := f.s.ReplaceToken(f.ctx, spec, hash); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if !alloc.IsKind(err, alloc.KindConflict) {
				t.Errorf("same secret %v: %v, want a conflict or success", sameSecret, err)
			}
		}
		var live int
		if err := f.s.db.QueryRow(f.ctx, `SELECT count(*) FROM api_tokens WHERE name = $1 AND revoked_at IS NULL`, spec.Name).Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live != 1 {
			t.Errorf("same secret %v: %d live tokens", sameSecret, live)
		}
		if sameSecret {
			if tok, err := f.s.TokenBySecret(f.ctx, shared); err != nil || tok.State != alloc.TokenActive {
				t.Errorf("the shared secret: %+v %v", tok, err)
			}
		}
	}
	// The database itself refuses a second live token of a name.
	_, err := f.s.db.Exec(f.ctx, `INSERT INTO api_tokens (name, role, secret_sha256, created_at, created_by, expires_at)
		VALUES ('bootstrap-admin', 'admin', sha256('x'), now(), 'test', now() + interval '1 hour')`)
	if code, constraint := pgCode(err); code != codeUniqueViolation || constraint != "api_tokens_live_name" {
		t.Errorf("second live token inserted: %v", err)
	}
	_, err = f.s.db.Exec(f.ctx, `INSERT INTO api_tokens (name, role, secret_sha256, created_at, created_by, expires_at)
		VALUES ('n', 'node', sha256('y'), now(), 'test', now() + interval '1 hour')`)
	if err == nil {
		t.Error("a token of role node inserted")
	}
}
