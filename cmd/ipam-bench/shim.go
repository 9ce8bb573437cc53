// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// The shim phase runs the CNI plugin cmd/cni-shim as a runtime does: one
// process per call, ADD then DEL of a fresh container, each over a new
// mutual-TLS connection (with the node's certificate; the shim resumes the
// TLS session of the process before from its session file) to the
// benchmark's first server, in an address space of its own. The reference
// host-local plugin runs the same pairs through the same harness first, as
// the yardstick: both are built as releases are (static, stripped).
const (
	shimPackage    = "github.com/ipam-dev/ipam/cmd/cni-shim"
	hostLocalPkg   = "github.com/containernetworking/plugins/plugins/ipam/host-local@v1.10.0"
	bridgePkg      = "github.com/containernetworking/plugins/plugins/main/bridge@v1.10.0"
	shimCNIVersion = "1.1.0"
	shimNode       = "shim-bench-node"
	// shimBridgeNode is the node of the bridge mode: a node of its own, so
	// that its one block (the bridge's gateway address) is not crowded
	// out by the other modes' cooling addresses. bridge with isGateway
	// takes one gateway per bridge; a second block would answer another.
	shimBridgeNode = "shim-bench-bridge-node"
	shimMask       = 24
	shimCallLimit  = 60 * time.Second
)

// shimResult is one mode of the shim phase: sequential, parallel or bridge.
type shimResult struct {
	Mode         string   `json:"mode"`
	Workers      int      `json:"workers"`
	Pairs        int      `json:"pairs"`
	Calls        int64    `json:"calls"`
	Errors       int64    `json:"errors"`
	ErrorRate    float64  `json:"errorRate"`
	Seconds      float64  `json:"seconds"`
	AddP50ms     float64  `json:"addP50ms"`
	AddP99ms     float64  `json:"addP99ms"`
	DelP50ms     float64  `json:"delP50ms"`
	DelP99ms     float64  `json:"delP99ms"`
	PairP50ms    float64  `json:"pairP50ms"`
	PairP99ms    float64  `json:"pairP99ms"`
	ErrorSamples []string `json:"errorSamples,omitempty"`
}

// shimReport is the shim phase in the -out file.
type shimReport struct {
	CNIVersion string     `json:"cniVersion"`
	Space      string     `json:"space"`
	BuildSecs  float64    `json:"buildSeconds"`
	Sequential shimResult `json:"sequential"`
	Parallel   shimResult `json:"parallel"`
	// HostLocal is the reference plugin in the same harness; the ratios
	// are the shim's pair latency over host-local's.
	HostLocal struct {
		Sequential shimResult  `json:"sequential"`
		Parallel   shimResult  `json:"parallel"`
		Bridge     *shimResult `json:"bridge,omitempty"`
	} `json:"hostLocal"`
	// Bridge is the runtime's view: the reference bridge plugin calling
	// the IPAM plugin, a veth into a Pod namespace per pair (bridge.go);
	// nil when skipped, for the reason BridgeSkipped.
	Bridge        *shimResult `json:"bridge,omitempty"`
	BridgeSkipped string      `json:"bridgeSkipped,omitempty"`
	Ratios        []shimRatio `json:"ratios"`
	// Whereabouts is the peer with central storage under bridge, taking
	// turns with host-local and the shim (whereabouts.go); nil when
	// skipped, for the reason WhereaboutsSkipped.
	Whereabouts        *shimResult `json:"whereabouts,omitempty"`
	WhereaboutsSkipped string      `json:"whereaboutsSkipped,omitempty"`
	WhereaboutsRatio   *peerRatio  `json:"whereaboutsRatio,omitempty"`
}

// results are every mode's results, the shim's and host-local's.
func (r *shimReport) results() []shimResult {
	all := []shimResult{r.Sequential, r.Parallel, r.HostLocal.Sequential, r.HostLocal.Parallel}
	for _, b := range []*shimResult{r.Bridge, r.HostLocal.Bridge, r.Whereabouts} {
		if b != nil {
			all = append(all, *b)
		}
	}
	return all
}

