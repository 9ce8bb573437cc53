// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"sigs.k8s.io/yaml"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// The pools table lists each pool with its CIDRs and counts; -o json is
// the API's list, every page of it; -o yaml the same object.
func TestPools(t *testing.T) {
	s := newService(t, true)
	s.seed(t)
	ctx := context.Background()

	out := s.ok(t, "pools")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME ") {
		t.Fatalf("pools table:\n%s", out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`^default\s+multi-pool\s+10\.244\.0\.0/16 /24\s+fd00:10:244::/104 /120\s+2/256 2/65,536\s+2 2\s+1 1\s+501 501\s+`),
		regexp.MustCompile(`^small\s+multi-pool\s+10\.250\.0\.0/24 /28\s+-\s+0/16\s+0\s+0\s+0\s+`),
	} {
		if !slices.ContainsFunc(lines[1:], want.MatchString) {
			t.Errorf("no row matches %s in\n%s", want, out)
		}
	}

	res, err := s.api.ListPoolsWithResponse(ctx, nil)
	must(t, res.HTTPResponse, res.Body, err)
	// Pages of one pool: ipamctl follows continue to the end.
	s.requestsTo("")
	got := decode[ipamclient.PoolList](t, s.ok(t, "pools", "-o", "json", "--page-size", "1"))
	sameJSON(t, "pools -o json", got, res.JSON200)
	// The API may answer a continue token with the last item; the page
	// after it is empty.
	if reqs := s.requestsTo("/v1/pools?"); len(reqs) < 2 || !strings.Contains(reqs[1], "continue=") {
		t.Errorf("requests for 2 pools in pages of 1: %v", reqs)
	}

	y := s.ok(t, "pools", "-o", "yaml")
	if !strings.Contains(y, "items:\n- createdAt:") || !strings.Contains(y, "name: default") {
		t.Errorf("pools -o yaml:\n%s", y)
	}
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "pools -o yaml", decode[ipamclient.PoolList](t, string(j)), res.JSON200)
}

// pool capacity draws a bar per family and a map of every pool CIDR: one
// character per block slot when the CIDR fits, aggregated when not; -o
// json holds the three API answers it is drawn from.
func TestPoolCapacity(t *testing.T) {
	s := newService(t, false)
	s.seed(t)
	ctx := context.Background()
	// A third node with a block far into the pool, and a reserved range,
	// so that the map has a gap and an x.
	res, err := s.api.CarveBlockWithResponse(ctx, "worker-2", nil, ipamclient.CarveRequest{Pool: "small", Family: ipamclient.Ipv4})
	must(t, res.HTTPResponse, res.Body, err)

	out := s.ok(t, "pool", "capacity", "default")
	t.Logf("pool capacity default:\n%s", out)
	for _, want := range []string{
		"pool default (space default), forecast over 1h",
		"ipv4  10.244.0.0/16, blocks of /24",
		"  blocks     [#...............................] 2 of 256 carved (0.8%), 254 free to carve; largest free prefix 10.244.128.0/17",
		"  addresses  [#...............................] 2 leased, 1 cooling, 501 free of 504 in blocks (64,512 possible)",
		"  nodes      2 with blocks, 0 at capacity, 0 in deficit",
		"ipv6  fd00:10:244::/104, blocks of /120",
		"  10.244.0.0/16: 256 blocks of /24, one character each",
		"    10.244.0.0      ##.............. ................",
		"    10.244.32.0     ................ ................",
		"  fd00:10:244::/104: 65,536 blocks of /120, 256 per character",
		"    fd00:10:244::         +............... ................",
		"    fd00:10:244::e0:0     ................ ................",
		mapLegend,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("no line %q", want)
		}
	}
	// 256 slots in rows of 32: eight rows for the IPv4 CIDR.
	if n := strings.Count(out, "\n    10.244."); n != 8 {
		t.Errorf("%d map rows for 10.244.0.0/16, want 8", n)
	}

	pc := decode[poolCapacity](t, s.ok(t, "pool", "capacity", "default", "-o", "json", "--page-size", "1"))
	pres, err := s.api.GetPoolWithResponse(ctx, "default", nil)
	must(t, pres.HTTPResponse, pres.Body, err)
	cres, err := s.api.GetPoolCapacityWithResponse(ctx, "default", nil)
	must(t, cres.HTTPResponse, cres.Body, err)
	bres, err := s.api.ListPoolBlocksWithResponse(ctx, "default", nil)
	must(t, bres.HTTPResponse, bres.Body, err)
	sameJSON(t, "pool capacity -o json: pool", pc.Pool, pres.JSON200)
	sameJSON(t, "pool capacity -o json: capacity", pc.Capacity, cres.JSON200)
	sameJSON(t, "pool capacity -o json: blocks", pc.Blocks, bres.JSON200.Items)
	if len(pc.Blocks) != 4 {
		t.Errorf("%d blocks, want 2 per family", len(pc.Blocks))
	}

	// A narrow terminal: shorter rows, the same slots; the reserved range
	// is the last two.
	r := ctlEnv(t, s.env(t, map[string]string{"COLUMNS": "30"}), "pool", "capacity", "small")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "  10.250.0.0/24: 16 blocks of /28, one character each\n    10.250.0.0    #.......\n    10.250.0.128  ......xx\n") {
		t.Errorf("pool capacity small at 30 columns:\n%s", r.stdout)
	}

	r = s.ctl(t, "pool", "capacity", "nope")
	if r.code != 1 || !strings.Contains(r.stderr, "Not found") {
		t.Errorf("unknown pool: exit %d, stderr %q", r.code, r.stderr)
	}
}

