// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

//go:build linux

package faulttest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/pgembed"
	"github.com/ipam-dev/ipam/internal/pgtest"
)

// callTimeout bounds one logical call, all its retries included: longer
// than any outage a test makes.
const callTimeout = 60 * time.Second

// workload runs clients that allocate, confirm and release leases over
// nodes, as CNI plugins do, until stop says so. Every answer is checked and
// recorded in led; the first errors end up in errs.
type workload struct {
	c     *client
	led   *ledger
	nodes int
	// confirmAll confirms every lease right after its allocation, so that
	// none stays pending (and could expire) for longer than an outage.
	confirmAll bool
	calls      atomic.Int64 // logical calls answered
	allocs     atomic.Int64
	confirm    atomic.Int64
	release    atomic.Int64
	errs       errs
}

// start runs workers clients in the background until the returned stop is
// called (or a client fails); stop waits for them and may be called again.
func (w *workload) start(workers int) (stop func()) {
	var stopped atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(workers, uint64(time.Now().UnixNano()), func() bool { return stopped.Load() || w.errs.failed() })
	}()
	return func() { stopped.Store(true); <-done }
}

// finish stops the load started by start, reports the clients' errors and
// outages, and records what they did.
func (w *workload) finish(t *testing.T, stop func()) {
	t.Helper()
	stop()
	w.errs.report(t)
	w.c.checkOutages(t)
	figure(t, "%d calls (%d allocations, %d confirmations, %d releases); %d attempts answered 503, %d got no answer",
		w.calls.Load(), w.allocs.Load(), w.confirm.Load(), w.release.Load(), w.c.unavailable.Load(), w.c.noAnswer.Load())
}

// run starts workers clients and returns when every one has stopped.
func (w *workload) run(workers int, seed uint64, stop func() bool) {
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() { w.worker(i, rand.New(rand.NewPCG(seed, uint64(i))), stop) })
	}
	wg.Wait()
}

func (w *workload) worker(id int, rng *rand.Rand, stop func() bool) {
	type mine struct {
		a         attachment
		confirmed bool
	}
	var held []mine
	for n := 0; !stop(); n++ {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := func() error {
			switch r := rng.IntN(100); {
			case len(held) == 0 || r < 50:
				a := attachment{node: fmt.Sprintf("node-%02d", rng.IntN(w.nodes)), cid: fmt.Sprintf("w%d-%d", id, n)}
				ans, err := w.c.call(ctx, rng, "POST", "/v1/nodes/"+a.node+"/leases", a.leaseBody())
				// 200: the first attempt committed but its answer was lost.
				if err := expect(ans, err, "allocate "+a.cid, http.StatusCreated, http.StatusOK); err != nil {
					return err
				}
				if err := w.led.leased(a, ans.body); err != nil {
					return err
				}
				held = append(held, mine{a: a})
				w.allocs.Add(1)
				if w.confirmAll {
					ans, err := w.c.call(ctx, rng, "POST", a.path()+"/confirm", nil)
					if err := expect(ans, err, "confirm "+a.cid, http.StatusOK); err != nil {
						return err
					}
					held[len(held)-1].confirmed = true
					w.led.confirmed(a)
					w.confirm.Add(1)
				}
			case r < 75 && !held[len(held)-1].confirmed:
				m := &held[len(held)-1]
				ans, err := w.c.call(ctx, rng, "POST", m.a.path()+"/confirm", nil)
				if err := expect(ans, err, "confirm "+m.a.cid, http.StatusOK); err != nil {
					return err
				}
				m.confirmed = true
				w.led.confirmed(m.a)
				w.confirm.Add(1)
			default:
				i := rng.IntN(len(held))
				a := held[i].a
				held = append(held[:i], held[i+1:]...)
				w.led.releasing(a)
				ans, err := w.c.call(ctx, rng, "DELETE", a.path(), nil)
				if err := expect(ans, err, "release "+a.cid, http.StatusNoContent); err != nil {
					return err
				}
				w.release.Add(1)
			}
			return nil
		}()
		cancel()
		if err != nil {
			w.errs.add(err)
			return
		}
		w.calls.Add(1)
	}
}