// shimRatio is the shim's pair latency over host-local's in one mode,
// with the figures it divides.
type shimRatio struct {
	Mode           string  `json:"mode"`
	P50            float64 `json:"pairP50"`
	P99            float64 `json:"pairP99"`
	Limit          float64 `json:"limit"`
	ShimP50ms      float64 `json:"shimPairP50ms"`
	ShimP99ms      float64 `json:"shimPairP99ms"`
	HostLocalP50ms float64 `json:"hostLocalPairP50ms"`
	HostLocalP99ms float64 `json:"hostLocalPairP99ms"`
}

// shimRatioLimit is the target: the shim's pair at most 1.3 times host-local's.
const shimRatioLimit = 1.3

// ratioOf compares the shim's and host-local's pairs of one mode.
func ratioOf(shim, hostLocal shimResult) shimRatio {
	r := shimRatio{Mode: shim.Mode, Limit: shimRatioLimit,
		ShimP50ms: shim.PairP50ms, ShimP99ms: shim.PairP99ms, HostLocalP50ms: hostLocal.PairP50ms, HostLocalP99ms: hostLocal.PairP99ms}
	r.P50, r.P99 = pairRatios(shim, hostLocal)
	return r
}

// pairRatios are a's pair p50 and p99 over b's (0 where b has none).
func pairRatios(a, b shimResult) (p50, p99 float64) {
	if b.PairP50ms > 0 {
		p50 = a.PairP50ms / b.PairP50ms
	}
	if b.PairP99ms > 0 {
		p99 = a.PairP99ms / b.PairP99ms
	}
	return p50, p99
}

// verdict judges r's p50 ratio against the target.
func (r shimRatio) verdict() string {
	switch {
	case r.P50 == 0:
		return "no figures"
	case r.P50 > r.Limit:
		return "over"
	}
	return "ok"
}

// line is the printed line of r.
func (r shimRatio) line() string {
	return fmt.Sprintf("shim/host-local %s pair_p50_ratio=%.2f pair_p99_ratio=%.2f target<=%.1f %s", r.Mode, r.P50, r.P99, r.Limit, r.verdict())
}

// summaryLine is r's line in the summary: both pairs and the ratios.
func (r shimRatio) summaryLine() string {
	return fmt.Sprintf("shim %-11s pair ms p50/p99: host-local %.2f/%.2f shim %.2f/%.2f ratio %.2f/%.2f (target p50<=%.1f) %s",
		r.Mode, r.HostLocalP50ms, r.HostLocalP99ms, r.ShimP50ms, r.ShimP99ms, r.P50, r.P99, r.Limit, r.verdict())
}

// peerRatio is the shim's pair latency over a peer's in one mode: the
// target is at most the peer's.
type peerRatio struct {
	Peer      string  `json:"peer"`
	Mode      string  `json:"mode"`
	P50       float64 `json:"pairP50"`
	P99       float64 `json:"pairP99"`
	Limit     float64 `json:"limit"`
	ShimP50ms float64 `json:"shimPairP50ms"`
	ShimP99ms float64 `json:"shimPairP99ms"`
	PeerP50ms float64 `json:"peerPairP50ms"`
	PeerP99ms float64 `json:"peerPairP99ms"`
}

// peerRatioLimit: the shim's pair p50 at most the peer's.
const peerRatioLimit = 1.0

func peerRatioOf(peer string, shim, p shimResult) peerRatio {
	r := peerRatio{Peer: peer, Mode: shim.Mode, Limit: peerRatioLimit,
		ShimP50ms: shim.PairP50ms, ShimP99ms: shim.PairP99ms, PeerP50ms: p.PairP50ms, PeerP99ms: p.PairP99ms}
	r.P50, r.P99 = pairRatios(shim, p)
	return r
}

func (r peerRatio) verdict() string {
	return shimRatio{P50: r.P50, Limit: r.Limit}.verdict()
}

