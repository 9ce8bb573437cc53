// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/testclock"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Migrate)
}

// ScreenshotsEnv names the directory the browser test saves its
// screenshots in (PNG); unset, a temporary directory of the test.
const ScreenshotsEnv = "IPAM_UI_SCREENSHOTS"

// ChromiumEnv names a Chromium binary to use instead of the one on PATH.
const ChromiumEnv = "IPAM_CHROMIUM"

// requireChromium returns the path of Chromium, or ends the test: skipped
// on a developer's machine, failed under CI ($CI set), which must run the
// browser test.
func requireChromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(ChromiumEnv); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "ui: no chromium on PATH (nor $" + ChromiumEnv + "); `make tools` installs Debian's (scripts/ensure-chromium.sh)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + "; CI must run the browser test, never skip it")
	}
	t.Skip(msg)
	return ""
}

// fixture is a real server (the API over the store on PostgreSQL, with
// this package's handler) with seeded pools, nodes, leases and history.
type fixture struct {
	t      *testing.T
	url    string // the server that requires credentials
	devURL string // the same store with --dev-no-auth's loopback viewer
	admin  string // bearer secrets
	viewer string
	clock  *testclock.Clock
	// history is the address whose history the seed wrote: leased,
	// confirmed, released, cooled, leased again, confirmed.
	history string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	// The history spreads over the last three hours, up to now.
	clk := testclock.New(time.Now().Add(-3 * time.Hour).Truncate(time.Second))
	o := store.DefaultOptions()
	o.Now = clk.Now
	st, err := store.Open(t.Context(), pgtest.NewDatabase(t), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := httptest.NewServer(api.NewHandler(api.StoresOf(st), api.Options{Logger: quiet, IsUnavailable: store.IsUnavailable, UI: Handler()}))
	t.Cleanup(srv.Close)
	dev := httptest.NewServer(api.NewHandler(api.StoresOf(st), api.Options{Logger: quiet, IsUnavailable: store.IsUnavailable, UI: Handler(),
		AnonymousRole: alloc.RoleViewer, AnonymousLoopbackOnly: true}))
	t.Cleanup(dev.Close)
	f := &fixture{t: t, url: srv.URL, devURL: dev.URL, clock: clk}
	token := func(name string, role alloc.Role) string {
		secret, hash := alloc.NewTokenSecret()
		if _, err := st.CreateToken(t.Context(), alloc.TokenSpec{Name: name, Role: role, TTL: 24 * time.Hour, CreatedBy: "test"}, hash); err != nil {
			t.Fatal(err)
		}
		return secret
	}
	f.admin, f.viewer = token("admin", alloc.RoleAdmin), token("ui-viewer", alloc.RoleViewer)
	f.seed()
	return f
}

// call sends a request as admin and decodes the answer into out (when
// not nil); a status other than want fails the test.
func (f *fixture) call(want int, method, path string, body any, out any) {
	f.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			f.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(f.t.Context(), method, f.url+path, rd)
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+f.admin)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want && !(want == 201 && res.StatusCode == 200) {
		f.t.Fatalf("%s %s: %d %s, want %d", method, path, res.StatusCode, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			f.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
}

type obj = map[string]any

// lease leases an address of each family to a container on node, from
// pool (empty: the default), and answers the IPv4 one.
func (f *fixture) lease(node, pool, container, ns, name string) string {
	f.t.Helper()
	body := obj{"owner": obj{"namespace": ns, "name": name, "uid": container}, "containerID": container, "interface": "eth0"}
	if pool != "" {
		body["pool"] = pool
	}
	var a struct {
		Addresses []struct{ Family, Address string }
	}
	f.call(201, "POST", "/v1/nodes/"+node+"/leases", body, &a)
	for _, x := range a.Addresses {
		if x.Family == "ipv4" {
			return strings.Split(x.Address, "/")[0]
		}
	}
	f.t.Fatalf("lease on %s: no IPv4 address in %+v", node, a)
	return ""
}

func (f *fixture) seed() {
	t := f.t
	f.call(201, "POST", "/v1/pools", obj{"name": "default", "labels": obj{"team": "platform"}, "spec": obj{
		"ipv4": obj{"cidrs": []string{"10.244.0.0/18", "10.250.0.0/22"}, "maskSize": 26,
			"pool": []obj{{"cidr": "10.250.0.0/22", "reservedRanges": []obj{{"start": "10.250.3.0", "end": "10.250.3.255"}}}}},
		"ipv6":             obj{"cidrs": []string{"fd00:10:244::/104"}, "maskSize": 120},
		"maxBlocksPerNode": 64,
	}}, nil)
	f.call(201, "POST", "/v1/pools", obj{"name": "batch", "spec": obj{
		"ipv4": obj{"cidrs": []string{"10.96.0.0/20"}, "maskSize": 24},
	}}, nil)
	nodes := []string{"worker-1", "worker-2", "worker-3", "worker-4", "worker-5", "worker-6"}
	for i, n := range nodes {
		f.call(201, "PUT", "/v1/nodes/"+n, obj{
			"labels":    obj{"topology.kubernetes.io/zone": "zone-" + string(rune('a'+i%3))},
			"addresses": []obj{{"type": "InternalIP", "address": fmt.Sprintf("192.168.10.%d", 11+i)}},
		}, nil)
	}

	// One address's life: leased, confirmed, released, cooled, leased
	// again, confirmed. The edge pool's /29 blocks hold four leasable
	// addresses and a node gets one block, so once the other three are
	// held the next lease must take the cooled address again.
	f.call(201, "POST", "/v1/pools", obj{"name": "edge", "spec": obj{
		"ipv4": obj{"cidrs": []string{"10.99.0.0/24"}, "maskSize": 29}, "maxBlocksPerNode": 1,
	}}, nil)
	f.history = f.lease("worker-1", "edge", "gw-0", "ingress", "gateway-0")
	for k := 1; k < 4; k++ {
		f.lease("worker-1", "edge", fmt.Sprintf("gw-%d", k), "ingress", fmt.Sprintf("gateway-%d", k))
	}
	f.clock.Advance(12 * time.Minute)
	f.call(200, "POST", "/v1/nodes/worker-1/attachments/gw-0/eth0/confirm", nil, nil)
	f.clock.Advance(50 * time.Minute)
	f.call(204, "DELETE", "/v1/nodes/worker-1/attachments/gw-0/eth0", nil, nil)
	f.clock.Advance(5 * time.Minute)
	if again := f.lease("worker-1", "edge", "gw-4", "ingress", "gateway-0"); again != f.history {
		t.Fatalf("the edge block's one free address is %s, but the lease got %s", f.history, again)
	}
	f.clock.Advance(3 * time.Minute)
	f.call(200, "POST", "/v1/nodes/worker-1/attachments/gw-4/eth0/confirm", nil, nil)

	// Blocks carved round-robin, then some given back: holes between the
	// nodes' blocks, as a pool looks after months of churn.
	quota := []int{28, 18, 24, 14, 8, 20}
	var carved [][]string
	for range nodes {
		carved = append(carved, nil)
	}
	for round := range slices.Max(quota) {
		for i, n := range nodes {
			if round < quota[i] {
				var b struct{ Cidr string }
				f.call(201, "POST", "/v1/nodes/"+n+"/blocks", obj{"pool": "default", "family": "ipv4"}, &b)
				carved[i] = append(carved[i], b.Cidr)
				if round%4 == 0 {
					f.call(201, "POST", "/v1/nodes/"+n+"/blocks", obj{"pool": "default", "family": "ipv6"}, nil)
				}
			}
		}
		f.clock.Advance(30 * time.Second)
	}
	for i, n := range nodes {
		for j, c := range carved[i] {
			if j%3 == 1 {
				f.call(204, "DELETE", "/v1/nodes/"+n+"/blocks?cidr="+c, nil, nil)
			}
		}
	}

	// Pods: leases on every node, most confirmed; a batch pool for two.
	pods := []int{36, 22, 28, 10, 5, 16}
	for i, n := range nodes {
		for k := range pods[i] {
			c := fmt.Sprintf("%s-c%02d", n, k)
			f.lease(n, "", c, []string{"shop", "search", "payments"}[k%3], fmt.Sprintf("pod-%s-%d", n[len(n)-1:], k))
			if k%5 != 4 {
				f.call(200, "POST", "/v1/nodes/"+n+"/attachments/"+c+"/eth0/confirm", nil, nil)
			}
		}
		f.clock.Advance(8 * time.Minute)
	}
	for _, n := range []string{"worker-4", "worker-6"} {
		for k := range 6 {
			f.lease(n, "batch", fmt.Sprintf("%s-b%d", n, k), "etl", fmt.Sprintf("job-%d", k))
		}
	}
	// Now, some Pods stop: their addresses cool for 30 s.
	f.clock.Set(time.Now().Truncate(time.Second))
	for i, n := range nodes {
		for k := 0; k < pods[i]; k += 7 {
			f.call(204, "DELETE", fmt.Sprintf("/v1/nodes/%s/attachments/%s-c%02d/eth0", n, n, k), nil, nil)
		}
	}
}

// browser is one headless Chromium tab, with the page's console errors
// and uncaught exceptions collected.
type browser struct {
	t    *testing.T
	ctx  context.Context
	dir  string // screenshots
	mu   sync.Mutex
	errs []string
}

func newBrowser(t *testing.T, exe string) *browser {
	t.Helper()
	// The flags that work on this project's machines: no sandbox (root in
	// a container), no GPU, and nothing that calls home.
	actx, cancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 900),
	)
	t.Cleanup(cancel)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(cancelTab)
	dir := os.Getenv(ScreenshotsEnv)
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b := &browser{t: t, ctx: ctx, dir: dir}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1200, 900)); err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			// A 401 before signing in is the page working as meant; the
			// browser logs every failed fetch as a network error.
			if m.Source == "network" {
				continue
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.mu.Lock()
				b.errs = append(b.errs, m.String())
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// do runs steps with a deadline.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval runs a script and decodes its JSON value into out.
func (b *browser) eval(script string, out any) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[string]("JSON.stringify("+script+")"))
	if err != nil {
		b.t.Fatalf("evaluating %.80s: %v", script, err)
	}
	if err := json.Unmarshal([]byte(raw), out); err != nil {
		b.t.Fatalf("decoding %.200s: %v", raw, err)
	}
}

