// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ipam-dev/ipam/internal/kubetest"
)

// The shim phase's bridge mode times the pair as a runtime sees it: the
// reference bridge plugin, run directly as a runtime runs it, calls the
// IPAM plugin and puts a veth into a Pod namespace (made and deleted
// around each pair, untimed). host-local and the shim take turns, pair by
// pair, in the same run.
//
// Where it runs: bridge runs in a "node" namespace of the run's own
// (netns.go), so the host's namespace gets no bridge, veth, address or
// route. The shim, which bridge starts there, must reach a server: the
// benchmark's servers listen on the host's loopback, which the node's
// namespace does not see, so a server of the same binary and options
// listens on the node namespace's loopback (127.0.0.1, which the server
// certificate names) and shares the benchmark's database through its Unix
// socket. This is how cmd/cni-shim/e2e runs its server, and no veth or
// address outside loopback is needed. The plugin processes are started
// from a thread that entered the node namespace: no wrapper process (such
// as ip netns exec) is timed, for either plugin.

// bridgeSkip answers why the bridge mode cannot run here, or "".
func bridgeSkip(calls, euid int, lookPath func(string) (string, error), databaseURL string) string {
	if calls == 0 {
		return "-shim-bridge-calls 0"
	}
	if euid != 0 {
		return fmt.Sprintf("network namespaces need root (euid %d)", euid)
	}
	if _, err := lookPath("ip"); err != nil {
		return fmt.Sprintf("network namespaces need ip (iproute2): %v", err)
	}
	c, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Sprintf("the database URL: %v", err)
	}
	if !strings.HasPrefix(c.Host, "/") {
		return fmt.Sprintf("the node namespace's server reaches the database over a Unix socket only, and -database-url's host is %s", c.Host)
	}
	return ""
}

// bridgeNetconf is the network configuration of network name: bridge
// makes the bridge br (the Pods' gateway, no masquerading) and calls the
// IPAM plugin of ipam. prev, when set, is ADD's result passed to DEL.
func bridgeNetconf(name, br string, ipam map[string]any, prev json.RawMessage) ([]byte, error) {
	m := map[string]any{
		"cniVersion": shimCNIVersion,
		"name":       name,
		"type":       "bridge",
		"bridge":     br,
		"isGateway":  true,
		"ipMasq":     false,
		"ipam":       ipam,
	}
	if len(prev) > 0 {
		m["prevResult"] = prev
	}
	return json.Marshal(m)
}

// bridgeRun is the bridge mode's node namespace and its server.
type bridgeRun struct {
	prefix string // of every namespace of the run
	suffix string // random, of the bridges' names
	node   *netns
	server *serverProc
}

// newBridgeRun makes the node namespace (its loopback up) and answers a
// run; close removes it.
func newBridgeRun(ctx context.Context) (*bridgeRun, error) {
	r := &bridgeRun{suffix: randomSuffix()}
	r.prefix = "ipam-bench-" + r.suffix
	node, err := addNetns(ctx, r.prefix+"-node")
	if err != nil {
		return nil, err
	}
	r.node = node
	if out, err := exec.CommandContext(ctx, "ip", "-n", node.name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		r.close()
		return nil, fmt.Errorf("ip -n %s link set lo up: %w: %s", node.name, err, strings.TrimSpace(string(out)))
	}
	return r, nil
}