// line is the printed line of r.
func (r peerRatio) line() string {
	return fmt.Sprintf("shim/%s %s pair_p50_ratio=%.2f pair_p99_ratio=%.2f target<=%.1f %s", r.Peer, r.Mode, r.P50, r.P99, r.Limit, r.verdict())
}

// summaryLine is r's line in the summary: both pairs and the ratios.
func (r peerRatio) summaryLine() string {
	return fmt.Sprintf("shim %-11s pair ms p50/p99: %s %.2f/%.2f shim %.2f/%.2f ratio %.2f/%.2f (target p50<=%.1f) %s",
		r.Mode, r.Peer, r.PeerP50ms, r.PeerP99ms, r.ShimP50ms, r.ShimP99ms, r.P50, r.P99, r.Limit, r.verdict())
}

// printShimSummary prints the shim phase's lines of the summary.
func printShimSummary(out io.Writer, r *shimReport) {
	if r == nil {
		return
	}
	for _, ratio := range r.Ratios {
		fmt.Fprintln(out, ratio.summaryLine())
	}
	if r.WhereaboutsRatio != nil {
		fmt.Fprintln(out, r.WhereaboutsRatio.summaryLine())
	}
	switch {
	case r.BridgeSkipped != "":
		fmt.Fprintf(out, "shim bridge: skipped: %s\n", r.BridgeSkipped)
	case r.WhereaboutsSkipped != "":
		fmt.Fprintf(out, "shim bridge: whereabouts skipped: %s\n", r.WhereaboutsSkipped)
	}
}

// shimTimes are the latencies and failures one mode collected.
type shimTimes struct {
	adds, dels, pairs []time.Duration
	calls, errors     int64
	samples           []string
}

// add merges o into t.
func (t *shimTimes) add(o shimTimes) {
	t.adds = append(t.adds, o.adds...)
	t.dels = append(t.dels, o.dels...)
	t.pairs = append(t.pairs, o.pairs...)
	t.calls += o.calls
	t.errors += o.errors
	for _, s := range o.samples {
		if len(t.samples) < maxSamplesPerRun {
			t.samples = append(t.samples, s)
		}
	}
}

// result summarizes t as mode.
func (t shimTimes) result(mode string, workers, pairs int, elapsed time.Duration) shimResult {
	a, d, p := summarize(t.adds), summarize(t.dels), summarize(t.pairs)
	return shimResult{
		Mode: mode, Workers: workers, Pairs: pairs, Calls: t.calls, Errors: t.errors,
		ErrorRate: errorRate(t.calls-t.errors, t.errors), Seconds: elapsed.Seconds(),
		AddP50ms: ms(a.P50), AddP99ms: ms(a.P99), DelP50ms: ms(d.P50), DelP99ms: ms(d.P99),
		PairP50ms: ms(p.P50), PairP99ms: ms(p.P99), ErrorSamples: t.samples,
	}
}

// shimLine is the printed line of r, a result of plugin.
func shimLine(plugin string, r shimResult) string {
	return fmt.Sprintf("%s %s add_p50_ms=%.2f add_p99_ms=%.2f del_p50_ms=%.2f del_p99_ms=%.2f pair_p50_ms=%.2f pair_p99_ms=%.2f pairs=%d errors=%d",
		plugin, r.Mode, r.AddP50ms, r.AddP99ms, r.DelP50ms, r.DelP99ms, r.PairP50ms, r.PairP99ms, r.Pairs, r.Errors)
}

// shimNetconf is the network configuration on the plugin's stdin; prev,
// when set, is ADD's result passed to DEL as prevResult, as runtimes do.
func shimNetconf(server, certDir, space string, prev json.RawMessage) ([]byte, error) {
	return netconf("bench", shimIPAM(server, certDir, space), prev)
}

