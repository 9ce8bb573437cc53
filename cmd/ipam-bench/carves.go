// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"fmt"
)

// The servers' carve counters (cmd/server, observeCarves).
const (
	inlineCarvesMetric     = "ipam_inline_carves_total"
	backgroundCarvesMetric = "ipam_background_carves_total"
)

// carveCounts are the blocks carved during a run, by who carved them:
// allocations on the lease path (Inline), the top-up and the GC's
// Rebalance ahead of demand.
type carveCounts struct {
	Inline    int64 `json:"inline"`
	TopUp     int64 `json:"topUp"`
	Rebalance int64 `json:"rebalance"`
}

func (c carveCounts) minus(o carveCounts) carveCounts {
	return carveCounts{Inline: c.Inline - o.Inline, TopUp: c.TopUp - o.TopUp, Rebalance: c.Rebalance - o.Rebalance}
}

// parseCarves reads the carve counters of a Prometheus text exposition.
func parseCarves(text string) (carveCounts, error) {
	inline, err := parseMetric(text, inlineCarvesMetric)
	if err != nil {
		return carveCounts{}, err
	}
	background, err := parseMetric(text, backgroundCarvesMetric)
	if err != nil {
		return carveCounts{}, err
	}
	if len(inline) == 0 || len(background) == 0 {
		return carveCounts{}, fmt.Errorf("%s or %s not exported", inlineCarvesMetric, backgroundCarvesMetric)
	}
	n, _ := sumSeries(inline, "")
	_, by := sumSeries(background, "by")
	return carveCounts{Inline: int64(n), TopUp: int64(by["top-up"]), Rebalance: int64(by["rebalance"])}, nil
}

// scrapeCarves sums the carve counters over the servers.
func (b *bench) scrapeCarves(ctx context.Context) (carveCounts, error) {
	var sum carveCounts
	err := b.scrapeServers(ctx, func(text string) error {
		c, err := parseCarves(text)
		sum.Inline, sum.TopUp, sum.Rebalance = sum.Inline+c.Inline, sum.TopUp+c.TopUp, sum.Rebalance+c.Rebalance
		return err
	})
	return sum, err
}

// scrapeServers hands the text of each server's /metrics to read.
func (b *bench) scrapeServers(ctx context.Context, read func(text string) error) error {
	hc := b.pki.adminClient()
	for _, s := range b.servers {
		text, err := scrape(ctx, hc, s.url+"/metrics")
		if err != nil {
			return err
		}
		if err := read(text); err != nil {
			return fmt.Errorf("%s: %w", s.url, err)
		}
	}
	return nil
}
