// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

//go:build linux

package faulttest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ipam-dev/ipam/internal/pgtest"
)

// serverBin is the ipam-server binary TestMain builds.
var serverBin string

func TestMain(m *testing.M) {
	bin, err := buildServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "faulttest: building ipam-server:", err)
		os.Exit(1)
	}
	serverBin = bin
	pgtest.Main(m, pgtest.Migrate)
}

// buildServer builds cmd/server next to the test binary: under go test that
// is the go command's work directory, removed when the run ends.
func buildServer() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	goTool, err := exec.LookPath("go") // go test puts its own GOROOT/bin first in PATH
	if err != nil {
		return "", err
	}
	out := filepath.Join(filepath.Dir(exe), "ipam-server")
	cmd := exec.Command(goTool, "build", "-o", out, "github.com/ipam-dev/ipam/cmd/server")
	cmd.Stderr = os.Stderr
	return out, cmd.Run()
}

// replica is one ipam-server process.
type replica struct {
	name string
	url  string
	cmd  *exec.Cmd
	log  *lockedBuffer // its stderr (JSON logs)
	done chan struct{} // closed when the process has exited
}

// startReplica runs the server binary against dbURL on a free loopback
// port, plain HTTP, and returns once it serves. It is stopped (SIGTERM,
// then SIGKILL) at cleanup; its log is shown when the test fails.
func startReplica(t *testing.T, name, dbURL string, extra ...string) *replica {
	t.Helper()
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--database-url", dbURL,
		// Plain HTTP on loopback as the anonymous admin, unthrottled: the
		// clients here stand for many nodes at once.
		"--insecure-http", "--dev-no-auth", "--client-rate-limit", "0", "--anonymous-rate-limit", "0",
		"--log-level", "warn"}, extra...)
	cmd := exec.Command(serverBin, args...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "IPAM_") })
	// The kernel ends the server if the test binary dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{name: name, cmd: cmd, log: &lockedBuffer{}, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			r.log.Write(append(line, '\n'))
			var entry struct{ Msg, Addr string }
			if json.Unmarshal(line, &entry) == nil && entry.Addr != "" && strings.HasPrefix(entry.Msg, "serving") {
				select {
				case addr <- entry.Addr:
				default:
				}
			}
		}
		_ = cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		r.stop()
		if t.Failed() {
			t.Logf("log of replica %s:\n%s", r.name, r.log)
		}
	})
	select {
	case a := <-addr:
		r.url = "http://" + a
		return r
	case <-r.done:
		t.Fatalf("replica %s exited at start: %s", name, r.log)
	case <-time.After(60 * time.Second):
		t.Fatalf("replica %s did not serve within 60s: %s", name, r.log)
	}
	return nil
}

// kill ends the replica with SIGKILL, as a node failure or the OOM killer
// would: no draining, in-flight requests get no answer.
func (r *replica) kill() {
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
}

func (r *replica) stop() {
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		r.kill()
	}
}

// lockedBuffer is a bytes.Buffer for several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// answer is a response a client got.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// client calls the service as a CNI plugin with a list of replicas would:
// a request that gets no answer (connection refused or reset, timeout) or
// a 503 is sent again, to the next replica, until ctx ends. Retries are
// safe because every call is idempotent by its attachment key.
type client struct {
	hc   *http.Client
	urls []string
	// Counters over all calls.
	noAnswer    atomic.Int64 // attempts that got no HTTP answer
	unavailable atomic.Int64 // 503 answers
	badOutage   atomic.Int64 // 5xx answers that are not a proper 503 problem
	badOutageMu sync.Mutex
	badOutages  []string // the first few of them
}

func newClient(urls ...string) *client {
	return &client{
		hc: &http.Client{
			Transport: &http.Transport{MaxIdleConnsPerHost: 64, MaxConnsPerHost: 0},
			Timeout:   20 * time.Second,
		},
		urls: urls,
	}
}

// call sends the request until it gets an answer other than 503, starting
// at a random replica. It fails only when ctx ends first.
func (c *client) call(ctx context.Context, rng *rand.Rand, method, path string, body any) (answer, error) {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return answer{}, err
		}
	}
	start := rng.IntN(len(c.urls))
	for attempt := 0; ; attempt++ {
		url := c.urls[(start+attempt)%len(c.urls)]
		a, err := c.once(ctx, method, url+path, raw)
		switch {
		case err != nil:
			c.noAnswer.Add(1)
		case a.status == http.StatusServiceUnavailable:
			c.unavailable.Add(1)
			c.checkOutage(method, path, a)
		case a.status >= 500:
			c.checkOutage(method, path, a)
			return a, nil
		default:
			return a, nil
		}
		// Back off a little, more after many attempts, with jitter.
		wait := time.Duration(10+rng.IntN(40)) * time.Millisecond * time.Duration(min(attempt+1, 5))
		select {
		case <-ctx.Done():
			return answer{}, fmt.Errorf("%s %s: no answer after %d attempts: %w (last: %v)", method, path, attempt+1, ctx.Err(), err)
		case <-time.After(wait):
		}
	}
}