// Three replicas on one database under 64 clients; one is killed with
// SIGKILL a third of the way through. Clients whose request got no answer
// send it again to another replica. At the end the database holds exactly
// what the clients were told, and no address twice.
func TestReplicaKilledUnderLoad(t *testing.T) {
	const (
		clients = 64
		calls   = 6000
	)
	dbURL := pgtest.NewDatabase(t)
	var reps []*replica
	var urls []string
	for i := range 3 {
		r := startReplica(t, "r"+strconv.Itoa(i), dbURL, "--cooldown", "0s", "--max-conns", "12")
		reps, urls = append(reps, r), append(urls, r.url)
	}
	c := newClient(urls...)
	createPool(t, c)

	w := &workload{c: c, led: newLedger(), nodes: 40}
	killedAt := make(chan int64, 1)
	go func() {
		for w.calls.Load() < calls/3 && !w.errs.failed() {
			time.Sleep(5 * time.Millisecond)
		}
		reps[0].kill()
		killedAt <- w.calls.Load()
	}()
	began := time.Now()
	w.run(clients, uint64(time.Now().UnixNano()), func() bool { return w.calls.Load() >= calls })
	w.errs.report(t)
	c.checkOutages(t)
	at := <-killedAt
	figure(t, "%d calls in %v (%d allocations, %d confirmations, %d releases); replica r0 killed after %d; %d attempts got no answer and went to another replica, %d answered 503",
		w.calls.Load(), time.Since(began).Round(time.Millisecond), w.allocs.Load(), w.confirm.Load(), w.release.Load(), at, c.noAnswer.Load(), c.unavailable.Load())
	if at >= calls {
		t.Errorf("the replica was killed after the run (%d calls), not during it", at)
	}
	if c.noAnswer.Load() == 0 {
		t.Error("no request went unanswered: the kill was not felt, so failover was not tested")
	}
	if t.Failed() {
		return
	}
	checked := w.led.verify(t, dbURL)
	figure(t, "%d addresses checked against the clients' ledger (%d attachments held, %d released)", checked, len(w.led.live), len(w.led.released))
	if checked == 0 {
		t.Error("no address was left to check")
	}
}

// postgres controls a private PostgreSQL cluster with pg_ctl, as its
// operator would, running it as the "postgres" user when we are root.
type postgres struct {
	dir    string // pgembed's DataDir
	pgData string
	binDir string
	cred   *syscall.Credential
}

func (p *postgres) pgCtl(args ...string) error {
	args = append([]string{"-D", p.pgData, "-w", "-t", "60", "-l", filepath.Join(p.pgData, "pg_ctl.log")}, args...)
	cmd := exec.Command(filepath.Join(p.binDir, "pg_ctl"), args...)
	cmd.Dir = p.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.pgData, "pg_ctl.log"))
		return fmt.Errorf("pg_ctl %s: %v\n%s\nlog:\n%s", strings.Join(args, " "), err, out, log)
	}
	return nil
}

// start starts the server with the settings pgembed gives it: the same
// socket directory and port, so that connection strings stay valid.
func (p *postgres) start() error {
	return p.pgCtl("start", "-o", fmt.Sprintf("-c listen_addresses='' -c port=5432 -c unix_socket_directories='%s' -c max_connections=300",
		filepath.Join(p.dir, "run")))
}

// startPostgres starts a durable private cluster (fsync and synchronous
// commit on: an immediate shutdown must not lose a committed lease) and
// stops it at cleanup, whatever pg_ctl did to it meanwhile.
func startPostgres(t *testing.T) (*postgres, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "ipam-fault-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil { // reachable for the postgres user
		t.Fatal(err)
	}
	binDir, err := pgembed.FindBinDir()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := pgembed.Start(t.Context(), pgembed.Options{DataDir: dir, BinDir: binDir})
	if err != nil {
		t.Fatal(err)
	}
	p := &postgres{dir: dir, pgData: filepath.Join(dir, "pgdata"), binDir: binDir}
	p.cred = postgresCredential(t)
	t.Cleanup(func() {
		// After a restart the postmaster is pg_ctl's, not pgembed's child:
		// stop it with pg_ctl; pgembed's Stop then finds its own exited.
		if err := p.pgCtl("stop", "-m", "fast"); err != nil {
			t.Logf("stopping PostgreSQL: %v", err)
		}
		_ = cl.Stop(context.Background())
	})
	return p, cl.ConnString("postgres")
}

