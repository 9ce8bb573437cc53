// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// runLeases is `ipamctl leases`: the leases of the space, with the
// filters GET /v1/leases has.
func runLeases(a *app, name string, args []string) error {
	f := a.newFlags(name, "leases").withSpace()
	node := f.String("node", "", "only the leases of this node")
	pool := f.String("pool", "", "only the leases of this pool")
	owner := f.String("owner", "", "only the leases of this owner, NAMESPACE/NAME")
	namespace := f.String("namespace", "", "only the leases of owners in this namespace")
	state := f.String("state", "", "only the leases in this state: pending, active, cooling or reserved")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos); err != nil {
		return err
	}
	p := ipamclient.ListLeasesParams{Node: optional(*node), Pool: optional(*pool), OwnerNamespace: optional(*namespace)}
	if *owner != "" {
		ns, n, ok := strings.Cut(*owner, "/")
		if !ok || ns == "" || n == "" {
			return usageErrorf("--owner: want NAMESPACE/NAME, not %q", *owner)
		}
		if *namespace != "" && *namespace != ns {
			return usageErrorf("--namespace %q and --owner %q name two namespaces", *namespace, *owner)
		}
		p.OwnerNamespace, p.OwnerName = &ns, &n
	}
	if *state != "" {
		st := ipamclient.LeaseState(*state)
		p.State = &st
	}
	c, s, err := a.client()
	if err != nil {
		return err
	}
	p.Space = s.spaceParam()
	leases, err := allPages(a, "leases", func(cont *string, limit int) ([]ipamclient.Lease, *string, error) {
		q := p
		q.Limit, q.Continue = &limit, cont
		res, err := c.ListLeasesWithResponse(a.ctx, &q)
		if err != nil {
			return nil, nil, err
		}
		if err := answer(res.HTTPResponse, res.Body, res.JSON200 != nil); err != nil {
			return nil, nil, err
		}
		return res.JSON200.Items, res.JSON200.Continue, nil
	})
	if err != nil {
		return err
	}
	if done, err := a.structured(ipamclient.LeaseList{Items: nonNil(leases)}); done {
		return err
	}
	t := newTable(a.stdout, "ADDRESS", "STATE", "NODE", "POOL", "OWNER", "CONTAINER", "INTERFACE", "NETWORK", "GENERATION", "AGE")
	for _, l := range leases {
		t.row(l.Address, string(l.State), l.Node, l.Pool, ownerName(l.Owner), shortID(l.ContainerID), l.Interface, str(l.Network),
			strconv.FormatInt(l.Generation, 10), a.age(l.CreatedAt))
	}
	return t.flush()
}

// optional is nil for "", so that an unset filter is no parameter.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// ownerName is NAMESPACE/NAME; a node's reserved address has no owner.
func ownerName(o *ipamclient.Owner) string {
	if o == nil {
		return ""
	}
	return o.Namespace + "/" + o.Name
}

// shortID shortens a container ID as container runtimes print them: 64
// hex digits do not fit a table.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// bareAddress drops a prefix length from an address, so that an address
// copied from the leases table (10.244.0.3/24) can be asked about; the
// API takes single addresses. Anything else goes to the service as it is,
// which names the field when it is no address.
func bareAddress(s string) string {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().String()
	}
	return s
}

// runWho is `ipamctl who ADDRESS [--at TIME]`: the lease holding the
// address, or, with --at, the holding that contained that instant.
func runWho(a *app, name string, args []string) error {
	f := a.newFlags(name, "who ADDRESS").withSpace()
	at := f.String("at", "", "an instant (RFC 3339, or a duration ago such as 2h): who held the address then")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos, "ADDRESS"); err != nil {
		return err
	}
	c, s, err := a.client()
	if err != nil {
		return err
	}
	addr := bareAddress(pos[0])
	if a.conn.given["at"] {
		instant, err := a.instant("--at", *at)
		if err != nil {
			return err
		}
		res, err := c.GetAddressHistoryWithResponse(a.ctx, addr, &ipamclient.GetAddressHistoryParams{Space: s.spaceParam(), At: &instant})
		if err != nil {
			return err
		}
		if err := answer(res.HTTPResponse, res.Body, res.JSON200 != nil); err != nil {
			return err
		}
		h := *res.JSON200
		h.Items = nonNil(h.Items)
		if done, err := a.structured(h); done {
			return err
		}
		if h.Holder == nil {
			_, err := fmt.Fprintf(a.stdout, "nobody held %s at %s\n", addr, instant)
			return err
		}
		hd := h.Holder
		w := &errWriter{w: a.stdout}
		kv := newTable(w)
		kv.row("Address:", hd.Address)
		kv.row("At:", instant)
		kv.row("Owner:", ownerName(&hd.Owner))
		kv.row("Node:", hd.Node)
		kv.row("Pool:", hd.Pool)
		kv.row("Attachment:", hd.ContainerID+" "+hd.Interface)
		kv.row("From:", timestamp(&hd.From))
		to := timestamp(hd.To)
		if to == "" {
			to = "still held"
		}
		kv.row("To:", to)
		if err := kv.flush(); err != nil {
			return err
		}
		fmt.Fprintln(w, "\nEvents:")
		if err := a.eventTable(w, h.Items); err != nil {
			return err
		}
		return w.err
	}
	res, err := c.GetAddressWithResponse(a.ctx, addr, &ipamclient.GetAddressParams{Space: s.spaceParam()})
	if err != nil {
		return err
	}
	if err := answer(res.HTTPResponse, res.Body, res.JSON200 != nil); err != nil {
		return err
	}
	l := *res.JSON200
	if done, err := a.structured(l); done {
		return err
	}
	kv := newTable(a.stdout)
	kv.row("Address:", l.Address)
	kv.row("State:", string(l.State))
	kv.row("Owner:", ownerName(l.Owner))
	kv.row("Node:", l.Node)
	kv.row("Pool:", l.Pool)
	kv.row("Block:", l.Block)
	kv.row("Attachment:", l.ContainerID+" "+l.Interface)
	kv.row("Network:", str(l.Network))
	kv.row("Generation:", strconv.FormatInt(l.Generation, 10))
	kv.row("Selected by:", str(l.SelectedBy))
	kv.row("Leased:", timestamp(&l.CreatedAt))
	for _, t := range []struct {
		label string
		v     string
	}{{"Confirmed:", timestamp(l.ConfirmedAt)}, {"Expires:", timestamp(l.ExpiresAt)}, {"Released:", timestamp(l.ReleasedAt)}, {"Cooling until:", timestamp(l.CooldownUntil)}} {
		if t.v != "" {
			kv.row(t.label, t.v)
		}
	}
	if l.Sticky != nil {
		kv.row("Sticky:", l.Sticky.Identity+" (retention "+l.Sticky.Retention+")")
	}
	return kv.flush()
}
