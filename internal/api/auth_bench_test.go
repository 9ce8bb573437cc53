// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
)

// What checking a bearer token in the database costs a request: the same
// request (sizing, which reads no table) without credentials on a server
// that lets anonymous callers in, and with a token read on every request.
func BenchmarkBearerToken(b *testing.B) {
	st, err := store.Open(b.Context(), pgtest.NewDatabase(b), store.DefaultOptions())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	secret, hash := alloc.NewTokenSecret()
	if _, err := st.CreateToken(b.Context(), alloc.TokenSpec{Name: "bench", Role: alloc.RoleViewer}, hash); err != nil {
		b.Fatal(err)
	}
	b.Run("lookup-only", func(b *testing.B) {
		for b.Loop() {
			if t, err := st.TokenBySecret(b.Context(), hash); err != nil || t.State != alloc.TokenActive {
				b.Fatal(t, err)
			}
		}
	})
	srv := httptest.NewServer(NewHandler(StoresOf(st), Options{Logger: slog.New(slog.DiscardHandler), AnonymousRole: alloc.RoleViewer}))
	b.Cleanup(srv.Close)
	for _, c := range []struct{ name, token string }{{"anonymous", ""}, {"token", secret}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				req, _ := http.NewRequest("GET", srv.URL+"/v1/sizing?cidr=10.0.0.0/16&maskSize=24", nil)
				if c.token != "" {
					req.Header.Set("Authorization", "Bearer "+c.token)
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil || res.StatusCode != 200 {
					b.Fatalf("%v %v", res, err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		})
	}
}
