// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"io"
	"math"
	"net/netip"
	"strings"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// runPools is `ipamctl pools`: every pool of the space with its status.
func runPools(a *app, name string, args []string) error {
	f := a.newFlags(name, "pools").withSpace()
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
	pools, err := allPages(a, "pools", func(cont *string, limit int) ([]ipamclient.Pool, *string, error) {
		res, err := c.ListPoolsWithResponse(a.ctx, &ipamclient.ListPoolsParams{Space: s.spaceParam(), Limit: &limit, Continue: cont})
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
	if done, err := a.structured(ipamclient.PoolList{Items: nonNil(pools)}); done {
		return err
	}
	t := newTable(a.stdout, "NAME", "MODE", "IPV4", "IPV6", "BLOCKS", "LEASED", "COOLING", "FREE", "AGE")
	for _, p := range pools {
		st := []*ipamclient.PoolFamilyStatus{p.Status.Ipv4, p.Status.Ipv6}
		t.row(p.Name, poolMode(p.Spec), familyCIDRs(p.Spec.Ipv4), familyCIDRs(p.Spec.Ipv6),
			perFamily(st, func(s *ipamclient.PoolFamilyStatus) string { return num(s.BlocksCarved) + "/" + num(s.BlocksPossible) }),
			perFamily(st, func(s *ipamclient.PoolFamilyStatus) string { return num(s.Leased) }),
			perFamily(st, func(s *ipamclient.PoolFamilyStatus) string { return num(s.Cooling) }),
			perFamily(st, func(s *ipamclient.PoolFamilyStatus) string { return num(s.Free) }),
			a.age(p.CreatedAt))
	}
	return t.flush()
}

// poolMode is the pool's mode, and whether it is disabled.
func poolMode(s ipamclient.PoolSpec) string {
	m := "multi-pool"
	if s.Mode != nil {
		m = string(*s.Mode)
	}
	if s.Disabled != nil && *s.Disabled {
		m += ",disabled"
	}
	return m
}

// familyCIDRs is a family's CIDRs and block size: "10.244.0.0/16 /24".
func familyCIDRs(f *ipamclient.PoolFamilySpec) string {
	if f == nil {
		return ""
	}
	return fmt.Sprintf("%s /%d", strings.Join(f.Cidrs, ","), f.MaskSize)
}

// perFamily formats a value of each family a pool has, IPv4 first,
// separated by a space (numbers carry commas of their own).
func perFamily[T any](fams []*T, f func(*T) string) string {
	var parts []string
	for _, s := range fams {
		if s != nil {
			parts = append(parts, f(s))
		}
	}
	return strings.Join(parts, " ")
}

// nonNil makes a nil list an empty one, so that JSON shows "items": []
// as the API does.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// runPool is `ipamctl pool capacity NAME`; the group has room for more
// verbs on one pool.
func runPool(a *app, name string, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprintln(a.stdout, "Usage: ipamctl pool capacity NAME [--window DURATION]")
			return errHelp
		}
		return usageErrorf("pool: missing subcommand (capacity)")
	}
	switch args[0] {
	case "capacity":
		return runPoolCapacity(a, args[1:])
	}
	return usageErrorf("pool: unknown subcommand %q (capacity)", args[0])
}

// poolCapacity is the JSON and YAML of `pool capacity`: the three answers
// the drawing is made of, as the API gave them.
type poolCapacity struct {
	Pool     ipamclient.Pool         `json:"pool"`
	Capacity ipamclient.PoolCapacity `json:"capacity"`
	Blocks   []ipamclient.Block      `json:"blocks"`
}

