// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// slowBody is one request whose body a client trickles: its headers
// announce size bytes, and a byte follows every interval, never all of
// them. The answer is the server's status line, or "" when the connection
// ended without one.
type slowBody struct {
	size   int
	status chan string
}

// trickle opens a TLS connection with cfg to addr and sends a lease request
// for node whose body never completes, until the server answers or stop
// is closed.
func trickle(t *testing.T, addr string, cfg *tls.Config, node string, size int, interval time.Duration, stop <-chan struct{}) *slowBody {
	t.Helper()
	sb := &slowBody{size: size, status: make(chan string, 1)}
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	head := fmt.Sprintf("POST /v1/nodes/%s/leases HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", node, addr, size)
	if _, err := conn.Write([]byte(head + `{"owner":{"namespace":"ns","name":"slow"},`)); err != nil {
		t.Fatal(err)
	}
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		line, _ := bufio.NewReader(conn).ReadString('\n')
		sb.status <- strings.TrimSpace(line)
	}()
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-answered:
				return
			case <-stop:
				_ = conn.Close()
				return
			case <-tick.C:
				if _, err := conn.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	return sb
}

// TestSlowBodiesHoldNoSlots is the slot-hoarding attack of outside
// testing: one node certificate trickles 25 bodies of 70,000 bytes (over
// the 64 KiB the server used to read before admission) and 12 of 60,000
// bytes (under it), one byte at a time, while a second node and an
// operator go on working. The bodies are read before a request waits for
// a slot, within the body timeout, and one caller has at most PerCaller
// requests in progress: so the slow node holds no slot, its requests over
// its own share are answered 429 and the ones it trickles 408 when their
// time is up, while every request of the others is served. Their
// latencies are logged; what is asserted is that none of them was
// refused or waited out the admission's Wait (the failure mode, 503 after
// a second), not a timing.
func TestSlowBodiesHoldNoSlots(t *testing.T) {
	e := newEnv(t, nil)
	adm := DefaultAdmission(8)
	adm.BodyTimeout = 3 * time.Second
	srv := newAuthServer(t, e, Options{Admission: adm, RateLimits: DefaultRateLimits})
	opCert, opKey, _ := srv.ca.IssueClient("platform-team", time.Hour)
	aCert, aKey, _ := srv.ca.IssueNode("node-a", time.Hour)
	bCert, bKey, _ := srv.ca.IssueNode("node-b", time.Hour)
	op, nodeB := srv.client(opCert, opKey), srv.client(bCert, bKey)
	do := func(c *http.Client, method, path, body string) (int, time.Duration) {
		t.Helper()
		req := jsonRequest(t, method, srv.url+path, bodyOf(body))
		began := time.Now()
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		return res.StatusCode, time.Since(began)
	}
	if s, _ := do(op, "POST", "/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`); s != 201 {
		t.Fatalf("creating the pool: %d", s)
	}

	// The attack: 25 bodies over the old read-ahead size, 12 under it.
	stop := make(chan struct{})
	defer close(stop)
	aCfg := srv.tlsConfig(aCert, aKey)
	var slow []*slowBody
	for i := range 37 {
		size := 70_000
		if i >= 25 {
			size = 60_000
		}
		slow = append(slow, trickle(t, srv.addr, aCfg, "node-a", size, 50*time.Millisecond, stop))
	}

	// The others, meanwhile: node-b leases and releases, the operator
	// lists, for as long as the slow bodies are in progress, each at a
	// pace its rate limit allows (a node's 50 requests a second, a
	// client's 100).
	var (
		mu        sync.Mutex
		latencies []time.Duration
		refused   []string
		running   atomic.Bool
		wg        sync.WaitGroup
	)
	running.Store(true)
	record := func(what string, status, want int, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		latencies = append(latencies, d)
		if status != want && len(refused) < 10 {
			refused = append(refused, fmt.Sprintf("%s: %d after %v", what, status, d))
		}
	}
	paced := func(every time.Duration, f func(i int)) {
		wg.Go(func() {
			tick := time.NewTicker(every)
			defer tick.Stop()
			for i := 0; running.Load(); i++ {
				f(i)
				<-tick.C
			}
		})
	}
	paced(50*time.Millisecond, func(i int) {
		cid := fmt.Sprintf("b%d", i)
		s, d := do(nodeB, "POST", "/v1/nodes/node-b/leases", `{"owner":{"namespace":"ns","name":"p-`+cid+`"},"containerID":"`+cid+`","interface":"eth0"}`)
		record("node-b lease "+cid, s, 201, d)
		s, d = do(nodeB, "DELETE", "/v1/nodes/node-b/attachments/"+cid+"/eth0", "")
		record("node-b release "+cid, s, 204, d)
	})
	paced(20*time.Millisecond, func(int) {
		s, d := do(op, "GET", "/v1/pools", "")
		record("operator list", s, 200, d)
	})

	// Every slow body is answered: 429 for those beyond node-a's share,
	// at once, and 408 for its share when the body timeout runs out.
	answers := map[string]int{}
	for _, sb := range slow {
		select {
		case st := <-sb.status:
			answers[st]++
		case <-time.After(30 * time.Second):
			t.Fatalf("a slow body of %d bytes got no answer in 30 s", sb.size)
		}
	}
	running.Store(false)
	wg.Wait()

	if want := map[string]int{"HTTP/1.1 408 Request Timeout": adm.PerCaller, "HTTP/1.1 429 Too Many Requests": len(slow) - adm.PerCaller}; !maps.Equal(answers, want) {
		t.Errorf("the slow bodies were answered %v, want %v", answers, want)
	}
	if len(refused) > 0 {
		t.Errorf("requests of the other callers were not served (the first 10): %v", refused)
	}
	slices.Sort(latencies)
	if len(latencies) < 20 {
		t.Fatalf("the other callers made only %d requests", len(latencies))
	}
	p := func(q float64) time.Duration { return latencies[int(q*float64(len(latencies)-1))] }
	t.Logf("other callers during the attack: %d requests, p50 %v, p99 %v, max %v",
		len(latencies), p(0.5), p(0.99), latencies[len(latencies)-1])
	if p(0.99) >= adm.Wait {
		t.Errorf("the other callers' p99 is %v: they waited for admission as long as it lets them", p(0.99))
	}

	// Node-a's turns are all given back: it is served again.
	if s, _ := do(srv.client(aCert, aKey), "POST", "/v1/nodes/node-a/leases", `{"owner":{"namespace":"ns","name":"after"},"containerID":"after","interface":"eth0"}`); s != 201 {
		t.Errorf("node-a after the attack: %d", s)
	}
}

// A caller's turns: a caller with PerCaller requests in progress waits
// for one of them (and is refused 429 when the Wait runs out), another
// caller is not held back, and a turn given back is taken by a waiting
// request; with nothing in progress, no caller is tracked.
func TestPerCallerTurns(t *testing.T) {
	a, err := newAdmitter(Admission{PerCaller: 2, Wait: 500 * time.Millisecond}, problems{}, noop.Meter{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	d1, err1 := a.takeTurn(ctx, "node:a")
	d2, err2 := a.takeTurn(ctx, "node:a")
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if _, err := a.takeTurn(ctx, "node:a"); !alloc.IsKind(err, kindRateLimited) {
		t.Errorf("a third turn of node:a: %v, want rate-limited", err)
	}
	d3, err := a.takeTurn(ctx, "node:b") // another caller is not held back
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		d, err := a.takeTurn(ctx, "node:a")
		if err == nil {
			d()
		}
		got <- err
	}()
	d1() // the third request of node:a takes this turn
	if err := <-got; err != nil {
		t.Errorf("a turn given back was not taken by the waiting request: %v", err)
	}
	d2()
	d3()
	if n := a.callersTracked(); n != 0 {
		t.Errorf("%d callers still tracked with nothing in progress", n)
	}
}