// nodes lists the nodes; node NAME shows one with its blocks and its
// demand per pool, and its JSON is the three API answers.
func TestNodes(t *testing.T) {
	s := newService(t, true)
	s.seed(t)
	ctx := context.Background()

	out := s.ok(t, "nodes")
	if !regexp.MustCompile(`(?m)^worker-1\s+2\s+2\s+192\.168\.10\.1\s+\S+$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^worker-2\s+2\s+2\s+192\.168\.10\.2\s+\S+$`).MatchString(out) {
		t.Errorf("nodes table:\n%s", out)
	}
	nres, err := s.api.ListNodesWithResponse(ctx, nil)
	must(t, nres.HTTPResponse, nres.Body, err)
	sameJSON(t, "nodes -o json", decode[ipamclient.NodeList](t, s.ok(t, "nodes", "-o", "json")), nres.JSON200)

	out = s.ok(t, "node", "worker-1")
	t.Logf("node worker-1:\n%s", out)
	for _, re := range []string{
		`(?m)^Name:\s+worker-1$`,
		`(?m)^Labels:\s+topology\.kubernetes\.io/zone=zone-a$`,
		`(?m)^Addresses:\s+InternalIP 192\.168\.10\.1$`,
		`(?m)^POOL\s+FAMILY\s+CIDR\s+GATEWAY\s+LEASED\s+COOLING\s+CAPACITY\s+SOURCE\s+AGE$`,
		`(?m)^default\s+ipv4\s+10\.244\.0\.0/24\s+10\.244\.0\.1\s+1\s+1\s+`,
		`(?m)^default\s+ipv6\s+fd00:10:244::/120\s+`,
		`(?m)^Demand per pool \(default pool default\):$`,
		`(?m)^default\s+ipv4\s+multi-pool\s+1\s+\d+\s+1\s+1\s+8\s+`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("node worker-1: no match for %s", re)
		}
	}
	v := decode[nodeView](t, s.ok(t, "node", "worker-1", "-o", "json"))
	gres, err := s.api.GetNodeWithResponse(ctx, "worker-1", nil)
	must(t, gres.HTTPResponse, gres.Body, err)
	bres, err := s.api.ListBlocksWithResponse(ctx, "worker-1", nil)
	must(t, bres.HTTPResponse, bres.Body, err)
	ures, err := s.api.GetNodeUsageWithResponse(ctx, "worker-1", nil)
	must(t, ures.HTTPResponse, ures.Body, err)
	sameJSON(t, "node -o json: node", v.Node, gres.JSON200)
	sameJSON(t, "node -o json: blocks", v.Blocks, bres.JSON200.Items)
	sameJSON(t, "node -o json: pools", v.Pools, ures.JSON200)

	// --space where the API has one: a space without the node.
	r := s.ctl(t, "node", "worker-1", "--space", "nope")
	if r.code != 1 || !strings.Contains(r.stderr, "(field space)") {
		t.Errorf("node in an unknown space: exit %d, stderr %q", r.code, r.stderr)
	}
}