// startServer starts a server of options o on the node namespace's
// loopback and waits until it is ready.
func (r *bridgeRun) startServer(ctx context.Context, p *benchPKI, o serverOptions) error {
	// A port free on the host's loopback too, so the shim's session file
	// keeps this server's tickets apart from the host's server's.
	port, err := freePort()
	if err != nil {
		return err
	}
	o.start = func(cmd *exec.Cmd) error { return r.node.do(cmd.Start) }
	s, err := spawnServer(o, "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	r.server = s
	return s.waitReady(ctx, r.client(p))
}

// client is the administrator's client, connecting from the node namespace.
func (r *bridgeRun) client(p *benchPKI) *http.Client {
	hc := p.adminClient()
	d := &net.Dialer{Timeout: 5 * time.Second}
	hc.Transport.(*http.Transport).DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := r.node.do(func() (err error) {
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return hc
}

// close stops the server and deletes every namespace of the run (the
// bridges and veths go with them).
func (r *bridgeRun) close() {
	if r.server != nil {
		r.server.stop()
	}
	if r.node != nil {
		if err := r.node.close(); err != nil {
			fmt.Fprintln(os.Stderr, "ipam-bench: bridge mode:", err)
		}
	}
	if err := deleteNetnsWithPrefix(r.prefix); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-bench: bridge mode:", err)
	}
}

// bridgePlugin is one IPAM plugin under bridge.
type bridgePlugin struct {
	name  string // host-local, shim
	bench *shimBench
	times shimTimes
}

// pair runs one pair of p in a new Pod namespace named cid.
func (r *bridgeRun) pair(ctx context.Context, p *bridgePlugin, cid string, t *shimTimes) error {
	pod, err := addNetns(ctx, cid)
	if err != nil {
		return err
	}
	p.bench.pair(ctx, cid, t)
	return pod.close()
}

// run runs one untimed warm-up pair of each plugin (bridge makes its
// bridge, the shim its first connection to this server), then calls pairs
// of each, taking turns, the first of a turn alternating. The warm-up's
// failures count, its latencies do not.
func (r *bridgeRun) run(ctx context.Context, calls int, plugins []*bridgePlugin) (time.Duration, error) {
	for _, p := range plugins {
		var warm shimTimes
		if err := r.pair(ctx, p, fmt.Sprintf("%s-%s-warm", r.prefix, p.name), &warm); err != nil {
			return 0, err
		}
		warm.adds, warm.dels, warm.pairs = nil, nil, nil
		p.times.add(warm)
	}
	start := time.Now()
	for i := range calls {
		for j := range plugins {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			if i%2 == 1 {
				j = len(plugins) - 1 - j
			}
			p := plugins[j]
			if err := r.pair(ctx, p, fmt.Sprintf("%s-%s-%06d", r.prefix, p.name, i), &p.times); err != nil {
				return 0, err
			}
		}
	}
	return time.Since(start), nil
}

// runBridge runs the bridge mode into rep: calls pairs of host-local, of
// the shim (as node shimBridgeNode with the certificate in nodeCertDir)
// and, when whereabouts is set and the API server is built, of
// whereabouts under bridge, taking turns. When the machine cannot make the node
// namespace it skips the mode, the reason in rep.BridgeSkipped.
func runBridge(ctx context.Context, calls int, whereabouts bool, p *benchPKI, o serverOptions, certDir, nodeCertDir string, rep *shimReport, out io.Writer) error {
	began := time.Now()
	brBin, err := installPlugin(ctx, certDir, bridgePkg)
	if err != nil {
		return err
	}
	built := time.Since(began).Seconds()
	r, err := newBridgeRun(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rep.BridgeSkipped = fmt.Sprintf("no node namespace: %v", err)
		fmt.Fprintf(out, "shim bridge: skipped: %s\n", rep.BridgeSkipped)
		return nil
	}
	defer r.close()
	if err := r.startServer(ctx, p, o); err != nil {
		return fmt.Errorf("bridge mode's server: %w", err)
	}
	fmt.Fprintf(out, "shim bridge: %s built in %.1fs; bridge (isGateway, no ipMasq) in namespace %s, server %s there (same binary and database); %d pairs each, host-local and the shim (and whereabouts, below) taking turns after one untimed warm-up pair each; a Pod namespace per pair, made and deleted untimed\n",
		brBin, built, r.node.name, r.server.url, calls)

	start := func(cmd *exec.Cmd) error { return r.node.do(cmd.Start) }
	shimIPAMBridge := shimIPAM(r.server.url, nodeCertDir, rep.Space)
	shimIPAMBridge["node"] = shimBridgeNode
	shimIPAMBridge["dataDir"] = filepath.Join(certDir, "shim-reserve-bridge") // a reserve per network
	hl := &bridgePlugin{name: "hl", bench: &shimBench{bin: brBin, start: start, netconf: func(prev json.RawMessage) ([]byte, error) {
		return bridgeNetconf("bench-bridge-host-local", "ipb"+r.suffix+"hl", hostLocalIPAM(filepath.Join(certDir, "host-local-bridge")), prev)
	}}}
	shim := &bridgePlugin{name: "shim", bench: &shimBench{bin: brBin, start: start, netconf: func(prev json.RawMessage) ([]byte, error) {
		return bridgeNetconf("bench-bridge-shim", "ipb"+r.suffix+"sh", shimIPAMBridge, prev)
	}}}
	plugins := []*bridgePlugin{hl, shim}
	var wa *bridgePlugin
	if !whereabouts {
		rep.WhereaboutsSkipped = "-shim-whereabouts=false"
	} else {
		peer, skipped, err := setUpWhereabouts(ctx, r.node, certDir, out)
		if err != nil {
			return fmt.Errorf("whereabouts: %w", err)
		}
		rep.WhereaboutsSkipped = skipped
		if peer != nil {
			defer peer.close()
			wa = &bridgePlugin{name: "wa", bench: &shimBench{bin: brBin, start: start, netconf: func(prev json.RawMessage) ([]byte, error) {
				return bridgeNetconf("bench-bridge-whereabouts", "ipb"+r.suffix+"wa", peer.ipam(), prev)
			}}}
			plugins = append(plugins, wa)
		}
	}
	elapsed, err := r.run(ctx, calls, plugins)
	if err != nil {
		return err
	}
	hlRes, shimRes := hl.times.result("bridge", 1, calls, elapsed), shim.times.result("bridge", 1, calls, elapsed)
	rep.HostLocal.Bridge, rep.Bridge = &hlRes, &shimRes
	printShim(out, "host-local", hlRes)
	printShim(out, "shim", shimRes)
	ratio := ratioOf(shimRes, hlRes)
	rep.Ratios = append(rep.Ratios, ratio)
	fmt.Fprintln(out, ratio.line())
	if wa == nil {
		fmt.Fprintf(out, "shim bridge: whereabouts skipped: %s\n", rep.WhereaboutsSkipped)
		return nil
	}
	waRes := wa.times.result("bridge", 1, calls, elapsed)
	rep.Whereabouts = &waRes
	printShim(out, "whereabouts", waRes)
	pr := peerRatioOf("whereabouts", shimRes, waRes)
	rep.WhereaboutsRatio = &pr
	fmt.Fprintln(out, pr.line())
	return nil
}

// setUpWhereabouts builds whereabouts into dir and starts its storage for
// the node namespace; with no kube-apiserver built it answers why it
// skips the peer.
func setUpWhereabouts(ctx context.Context, node *netns, dir string, out io.Writer) (*whereaboutsPeer, string, error) {
	began := time.Now()
	modDir, err := buildWhereabouts(ctx, dir)
	if err != nil {
		return nil, "", err
	}
	built := time.Since(began)
	peer, err := startWhereabouts(ctx, node, modDir, dir)
	if errors.Is(err, kubetest.ErrNoBinaries) {
		return nil, err.Error(), nil
	} else if err != nil {
		return nil, "", err
	}
	fmt.Fprintf(out, "shim bridge: whereabouts %s built or found in %.1fs; its Kubernetes storage on etcd and kube-apiserver %s (%s, reached from the node namespace through a forwarder on its loopback), range %s, taking turns with the others\n",
		whereaboutsVersion, built.Seconds(), kubetest.KubernetesVersion, peer.kc.Host(), whereaboutsRange)
	return peer, "", nil
}
