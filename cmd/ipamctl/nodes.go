// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// runNodes is `ipamctl nodes`: every node of the space.
func runNodes(a *app, name string, args []string) error {
	f := a.newFlags(name, "nodes").withSpace()
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos); err != nil {
		return err
	}
	c, s, err := a.client()
	if err != nil {
		return err
	}
	nodes, err := allPages(a, "nodes", func(cont *string, limit int) ([]ipamclient.Node, *string, error) {
		res, err := c.ListNodesWithResponse(a.ctx, &ipamclient.ListNodesParams{Space: s.spaceParam(), Limit: &limit, Continue: cont})
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
	if done, err := a.structured(ipamclient.NodeList{Items: nonNil(nodes)}); done {
		return err
	}
	t := newTable(a.stdout, "NAME", "BLOCKS", "LEASES", "ADDRESSES", "AGE")
	for _, n := range nodes {
		t.row(n.Name, strconv.Itoa(n.Blocks), strconv.Itoa(n.Leases), nodeAddresses(n.Addresses), a.age(n.CreatedAt))
	}
	return t.flush()
}

func nodeAddresses(as []ipamclient.NodeAddress) string {
	var s []string
	for _, ad := range as {
		s = append(s, ad.Address)
	}
	return strings.Join(s, ",")
}

// nodeView is the JSON and YAML of `node NAME`: the node, its blocks and
// its use of each pool, as the three API answers gave them.
type nodeView struct {
	Node   ipamclient.Node      `json:"node"`
	Blocks []ipamclient.Block   `json:"blocks"`
	Pools  ipamclient.NodeUsage `json:"pools"`
}

// runNode is `ipamctl node NAME`: the node, its blocks and its demand.
func runNode(a *app, name string, args []string) error {
	f := a.newFlags(name, "node NAME").withSpace()
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos, "NAME"); err != nil {
		return err
	}
	c, s, err := a.client()
	if err != nil {
		return err
	}
	node, sp := pos[0], s.spaceParam()
	var v nodeView
	nres, err := c.GetNodeWithResponse(a.ctx, node, &ipamclient.GetNodeParams{Space: sp})
	if err != nil {
		return err
	}
	if err := answer(nres.HTTPResponse, nres.Body, nres.JSON200 != nil); err != nil {
		return err
	}
	v.Node = *nres.JSON200
	bres, err := c.ListBlocksWithResponse(a.ctx, node, &ipamclient.ListBlocksParams{Space: sp})
	if err != nil {
		return err
	}
	if err := answer(bres.HTTPResponse, bres.Body, bres.JSON200 != nil); err != nil {
		return err
	}
	v.Blocks = nonNil(bres.JSON200.Items)
	ures, err := c.GetNodeUsageWithResponse(a.ctx, node, &ipamclient.GetNodeUsageParams{Space: sp})
	if err != nil {
		return err
	}
	if err := answer(ures.HTTPResponse, ures.Body, ures.JSON200 != nil); err != nil {
		return err
	}
	v.Pools = *ures.JSON200
	v.Pools.Items = nonNil(v.Pools.Items)
	if done, err := a.structured(v); done {
		return err
	}

	n := v.Node
	w := &errWriter{w: a.stdout}
	kv := newTable(w)
	kv.row("Name:", n.Name)
	kv.row("Space:", n.Space)
	kv.row("Labels:", labels(n.Labels))
	var addrs []string
	for _, ad := range n.Addresses {
		addrs = append(addrs, string(ad.Type)+" "+ad.Address)
	}
	kv.row("Addresses:", strings.Join(addrs, ", "))
	kv.row("Provider ID:", str(n.ProviderID))
	kv.row("Blocks:", strconv.Itoa(n.Blocks))
	kv.row("Leases:", strconv.Itoa(n.Leases))
	kv.row("Created:", timestamp(&n.CreatedAt)+" ("+a.age(n.CreatedAt)+" ago)")
	if err := kv.flush(); err != nil {
		return err
	}

	fmt.Fprintln(w, "\nBlocks:")
	if len(v.Blocks) == 0 {
		fmt.Fprintln(w, "  none")
	} else {
		t := newTable(w, "POOL", "FAMILY", "CIDR", "GATEWAY", "LEASED", "COOLING", "CAPACITY", "SOURCE", "AGE")
		for _, b := range v.Blocks {
			t.row(b.Pool, string(b.Family), b.Cidr, str(b.Gateway), num(b.Leased), num(b.Cooling), num(b.Capacity), str(b.Source), a.age(b.CreatedAt))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}

	fmt.Fprintf(w, "\nDemand per pool (default pool %s):\n", v.Pools.DefaultPool)
	if len(v.Pools.Items) == 0 {
		fmt.Fprintln(w, "  none")
		return w.err
	}
	t := newTable(w, "POOL", "FAMILY", "MODE", "BLOCKS", "CAPACITY", "LEASED", "RELEASED", "PRE-ALLOCATE", "NEEDED", "AVAILABLE", "DEFICIT", "CAN-LEASE")
	for _, u := range v.Pools.Items {
		canLease := "yes"
		if !u.CanLease {
			canLease = "no"
		}
		if u.AtCapacity {
			canLease += " (at capacity)"
		}
		t.row(u.Pool, string(u.Family), string(u.Mode), num(u.Blocks), num(u.Capacity), num(u.Leased), num(u.Released),
			num(u.PreAllocate), num(u.Needed), num(u.Available), num(u.Deficit), canLease)
	}
	if err := t.flush(); err != nil {
		return err
	}
	return w.err
}
