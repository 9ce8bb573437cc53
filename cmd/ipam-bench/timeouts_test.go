// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// TestRetryAfterTimeout: with retry, an allocation that timed out is sent
// again for the same attachment, on a new connection (the timed-out one
// is closed), and one answered 503 is sent again after its Retry-After on
// the same connection; the answer of an earlier attempt's lease (200) is
// the attachment's address.
func TestRetryAfterTimeout(t *testing.T) {
	var (
		mu         sync.Mutex
		containers []string
		remotes    []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body ipamclient.LeaseRequest
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Error(err)
		}
		mu.Lock()
		containers = append(containers, body.ContainerID)
		remotes = append(remotes, r.RemoteAddr)
		n := len(containers)
		mu.Unlock()
		switch n {
		case 1: // the lease is made, but the answer comes too late
			<-r.Context().Done()
			return
		case 2:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ipamclient.Allocation{ContainerID: body.ContainerID, Interface: body.Interface,
			Addresses: []ipamclient.LeaseAddress{{Address: "10.0.0.7/26", Family: ipamclient.Ipv4}}})
	}))
	defer srv.Close()
	cl, err := apiClient(srv.URL, &http.Client{})
	if err != nil {
		t.Fatal(err)
	}
	w := &worker{clients: map[string]*ipamclient.ClientWithResponses{"n": cl}, ledger: newLedger(), errs: map[string]int64{},
		retry: true, timeout: 100 * time.Millisecond}
	if err := w.allocate(t.Context(), "n", true); err != nil {
		t.Fatal(err)
	}
	if w.timedOut != 1 || w.refused != 1 || len(w.held) != 1 || w.held[0].addr.String() != "10.0.0.7" {
		t.Fatalf("timed out %d, refused %d, held %+v", w.timedOut, w.refused, w.held)
	}
	if len(containers) != 3 || len(slices.Compact(slices.Clone(containers))) != 1 {
		t.Errorf("attempts for containers %v, want one attachment three times", containers)
	}
	if remotes[0] == remotes[1] || remotes[1] != remotes[2] {
		t.Errorf("connections %v: want a new one after the timeout, the same after the 503", remotes)
	}

	// Without retry, a timeout is an error.
	w = &worker{clients: map[string]*ipamclient.ClientWithResponses{"n": cl}, ledger: newLedger(), errs: map[string]int64{}, timeout: 100 * time.Millisecond}
	mu.Lock()
	containers = nil
	mu.Unlock()
	if err := w.allocate(t.Context(), "n", true); err == nil || w.timedOut != 0 {
		t.Errorf("without retry: %v, timed out %d", err, w.timedOut)
	}
}
