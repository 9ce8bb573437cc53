// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"strings"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// runTokens is `ipamctl tokens [list|create|revoke]`: the API tokens, which
// only an admin may manage. Without a subcommand it lists.
func runTokens(a *app, name string, args []string) error {
	sub := "list"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	switch sub {
	case "list":
		return tokensList(a, args)
	case "create":
		return tokensCreate(a, args)
	case "revoke":
		return tokensRevoke(a, args)
	}
	return usageErrorf("tokens: unknown subcommand %q (list, create, revoke)", sub)
}

func tokensList(a *app, args []string) error {
	f := a.newFlags("tokens list", "tokens list")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos); err != nil {
		return err
	}
	c, _, err := a.client()
	if err != nil {
		return err
	}
	tokens, err := allPages(a, "tokens", func(cont *string, limit int) ([]ipamclient.Token, *string, error) {
		res, err := c.ListTokensWithResponse(a.ctx, &ipamclient.ListTokensParams{Limit: &limit, Continue: cont})
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
	if done, err := a.structured(ipamclient.TokenList{Items: nonNil(tokens)}); done {
		return err
	}
	t := newTable(a.stdout, "NAME", "ROLE", "STATE", "CREATED-BY", "EXPIRES", "LAST-USED", "AGE")
	for _, tk := range tokens {
		t.row(tk.Name, string(tk.Role), tk.State, tk.CreatedBy, timestamp(&tk.ExpiresAt), timestamp(tk.LastUsedAt), a.age(tk.CreatedAt))
	}
	return t.flush()
}

func tokensCreate(a *app, args []string) error {
	f := a.newFlags("tokens create", "tokens create NAME --role ROLE")
	role := f.String("role", "", "admin, operator or viewer (required)")
	expiresIn := f.String("expires-in", "", "lifetime, a Go duration such as 720h (default 720h)")
	expiresAt := f.String("expires-at", "", "expiry instant (RFC 3339), instead of --expires-in")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos, "NAME"); err != nil {
		return err
	}
	if *role == "" {
		return usageErrorf("tokens create: --role: missing (admin, operator or viewer)")
	}
	if *expiresIn != "" && *expiresAt != "" {
		return usageErrorf("tokens create: give --expires-in or --expires-at, not both")
	}
	c, _, err := a.client()
	if err != nil {
		return err
	}
	res, err := c.CreateTokenWithResponse(a.ctx, ipamclient.TokenRequest{Name: pos[0], Role: ipamclient.TokenRole(*role),
		ExpiresIn: optional(*expiresIn), ExpiresAt: optional(*expiresAt)})
	if err != nil {
		return err
	}
	if err := answer(res.HTTPResponse, res.Body, res.JSON201 != nil); err != nil {
		return err
	}
	tk := *res.JSON201
	if done, err := a.structured(tk); done {
		return err
	}
	// The secret alone on the last line, so that `| tail -1` takes it; the
	// service keeps only its hash and cannot show it again.
	_, err = fmt.Fprintf(a.stdout, "token %s created (role %s, expires %s); its secret, shown this once:\n%s\n",
		tk.Name, tk.Role, timestamp(&tk.ExpiresAt), tk.Secret)
	return err
}

func tokensRevoke(a *app, args []string) error {
	f := a.newFlags("tokens revoke", "tokens revoke NAME")
	pos, err := f.parse(args)
	if err != nil {
		return err
	}
	if err := f.wantArgs(pos, "NAME"); err != nil {
		return err
	}
	c, _, err := a.client()
	if err != nil {
		return err
	}
	res, err := c.RevokeTokenWithResponse(a.ctx, pos[0])
	if err != nil {
		return err
	}
	if err := answer(res.HTTPResponse, res.Body, true); err != nil {
		return err
	}
	if a.conn.output != "table" {
		return nil // nothing to encode: the answer is a 204
	}
	_, err = fmt.Fprintf(a.stdout, "token %s revoked\n", pos[0])
	return err
}