// shimIPAM is the shim's ipam section: the node's certificate in certDir,
// its reserve file there too (not under /var/lib/cni, which would outlive
// the run and carry another run's slots into this one). It names its pool,
// as a configuration must for ADD to answer from the node's reserve
// without a request (the reserve's default size, 4): a pair then runs on
// the reserve while it has a free slot, and on the service when it has not.
func shimIPAM(server, certDir, space string) map[string]any {
	return map[string]any{
		"type":     "ipam-shim",
		"pool":     "default",
		"server":   server,
		"caFile":   filepath.Join(certDir, "ca.crt"),
		"certFile": filepath.Join(certDir, "node.crt"),
		"keyFile":  filepath.Join(certDir, "node.key"),
		"node":     shimNode,
		"space":    space,
		"timeout":  shimCallLimit.String(),
		"dataDir":  filepath.Join(certDir, "shim-reserve"),
	}
}

// hostLocalNetconf is the network configuration of the reference
// host-local plugin, leasing from a /16 with its files in dataDir.
func hostLocalNetconf(dataDir string, prev json.RawMessage) ([]byte, error) {
	return netconf("bench-host-local", hostLocalIPAM(dataDir), prev)
}

// hostLocalIPAM is host-local's ipam section.
func hostLocalIPAM(dataDir string) map[string]any {
	return map[string]any{
		"type":    "host-local",
		"ranges":  [][]map[string]string{{{"subnet": "10.250.0.0/16"}}},
		"dataDir": dataDir,
	}
}

// netconf is the configuration of network name, of type bridge with the
// ipam section ipam, as an IPAM plugin gets it from bridge.
func netconf(name string, ipam map[string]any, prev json.RawMessage) ([]byte, error) {
	m := map[string]any{
		"cniVersion": shimCNIVersion,
		"name":       name,
		"type":       "bridge",
		"ipam":       ipam,
	}
	if len(prev) > 0 {
		m["prevResult"] = prev
	}
	return json.Marshal(m)
}

// releaseBuild are the go build flags of a release binary, as
// deploy/cni/Dockerfile builds the shim: static, without a symbol table or
// DWARF, without local paths. A process per CNI call pays for what it maps.
var releaseBuild = []string{"-trimpath", "-ldflags=-s -w"}

// releaseEnv is the environment of a release build: CGO_ENABLED=0.
func releaseEnv() []string { return append(os.Environ(), "CGO_ENABLED=0") }

// installPlugin installs a reference plugin (host-local, bridge) from
// the Go module proxy (as cmd/cni-shim/e2e installs bridge) into dir, as a
// release is built, and answers its path.
func installPlugin(ctx context.Context, dir, module string) (string, error) {
	tool, err := goTool()
	if err != nil {
		return "", fmt.Errorf("go tool: %w", err)
	}
	cmd := exec.CommandContext(ctx, tool, append(append([]string{"install"}, releaseBuild...), module)...)
	cmd.Env = append(releaseEnv(), "GOBIN="+dir, "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go install %s: %w: %s", module, err, strings.TrimSpace(stderr.String()))
	}
	pkg, _, _ := strings.Cut(module, "@")
	return filepath.Join(dir, path.Base(pkg)), nil
}

// goTool answers the go command: GOROOT/bin/go of this program's
// toolchain when present, else go from PATH.
func goTool() (string, error) {
	//lint:ignore SA1019 under go run, the toolchain that built this program is the one wanted
	if root := runtime.GOROOT(); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return exec.LookPath("go")
}