func (c *client) once(ctx context.Context, method, url string, body []byte) (answer, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return answer{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return answer{}, err // cut off mid-answer: no answer
	}
	return answer{status: res.StatusCode, header: res.Header, body: b}, nil
}

// checkOutage records a 5xx answer that is not the service's 503: a
// problem+json of type unavailable with Retry-After.
func (c *client) checkOutage(method, path string, a answer) {
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	bad := ""
	switch {
	case a.status != http.StatusServiceUnavailable:
		bad = fmt.Sprintf("status %d", a.status)
	case a.header.Get("Content-Type") != "application/problem+json":
		bad = "Content-Type " + a.header.Get("Content-Type")
	case json.Unmarshal(a.body, &p) != nil || p.Type != "urn:ipam:problem:unavailable" || p.Status != a.status:
		bad = "problem " + string(a.body)
	case a.header.Get("Retry-After") == "":
		bad = "no Retry-After"
	}
	if bad == "" {
		return
	}
	c.badOutage.Add(1)
	c.badOutageMu.Lock()
	defer c.badOutageMu.Unlock()
	if len(c.badOutages) < 10 {
		c.badOutages = append(c.badOutages, fmt.Sprintf("%s %s: %s: %s", method, path, bad, a.body))
	}
}

// checkOutages fails t for every improper outage answer.
func (c *client) checkOutages(t *testing.T) {
	t.Helper()
	c.badOutageMu.Lock()
	defer c.badOutageMu.Unlock()
	for _, s := range c.badOutages {
		t.Errorf("outage answered improperly (want 503 problem+json unavailable with Retry-After): %s", s)
	}
	if n := c.badOutage.Load(); n > int64(len(c.badOutages)) {
		t.Errorf("%d more improper outage answers", n-int64(len(c.badOutages)))
	}
}

// attachment is a lease key: node, container and interface (eth0).
type attachment struct{ node, cid string }

func (a attachment) path() string {
	return "/v1/nodes/" + a.node + "/attachments/" + a.cid + "/eth0"
}

func (a attachment) leaseBody() map[string]any {
	return map[string]any{
		"owner":       map[string]any{"namespace": "fault", "name": a.cid},
		"containerID": a.cid,
		"interface":   "eth0",
	}
}

// holding is what the clients were told about one attachment.
type holding struct {
	addrs     []string // sorted host addresses
	confirmed bool
}

// ledger is what the clients believe: the attachments they hold, with the
// addresses they were given, and those they released. The database must
// agree with it at the end, row for row.
type ledger struct {
	mu       sync.Mutex
	holder   map[string]attachment // address -> attachment, while held
	live     map[attachment]*holding
	released map[attachment]bool
	// ignored are nodes whose leases the ledger does not track (a test
	// checks them itself); only the check for addresses held twice sees
	// them.
	ignored map[string]bool
}

func newLedger(ignoredNodes ...string) *ledger {
	l := &ledger{holder: map[string]attachment{}, live: map[attachment]*holding{}, released: map[attachment]bool{}, ignored: map[string]bool{}}
	for _, n := range ignoredNodes {
		l.ignored[n] = true
	}
	return l
}

