// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package armfake

import (
	"fmt"
	"net/http"
	"net/netip"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
)

// ETags: a NIC and its scale set instance's model answer an etag that
// every accepted write changes, and a write whose If-Match names another
// is refused with 412 PreconditionFailed, as ARM does: the optimistic
// concurrency a read-modify-write of a NIC needs, for Azure itself and
// other tools write NICs too.

func (n *nic) etagValue() string { return etagOf(n.etag) }

func etagOf(n int) string { return fmt.Sprintf(`W/"%08d-0000-0000-0000-000000000000"`, n) }

// modelEtagLocked is the etag of scale set instance vm's model: the sum of
// its NICs' counts, which any write to one of them changes.
func (s *Server) modelEtagLocked(vm *setVM) string {
	sum := 0
	for _, id := range vm.nics {
		sum += s.nics[key(id)].etag
	}
	return etagOf(sum)
}

// ifMatch is ARM's refusal of a write whose If-Match is not current.
func ifMatch(r *http.Request, current string) *Error {
	if h := r.Header.Get("If-Match"); h != "" && h != "*" && h != current {
		return &Error{Status: http.StatusPreconditionFailed, Code: "PreconditionFailed",
			Message: fmt.Sprintf("The ETag %s in the If-Match header does not match the resource's current ETag %s.", h, current)}
	}
	return nil
}

// AddForeignConfiguration is another writer's change to NIC id: an IP
// configuration named name, provisioned with the lowest free address of
// the NIC's subnet, which changes the NIC's etag. It answers the address.
func (s *Server) AddForeignConfiguration(id, name string) (netip.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nics[key(id)]
	if !ok || len(n.configs) == 0 {
		return netip.Addr{}, fmt.Errorf("unknown NIC %s", id)
	}
	sn := s.subnets[key(n.configs[0].subnet)]
	a, ok := sn.lowestFree()
	if !ok {
		return netip.Addr{}, fmt.Errorf("subnet %s is full", sn.id)
	}
	sn.taken[a] = true
	n.configs = append(n.configs, &ipConfig{name: name, subnet: sn.id, addr: a, state: string(armnetwork.ProvisioningStateSucceeded)})
	n.etag++
	return a, nil
}
