// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/internal/store"
)

// NewHandler refuses stores left out, naming them, rather than serve
// handlers that would fail on their first request.
func TestNewHandlerWantsEveryStore(t *testing.T) {
	st := StoresOf((*store.Store)(nil)) // no call reaches it
	st.Leases, st.Credentials = nil, nil
	defer func() {
		msg, _ := recover().(string)
		if !strings.Contains(msg, "Leases, Credentials") || strings.Contains(msg, "Pools") {
			t.Fatalf("panic %q, want one naming Leases and Credentials only", msg)
		}
	}()
	NewHandler(st, Options{})
	t.Fatal("NewHandler served without a lease store")
}