// leases filters as GET /v1/leases does, and its JSON is the API's list.
func TestLeases(t *testing.T) {
	s := newService(t, true)
	sd := s.seed(t)
	ctx := context.Background()

	addrs := func(args ...string) []string {
		t.Helper()
		l := decode[ipamclient.LeaseList](t, s.ok(t, append([]string{"leases", "-o", "json"}, args...)...))
		var a []string
		for _, it := range l.Items {
			if it.Family == ipamclient.Ipv4 {
				a = append(a, it.Address+" "+string(it.State))
			}
		}
		return a
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{nil, []string{sd.web0 + " active", sd.web1 + " cooling", sd.pg0 + " pending"}},
		{[]string{"--node", "worker-2"}, []string{sd.pg0 + " pending"}},
		{[]string{"--owner", "shop/web-0"}, []string{sd.web0 + " active"}},
		{[]string{"--namespace", "shop"}, []string{sd.web0 + " active", sd.web1 + " cooling"}},
		{[]string{"--state", "pending"}, []string{sd.pg0 + " pending"}},
		{[]string{"--pool", "small"}, nil},
	} {
		got := addrs(c.args...)
		slices.Sort(got)
		slices.Sort(c.want)
		if !slices.Equal(got, c.want) {
			t.Errorf("leases %v: %v, want %v", c.args, got, c.want)
		}
	}

	res, err := s.api.ListLeasesWithResponse(ctx, nil)
	must(t, res.HTTPResponse, res.Body, err)
	sameJSON(t, "leases -o json", decode[ipamclient.LeaseList](t, s.ok(t, "leases", "-o", "json", "--page-size", "2")), res.JSON200)

	out := s.ok(t, "leases", "--node", "worker-1")
	if !regexp.MustCompile(`(?m)^ADDRESS\s+STATE\s+NODE\s+POOL\s+OWNER\s+CONTAINER\s+INTERFACE\s+NETWORK\s+GENERATION\s+AGE$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(sd.web0)+`\s+active\s+worker-1\s+default\s+shop/web-0\s+c-web-0\s+eth0\s+-\s+\d+\s+\S+$`).MatchString(out) {
		t.Errorf("leases table:\n%s", out)
	}

	r := s.ctl(t, "leases", "--owner", "web-0")
	if r.code != 2 || !strings.Contains(r.stderr, "--owner") {
		t.Errorf("leases --owner web-0: exit %d, stderr %q", r.code, r.stderr)
	}
	r = s.ctl(t, "leases", "--state", "gone")
	if r.code != 1 || !strings.Contains(r.stderr, "(field state)") {
		t.Errorf("leases --state gone: exit %d, stderr %q", r.code, r.stderr)
	}
}

// who answers the lease holding an address; with --at, who held it then,
// also an address released since; bad input is the service's problem,
// naming the field.
func TestWho(t *testing.T) {
	s := newService(t, true)
	sd := s.seed(t)
	ctx := context.Background()

	out := s.ok(t, "who", sd.web0)
	for _, re := range []string{`(?m)^Address:\s+` + regexp.QuoteMeta(sd.web0) + `$`, `(?m)^State:\s+active$`,
		`(?m)^Owner:\s+shop/web-0$`, `(?m)^Node:\s+worker-1$`, `(?m)^Attachment:\s+c-web-0 eth0$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("who %s: no match for %s in\n%s", sd.web0, re, out)
		}
	}
	res, err := s.api.GetAddressWithResponse(ctx, ip(sd.web0), nil)
	must(t, res.HTTPResponse, res.Body, err)
	sameJSON(t, "who -o json", decode[ipamclient.Lease](t, s.ok(t, "who", sd.web0, "-o", "json")), res.JSON200)

	// shop/web-1 held its address for a minute and released it.
	at := sd.leasedWeb1.Add(30 * time.Second).Format(time.RFC3339)
	out = s.ok(t, "who", sd.web1, "--at", at)
	t.Logf("who %s --at %s:\n%s", sd.web1, at, out)
	for _, re := range []string{`(?m)^Owner:\s+shop/web-1$`, `(?m)^Node:\s+worker-1$`,
		`(?m)^From:\s+` + regexp.QuoteMeta(sd.leasedWeb1.Format(timestampLayout)) + `$`,
		`(?m)^To:\s+` + regexp.QuoteMeta(sd.released.Format(timestampLayout)) + `$`,
		`(?m)^\S+\s+lease\s+` + regexp.QuoteMeta(ip(sd.web1)) + `\s+`, `(?m)^\S+\s+release\s+` + regexp.QuoteMeta(ip(sd.web1)) + `\s+`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("who --at: no match for %s", re)
		}
	}
	hres, err := s.api.GetAddressHistoryWithResponse(ctx, ip(sd.web1), &ipamclient.GetAddressHistoryParams{At: &at})
	must(t, hres.HTTPResponse, hres.Body, err)
	sameJSON(t, "who --at -o json", decode[ipamclient.AddressHistory](t, s.ok(t, "who", sd.web1, "--at", at, "-o", "json")), hres.JSON200)
	// After the release nobody held it.
	after := sd.released.Add(time.Second).Format(time.RFC3339)
	if out := s.ok(t, "who", sd.web1, "--at", after); out != "nobody held "+ip(sd.web1)+" at "+after+"\n" {
		t.Errorf("who --at after the release: %q", out)
	}

	for _, c := range []struct {
		args  []string
		field string
	}{
		{[]string{"who", "not-an-ip"}, "address"},
		{[]string{"who", sd.web0, "--at", "noon"}, "at"},
		{[]string{"history", "not-an-ip"}, "address"},
	} {
		r := s.ctl(t, c.args...)
		if r.code != 1 || r.stdout != "" || !strings.HasPrefix(r.stderr, "ipamctl: Invalid input: ") || !strings.HasSuffix(r.stderr, "(field "+c.field+")\n") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 1 and the problem naming %s", c.args, r.code, r.stdout, r.stderr, c.field)
		}
	}
	r := s.ctl(t, "who", "10.244.200.1")
	if r.code != 1 || !strings.Contains(r.stderr, "Not found") {
		t.Errorf("who of a free address: exit %d, stderr %q", r.code, r.stderr)
	}
}