// PostgreSQL is restarted with an immediate shutdown (a crash, for the
// clients) under load, then stopped for a while and started again. While
// it is down every replica answers 503 problem+json with Retry-After on
// /readyz and on lease calls, never 500 and never silence; once it is back
// they recover by themselves within seconds, and no confirmed lease is
// lost.
func TestPostgresRestartUnderLoad(t *testing.T) {
	// Fewer clients than database connections per replica: /readyz then
	// measures recovery, not queueing behind a saturated pool.
	const clients = 12
	pg, dbURL := startPostgres(t)
	var (
		urls     []string
		replicas []*replica
	)
	for i := range 2 {
		r := startReplica(t, "r"+strconv.Itoa(i), dbURL, "--cooldown", "0s", "--max-conns", "16")
		urls = append(urls, r.url)
		replicas = append(replicas, r)
	}
	c := newClient(urls...)
	createPool(t, c)

	w := &workload{c: c, led: newLedger(), nodes: 20}
	stopLoad := w.start(clients)
	defer stopLoad()
	// progress waits for 50 more calls by the clients and answers how long
	// the first one took.
	progress := func(what string) (time.Duration, error) {
		began, from := time.Now(), w.calls.Load()
		var first time.Duration
		for w.calls.Load() < from+50 {
			if first == 0 && w.calls.Load() > from {
				first = time.Since(began)
			}
			if time.Since(began) > 30*time.Second {
				return 0, fmt.Errorf("%s: only %d calls in 30s", what, w.calls.Load()-from)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return max(first, time.Millisecond), nil
	}
	// recovered answers how long after PostgreSQL is back the service is
	// whole again: every replica ready, and the clients' calls succeeding.
	recovered := func(what string) time.Duration {
		t.Helper()
		type result struct {
			d   time.Duration
			err error
		}
		done := make(chan result, 1)
		go func() {
			d, err := progress(what)
			done <- result{d, err}
		}()
		ready := waitReady(t, urls)
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		return max(ready, r.d)
	}
	if _, err := progress("before the restart"); err != nil {
		t.Fatal(err)
	}

	// 1. pg_ctl restart -m immediate under load.
	began := time.Now()
	if err := pg.pgCtl("restart", "-m", "immediate"); err != nil {
		t.Fatal(err)
	}
	restarted := time.Since(began)
	recovery := recovered("after the restart")
	figure(t, "pg_ctl restart -m immediate took %v; the service recovered %v later (every replica ready, the clients' calls succeeding)",
		restarted.Round(time.Millisecond), recovery.Round(time.Millisecond))

	// 1b. pg_ctl restart -m fast: the server ends each session with
	// SQLSTATE 57P01 (admin_shutdown), an error with a code that is still
	// no fault of the input.
	began = time.Now()
	if err := pg.pgCtl("restart", "-m", "fast"); err != nil {
		t.Fatal(err)
	}
	restarted = time.Since(began)
	recoveryFast := recovered("after the fast restart")
	figure(t, "pg_ctl restart -m fast took %v; the service recovered %v later",
		restarted.Round(time.Millisecond), recoveryFast.Round(time.Millisecond))

	// 2. Down for a while: every replica says so, properly.
	if err := pg.pgCtl("stop", "-m", "immediate"); err != nil {
		t.Fatal(err)
	}
	probes := probeDown(t, c, urls, 2*time.Second)
	if err := pg.start(); err != nil {
		t.Fatal(err)
	}
	recovery2 := recovered("after the start")
	figure(t, "while PostgreSQL was down: %d probes answered 503 problem+json with Retry-After; recovered %v after pg_ctl start", probes, recovery2.Round(time.Millisecond))
	for _, d := range []time.Duration{recovery, recoveryFast, recovery2} {
		if d > 10*time.Second {
			t.Errorf("the service took %v to recover, more than 10s", d)
		}
	}

	w.finish(t, stopLoad)
	if c.unavailable.Load() == 0 {
		t.Error("no client saw a 503: the outage was not felt")
	}
	classes := logClasses(t, replicas)
	figure(t, "the replicas' log lines about failed requests, by class: %v", classes)
	if classes["unavailable"] == 0 {
		t.Error("the outage was not logged as unavailable")
	}
	for class, n := range classes {
		if class != "unavailable" {
			t.Errorf("%d failed requests logged as %q during a database restart; a lost connection is an availability problem", n, class)
		}
	}
	if c.noAnswer.Load() != 0 {
		t.Errorf("%d attempts got no answer from a running replica", c.noAnswer.Load())
	}
	if t.Failed() {
		return
	}
	checked := w.led.verify(t, dbURL)
	figure(t, "%d addresses checked against the clients' ledger (%d attachments held, %d released)", checked, len(w.led.live), len(w.led.released))
	if checked == 0 {
		t.Error("no address was left to check")
	}
}

// logClasses counts the API's log lines about failed requests in the
// replicas' logs, by their class attribute (internal, unavailable,
// validation-gap); a line of one of the API's failure messages without a
// class counts under its message.
func logClasses(t *testing.T, replicas []*replica) map[string]int {
	t.Helper()
	classes := map[string]int{}
	for _, r := range replicas {
		for line := range strings.Lines(r.log.String()) {
			var entry struct{ Msg, Class string }
			if json.Unmarshal([]byte(line), &entry) != nil || !strings.HasPrefix(entry.Msg, "api: ") {
				continue
			}
			switch {
			case entry.Class != "":
				classes[entry.Class]++
			case entry.Msg == "api: internal error" || entry.Msg == "api: unavailable" ||
				strings.Contains(entry.Msg, "refused a value"):
				classes[entry.Msg]++
			}
		}
	}
	return classes
}

// waitReady polls /readyz on every replica until all answer 200 and
// returns how long that took; it fails t after 30s.
func waitReady(t *testing.T, urls []string) time.Duration {
	t.Helper()
	began := time.Now()
	hc := &http.Client{Timeout: 5 * time.Second}
	for _, u := range urls {
		for {
			res, err := hc.Get(u + "/readyz")
			if err == nil {
				res.Body.Close()
				if res.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Since(began) > 30*time.Second {
				t.Fatalf("%s/readyz not 200 within 30s: %v", u, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return time.Since(began)
}

// probeDown asks every replica for readiness and a lease, once each per
// round, for d, while the database is down: each answer must be a 503
// problem+json of type unavailable with Retry-After. It returns how many
// probes were made.
func probeDown(t *testing.T, c *client, urls []string, d time.Duration) int {
	t.Helper()
	n := 0
	ctx := t.Context()
	for end := time.Now().Add(d); time.Now().Before(end); {
		for _, u := range urls {
			a := attachment{node: "probe", cid: "probe-" + strconv.Itoa(n)}
			for _, req := range []struct {
				method, path string
				body         any
			}{
				{"GET", "/readyz", nil},
				{"POST", "/v1/nodes/probe/leases", a.leaseBody()},
				{"POST", a.path() + "/confirm", nil},
			} {
				var body []byte
				if req.body != nil {
					body = mustJSON(t, req.body)
				}
				ans, err := c.once(ctx, req.method, u+req.path, body)
				if err != nil {
					t.Fatalf("%s %s with PostgreSQL down: no answer: %v", req.method, req.path, err)
				}
				if ans.status != http.StatusServiceUnavailable {
					t.Fatalf("%s %s with PostgreSQL down: status %d, want 503: %s", req.method, req.path, ans.status, ans.body)
				}
				c.checkOutage(req.method, req.path, ans)
				n++
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return n
}
