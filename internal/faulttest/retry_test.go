// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

//go:build linux

package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/pgtest"
)

// repeat sends one call as an unreliable client does, in one of several
// ways chosen at random: once; twice in a row (the first answer "lost":
// received but not trusted, as when a plugin times out just as it
// arrives); two or three copies at once; copies at once followed by a late
// retry. Every copy goes to a random replica. It returns every answer.
func repeat(ctx context.Context, c *client, rng *rand.Rand, method, path string, body any) ([]answer, error) {
	var copies, after int
	switch r := rng.IntN(100); {
	case r < 30:
		copies = 1
	case r < 55:
		copies, after = 1, 1
	case r < 85:
		copies = 2 + rng.IntN(2)
	default:
		copies, after = 2, 1
	}
	seeds := make([]uint64, copies+after)
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	answers := make([]answer, copies, copies+after)
	errs := make([]error, copies)
	var wg sync.WaitGroup
	for i := range copies {
		wg.Go(func() {
			answers[i], errs[i] = c.call(ctx, rand.New(rand.NewPCG(seeds[i], 1)), method, path, body)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	for i := range after {
		a, err := c.call(ctx, rand.New(rand.NewPCG(seeds[copies+i], 2)), method, path, body)
		if err != nil {
			return nil, err
		}
		answers = append(answers, a)
	}
	return answers, nil
}

// A client that repeats every call at random (ADD, confirm and DEL, in
// sequence and concurrently, across two replicas) gets exactly one address
// per family per attachment: every ADD of an attachment answers the same
// addresses, exactly one of them 201; nothing stays held after DEL; the
// database agrees with the clients.
func TestRandomRetriesOneAddressPerAttachment(t *testing.T) {
	const (
		clients     = 24
		attachments = 30 // per client
	)
	dbURL := pgtest.NewDatabase(t)
	var urls []string
	for i := range 2 {
		r := startReplica(t, "r"+strconv.Itoa(i), dbURL, "--cooldown", "0s", "--max-conns", "16")
		urls = append(urls, r.url)
	}
	c := newClient(urls...)
	createPool(t, c)
	led := newLedger()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)

	var (
		mu                  sync.Mutex
		sent, kept, dropped int
		staleConfirms       int
		fails               errs
	)
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := range attachments {
				if err := lifecycle(c, rng, led, attachment{node: fmt.Sprintf("node-%d", rng.IntN(6)), cid: fmt.Sprintf("w%d-%d", w, i)},
					func(n int, release, stale bool) {
						mu.Lock()
						defer mu.Unlock()
						sent += n
						if release {
							dropped++
						} else {
							kept++
						}
						if stale {
							staleConfirms++
						}
					}); err != nil {
					fails.add(err)
					return
				}
			}
		})
	}
	wg.Wait()
	fails.report(t)
	c.checkOutages(t)
	t.Logf("%d attachments (%d kept, %d released), %d requests in all, %d stale confirmations after release",
		kept+dropped, kept, dropped, sent, staleConfirms)
	if t.Failed() {
		return
	}
	checked := led.verify(t, dbURL)
	t.Logf("%d addresses checked against the clients' ledger", checked)
	if checked != 2*kept {
		t.Errorf("%d addresses checked, want 2 for each of %d kept attachments", checked, kept)
	}
}

// lifecycle runs one attachment through ADD, confirm (usually) and DEL
// (half the time), each call repeated at random, and checks every answer.
// done is told how many requests were sent and what happened.
func lifecycle(c *client, rng *rand.Rand, led *ledger, a attachment, done func(requests int, released, staleConfirm bool)) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	requests := 0

	adds, err := repeat(ctx, c, rng, "POST", "/v1/nodes/"+a.node+"/leases", a.leaseBody())
	if err != nil {
		return err
	}
	requests += len(adds)
	created := 0
	for _, ans := range adds {
		if err := expect(ans, nil, "allocate "+a.cid, http.StatusCreated, http.StatusOK); err != nil {
			return err
		}
		if ans.status == http.StatusCreated {
			created++
		}
		if err := led.leased(a, ans.body); err != nil {
			return err
		}
	}
	if created != 1 {
		return fmt.Errorf("attachment %v: %d of %d ADD answers were 201 Created, want exactly 1", a, created, len(adds))
	}

	if rng.IntN(100) < 80 {
		confirms, err := repeat(ctx, c, rng, "POST", a.path()+"/confirm", nil)
		if err != nil {
			return err
		}
		requests += len(confirms)
		for _, ans := range confirms {
			if err := expect(ans, nil, "confirm "+a.cid, http.StatusOK); err != nil {
				return err
			}
			if err := led.leased(a, ans.body); err != nil { // the same addresses again
				return err
			}
		}
		led.confirmed(a)
	}

	release := rng.IntN(2) == 0
	stale := false
	if release {
		led.releasing(a)
		dels, err := repeat(ctx, c, rng, "DELETE", a.path(), nil)
		if err != nil {
			return err
		}
		requests += len(dels)
		for _, ans := range dels {
			if err := expect(ans, nil, "release "+a.cid, http.StatusNoContent); err != nil {
				return err
			}
		}
		// A confirmation retried so late that it arrives after the
		// release: refused, and nothing comes back to life.
		if rng.IntN(100) < 20 {
			stale = true
			ans, err := c.call(ctx, rng, "POST", a.path()+"/confirm", nil)
			requests++
			if err := expect(ans, err, "stale confirm "+a.cid, http.StatusNotFound); err != nil {
				return err
			}
		}
	}
	done(requests, release, stale)
	return nil
}
