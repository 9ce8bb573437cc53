// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package azure

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"

	"github.com/ipam-dev/ipam/internal/cloud"
)

// A subnet's free addresses, as Cilium's Azure IPAM counts them
// (pkg/azure/api parseSubnet): the subnet's size less its IP
// configurations, which ARM lists with the subnet; and less the five
// addresses Azure reserves in every subnet (the network, the gateway, two
// for DNS, the broadcast), which Cilium counts as free. Cilium asks no
// more than that (pkg/azure/ipam PrepareIPAllocation: the smaller of the
// subnet's and the NIC's room), so a nearly full subnet still gives what
// it has, and a full one is not written to at all; before, every write
// asked the node's whole need and ARM refused it whole (SubnetIsFull),
// pass after pass.
//
// The count is read once per subnet per freeSpaceTTL (Cilium reads every
// subnet at its resync, every minute), shared by the nodes of the subnet
// and kept current by the provider's own writes: an add takes from it
// before the write, a removal gives back. ARM's SubnetIsFull (other
// writers took the room) makes it 0 until the next reading.

// freeSpaceTTL is how long a reading of a subnet's free addresses is used.
const freeSpaceTTL = time.Minute

// reservedPerSubnet is how many addresses Azure keeps of every subnet.
const reservedPerSubnet = 5

// subnetSpace is what the provider knows of a subnet's free addresses.
type subnetSpace struct {
	free   int
	readAt time.Time
	// unknown: ARM listed no IP configurations with the subnet (it
	// leaves them out for a subnet that has many): as Cilium, the
	// subnet is taken to have room, and nothing is capped.
	unknown bool
}

func (p *Provider) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

// reserve takes up to n of subnet's free addresses for a write and
// answers how many: KindSubnetFull when it has none.
func (p *Provider) reserve(ctx context.Context, subnet string, n int) (int, error) {
	k := strings.ToLower(subnet)
	p.mu.Lock()
	sp := p.free[k]
	fresh := sp != nil && p.now().Sub(sp.readAt) < freeSpaceTTL
	p.mu.Unlock()
	if !fresh {
		read, err := p.readFree(ctx, subnet)
		if err != nil {
			return 0, err
		}
		p.mu.Lock()
		// Another node's reading may have come first, and its write
		// taken from it since: that one stands.
		if cur := p.free[k]; cur == nil || p.now().Sub(cur.readAt) >= freeSpaceTTL {
			p.free[k] = read
		}
		p.mu.Unlock()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	sp = p.free[k]
	switch {
	case sp.unknown:
		return n, nil
	case sp.free <= 0:
		return 0, &cloud.Error{Kind: cloud.KindSubnetFull, Code: "SubnetIsFull",
			Message: fmt.Sprintf("subnet %s has no free address (read %v ago); nothing written", subnet, p.now().Sub(sp.readAt).Round(time.Second))}
	}
	got := min(n, sp.free)
	sp.free -= got
	return got, nil
}

// wrote settles a reservation of k addresses of subnet whose write failed
// with err: ARM's SubnetIsFull empties the subnet until the next reading;
// a refusal that surely changed nothing (throttled, or a stale or busy
// write) gives the k back. Any other failure keeps them taken: the write
// may have been applied, and the next reading tells.
func (p *Provider) wrote(subnet string, k int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sp := p.free[strings.ToLower(subnet)]
	if sp == nil || sp.unknown {
		return
	}
	var ce *cloud.Error
	switch kind := cloud.KindOf(err); {
	case kind == cloud.KindSubnetFull:
		sp.free, sp.readAt = 0, p.now()
	case kind == cloud.KindThrottled, errors.As(err, &ce) && (ce.Code == "PreconditionFailed" || ce.Code == "AnotherOperationInProgress"):
		sp.free += k
	}
}

// freed gives back k addresses of subnet that a removal freed.
func (p *Provider) freed(subnet string, k int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sp := p.free[strings.ToLower(subnet)]; sp != nil && !sp.unknown {
		sp.free += k
	}
}

// readFree reads subnet's free addresses from ARM (Subnets.Get).
func (p *Provider) readFree(ctx context.Context, subnet string) (*subnetSpace, error) {
	rid, err := arm.ParseResourceID(subnet)
	if err != nil || rid.Parent == nil {
		return nil, fmt.Errorf("subnet %q is no subnet ID: %v", subnet, err)
	}
	got, err := p.subnets.Get(ctx, rid.ResourceGroupName, rid.Parent.Name, rid.Name, nil)
	if err != nil {
		return nil, classify(err)
	}
	if got.Properties == nil {
		return nil, fmt.Errorf("subnet %s has no properties", subnet)
	}
	candidates := got.Properties.AddressPrefixes
	if got.Properties.AddressPrefix != nil {
		candidates = append(candidates, got.Properties.AddressPrefix)
	}
	var cidr netip.Prefix
	for _, c := range candidates {
		pf, err := netip.ParsePrefix(str(c))
		if err != nil {
			return nil, fmt.Errorf("subnet %s: %w", subnet, err)
		}
		if pf.Addr().Is4() {
			cidr = pf.Masked()
		}
	}
	if !cidr.IsValid() {
		return nil, fmt.Errorf("subnet %s has no IPv4 prefix", subnet)
	}
	sp := &subnetSpace{readAt: p.now()}
	if got.Properties.IPConfigurations == nil {
		sp.unknown = true
		return sp, nil
	}
	size := 1 << (32 - cidr.Bits())
	sp.free = max(size-reservedPerSubnet-len(got.Properties.IPConfigurations), 0)
	return sp, nil
}