// history follows continue across pages to the end, for an owner, a node
// and an address, oldest first; its JSON is every event the API has.
func TestHistoryPages(t *testing.T) {
	s := newService(t, false)
	sd := s.seed(t)
	ctx := context.Background()
	// Four more lease and release pairs of shop/web-0 on worker-2.
	for i := range 4 {
		s.clock.Advance(time.Minute)
		s.lease(t, "worker-2", fmt.Sprintf("c-%d", i), "shop/web-0")
		s.clock.Advance(time.Minute)
		s.release(t, "worker-2", fmt.Sprintf("c-%d", i))
	}
	limit := 1000
	owner := "shop/web-0"
	res, err := s.api.ListHistoryWithResponse(ctx, &ipamclient.ListHistoryParams{Owner: &owner, Limit: &limit})
	must(t, res.HTTPResponse, res.Body, err)
	want := res.JSON200
	if len(want.Items) < 10 {
		t.Fatalf("%d events of %s; the test wants several pages", len(want.Items), owner)
	}
	s.requestsTo("")

	got := decode[ipamclient.EventList](t, s.ok(t, "history", "--owner", owner, "--page-size", "3", "-o", "json"))
	sameJSON(t, "history --owner -o json", got, want)
	pages := s.requestsTo("/v1/history?")
	if n := (len(want.Items) + 2) / 3; len(pages) < n || len(pages) > n+1 {
		t.Errorf("%d requests for %d events in pages of 3, want %d or one more: %v", len(pages), len(want.Items), n, pages)
	}
	if len(pages) > 1 && !strings.Contains(pages[1], "continue=") {
		t.Errorf("second page without continue: %s", pages[1])
	}

	// The table: a header and one row per event, oldest first.
	out := s.ok(t, "history", "--owner", owner, "--page-size", "2")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(want.Items)+1 || !strings.HasPrefix(lines[0], "TIME ") {
		t.Errorf("history table of %d lines for %d events:\n%s", len(lines), len(want.Items), out)
	}
	for i, e := range want.Items {
		if i+1 < len(lines) && !strings.HasPrefix(lines[i+1], timestamp(&e.At)+" ") {
			t.Errorf("row %d: %q, want the event at %s", i+1, lines[i+1], timestamp(&e.At))
		}
	}

	// A node's history and an address's, with --from.
	nres, err := s.api.ListHistoryWithResponse(ctx, &ipamclient.ListHistoryParams{Node: ptr("worker-1"), Limit: &limit})
	must(t, nres.HTTPResponse, nres.Body, err)
	sameJSON(t, "history --node", decode[ipamclient.EventList](t, s.ok(t, "history", "--node", "worker-1", "--page-size", "1", "-o", "json")), nres.JSON200)
	from := sd.released.Format(time.RFC3339)
	ares, err := s.api.GetAddressHistoryWithResponse(ctx, ip(sd.web1), &ipamclient.GetAddressHistoryParams{From: &from})
	must(t, ares.HTTPResponse, ares.Body, err)
	ah := decode[ipamclient.EventList](t, s.ok(t, "history", sd.web1, "--from", from, "-o", "json"))
	sameJSON(t, "history ADDRESS --from", ah.Items, ares.JSON200.Items)
	if len(ah.Items) == 0 || ah.Items[0].Kind != "release" {
		t.Errorf("history of %s from its release: %+v", sd.web1, ah.Items)
	}

	for _, args := range [][]string{
		{"history"},
		{"history", sd.web1, "--owner", owner},
		{"history", "--owner", owner, "--node", "worker-1"},
		{"history", "--owner", owner, "--from", "-5m"},
	} {
		if r := s.ctl(t, args...); r.code != 2 || !strings.Contains(r.stderr, "ipamctl: history") && !strings.Contains(r.stderr, "--from") {
			t.Errorf("%v: exit %d, stderr %q; want a usage error", args, r.code, r.stderr)
		}
	}
}

