// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"strings"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// findingsError is check's answer when the database breaks an invariant:
// exit code 1, after the report is printed, so that a cron job notices.
type findingsError struct{ n int }

func (e findingsError) Error() string {
	return "consistency check: " + plural(int64(e.n), "finding")
}

// runCheck is `ipamctl check`: GET /v1/consistency, which reads whole
// tables in one snapshot and may take seconds on a large database, hence
// the progress line.
func runCheck(a *app, name string, args []string) error {
	f := a.newFlags(name, "check")
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
	var r ipamclient.ConsistencyReport
	err = a.progress().during("checking consistency", func() error {
		res, err := c.CheckConsistencyWithResponse(a.ctx)
		if err != nil {
			return err
		}
		if err := answer(res.HTTPResponse, res.Body, res.JSON200 != nil); err != nil {
			return err
		}
		r = *res.JSON200
		return nil
	})
	if err != nil {
		return err
	}
	r.Findings = nonNil(r.Findings)
	done, err := a.structured(r)
	if !done {
		err = a.checkTable(r)
	}
	if err != nil {
		return err
	}
	if !r.Consistent || len(r.Findings) > 0 {
		return findingsError{n: len(r.Findings)}
	}
	return nil
}

// plural is "1 pool", "2 pools".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return num(n) + " " + noun + "s"
}

func (a *app) checkTable(r ipamclient.ConsistencyReport) error {
	w := &errWriter{w: a.stdout}
	n := r.Counts
	verdict := "consistent"
	if !r.Consistent {
		verdict = "INCONSISTENT, " + plural(int64(len(r.Findings)), "finding")
		if r.Truncated {
			verdict += " (more not listed)"
		}
	}
	fmt.Fprintf(w, "%s: %s, %s, %s, %s, %s, %s checked at %s in %.2fs\n", verdict,
		plural(n.Spaces, "space"), plural(n.Pools, "pool"), plural(n.PoolCIDRs, "pool CIDR"), plural(n.Nodes, "node"),
		plural(n.Blocks, "block"), plural(n.Leases, "lease"), timestamp(&r.CheckedAt), r.DurationSeconds)
	if len(r.Findings) == 0 {
		return w.err
	}
	fmt.Fprintln(w)
	t := newTable(w, "KIND", "SPACE", "OBJECTS", "DETAIL")
	for _, fd := range r.Findings {
		t.row(string(fd.Kind), fd.Space, strings.Join(fd.Objects, ","), fd.Detail)
	}
	if err := t.flush(); err != nil {
		return err
	}
	return w.err
}