// buildShim builds the plugin into dir as a release is built and answers
// its path.
func buildShim(ctx context.Context, dir string) (string, error) {
	tool, err := goTool()
	if err != nil {
		return "", fmt.Errorf("go tool: %w", err)
	}
	out := filepath.Join(dir, "ipam-shim")
	cmd := exec.CommandContext(ctx, tool, append(append([]string{"build", "-o", out}, releaseBuild...), shimPackage)...)
	cmd.Env = releaseEnv()
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = io.Discard, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", shimPackage, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// shimBench is the state of the shim phase for one plugin.
type shimBench struct {
	bin string
	// start starts a call's process; nil is cmd.Start.
	start func(cmd *exec.Cmd) error
	// netconf is the configuration of a call; prev is ADD's result for DEL.
	netconf func(prev json.RawMessage) ([]byte, error)
}

// call runs the plugin once for verb and answers its stdout and duration.
func (b *shimBench) call(ctx context.Context, verb, cid string, stdin []byte) ([]byte, time.Duration, error) {
	cmd := exec.CommandContext(ctx, b.bin)
	cmd.Env = []string{
		"CNI_COMMAND=" + verb,
		"CNI_CONTAINERID=" + cid,
		"CNI_NETNS=" + filepath.Join(netnsDir, cid), // an IPAM plugin never enters it; bridge enters the bridge mode's Pod namespace, named cid
		"CNI_IFNAME=" + benchInterface,
		"CNI_PATH=" + filepath.Dir(b.bin),
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=" + cid,
		"PATH=" + os.Getenv("PATH"),
	}
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	var err error
	if b.start != nil {
		err = b.start(cmd)
	} else {
		err = cmd.Start()
	}
	if err == nil {
		err = cmd.Wait()
	}
	d := time.Since(start)
	if err != nil {
		return nil, d, fmt.Errorf("%s %s: %w: %s %s", verb, cid, err,
			strings.TrimSpace(stdout.String()), strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), d, nil
}

// pair runs ADD then DEL of container cid into t.
func (b *shimBench) pair(ctx context.Context, cid string, t *shimTimes) {
	fail := func(err error) {
		t.errors++
		if len(t.samples) < maxSamplesPerRun {
			t.samples = append(t.samples, err.Error())
		}
	}
	conf, err := b.netconf(nil)
	if err != nil {
		fail(err)
		return
	}
	t.calls++
	out, addD, addErr := b.call(ctx, "ADD", cid, conf)
	if addErr != nil {
		fail(addErr)
		out = nil // DEL all the same, as a runtime would, without prevResult
	} else {
		t.adds = append(t.adds, addD)
	}
	if conf, err = b.netconf(out); err != nil {
		fail(err)
		return
	}
	t.calls++
	_, delD, delErr := b.call(ctx, "DEL", cid, conf)
	if delErr != nil {
		fail(delErr)
		return
	}
	t.dels = append(t.dels, delD)
	if addErr == nil {
		t.pairs = append(t.pairs, addD+delD)
	}
}

// mode runs workers goroutines of calls pairs each.
func (b *shimBench) mode(ctx context.Context, name string, workers, calls int) shimResult {
	var (
		mu  sync.Mutex
		all shimTimes
		wg  sync.WaitGroup
	)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			var t shimTimes
			for i := range calls {
				if ctx.Err() != nil {
					break
				}
				b.pair(ctx, fmt.Sprintf("shim-%s-w%02d-%06d", strings.SplitN(name, "=", 2)[0], w, i), &t)
			}
			mu.Lock()
			all.add(t)
			mu.Unlock()
		})
	}
	wg.Wait()
	return all.result(name, workers, workers*calls, time.Since(start))
}

