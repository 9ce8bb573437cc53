// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package azure

import (
	"context"
	"net/http"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/ipam-dev/ipam/internal/cloud/azure/armfake"
)

// TestAssignKeepsAConcurrentWrite: a write another tool makes to the NIC
// between the provider's read and its write (Azure itself, a second
// controller) is not lost: the provider writes with If-Match, ARM refuses
// the stale write with 412, and the provider reads again and writes both
// changes. For a VM's NIC and a scale set instance's model alike.
func TestAssignKeepsAConcurrentWrite(t *testing.T) {
	for _, scaleSet := range []bool{false, true} {
		var foreign atomic.Value
		var nicID string
		var writes, refused atomic.Int64
		fake, p := newWorldVia(t, "10.45.0.0/24", -1, func(fake *armfake.Server, next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPut {
					if writes.Add(1) == 1 {
						// Another writer gets in between the read and this write.
						a, err := fake.AddForeignConfiguration(nicID, "other-tool")
						if err != nil {
							t.Error(err)
						}
						foreign.Store(a)
					}
					rec := &statusRecorder{ResponseWriter: w}
					next.ServeHTTP(rec, r)
					if rec.status == http.StatusPreconditionFailed {
						refused.Add(1)
					}
					return
				}
				next.ServeHTTP(w, r)
			})
		})
		var err error
		if scaleSet {
			_, nicID, err = fake.AddScaleSetVM("rg", "pool1", "0", subnetA, true)
		} else {
			_, nicID, err = fake.AddVM("rg", "node-a", subnetA)
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Assign(context.Background(), nicID, 2, false)
		if err != nil {
			t.Fatalf("scale set %v: %v", scaleSet, err)
		}
		addrs := fake.Addresses(nicID)
		other, _ := foreign.Load().(netip.Addr)
		if addrs["other-tool"] != other || !other.IsValid() {
			t.Fatalf("scale set %v: the other tool's configuration (%v) was lost: %v", scaleSet, other, addrs)
		}
		if len(got.Addresses) != 2 || slices.Contains(got.Addresses, other) || len(addrs) != 1+1+2 {
			t.Fatalf("scale set %v: assigned %v; the NIC holds %v", scaleSet, got.Addresses, addrs)
		}
		if refused.Load() != 1 || writes.Load() != 2 {
			t.Fatalf("scale set %v: %d writes, %d refused with 412; want 2 and 1", scaleSet, writes.Load(), refused.Load())
		}
	}
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}
