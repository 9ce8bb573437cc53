// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"fmt"
	"io"
)

// writeBatches is what the servers' store batcher did during one run: the
// transactions that carried two or more lease and release statements, the
// statements in them, those sent alone, and those that ran again alone
// after their batch failed (ipam_store_* on /metrics, summed over the
// servers, the difference across the run).
type writeBatches struct {
	Batches   int64   `json:"batches"`
	Batched   int64   `json:"batched"`
	Alone     int64   `json:"alone"`
	Fallbacks int64   `json:"fallbacks"`
	MeanSize  float64 `json:"meanSize"`
}

// writeBatchMetrics are the counters writeBatches reads, in its order.
var writeBatchMetrics = []string{"ipam_store_write_batches_total", "ipam_store_batched_writes_total",
	"ipam_store_unbatched_writes_total", "ipam_store_batch_fallbacks_total"}

// scrapeWriteBatches sums the batcher's counters over the servers.
func (b *bench) scrapeWriteBatches(ctx context.Context) (writeBatches, error) {
	var w writeBatches
	err := b.scrapeServers(ctx, func(text string) error {
		got, err := parseWriteBatches(text)
		w = w.plus(got, 1)
		return err
	})
	return w, err
}

func parseWriteBatches(text string) (writeBatches, error) {
	var v [4]int64
	for i, name := range writeBatchMetrics {
		ss, err := parseMetric(text, name)
		if err != nil {
			return writeBatches{}, err
		}
		total, _ := sumSeries(ss, "")
		v[i] = int64(total)
	}
	return writeBatches{Batches: v[0], Batched: v[1], Alone: v[2], Fallbacks: v[3]}, nil
}

// plus answers w + sign x o, with the mean batch size of the result.
func (w writeBatches) plus(o writeBatches, sign int64) writeBatches {
	out := writeBatches{Batches: w.Batches + sign*o.Batches, Batched: w.Batched + sign*o.Batched,
		Alone: w.Alone + sign*o.Alone, Fallbacks: w.Fallbacks + sign*o.Fallbacks}
	if out.Batches > 0 {
		out.MeanSize = float64(out.Batched) / float64(out.Batches)
	}
	return out
}

func printWriteBatches(out io.Writer, w *writeBatches) {
	if w == nil {
		return
	}
	fmt.Fprintf(out, "  write batches: %d transactions carried %d statements (mean %.1f), %d went alone, %d ran again alone after their batch failed\n",
		w.Batches, w.Batched, w.MeanSize, w.Alone, w.Fallbacks)
}