// leased records an allocation answer (201, or 200 for a retry). It fails
// when an address is held by another attachment, or when a retry answers
// other addresses than the first answer.
func (l *ledger) leased(a attachment, body []byte) error {
	var alloc struct {
		Addresses []struct {
			Family  string `json:"family"`
			Address string `json:"address"`
		} `json:"addresses"`
	}
	if err := json.Unmarshal(body, &alloc); err != nil {
		return fmt.Errorf("allocation of %v: %v: %s", a, err, body)
	}
	var addrs []string
	families := map[string]bool{}
	for _, x := range alloc.Addresses {
		host, _, _ := strings.Cut(x.Address, "/")
		addrs = append(addrs, host)
		families[x.Family] = true
	}
	slices.Sort(addrs)
	if len(addrs) != 2 || !families["ipv4"] || !families["ipv6"] {
		return fmt.Errorf("allocation of %v is not one IPv4 and one IPv6 address: %s", a, body)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.live[a]; ok {
		if !slices.Equal(h.addrs, addrs) {
			return fmt.Errorf("attachment %v got %v, then %v on a retry", a, h.addrs, addrs)
		}
		return nil
	}
	if l.released[a] {
		return fmt.Errorf("attachment %v got addresses after its release", a)
	}
	for _, ip := range addrs {
		if other, dup := l.holder[ip]; dup {
			return fmt.Errorf("address %s given to %v while %v holds it", ip, a, other)
		}
	}
	for _, ip := range addrs {
		l.holder[ip] = a
	}
	l.live[a] = &holding{addrs: addrs}
	return nil
}

func (l *ledger) confirmed(a attachment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.live[a]; h != nil {
		h.confirmed = true
	}
}

// releasing forgets a's addresses before its release is sent: once the
// release commits, another attachment may get them at once.
func (l *ledger) releasing(a attachment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.live[a]; h != nil {
		for _, ip := range h.addrs {
			delete(l.holder, ip)
		}
	}
	delete(l.live, a)
	l.released[a] = true
}

// verify compares the database with the ledger: every attachment the
// clients hold has exactly its addresses, active when confirmed, pending
// otherwise; a released one holds nothing; nothing else is held; no
// address is held twice. It returns how many addresses it checked.
func (l *ledger) verify(t *testing.T, dbURL string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT n.name, l.container_id, l.interface, host(l.addr), l.state
		FROM leases l JOIN nodes n ON n.id = l.node_id WHERE l.state <> 'released'`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ addr, state string }
	inDB := map[attachment][]row{}
	total := 0
	for rows.Next() {
		var a attachment
		var iface string
		var r row
		if err := rows.Scan(&a.node, &a.cid, &iface, &r.addr, &r.state); err != nil {
			t.Fatal(err)
		}
		if l.ignored[a.node] {
			continue
		}
		if iface != "eth0" {
			t.Errorf("lease of %v on interface %q nobody asked for", a, iface)
		}
		inDB[a] = append(inDB[a], r)
		total++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	checked, want := 0, 0
	for a, h := range l.live {
		want += len(h.addrs)
		got := inDB[a]
		var addrs []string
		for _, r := range got {
			addrs = append(addrs, r.addr)
			wantState := "pending"
			if h.confirmed {
				wantState = "active"
			}
			if r.state != wantState {
				t.Errorf("%v: %s is %s in the database; the client was told it is %s", a, r.addr, r.state, wantState)
			}
		}
		slices.Sort(addrs)
		if !slices.Equal(addrs, h.addrs) {
			t.Errorf("%v: the database holds %v, the client was given %v (lost lease)", a, addrs, h.addrs)
		}
		checked += len(addrs)
	}
	for a, rs := range inDB {
		if _, ok := l.live[a]; ok {
			continue
		}
		if l.released[a] {
			t.Errorf("%v: released, but the database still holds %v (leaked)", a, rs)
		} else {
			t.Errorf("%v: the database holds %v for an attachment no client holds (leaked)", a, rs)
		}
	}
	if total != want {
		t.Errorf("the database holds %d addresses, the clients believe %d", total, want)
	}
	var dups int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM leases GROUP BY space, host(addr) HAVING count(*) > 1) d`).Scan(&dups); err != nil {
		t.Fatal(err)
	}
	if dups != 0 {
		t.Errorf("%d addresses are held twice", dups)
	}
	var badCounts int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM blocks b
		WHERE b.allocated <> (SELECT count(*) FROM leases l WHERE l.block_id = b.id)`).Scan(&badCounts); err != nil {
		t.Fatal(err)
	}
	if badCounts != 0 {
		t.Errorf("%d blocks count their leases wrong", badCounts)
	}
	return checked
}

// createPool makes the dual-stack default pool every test leases from:
// small blocks, so that the runs carve many.
func createPool(t *testing.T, c *client) {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	a, err := c.call(t.Context(), rng, "POST", "/v1/pools", map[string]any{
		"name": "default",
		"spec": map[string]any{
			"ipv4": map[string]any{"cidrs": []string{"10.0.0.0/16"}, "maskSize": 26},
			"ipv6": map[string]any{"cidrs": []string{"fd00:10::/104"}, "maskSize": 120},
		},
	})
	if err != nil || a.status != http.StatusCreated {
		t.Fatalf("create pool: %v %d %s", err, a.status, a.body)
	}
}

// errs collects the first errors of many goroutines.
type errs struct {
	mu   sync.Mutex
	list []error
	n    int
}

func (e *errs) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if len(e.list) < 10 {
		e.list = append(e.list, err)
	}
}

func (e *errs) report(t *testing.T) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, err := range e.list {
		t.Error(err)
	}
	if e.n > len(e.list) {
		t.Errorf("and %d more errors", e.n-len(e.list))
	}
}

// expect checks a final answer's status.
func expect(a answer, err error, what string, statuses ...int) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if !slices.Contains(statuses, a.status) {
		return fmt.Errorf("%s: status %d, want %v: %s", what, a.status, statuses, a.body)
	}
	return nil
}

// failed reports whether any error was added.
func (e *errs) failed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n > 0
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// figure logs a measured figure of a fault test and, when
// $IPAM_TEST_FIGURES names a file (make test sets it and prints the file
// at the end), appends it there too: go test shows a passing test's log
// only with -v, and the failover's figures are what a run is for.
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	name := os.Getenv("IPAM_TEST_FIGURES")
	if name == "" {
		return
	}
	f, err := os.OpenFile(name, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("IPAM_TEST_FIGURES: %v", err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%s: %s\n", t.Name(), line); err != nil {
		t.Errorf("IPAM_TEST_FIGURES: %v", err)
	}
}

// postgresCredential is the OS user the test's PostgreSQL servers run as:
// nil (this process's user) unless the test runs as root, which initdb and
// postgres refuse; then the postgres user the Debian package creates.
func postgresCredential(t *testing.T) *syscall.Credential {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatal(err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
}