// runShim runs the shim phase against the running server: build, the
// node's certificate, a space of its own, sequential then parallel, then
// under bridge in namespaces of its own, with a server of options so.
func runShim(ctx context.Context, cfg config, p *benchPKI, server string, so serverOptions, admin *ipamclient.ClientWithResponses, out io.Writer) (*shimReport, error) {
	rep := &shimReport{CNIVersion: shimCNIVersion, Space: fmt.Sprintf("shim-bench-%d", time.Now().Unix())}
	certDir, err := os.MkdirTemp("", "ipam-bench-shim-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(certDir)
	began := time.Now()
	bin, err := buildShim(ctx, certDir)
	if err != nil {
		return nil, err
	}
	hlBin, err := installPlugin(ctx, certDir, hostLocalPkg)
	if err != nil {
		return nil, err
	}
	rep.BuildSecs = time.Since(began).Seconds()
	if err := p.writeNode(rep.Space, shimNode, certDir); err != nil {
		return nil, fmt.Errorf("shim certificates: %w", err)
	}
	bridgeCertDir := filepath.Join(certDir, "bridge-node")
	if err := os.Mkdir(bridgeCertDir, 0o700); err != nil {
		return nil, err
	}
	if err := p.writeNode(rep.Space, shimBridgeNode, bridgeCertDir); err != nil {
		return nil, fmt.Errorf("shim certificates: %w", err)
	}
	if err := setupPool(ctx, admin, &rep.Space, shimMask, []string{shimNode, shimBridgeNode}); err != nil {
		return nil, fmt.Errorf("shim setup: %w", err)
	}
	defer func() {
		if err := teardown(context.WithoutCancel(ctx), admin, rep.Space, []string{shimNode, shimBridgeNode}, []string{"default"}); err != nil {
			fmt.Fprintln(os.Stderr, "ipam-bench: shim teardown:", err)
		}
	}()
	// First, the shim's background syncs end (each holds its reserve's
	// sync lock), so the teardown finds no call of theirs under way.
	defer waitReserveSync(filepath.Join(certDir, "shim-reserve"), filepath.Join(certDir, "shim-reserve-bridge"))
	fmt.Fprintf(out, "shim: %s and %s built in %.1fs (%s, CGO_ENABLED=0); cniVersion=%s mutual TLS to %s space=%s node=%s sequential=%d parallel=%dx%d\n",
		bin, hlBin, rep.BuildSecs, strings.Join(releaseBuild, " "), shimCNIVersion, server, rep.Space, shimNode, cfg.ShimCalls, cfg.ShimParallel, cfg.ShimParallelCalls)

	shim := &shimBench{bin: bin, netconf: func(prev json.RawMessage) ([]byte, error) {
		return shimNetconf(server, certDir, rep.Space, prev)
	}}
	hl := &shimBench{bin: hlBin, netconf: func(prev json.RawMessage) ([]byte, error) {
		return hostLocalNetconf(filepath.Join(certDir, "host-local-data"), prev)
	}}
	parallel := fmt.Sprintf("parallel=%d", cfg.ShimParallel)
	// Each mode: host-local, then the shim, back to back.
	for _, m := range []struct {
		name           string
		workers, calls int
		hl, shim       *shimResult
	}{
		{"sequential", 1, cfg.ShimCalls, &rep.HostLocal.Sequential, &rep.Sequential},
		{parallel, cfg.ShimParallel, cfg.ShimParallelCalls, &rep.HostLocal.Parallel, &rep.Parallel},
	} {
		*m.hl = hl.mode(ctx, m.name, m.workers, m.calls)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		printShim(out, "host-local", *m.hl)
		*m.shim = shim.mode(ctx, m.name, m.workers, m.calls)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		printShim(out, "shim", *m.shim)
		r := ratioOf(*m.shim, *m.hl)
		rep.Ratios = append(rep.Ratios, r)
		fmt.Fprintln(out, r.line())
	}
	if rep.BridgeSkipped = bridgeSkip(cfg.ShimBridgeCalls, os.Geteuid(), exec.LookPath, so.databaseURL); rep.BridgeSkipped != "" {
		fmt.Fprintf(out, "shim bridge: skipped: %s\n", rep.BridgeSkipped)
		return rep, nil
	}
	if err := runBridge(ctx, cfg.ShimBridgeCalls, cfg.ShimWhereabouts, p, so, certDir, bridgeCertDir, rep, out); err != nil {
		return nil, err
	}
	return rep, nil
}

// waitReserveSync waits until no background sync of the shim holds the
// reserve in each dir (its sync.lock), as long as the sync's own timeout.
func waitReserveSync(dirs ...string) {
	for _, dir := range dirs {
		f, err := os.Open(filepath.Join(dir, "sync.lock"))
		if err != nil {
			continue // no reserve there
		}
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		_ = f.Close()
	}
}

func printShim(out io.Writer, plugin string, r shimResult) {
	fmt.Fprintln(out, shimLine(plugin, r))
	for _, s := range r.ErrorSamples {
		fmt.Fprintf(out, "  error sample: %s\n", s)
	}
}
