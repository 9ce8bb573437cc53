// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Migrate)
}

// startServer runs one server instance (the real run function, with flags)
// against dbURL and returns its base URL; it stops at test cleanup.
func startServer(t *testing.T, dbURL string, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	bound := make(chan string, 1)
	done := make(chan error, 1)
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--database-url", dbURL, "--log-level", "error"}, extra...)
	if !slices.Contains(extra, "--tls-cert-file") && !slices.Contains(extra, "--data-dir") && !slices.Contains(extra, "--insecure-http") {
		// These tests speak plain HTTP from loopback, as make run's user.
		args = append(args, "--insecure-http", "--dev-no-auth")
	}
	go func() { done <- run(ctx, args, func(string) string { return "" }, bound) }()
	select {
	case addr := <-bound:
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("server exit: %v", err)
			}
		})
		return "http://" + addr
	case err := <-done:
		cancel()
		t.Fatalf("server did not start: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("server did not start in 30s")
	}
	return ""
}

// Two server instances on one database, 64 concurrent clients over 50
// nodes, 20,000 mixed allocate/release calls with zero cooldown (maximum
// reuse): no address is ever held twice, and the final counts match.
func TestConcurrentReplicasNeverDuplicate(t *testing.T) {
	const (
		clients = 64
		nodes   = 50
		calls   = 20000
	)
	dbURL := pgtest.NewDatabase(t)
	urls := []string{
		startServer(t, dbURL, "--cooldown", "0s", "--max-conns", "16"),
		startServer(t, dbURL, "--cooldown", "0s", "--max-conns", "16"),
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}, Timeout: 60 * time.Second}
	var cs []*ipamclient.ClientWithResponses
	for _, u := range urls {
		c, err := ipamclient.NewClientWithResponses(u, ipamclient.WithHTTPClient(hc))
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	ctx := context.Background()
	// Small blocks so the run carves many (/26: 62 leasable per block).
	pool, err := cs[0].CreatePoolWithResponse(ctx, nil, ipamclient.PoolRequest{Name: "default", Spec: ipamclient.PoolSpec{
		Ipv4: &ipamclient.PoolFamilySpec{Cidrs: []string{"10.0.0.0/16"}, MaskSize: 26},
		Ipv6: &ipamclient.PoolFamilySpec{Cidrs: []string{"fd00:10::/104"}, MaskSize: 120},
	}})
	if err != nil || pool.StatusCode() != http.StatusCreated {
		t.Fatalf("create pool: %v %s", err, pool.Body)
	}

	// held maps every address the clients believe is leased to its holder.
	var (
		mu     sync.Mutex
		held   = map[string]string{}
		issued atomic.Int64
		allocs atomic.Int64
		rels   atomic.Int64
		retry  atomic.Int64
	)
	type attachment struct{ node, cid string }
	var wg sync.WaitGroup
	errc := make(chan error, clients)
	for w := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			var mine []attachment
			var addrsOf = map[attachment][]string{}
			for n := 0; ; n++ {
				if issued.Add(1) > calls {
					return
				}
				c := cs[rng.IntN(len(cs))]
				if len(mine) == 0 || rng.IntN(100) < 55 {
					a := attachment{node: fmt.Sprintf("node-%02d", rng.IntN(nodes)), cid: fmt.Sprintf("w%d-%d", w, n)}
					body := ipamclient.LeaseRequest{ContainerID: a.cid, Interface: "eth0",
						Owner: ipamclient.Owner{Namespace: "bench", Name: a.cid}}
					r, err := c.AllocateLeaseWithResponse(ctx, a.node, nil, body)
					// Admission control answers 503 before doing anything
					// when no request slot came free (a loaded machine): a
					// client retries it, as the CNI plugin does.
					for try := 1; err == nil && r.StatusCode() == http.StatusServiceUnavailable && try <= 20; try++ {
						time.Sleep(time.Duration(try) * 20 * time.Millisecond)
						r, err = c.AllocateLeaseWithResponse(ctx, a.node, nil, body)
					}
					if err != nil || r.JSON201 == nil {
						errc <- fmt.Errorf("allocate %v: %v %d %s", a, err, r.StatusCode(), r.Body)
						return
					}
					allocs.Add(1)
					var addrs []string
					mu.Lock()
					for _, la := range r.JSON201.Addresses {
						ip := strings.Split(la.Address, "/")[0]
						if prev, dup := held[ip]; dup {
							mu.Unlock()
							errc <- fmt.Errorf("address %s leased to %s while %s holds it", ip, a.cid, prev)
							return
						}
						held[ip] = a.cid
						addrs = append(addrs, ip)
					}
					mu.Unlock()
					mine = append(mine, a)
					addrsOf[a] = addrs
					// Now and then the CNI plugin retries: same answer, 200.
					if rng.IntN(20) == 0 {
						again, err := cs[rng.IntN(len(cs))].AllocateLeaseWithResponse(ctx, a.node, nil, body)
						if err != nil || again.JSON200 == nil || again.JSON200.Addresses[0].Address != r.JSON201.Addresses[0].Address {
							errc <- fmt.Errorf("retry of %v: %v %s", a, err, again.Body)
							return
						}
						retry.Add(1)
					}
					continue
				}
				i := rng.IntN(len(mine))
				a := mine[i]
				mine[i] = mine[len(mine)-1]
				mine = mine[:len(mine)-1]
				// Forget the addresses before releasing: once the release
				// commits, another client may get them at once.
				mu.Lock()
				for _, ip := range addrsOf[a] {
					delete(held, ip)
				}
				mu.Unlock()
				delete(addrsOf, a)
				r, err := c.ReleaseAttachmentWithResponse(ctx, a.node, a.cid, "eth0", nil)
				for try := 1; err == nil && r.StatusCode() == http.StatusServiceUnavailable && try <= 20; try++ {
					time.Sleep(time.Duration(try) * 20 * time.Millisecond)
					r, err = c.ReleaseAttachmentWithResponse(ctx, a.node, a.cid, "eth0", nil)
				}
				if err != nil || r.StatusCode() != http.StatusNoContent {
					errc <- fmt.Errorf("release %v: %v %d %s", a, err, r.StatusCode(), r.Body)
					return
				}
				rels.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	t.Logf("%d allocations (%d retries), %d releases, %d addresses held", allocs.Load(), retry.Load(), rels.Load(), len(held))
	if allocs.Load()+rels.Load() < calls-clients {
		t.Fatalf("only %d calls made", allocs.Load()+rels.Load())
	}

	// The database agrees with the clients, row for row.
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT host(addr), container_id FROM leases WHERE state <> 'released'`)
	if err != nil {
		t.Fatal(err)
	}
	inDB := map[string]string{}
	for rows.Next() {
		var ip, cid string
		if err := rows.Scan(&ip, &cid); err != nil {
			t.Fatal(err)
		}
		inDB[ip] = cid
	}
	if len(inDB) != len(held) {
		t.Fatalf("database holds %d addresses, clients %d", len(inDB), len(held))
	}
	for ip, cid := range held {
		if inDB[ip] != cid {
			t.Fatalf("%s: database says %q, client %q", ip, inDB[ip], cid)
		}
	}
	var dups, badCounts int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT addr FROM leases GROUP BY space, addr HAVING count(*) > 1) d`).Scan(&dups); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM blocks b
		WHERE b.allocated <> (SELECT count(*) FROM leases l WHERE l.block_id = b.id)`).Scan(&badCounts); err != nil {
		t.Fatal(err)
	}
	if dups != 0 || badCounts != 0 {
		t.Fatalf("%d duplicate addresses, %d blocks with a wrong count", dups, badCounts)
	}
	// And the database itself refuses a second holder of an address.
	var anyIP string
	for ip := range held {
		anyIP = ip
		break
	}
	_, err = conn.Exec(ctx, `INSERT INTO leases (space, addr, block_id, block_cidr, node_id, pool_id, family, state,
		container_id, interface, owner_namespace, owner_name, created_at, confirmed_at)
		SELECT space, addr, block_id, block_cidr, node_id, pool_id, family, 'active', 'intruder', 'eth0', 'x', 'y', now(), now()
		FROM leases WHERE host(addr) = $1`, anyIP)
	if err == nil || !strings.Contains(err.Error(), "leases_one_holder_per_address") {
		t.Fatalf("duplicate insert of %s: %v", anyIP, err)
	}
}

// The README's curl tour works verbatim against a fresh server: the block
// fenced as "sh tour" runs in bash with only the host:port replaced.
func TestReadmeTour(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```sh tour\n")
	if !ok {
		t.Fatal("README has no ```sh tour block")
	}
	script, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("unterminated tour block")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the tour needs curl: apt-get install -y curl")
	}
	base := startServer(t, pgtest.NewDatabase(t))
	script = strings.ReplaceAll(script, "localhost:8080", strings.TrimPrefix(base, "http://"))
	out, err := exec.Command("bash", "-euo", "pipefail", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("tour failed: %v\n%s", err, out)
	}
	got := string(out)
	for _, want := range []string{
		`"name":"default"`,                       // pool created
		`"topology.kubernetes.io/zone":"zone-a"`, // node registered
		`"address":"10.244.0.3/24"`,              // first lease after router and health
		`"address":"fd00:10:244::3/120"`,         // and its IPv6 twin
		`"gateway":"10.244.0.1"`,                 // the router address
		`"state":"active"`,                       // confirmed
		`"containerID":"3f2a9c71"`,               // who holds it
		"\n204\n",                                // released
		`"cooling":1`,                            // the pool shows the cooling address
		`"reason":"attachment-released"`,         // the history says why it was released
		`"consistent":true`,                      // the consistency check found nothing
		`"usablePerNode":11`,                     // Lab 1 sizing
		`"field":"spec.ipv4.cidrs[0]"`,           // the bad input names its field
	} {
		if !strings.Contains(got, want) {
			t.Errorf("tour output lacks %s", want)
		}
	}
	if strings.Contains(got, "urn:ipam:problem:internal") || strings.Count(got, "urn:ipam:problem:") != 1 {
		t.Errorf("tour hit an unexpected problem:\n%s", got)
	}
	if t.Failed() {
		t.Logf("tour output:\n%s", got)
	}

	// Then the README's ipamctl block (fenced as "sh ipamctl") asks the
	// same server about what the tour did.
	_, rest, ok = strings.Cut(string(readme), "```sh ipamctl\n")
	if !ok {
		t.Fatal("README has no ```sh ipamctl block")
	}
	script, _, _ = strings.Cut(rest, "```")
	bin := filepath.Join(t.TempDir(), "ipamctl")
	if out, err := exec.Command("go", "build", "-o", bin, "../ipamctl").CombinedOutput(); err != nil {
		t.Fatalf("building ipamctl: %v\n%s", err, out)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(script, "bin/ipamctl", bin))
	cmd.Env = append(os.Environ(), "IPAM_SERVER="+base, "IPAMCTL_CONFIG="+filepath.Join(t.TempDir(), "none.yaml"))
	out, err = cmd.CombinedOutput()
	got = string(out)
	if err != nil {
		t.Fatalf("ipamctl tour failed: %v\n%s", err, got)
	}
	for _, want := range []string{
		"10.244.0.0/16",       // pools: the pool's CIDR
		"legend:",             // pool capacity: the map
		"state: cooling",      // leases -o yaml: the released lease cools
		"attachment-released", // history: why it was released
		"consistent",          // check
		"fd00:10:244::3/120",  // the IPv6 twin, in leases
	} {
		if !strings.Contains(got, want) {
			t.Errorf("ipamctl tour output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("ipamctl tour output:\n%s", got)
	}
}
