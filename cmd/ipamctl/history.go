// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"io"
	"strings"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// runHistory is `ipamctl history`: the events of one address, one owner or
// one node, oldest first, every page of them.
func runHistory(a *app, name string, args []string) error {
	f := a.newFlags(name, "history [ADDRESS] [--owner NAMESPACE/NAME | --node NAME]").withSpace()
	owner := f.String("owner", "", "the history of this owner's leases, NAMESPACE/NAME")
	node := f.String("node", "", "the history of this node's leases and blocks")
	from := f.String("from", "", "events at or after this instant (RFC 3339, or a duration ago such as 2h)")
	to := f.String("to", "", "events before this instant (RFC 3339, or a duration ago)")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageErrorf("history: unexpected argument %q", pos[1])
	}
	var subjects []string
	if len(pos) == 1 {
		subjects = append(subjects, "ADDRESS")
	}
	if *owner != "" {
		subjects = append(subjects, "--owner")
	}
	if *node != "" {
		subjects = append(subjects, "--node")
	}
	if len(subjects) != 1 {
		if len(subjects) == 0 {
			return usageErrorf("history: give an ADDRESS, --owner or --node")
		}
		return usageErrorf("history: %s: give only one of ADDRESS, --owner and --node", strings.Join(subjects, " and "))
	}
	var fromP, toP *string
	if *from != "" {
		v, err := a.instant("--from", *from)
		if err != nil {
			return err
		}
		fromP = &v
	}
	if *to != "" {
		v, err := a.instant("--to", *to)
		if err != nil {
			return err
		}
		toP = &v
	}
	c, s, err := a.client()
	if err != nil {
		return err
	}
	var fetch page[ipamclient.AddressEvent]
	var what string // for the progress line
	if len(pos) == 1 {
		addr := bareAddress(pos[0])
		what = "events of " + addr
		fetch = func(cont *string, limit int) ([]ipamclient.AddressEvent, *string, error) {
			res, err := c.GetAddressHistoryWithResponse(a.ctx, addr, &ipamclient.GetAddressHistoryParams{
				Space: s.spaceParam(), From: fromP, To: toP, Limit: &limit, Continue: cont})
			if err != nil {
				return nil, nil, err
			}
			if err := answer(res.HTTPResponse, res.Body, res.JSON200 != nil); err != nil {
				return nil, nil, err
			}
			return res.JSON200.Items, res.JSON200.Continue, nil
		}
	} else {
		what = "events of " + *owner + *node
		fetch = func(cont *string, limit int) ([]ipamclient.AddressEvent, *string, error) {
			res, err := c.ListHistoryWithResponse(a.ctx, &ipamclient.ListHistoryParams{
				Space: s.spaceParam(), Owner: optional(*owner), Node: optional(*node), From: fromP, To: toP, Limit: &limit, Continue: cont})
			if err != nil {
				return nil, nil, err
			}
			if err := answer(res.HTTPResponse, res.Body, res.JSON200 != nil); err != nil {
				return nil, nil, err
			}
			return res.JSON200.Items, res.JSON200.Continue, nil
		}
	}
	events, err := allPages(a, what, fetch)
	if err != nil {
		return err
	}
	if done, err := a.structured(ipamclient.EventList{Items: nonNil(events)}); done {
		return err
	}
	return a.eventTable(a.stdout, events)
}

// eventTable prints events, one a row.
func (a *app) eventTable(w io.Writer, events []ipamclient.AddressEvent) error {
	t := newTable(w, "TIME", "KIND", "ADDRESS", "BLOCK", "NODE", "OWNER", "STATE", "ACTOR", "REASON")
	for _, e := range events {
		addr := str(e.Address)
		t.row(timestamp(&e.At), string(e.Kind), addr, str(e.Block), str(e.Node), ownerName(e.Owner), str(e.State), e.Actor, e.Reason)
	}
	return t.flush()
}

// instant is a time flag's value as the API takes it: RFC 3339 is passed
// on for the service to check (its problem names the parameter), and a
// duration is that long before now ("2h": two hours ago), which is how
// one asks during an incident.
func (a *app) instant(flag, v string) (string, error) {
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return "", usageErrorf("%s: a duration is how long ago; want a positive one, not %s", flag, v)
		}
		return a.now().Add(-d).UTC().Format(time.RFC3339Nano), nil
	}
	return v, nil
}