func runPoolCapacity(a *app, args []string) error {
	f := a.newFlags("pool capacity", "pool capacity NAME").withSpace()
	window := f.String("window", "", "how far back the exhaustion forecast looks, 5m to 24h (default 1h)")
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
	var out poolCapacity
	pool, sp := pos[0], s.spaceParam()
	pres, err := c.GetPoolWithResponse(a.ctx, pool, &ipamclient.GetPoolParams{Space: sp})
	if err != nil {
		return err
	}
	if err := answer(pres.HTTPResponse, pres.Body, pres.JSON200 != nil); err != nil {
		return err
	}
	out.Pool = *pres.JSON200
	cp := &ipamclient.GetPoolCapacityParams{Space: sp}
	if *window != "" {
		cp.Window = window
	}
	cres, err := c.GetPoolCapacityWithResponse(a.ctx, pool, cp)
	if err != nil {
		return err
	}
	if err := answer(cres.HTTPResponse, cres.Body, cres.JSON200 != nil); err != nil {
		return err
	}
	out.Capacity = *cres.JSON200
	out.Blocks, err = allPages(a, "blocks of "+pool, func(cont *string, limit int) ([]ipamclient.Block, *string, error) {
		res, err := c.ListPoolBlocksWithResponse(a.ctx, pool, &ipamclient.ListPoolBlocksParams{Space: sp, Limit: &limit, Continue: cont})
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
	out.Blocks = nonNil(out.Blocks)
	if done, err := a.structured(out); done {
		return err
	}
	return a.drawCapacity(out)
}

// shortDuration drops the zero units of a Go duration: "1h", not
// "1h0m0s". Anything else is shown as the API gave it.
func shortDuration(s string) string {
	if _, err := time.ParseDuration(s); err != nil {
		return s
	}
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// barWidth is the width of a capacity bar's inside.
const barWidth = 32

// bar draws used of total as [###.....]: at least one # when anything is
// used and at least one . until everything is, so that 1 of 65,536 and
// 65,535 of 65,536 do not look like empty and full.
func bar(used, total int64) string {
	n := 0
	if total > 0 {
		n = int(math.Round(float64(used) / float64(total) * barWidth))
	}
	if used > 0 && n == 0 {
		n = 1
	}
	if used < total && n == barWidth {
		n = barWidth - 1
	}
	n = max(0, min(n, barWidth))
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", barWidth-n) + "]"
}

// percent is part of whole with one decimal.
func percent(part, whole int64) string {
	if whole == 0 {
		return "0%"
	}
	return fmt.Sprintf("%.1f%%", float64(part)*100/float64(whole))
}

// drawCapacity is the table form of `pool capacity`: per family a bar of
// carved blocks and one of used addresses with the counts, then the map
// of each CIDR.
func (a *app) drawCapacity(pc poolCapacity) error {
	w := &errWriter{w: a.stdout}
	space := pc.Pool.Space
	fmt.Fprintf(w, "pool %s (space %s), forecast over %s\n", pc.Pool.Name, space, shortDuration(pc.Capacity.Window))
	fams := []struct {
		name string
		spec *ipamclient.PoolFamilySpec
		cap  *ipamclient.FamilyCapacity
	}{{"ipv4", pc.Pool.Spec.Ipv4, pc.Capacity.Ipv4}, {"ipv6", pc.Pool.Spec.Ipv6, pc.Capacity.Ipv6}}
	width := a.termWidth()
	drawn := false
	for _, fam := range fams {
		if fam.spec == nil || fam.cap == nil {
			continue
		}
		fc := fam.cap
		fmt.Fprintf(w, "\n%s  %s, blocks of /%d\n", fam.name, strings.Join(fam.spec.Cidrs, ", "), fam.spec.MaskSize)
		largest := ""
		if fc.LargestFreeBlock != nil {
			largest = "; largest free prefix " + *fc.LargestFreeBlock
		}
		fmt.Fprintf(w, "  blocks     %s %s of %s carved (%s), %s free to carve%s\n", bar(fc.BlocksCarved, fc.BlocksPossible),
			num(fc.BlocksCarved), num(fc.BlocksPossible), percent(fc.BlocksCarved, fc.BlocksPossible), num(fc.FreeBlocks), largest)
		used := fc.Leased + fc.Cooling
		fmt.Fprintf(w, "  addresses  %s %s leased, %s cooling, %s free of %s in blocks (%s possible)\n", bar(used, fc.AddressesInBlocks),
			num(fc.Leased), num(fc.Cooling), num(fc.Free), num(fc.AddressesInBlocks), num(fc.AddressesPossible))
		fmt.Fprintf(w, "  nodes      %s with blocks, %s at capacity, %s in deficit\n", num(fc.NodesWithBlocks), num(fc.NodesAtCapacity), num(fc.NodesInDeficit))
		if fc.Forecast.Summary != "" {
			fmt.Fprintf(w, "  forecast   %s\n", fc.Forecast.Summary)
		}
		for _, cidr := range fam.spec.Cidrs {
			fmt.Fprintln(w)
			if err := a.drawMap(w, cidr, fam.spec, pc.Blocks, width); err != nil {
				fmt.Fprintf(w, "  %s: %v\n", cidr, err)
				continue
			}
			drawn = true
		}
	}
	if drawn {
		fmt.Fprintf(w, "\n%s\n", mapLegend)
	}
	return w.err
}

// drawMap draws one pool CIDR with the pool's blocks and reserved ranges.
func (a *app) drawMap(w io.Writer, cidr string, spec *ipamclient.PoolFamilySpec, blocks []ipamclient.Block, width int) error {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return err
	}
	m, err := newPoolMap(p, spec.MaskSize, width, 2)
	if err != nil {
		return err
	}
	for _, b := range blocks {
		if bp, err := netip.ParsePrefix(b.Cidr); err == nil {
			m.carve(bp)
		}
	}
	if spec.Pool != nil {
		for _, pc := range *spec.Pool {
			if pc.ReservedRanges == nil {
				continue
			}
			for _, r := range *pc.ReservedRanges {
				start, err1 := netip.ParseAddr(r.Start)
				end, err2 := netip.ParseAddr(r.End)
				if err1 == nil && err2 == nil {
					m.reserve(start, end)
				}
			}
		}
	}
	return m.write(w, "  ")
}

// errWriter keeps the first write error, so that a drawing of many
// Fprintf calls checks once.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}
