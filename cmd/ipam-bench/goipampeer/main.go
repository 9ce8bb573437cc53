// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

//go:build goipampeer

// Command goipampeer is the go-ipam peer of ipam-bench: go-ipam's own
// library on its PostgreSQL storage, in this process, driven with the
// lease path's workload shape (allocate and release over 256 prefixes by
// a number of clients) for a duration; it prints one JSON line of what
// it did. ipam-bench builds it in a module of its own (goipam.go), so
// go-ipam's dependencies never enter the project's go.mod; the build
// tag keeps it out of the project's builds.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goipam "github.com/metal-stack/go-ipam"
)

type result struct {
	Clients  int      `json:"clients"`
	Prefixes int      `json:"prefixes"`
	Seconds  float64  `json:"seconds"`
	Allocs   int64    `json:"allocs"`
	Releases int64    `json:"releases"`
	Errors   int64    `json:"errors"`
	Samples  []string `json:"errorSamples,omitempty"`
}

func main() {
	host := flag.String("host", "", "PostgreSQL host or Unix socket directory")
	port := flag.String("port", "5432", "PostgreSQL port")
	user := flag.String("user", "postgres", "PostgreSQL user")
	password := flag.String("password", "", "PostgreSQL password")
	dbname := flag.String("dbname", "", "database (go-ipam creates its table there)")
	clients := flag.Int("clients", 32, "concurrent clients")
	prefixes := flag.Int("prefixes", 256, "prefixes, a /24 each")
	held := flag.Int("held", 32, "addresses each prefix holds throughout, taken before the run")
	duration := flag.Duration("duration", 20*time.Second, "how long the clients run")
	flag.Parse()
	if err := run(*host, *port, *user, *password, *dbname, *clients, *prefixes, *held, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "goipampeer:", err)
		os.Exit(1)
	}
}

func run(host, port, user, password, dbname string, clients, prefixes, held int, duration time.Duration) error {
	// go-ipam puts host and port into a URL and appends its SSL mode as
	// the URL's query. A Unix socket directory (the benchmark's
	// PostgreSQL listens on one only) cannot be a URL's host, so it goes
	// into the query as lib/pq's host parameter, the URL's host left
	// empty (lib/pq then takes the parameter).
	mode, urlHost := goipam.SSLModeDisable, host
	if strings.HasPrefix(host, "/") {
		mode, urlHost = goipam.SSLMode(string(goipam.SSLModeDisable)+"&host="+url.QueryEscape(host)), ""
	}
	storage, err := goipam.NewPostgresStorage(urlHost, port, user, password, dbname, mode)
	if err != nil {
		return err
	}
	ipam := goipam.NewWithStorage(storage)
	ctx := context.Background()
	cidrs := make([]string, prefixes)
	for i := range cidrs {
		cidrs[i] = fmt.Sprintf("10.%d.%d.0/24", 64+i/256, i%256)
		if _, err := ipam.NewPrefix(ctx, cidrs[i]); err != nil {
			return fmt.Errorf("prefix %s: %w", cidrs[i], err)
		}
		for range held {
			if _, err := ipam.AcquireIP(ctx, cidrs[i]); err != nil {
				return fmt.Errorf("holding in %s: %w", cidrs[i], err)
			}
		}
	}
	var (
		r        = result{Clients: clients, Prefixes: prefixes}
		allocs   atomic.Int64
		releases atomic.Int64
		errs     atomic.Int64
		mu       sync.Mutex
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		errs.Add(1)
		mu.Lock()
		if len(r.Samples) < 5 {
			r.Samples = append(r.Samples, err.Error())
		}
		mu.Unlock()
	}
	start := time.Now()
	end := start.Add(duration)
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 37))
			// Like the lease path's clients: each allocation is released
			// by the same client, an allocation and a release per turn.
			for time.Now().Before(end) {
				cidr := cidrs[rng.IntN(len(cidrs))]
				ip, err := ipam.AcquireIP(ctx, cidr)
				if err != nil {
					fail(err)
					continue
				}
				allocs.Add(1)
				if _, err := ipam.ReleaseIP(ctx, ip); err != nil {
					fail(err)
					continue
				}
				releases.Add(1)
			}
		})
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	r.Allocs, r.Releases, r.Errors = allocs.Load(), releases.Load(), errs.Load()
	return json.NewEncoder(os.Stdout).Encode(r)
}