// page waits until the view has rendered the page of the title.
func (b *browser) page(title string) {
	b.t.Helper()
	b.do("waiting for page "+title, chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`main[aria-busy="false"][data-page=%q]`, title))))
}

// open goes to a route of the view (a same-document navigation).
func (b *browser) open(route, title string) {
	b.t.Helper()
	b.do("opening "+route, chromedp.Evaluate[chromedp.Void](fmt.Sprintf("location.hash = %q", route)))
	b.page(title)
}

// shot saves a PNG of the page (the whole page when full, else the
// viewport), recompressed as small as Go's encoder makes it.
func (b *browser) shot(name string, full bool) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	var raw []byte
	var err error
	if full {
		raw, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
	} else {
		raw, err = chromedp.Run(ctx, chromedp.CaptureScreenshot())
	}
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	var out bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&out, img); err != nil {
		b.t.Fatal(err)
	}
	path := filepath.Join(b.dir, name)
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot %s (%dx%d, %d KiB)", path, img.Bounds().Dx(), img.Bounds().Dy(), out.Len()/1024)
}

func (b *browser) noErrors() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.errs {
		b.t.Errorf("browser console: %s", e)
	}
	b.errs = nil
}

// n reads a figure as the page shows it: "1,234" is 1234.
func n(t *testing.T, s string) int64 {
	t.Helper()
	v, err := strconv.ParseInt(strings.ReplaceAll(strings.TrimSpace(s), ",", ""), 10, 64)
	if err != nil {
		t.Fatalf("%q is not a figure: %v", s, err)
	}
	return v
}

