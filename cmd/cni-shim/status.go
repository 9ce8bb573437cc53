// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// canServeAdd reports whether an ADD of this configuration would get an
// address now, asking the service's node-usage view of the pools the
// configuration names (or the default pool): for each family ADD would
// lease, the node has a free address in a block of that pool, or the pool
// can carve it one. Pod selectors and annotations are not known to STATUS,
// so a Pod they send to another pool is not covered.
//
// It answers nil, or the STATUS error: code 50 (plugin not available: no
// new ADD can be served) when the pools cannot serve a family, a pool the
// configuration names does not exist, or the service refuses this node's
// credentials; code 11 when the service cannot be reached or is
// unavailable, which is usually brief. exhausted says that the pools
// answered, and only that they have no address left for the node.
func (c *call) canServeAdd() (e *types.Error, exhausted bool) {
	// The family ADD leases, and from which pool: the per-family pool, then
	// "pool", then the default (the selection rules of the service, less
	// those that need the Pod).
	wanted, explicit := c.cfg.families, true
	if len(wanted) == 0 {
		wanted, explicit = []ipamclient.Family{ipamclient.Ipv4, ipamclient.Ipv6}, false
	}
	params := &ipamclient.GetNodeUsageParams{Space: c.space()}
	var names []string
	poolOf := map[ipamclient.Family]string{}
	perFamily := map[ipamclient.Family]bool{}
	for _, f := range wanted {
		switch {
		case c.cfg.pools[f] != "":
			poolOf[f], perFamily[f] = c.cfg.pools[f], true
			names = append(names, c.cfg.pools[f])
		case c.cfg.pool != "":
			poolOf[f] = c.cfg.pool
			names = append(names, c.cfg.pool)
		default:
			params.DefaultPool = ptrTo(true) // poolOf[f] is known from the answer
		}
	}
	if len(names) > 0 {
		slices.Sort(names)
		names = slices.Compact(names)
		params.Pool = &names
	}
	r, err := c.client.GetNodeUsageWithResponse(c.ctx, c.cfg.node, params)
	if err != nil {
		e := transportError("status", err)
		if e.Code == ErrTLS {
			e.Code = errPluginNotAvailable
		}
		return e, false
	}
	if r.JSON200 == nil {
		e := problemError("status", r.StatusCode(), r.Body)
		switch e.Code {
		case ErrForbidden, ErrNotFound: // credentials refused; a pool the configuration names is missing
			e.Code = errPluginNotAvailable
		}
		return e, false
	}
	u := r.JSON200
	if u.DefaultPool == "" {
		// A service older than the pool query answers the node's own
		// pools without canLease: it is up, and that is all it can say.
		return nil, false
	}
	canLease := map[string]bool{}
	for _, it := range u.Items {
		canLease[it.Pool+"/"+string(it.Family)] = it.CanLease
	}
	var full []string
	served, config := 0, false // config: a pool lacks a family named
	for _, f := range wanted {
		pool, ok := poolOf[f]
		if !ok {
			pool = u.DefaultPool
		}
		can, has := canLease[pool+"/"+string(f)]
		switch {
		case !has && (explicit || perFamily[f]):
			full, config = append(full, fmt.Sprintf("pool %q has no %s CIDRs", pool, f)), true
		case !has:
			// ADD leaves out a family its pool lacks.
		case !can:
			full = append(full, fmt.Sprintf("pool %q has no %s address for node %s and cannot carve it a block", pool, f, c.cfg.node))
		default:
			served++
		}
	}
	if len(full) == 0 && served == 0 {
		full, config = append(full, fmt.Sprintf("no pool serves node %s: pool %q has neither family", c.cfg.node, u.DefaultPool)), true
	}
	if len(full) > 0 {
		return types.NewError(errPluginNotAvailable, "status: no new ADD can be served: "+strings.Join(full, "; "), ""), !config
	}
	return nil, false
}

func ptrTo[T any](v T) *T { return &v }