// Progress goes to stderr on a terminal only: paging through history
// shows how far it got, then erases its line; without a terminal (every
// other test, and a pipe) stderr stays empty.
func TestProgressOnlyOnTerminal(t *testing.T) {
	s := newService(t, false)
	s.seed(t)
	env := s.env(t, nil)
	runTTY := func(tty bool, args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		a := newApp(context.Background(), &out, &errb, func(k string) string { return env[k] })
		a.isTerminal = func(io.Writer) bool { return tty }
		a.progressDelay = 0
		code := a.main(args) // before reading the buffers
		return out.String(), errb.String(), code
	}
	_, _, _ = runTTY(false, "pools") // warm
	out, stderr, code := runTTY(true, "history", "--node", "worker-1", "--page-size", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stderr, clearLine+"events of worker-1: 1 so far, fetching page 2…") ||
		!strings.Contains(stderr, clearLine+"events of worker-1: 2 so far, fetching page 3…") || !strings.HasSuffix(stderr, clearLine) {
		t.Errorf("progress on a terminal: %q", stderr)
	}
	if strings.Contains(out, "\r") {
		t.Errorf("progress on stdout: %q", out)
	}
	_, stderr, code = runTTY(true, "check")
	if code != 0 || !strings.HasPrefix(stderr, clearLine+"checking consistency…") || !strings.HasSuffix(stderr, clearLine) {
		t.Errorf("check on a terminal: exit %d, stderr %q", code, stderr)
	}

	for _, args := range [][]string{{"history", "--node", "worker-1", "--page-size", "1"}, {"check"}, {"pool", "capacity", "default", "--page-size", "1"}} {
		_, stderr, code := runTTY(false, args...)
		if code != 0 || stderr != "" {
			t.Errorf("%v without a terminal: exit %d, stderr %q", args, code, stderr)
		}
	}
}