// figures are the data-k figures of the rows a selector finds, keyed by
// their data-* identity.
const readRows = `(sel) => [...document.querySelectorAll(sel)].map(el => ({
	id: {...el.dataset},
	k: Object.fromEntries([...el.querySelectorAll('[data-k]')].map(e => [e.dataset.k, e.textContent])),
}))`

type row struct {
	ID map[string]string `json:"id"`
	K  map[string]string `json:"k"`
}

func (b *browser) rows(sel string) []row {
	b.t.Helper()
	var rs []row
	b.eval(fmt.Sprintf("(%s)(%q)", readRows, sel), &rs)
	return rs
}

// check compares the figures a row shows with the API's.
func check(t *testing.T, where string, shown map[string]string, api map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		s, ok := shown[k]
		if !ok {
			t.Errorf("%s: the page shows no %s", where, k)
			continue
		}
		want, ok := api[k].(float64)
		if !ok {
			t.Errorf("%s: the API has no %s", where, k)
			continue
		}
		if got := n(t, s); got != int64(want) {
			t.Errorf("%s: %s shows %d, the API says %d", where, k, got, int64(want))
		}
	}
}

// TestBrowser loads every page of the view in headless Chromium against a
// seeded server, signs in with a viewer token through the form, and
// checks each figure the page shows against the API's own answer.
func TestBrowser(t *testing.T) {
	exe := requireChromium(t)
	f := newFixture(t)
	b := newBrowser(t, exe)

	// Without credentials the view asks for a token; a wrong one is
	// refused in the form, a viewer's signs in.
	b.do("loading the view", chromedp.Navigate(f.url+"/ui/"))
	b.page("Sign in")
	b.shot("signin.png", false)
	b.do("signing in with a bad token",
		chromedp.SendKeys(chromedp.CSS("#token"), "ipam_not-a-real-token"),
		chromedp.Click(chromedp.CSS(".signin-form button")),
		chromedp.WaitVisible(chromedp.CSS(".signin-form .error:not(:empty)")))
	b.do("signing in",
		chromedp.Evaluate[chromedp.Void](`document.getElementById('token').value = ''`),
		chromedp.SendKeys(chromedp.CSS("#token"), f.viewer),
		chromedp.Click(chromedp.CSS(".signin-form button")))
	b.page("Pools")
	var cookieVisible bool
	b.eval(`document.cookie.includes('ipam_session')`, &cookieVisible)
	if cookieVisible {
		t.Error("the session cookie is readable by scripts; it must be HttpOnly")
	}

	// The pools page: each pool family's figures are the capacity API's.
	pools := b.rows("table.pools tbody tr")
	if len(pools) != 4 {
		t.Fatalf("the pools table has %d rows, want 4 (batch, default ipv4 and ipv6, edge)", len(pools))
	}
	caps := map[string]map[string]any{}
	for _, p := range []string{"default", "batch", "edge"} {
		var c map[string]any
		f.call(200, "GET", "/v1/pools/"+p+"/capacity", nil, &c)
		caps[p] = c
	}
	for _, r := range pools {
		fam, _ := caps[r.ID["pool"]][r.ID["family"]].(map[string]any)
		check(t, "pools page "+r.ID["pool"]+" "+r.ID["family"], r.K, fam,
			"blocksCarved", "blocksPossible", "leased", "addressesInBlocks", "cooling", "free", "nodesWithBlocks")
	}
	b.shot("pools.png", false)

	// The pool's page: figures, the map against the blocks, the legend
	// and the node table against the blocks' sums.
	b.open("#/pools/default", "Pool default")
	var blocks struct {
		Items []struct {
			Cidr, Node, Family        string
			Leased, Capacity, Cooling int64
		}
	}
	f.call(200, "GET", "/v1/pools/default/blocks?limit=1000", nil, &blocks)
	for _, fam := range []string{"ipv4", "ipv6"} {
		famCap := caps["default"][fam].(map[string]any)
		tiles := b.rows(fmt.Sprintf(`section.family[data-family=%q]`, fam))
		if len(tiles) != 1 {
			t.Fatalf("%s: %d sections", fam, len(tiles))
		}
		check(t, "pool page "+fam, tiles[0].K, famCap, "blocksCarved", "freeBlocks", "leased", "cooling", "free", "nodesWithBlocks")

		var grids []struct {
			Cidr          string
			Cells         int
			SlotsPerCell  int
			Carved        int
			CarvedCells   map[string]string // prefix -> node
			ReservedCells int
		}
		b.eval(fmt.Sprintf(`[...document.querySelectorAll('section.family[data-family=%q] svg.grid')].map(g => ({
			cidr: g.dataset.cidr, cells: +g.dataset.cells, slotsPerCell: +g.dataset.slotsPerCell, carved: +g.dataset.carved,
			carvedCells: Object.fromEntries([...g.querySelectorAll('rect[data-state="carved"]')].map(r => [r.dataset.prefix, r.dataset.node])),
			reservedCells: g.querySelectorAll('rect[data-state="reserved"]').length,
		}))`, fam), &grids)
		perNode := map[string]int{}
		apiCells := map[string]string{}
		for _, bl := range blocks.Items {
			if bl.Family == fam {
				perNode[bl.Node]++
				apiCells[bl.Cidr] = bl.Node
			}
		}
		carved := 0
		for _, g := range grids {
			carved += g.Carved
		}
		if int64(carved) != int64(famCap["blocksCarved"].(float64)) {
			t.Errorf("%s map: %d slots drawn carved, the API has %v blocks", fam, carved, famCap["blocksCarved"])
		}
		switch fam {
		case "ipv4":
			// One cell per block: every block is drawn at its place, in
			// its node's colour, and nothing else is.
			if len(grids) != 2 || grids[0].Cells != 256 || grids[1].Cells != 16 || grids[0].SlotsPerCell != 1 {
				t.Fatalf("ipv4 grids %+v, want 256 and 16 cells of one slot", grids)
			}
			drawn := map[string]string{}
			for _, g := range grids {
				for p, node := range g.CarvedCells {
					drawn[p] = node
				}
			}
			if fmt.Sprint(drawn) != fmt.Sprint(apiCells) {
				t.Errorf("ipv4 map draws %v, the API's blocks are %v", drawn, apiCells)
			}
			if grids[1].ReservedCells != 4 {
				t.Errorf("10.250.0.0/22: %d reserved cells, want 4 (10.250.3.0-10.250.3.255 in /26s)", grids[1].ReservedCells)
			}
		case "ipv6":
			// 65536 slots drawn as 1024 cells of 64 slots, and said so.
			if len(grids) != 1 || grids[0].Cells != 1024 || grids[0].SlotsPerCell != 64 {
				t.Errorf("ipv6 grid %+v, want 1024 cells of 64 slots", grids)
			}
			var note string
			b.eval(`document.querySelector('section.family[data-family="ipv6"] .agg-note').textContent`, &note)
			if !strings.Contains(note, "one cell per 64 slots") {
				t.Errorf("the aggregated map does not say so: %q", note)
			}
		}
		var legend map[string]string
		b.eval(fmt.Sprintf(`Object.fromEntries([...document.querySelectorAll('section.family[data-family=%q] .legend a[data-node]')].map(a => [a.dataset.node, a.dataset.blocks]))`, fam), &legend)
		for node, k := range perNode {
			if legend[node] != strconv.Itoa(k) {
				t.Errorf("%s legend: %s has %q blocks, the API %d", fam, node, legend[node], k)
			}
		}
	}
	for _, r := range b.rows("table.pool-nodes tbody tr") {
		var leased, capacity, count int64
		for _, bl := range blocks.Items {
			if bl.Node == r.ID["node"] && bl.Family == r.ID["family"] {
				leased, capacity, count = leased+bl.Leased, capacity+bl.Capacity, count+1
			}
		}
		check(t, "pool nodes "+r.ID["node"]+" "+r.ID["family"], r.K, map[string]any{"leased": float64(leased), "capacity": float64(capacity), "blocks": float64(count)},
			"leased", "capacity", "blocks")
	}
	// The README's picture: the page down to the end of the IPv4 map.
	b.do("scrolling to the top", chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
	var bottom int64
	b.eval(`Math.ceil(document.querySelector('section.family[data-family="ipv4"]').getBoundingClientRect().bottom) + 12`, &bottom)
	b.do("fitting the viewport", chromedp.EmulateViewport(1200, bottom))
	b.shot("ui-pool.png", false)
	b.do("restoring the viewport", chromedp.EmulateViewport(1200, 900))
	b.shot("pool-full.png", true)

	// A map cell links to its node: the node's page shows the API's
	// figures.
	var node string
	b.eval(`document.querySelector('section.family[data-family="ipv4"] svg.grid rect[data-node="worker-3"]').dataset.node`, &node)
	b.do("clicking a cell of worker-3", chromedp.Click(chromedp.CSS(`section.family[data-family="ipv4"] svg.grid a:has(rect[data-node="worker-3"])`)))
	b.page("Node " + node)
	var apiNode map[string]any
	f.call(200, "GET", "/v1/nodes/"+node, nil, &apiNode)
	tiles := b.rows("main section.card:first-of-type")
	check(t, "node page", tiles[0].K, apiNode, "blocks", "leases")
	var usage struct{ Items []map[string]any }
	f.call(200, "GET", "/v1/nodes/"+node+"/pools", nil, &usage)
	demand := b.rows("table.demand tbody tr")
	if len(demand) != len(usage.Items) {
		t.Errorf("node page: %d demand rows, the API %d", len(demand), len(usage.Items))
	}
	for i, r := range demand {
		if i < len(usage.Items) {
			check(t, "demand "+r.ID["pool"]+" "+r.ID["family"], r.K, usage.Items[i], "blocks", "capacity", "leased", "released", "needed", "available", "deficit")
		}
	}
	var nodeBlocks struct{ Items []map[string]any }
	f.call(200, "GET", "/v1/nodes/"+node+"/blocks", nil, &nodeBlocks)
	shownBlocks := b.rows("table.blocks tbody tr")
	if len(shownBlocks) != len(nodeBlocks.Items) {
		t.Errorf("node page: %d blocks, the API %d", len(shownBlocks), len(nodeBlocks.Items))
	}
	for i, r := range shownBlocks {
		if i < len(nodeBlocks.Items) {
			if r.ID["cidr"] != nodeBlocks.Items[i]["cidr"] {
				t.Errorf("node block %d: %s, the API %v", i, r.ID["cidr"], nodeBlocks.Items[i]["cidr"])
			}
			check(t, "node block "+r.ID["cidr"], r.K, nodeBlocks.Items[i], "leased", "capacity", "cooling")
		}
	}
	var nodeLeases struct{ Items []map[string]any }
	f.call(200, "GET", "/v1/leases?limit=200&node="+node, nil, &nodeLeases)
	if got := len(b.rows("table.leases tbody tr")); got != len(nodeLeases.Items) {
		t.Errorf("node page: %d addresses, the API %d", got, len(nodeLeases.Items))
	}
	b.shot("node.png", true)

	// The node links to its addresses: who holds one.
	var addr string
	b.eval(`document.querySelector('table.leases tbody tr[data-address]').dataset.address`, &addr)
	b.do("clicking an address", chromedp.Click(chromedp.CSS(`table.leases tbody tr[data-address] a`)))
	b.page(addr)
	var holder map[string]any
	f.call(200, "GET", "/v1/addresses/"+addr, nil, &holder)
	var shownNode string
	b.eval(`document.querySelector('.holder [data-k="node"]').textContent`, &shownNode)
	if shownNode != holder["node"] {
		t.Errorf("address %s: the page says node %q, the API %v", addr, shownNode, holder["node"])
	}

	// The header's search finds the history address: its holder now and
	// every event, as holdings on the timeline.
	b.do("searching "+f.history,
		chromedp.SendKeys(chromedp.CSS(`#search input`), f.history+"\n"))
	b.page(f.history)
	var hist struct{ Items []map[string]any }
	f.call(200, "GET", "/v1/addresses/"+f.history+"/history", nil, &hist)
	var shown struct {
		Events, Held, Cooling int
		State, Node, Count    string
	}
	b.eval(`({events: document.querySelectorAll('ol.events li').length,
		held: document.querySelectorAll('svg.timeline rect[data-kind="held"]').length,
		cooling: document.querySelectorAll('svg.timeline rect[data-kind="cooling"]').length,
		state: document.querySelector('.holder').dataset.state,
		node: document.querySelector('.holder [data-k="node"]').textContent,
		count: document.querySelector('[data-k="events"]').textContent})`, &shown)
	var kinds []string
	for _, e := range hist.Items {
		kinds = append(kinds, e["kind"].(string))
	}
	if want := []string{"lease", "confirm", "release", "cooldown-end", "lease", "confirm"}; !slices.Equal(kinds, want) {
		t.Errorf("the API's history of %s is %v, the seed wrote %v", f.history, kinds, want)
	}
	if shown.Events != len(hist.Items) || shown.Count != fmt.Sprintf("%d events", len(hist.Items)) || shown.Held != 2 || shown.Cooling != 1 ||
		shown.State != "active" || shown.Node != "worker-1" {
		t.Errorf("history page %+v, want %d events, 2 holdings and a cooldown, held (active) on worker-1", shown, len(hist.Items))
	}
	b.shot("address.png", true)

	// The nodes page.
	b.open("#/nodes", "Nodes")
	var apiNodes struct{ Items []map[string]any }
	f.call(200, "GET", "/v1/nodes", nil, &apiNodes)
	shownNodes := b.rows("table.nodes tbody tr")
	if len(shownNodes) != len(apiNodes.Items) {
		t.Fatalf("nodes page: %d rows, the API %d", len(shownNodes), len(apiNodes.Items))
	}
	for i, r := range shownNodes {
		check(t, "nodes page "+r.ID["node"], r.K, apiNodes.Items[i], "blocks", "leases")
	}
	b.shot("nodes.png", false)
	b.noErrors()

	// Signing out: the view asks for a token again.
	b.do("signing out", chromedp.Click(chromedp.CSS("#signout")))
	b.page("Sign in")

	// --dev-no-auth: loopback callers are served without signing in.
	b.do("loading the view of the dev server", chromedp.Navigate(f.devURL+"/ui/#/pools"))
	b.page("Pools")
	if got := len(b.rows("table.pools tbody tr")); got != 4 {
		t.Errorf("dev server: %d pool rows, want 4", got)
	}
	b.noErrors()
}
