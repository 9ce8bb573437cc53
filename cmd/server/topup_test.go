// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/pgtest"
)

// A node's first lease carves its first block on the lease path (nothing
// was there to top up); the server's top-up then carves the block its need
// asks for (demand 1 and the default pool's pre-allocation 8 need 16
// addresses; a /28 leases 12). The metrics count both, apart. With
// --block-top-up=false nothing is carved in the background.
func TestMetricsCarves(t *testing.T) {
	for _, on := range []bool{true, false} {
		// The GC's pass would carve the same block: not within the test.
		base := startServer(t, pgtest.NewDatabase(t), "--gc-interval", "1h", "--block-top-up="+strconv.FormatBool(on))
		mustCall(t, 201, "POST", base+"/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/24"],"maskSize":28}}}`)
		mustCall(t, 201, "POST", base+"/v1/nodes/n1/leases", `{"containerID":"c1","interface":"eth0","owner":{"namespace":"ns","name":"p1"}}`)
		wantSeries := map[string]string{
			`ipam_inline_carves_total`:                     "1",
			`ipam_background_carves_total{by="top-up"}`:    "0",
			`ipam_background_carves_total{by="rebalance"}`: "0",
		}
		if on {
			wantSeries[`ipam_background_carves_total{by="top-up"}`] = "1"
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			got := mustCall(t, 200, "GET", base+"/metrics", "")
			var off []string
			for series, v := range wantSeries {
				if g, ok := sample(got, series); g != v {
					off = append(off, fmt.Sprintf("%s = %q (present %v), want %s", series, g, ok, v))
				}
			}
			if len(off) == 0 {
				break
			}
			if !on || time.Now().After(deadline) {
				t.Fatalf("top-up %v: %v", on, off)
			}
			time.Sleep(20 * time.Millisecond)
		}
		blocks := mustCall(t, 200, "GET", base+"/v1/nodes/n1/blocks", "")
		want := 1
		if on {
			want = 2
		}
		if n := strings.Count(blocks, `"cidr"`); n != want {
			t.Errorf("top-up %v: node n1 holds %d blocks, want %d: %s", on, n, want, blocks)
		}
	}
}

// The top-up is on unless --block-top-up=false (or IPAM_BLOCK_TOP_UP)
// turns it off, at most one pass every 100 ms unless
// --block-top-up-interval says otherwise, which must be positive.
func TestBlockTopUpFlags(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		env   map[string]string
		on    bool
		every time.Duration
	}{
		{nil, nil, true, 100 * time.Millisecond},
		{[]string{"--block-top-up=false"}, nil, false, 100 * time.Millisecond},
		{nil, map[string]string{"IPAM_BLOCK_TOP_UP": "false"}, false, 100 * time.Millisecond},
		{[]string{"--block-top-up-interval", "1s"}, nil, true, time.Second},
	} {
		c, err := parseConfig("serve", append(tc.args, "--database-url", "postgres://x"), func(k string) string { return tc.env[k] })
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if c.BlockTopUp != tc.on || c.BlockTopUpInterval != tc.every {
			t.Errorf("%v %v: top-up %v every %v, want %v every %v", tc.args, tc.env, c.BlockTopUp, c.BlockTopUpInterval, tc.on, tc.every)
		}
	}
	for _, args := range [][]string{{"--block-top-up-interval", "0s"}, {"--block-top-up-interval", "-1s"}} {
		if _, err := parseConfig("serve", append(args, "--database-url", "postgres://x"), func(string) string { return "" }); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// Every allocation's fast-path lookup is counted by the lookup batcher's
// metrics: sequential allocations, with nothing queued beside them, each
// alone. The node's first allocation looks up twice, before and after it
// carves the node's first block.
func TestMetricsLookupBatches(t *testing.T) {
	base := startServer(t, pgtest.NewDatabase(t), "--gc-interval", "1h")
	mustCall(t, 201, "POST", base+"/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/24"],"maskSize":28}}}`)
	for i := range 3 {
		mustCall(t, 201, "POST", base+"/v1/nodes/n1/leases",
			fmt.Sprintf(`{"containerID":"c%d","interface":"eth0","owner":{"namespace":"ns","name":"p%d"}}`, i, i))
	}
	got := mustCall(t, 200, "GET", base+"/metrics", "")
	for series, want := range map[string]string{
		`ipam_store_unbatched_lookups_total`:      "4",
		`ipam_store_batched_lookups_total`:        "0",
		`ipam_store_lookup_batches_total`:         "0",
		`ipam_store_lookup_batch_fallbacks_total`: "0",
	} {
		if g, ok := sample(got, series); g != want {
			t.Errorf("%s = %q (present %v), want %s", series, g, ok, want)
		}
	}
}
