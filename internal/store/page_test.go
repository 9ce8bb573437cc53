// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// A continue token is good for the next page of the list and filter that
// made it, on any replica of the database, and for nothing else: another
// list, another filter, an altered or truncated token, a token of another
// secret, and a token of the format before version 1 (the plain key in
// base64url) are all KindInvalid on "continue", before any query.
func TestContinueTokens(t *testing.T) {
	f := newFixture(t, nil)
	ctx := f.ctx
	pools := scopeOf(pagePools, "default")
	tok, err := f.s.encodeContinue(ctx, pools, "p1")
	if err != nil {
		t.Fatal(err)
	}
	if key, err := f.s.decodeContinue(ctx, pools, tok); err != nil || key != "p1" {
		t.Fatalf("round trip: %q, %v", key, err)
	}
	// Another replica of the same database reads the same secret.
	other, err := Open(ctx, f.conn, f.opts)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if key, err := other.decodeContinue(ctx, pools, tok); err != nil || key != "p1" {
		t.Fatalf("another replica: %q, %v", key, err)
	}

	raw, _ := base64.RawURLEncoding.DecodeString(tok)
	flip := func(i int) string {
		b := append([]byte(nil), raw...)
		b[i] ^= 1
		return base64.RawURLEncoding.EncodeToString(b)
	}
	// A token sealed with a secret that is not the database's.
	stranger := &Store{db: f.s.db}
	stranger.pageSecrets.secret = make([]byte, pageSecretLen)
	foreign, err := stranger.encodeContinue(ctx, pools, "p1")
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]struct {
		scope pageScope
		tok   string
	}{
		"other list":          {scopeOf(pageNodes, "default"), tok},
		"other filter":        {scopeOf(pagePools, "blue"), tok},
		"filter split apart":  {scopeOf(pagePools, "def", "ault"), tok},
		"key altered":         {pools, flip(1)},
		"version altered":     {pools, flip(0)},
		"MAC altered":         {pools, flip(len(raw) - 1)},
		"truncated":           {pools, base64.RawURLEncoding.EncodeToString(raw[:len(raw)-1])},
		"another secret":      {pools, foreign},
		"before version 1":    {pools, base64.RawURLEncoding.EncodeToString([]byte("p1"))},
		"NUL key, old format": {pools, base64.RawURLEncoding.EncodeToString([]byte{0})},
		"not base64url":       {pools, "zz!"},
		"zzz":                 {pools, "zzz"},
		"padding":             {pools, tok + "="},
	}
	for name, c := range bad {
		key, err := f.s.decodeContinue(ctx, c.scope, c.tok)
		if !isInvalidContinue(err) {
			t.Errorf("%s: key %q, error %v; want invalid continue", name, key, err)
		}
	}
}

// Every list refuses a token of another list or filter: the test above
// covers the token itself, this one that each list checks its own scope.
func TestListsRefuseOtherListsTokens(t *testing.T) {
	f := newFixture(t, nil)
	f.pool("default", alloc.PoolSpec{IPv4: fam(24, "10.244.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	f.pool("other", alloc.PoolSpec{IPv4: fam(24, "10.245.0.0/16"), NodeLocal: alloc.DefaultNodeLocal})
	for i := range 3 {
		f.allocate(req("node-a", fmt.Sprint("a", i)))
	}
	one := alloc.Page{Limit: 1}
	_, poolsTok, err := f.s.ListPools(f.ctx, alloc.DefaultSpace, one)
	if err != nil || poolsTok == "" {
		t.Fatalf("pools: %q, %v", poolsTok, err)
	}
	leases := alloc.LeaseFilter{Space: alloc.DefaultSpace, Node: "node-a"}
	_, leasesTok, err := f.s.ListLeases(f.ctx, leases, one)
	if err != nil || leasesTok == "" {
		t.Fatalf("leases: %q, %v", leasesTok, err)
	}
	history := alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: "node-a"}
	_, historyTok, err := f.s.History(f.ctx, history, one)
	if err != nil || historyTok == "" {
		t.Fatalf("history: %q, %v", historyTok, err)
	}
	// Each token works where it was made.
	if _, _, err := f.s.ListPools(f.ctx, alloc.DefaultSpace, alloc.Page{Limit: 1, Continue: poolsTok}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.s.ListLeases(f.ctx, leases, alloc.Page{Limit: 1, Continue: leasesTok}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.s.History(f.ctx, history, alloc.Page{Limit: 1, Continue: historyTok}); err != nil {
		t.Fatal(err)
	}
	wantInvalid := func(what string, err error) {
		t.Helper()
		if !isInvalidContinue(err) {
			t.Errorf("%s: %v, want invalid continue", what, err)
		}
	}
	page := func(tok string) alloc.Page { return alloc.Page{Limit: 1, Continue: tok} }
	_, _, err = f.s.ListSpaces(f.ctx, page(poolsTok))
	wantInvalid("spaces with a pools token", err)
	_, _, err = f.s.ListNodes(f.ctx, alloc.DefaultSpace, page(poolsTok))
	wantInvalid("nodes with a pools token", err)
	_, _, err = f.s.ListTokens(f.ctx, page(poolsTok))
	wantInvalid("tokens with a pools token", err)
	_, _, err = f.s.ListLeases(f.ctx, alloc.LeaseFilter{Space: alloc.DefaultSpace, Node: "node-b"}, page(leasesTok))
	wantInvalid("leases of another node", err)
	_, _, err = f.s.ListLeases(f.ctx, alloc.LeaseFilter{Space: alloc.DefaultSpace, Node: "node-a", State: alloc.StatePending}, page(leasesTok))
	wantInvalid("leases of another state", err)
	_, _, err = f.s.ListLeases(f.ctx, leases, page(poolsTok))
	wantInvalid("leases with a pools token", err)
	_, _, err = f.s.History(f.ctx, alloc.HistoryFilter{Space: alloc.DefaultSpace, Node: "node-b"}, page(historyTok))
	wantInvalid("history of another node", err)
	h := history
	h.To = f.clock.Now().Add(1)
	_, _, err = f.s.History(f.ctx, h, page(historyTok))
	wantInvalid("history of another range", err)
	_, _, err = f.s.History(f.ctx, history, page(leasesTok))
	wantInvalid("history with a leases token", err)
}

// A database without the secret row (an operator deleted it) gets one on
// first use, the same for every replica however they race.
func TestContinueSecretCreatedOnce(t *testing.T) {
	f := newFixture(t, nil)
	if _, err := f.s.db.Exec(f.ctx, `DELETE FROM page_token_key`); err != nil {
		t.Fatal(err)
	}
	const replicas = 6
	stores := make([]*Store, replicas)
	for i := range stores {
		s, err := Open(f.ctx, f.conn, f.opts)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores[i] = s
	}
	secrets := make([][]byte, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() { secrets[i], errs[i] = s.pageSecret(f.ctx) })
	}
	wg.Wait()
	for i := range stores {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		if string(secrets[i]) != string(secrets[0]) || len(secrets[i]) != pageSecretLen {
			t.Fatalf("replica %d has another secret (%d bytes)", i, len(secrets[i]))
		}
	}
	var n int
	if err := f.s.db.QueryRow(f.ctx, `SELECT count(*) FROM page_token_key`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows, %v", n, err)
	}
}

func isInvalidContinue(err error) bool {
	var ae *alloc.Error
	return errors.As(err, &ae) && ae.Kind == alloc.KindInvalid && ae.Field == "continue"
}