// check prints the verdict and the counts, and each finding with exit 1
// when the database breaks an invariant.
func TestCheck(t *testing.T) {
	s := newService(t, true)
	s.seed(t)
	ctx := context.Background()

	out := s.ok(t, "check")
	if !regexp.MustCompile(`^consistent: 1 space, 2 pools, 3 pool CIDRs, 2 nodes, 4 blocks, 6 leases checked at \S+ in \d+\.\d\ds\n$`).MatchString(out) {
		t.Errorf("check:\n%s", out)
	}
	res, err := s.api.CheckConsistencyWithResponse(ctx)
	must(t, res.HTTPResponse, res.Body, err)
	r := decode[ipamclient.ConsistencyReport](t, s.ok(t, "check", "-o", "json"))
	if !r.Consistent || r.Counts != res.JSON200.Counts {
		t.Errorf("check -o json: %+v, the API: %+v", r, res.JSON200)
	}

	// A block counter that disagrees with its lease rows.
	conn, err := pgx.Connect(ctx, s.db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tag, err := conn.Exec(ctx, "UPDATE blocks SET allocated = allocated + 5 WHERE cidr = '10.244.0.0/24'")
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("break a counter: %v, %v", tag, err)
	}
	rr := s.ctl(t, "check")
	t.Logf("check of a broken database:\n%s%s", rr.stdout, rr.stderr)
	if rr.code != 1 || !strings.HasPrefix(rr.stdout, "INCONSISTENT, 1 finding: ") || !strings.Contains(rr.stdout, "10.244.0.0/24") ||
		!strings.Contains(rr.stderr, "ipamctl: consistency check: ") {
		t.Errorf("check of a broken database: exit %d\n%s%s", rr.code, rr.stdout, rr.stderr)
	}
	rr = s.ctl(t, "check", "-o", "json")
	if r := decode[ipamclient.ConsistencyReport](t, rr.stdout); rr.code != 1 || r.Consistent || len(r.Findings) == 0 {
		t.Errorf("check -o json of a broken database: exit %d, %+v", rr.code, r)
	}
}

// tokens create, list and revoke over TLS with an admin token; the new
// token works until revoked, and a viewer may not manage tokens.
func TestTokens(t *testing.T) {
	s := newService(t, true)

	out := s.ok(t, "tokens", "create", "ci", "--role", "viewer", "--expires-in", "24h")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	secret := lines[len(lines)-1]
	if !strings.HasPrefix(out, "token ci created (role viewer, expires ") || !strings.HasPrefix(secret, "ipam_") {
		t.Fatalf("tokens create:\n%s", out)
	}
	created := decode[ipamclient.TokenCreated](t, s.ok(t, "tokens", "create", "ci-json", "--role", "operator", "-o", "json"))
	if created.Name != "ci-json" || created.Role != "operator" || !strings.HasPrefix(created.Secret, "ipam_") {
		t.Errorf("tokens create -o json: %+v", created)
	}

	out = s.ok(t, "tokens")
	for _, re := range []string{`(?m)^NAME\s+ROLE\s+STATE\s+CREATED-BY\s+EXPIRES\s+LAST-USED\s+AGE$`, `(?m)^admin\s+admin\s+`,
		`(?m)^ci\s+viewer\s+active\s+token:admin\s+`, `(?m)^ci-json\s+operator\s+`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("tokens: no match for %s in\n%s", re, out)
		}
	}
	if strings.Contains(out, "ipam_") {
		t.Errorf("tokens list shows a secret:\n%s", out)
	}
	lres, err := s.api.ListTokensWithResponse(context.Background(), nil)
	must(t, lres.HTTPResponse, lres.Body, err)
	sameJSON(t, "tokens list -o json", decode[ipamclient.TokenList](t, s.ok(t, "tokens", "list", "-o", "json")), lres.JSON200)

	// The viewer token reads, and may not manage tokens.
	viewer := s.env(t, map[string]string{"IPAM_TOKEN": secret})
	if r := ctlEnv(t, viewer, "pools"); r.code != 0 {
		t.Errorf("pools as the viewer: exit %d, %s", r.code, r.stderr)
	}
	if r := ctlEnv(t, viewer, "tokens", "revoke", "admin"); r.code != 1 || !strings.Contains(r.stderr, "Forbidden") {
		t.Errorf("tokens revoke as a viewer: exit %d, %q", r.code, r.stderr)
	}

	if out := s.ok(t, "tokens", "revoke", "ci"); out != "token ci revoked\n" {
		t.Errorf("tokens revoke: %q", out)
	}
	if r := ctlEnv(t, viewer, "pools"); r.code != 1 || !strings.Contains(r.stderr, "ipamctl: Unauthenticated") {
		t.Errorf("pools with a revoked token: exit %d, %q", r.code, r.stderr)
	}
	if out := s.ok(t, "tokens"); regexp.MustCompile(`(?m)^ci\s`).MatchString(out) {
		t.Errorf("a revoked token is listed:\n%s", out)
	}

	// Problems of the service name the field; missing flags are usage.
	if r := s.ctl(t, "tokens", "create", "ci-json", "--role", "viewer"); r.code != 1 || !strings.Contains(r.stderr, "(field name)") {
		t.Errorf("a second live token of a name: exit %d, %q", r.code, r.stderr)
	}
	if r := s.ctl(t, "tokens", "create", "x", "--role", "root"); r.code != 1 || !strings.Contains(r.stderr, "(field role)") {
		t.Errorf("role root: exit %d, %q", r.code, r.stderr)
	}
	if r := s.ctl(t, "tokens", "create", "x"); r.code != 2 || !strings.Contains(r.stderr, "--role") {
		t.Errorf("no --role: exit %d, %q", r.code, r.stderr)
	}
	// Without credentials over TLS: the service's 401.
	if r := ctlEnv(t, s.env(t, map[string]string{"IPAM_TOKEN": ""}), "pools"); r.code != 1 || !strings.Contains(r.stderr, "Unauthenticated") {
		t.Errorf("no token: exit %d, %q", r.code, r.stderr)
	}
	// Without the CA the server's certificate does not verify.
	if r := ctlEnv(t, s.env(t, map[string]string{"IPAM_CA_FILE": ""}), "pools"); r.code != 1 || !strings.Contains(r.stderr, "certificate") {
		t.Errorf("no CA: exit %d, %q", r.code, r.stderr)
	}
}

func ptr[T any](v T) *T { return &v }
