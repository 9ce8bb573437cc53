// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package e2e runs the CNI plugin as a container runtime would: the
// reference bridge plugin, built from the Go module proxy, calls the shim as
// its IPAM plugin through cnitool, in real network namespaces, against the
// real server binary over mutual TLS. It needs root (ip netns), as CI has.
package e2e

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/pki"
	"github.com/ipam-dev/ipam/internal/store"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.Migrate)
}

// Versions of the reference CNI plugins and of cnitool, built from the Go
// module proxy.
const (
	pluginsModule = "github.com/containernetworking/plugins/plugins/main/%s@v1.10.0"
	cnitoolModule = "github.com/containernetworking/cni/cnitool@v1.3.0"
	listen        = "127.0.0.1:18443" // inside the node namespace, which is new
)

type e2e struct {
	t       *testing.T
	bin     string // plugins, shim, server, cnitool
	dir     string // certificates, conflists
	node    string // the namespace that plays the node
	prefix  string
	netName string
	st      *store.Store
	server  *exec.Cmd
	srvArgs []string
}

func run(t *testing.T, env []string, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func must(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	out, err := run(t, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// build compiles the shim and the server from this module and installs the
// reference plugins and cnitool from the module proxy.
func build(t *testing.T, bin string) {
	t.Helper()
	goTool := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		if goTool, err = exec.LookPath("go"); err != nil {
			t.Fatal("the go tool is needed to build the plugins")
		}
	}
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	must(t, nil, goTool, "build", "-C", root, "-o", filepath.Join(bin, "ipam-shim"), "./cmd/cni-shim")
	must(t, nil, goTool, "build", "-C", root, "-o", filepath.Join(bin, "ipam-server"), "./cmd/server")
	gobin := []string{"GOBIN=" + bin, "GOFLAGS=-mod=mod"}
	must(t, gobin, goTool, "install", fmt.Sprintf(pluginsModule, "bridge"), fmt.Sprintf(pluginsModule, "loopback"))
	must(t, gobin, goTool, "install", cnitoolModule)
}

// setups numbers the tests' namespaces and networks (tests run one at a time).
var setups int

func setup(t *testing.T) *e2e {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the end-to-end test creates network namespaces and needs root (CI runs as root)")
	}
	e := &e2e{t: t, bin: t.TempDir(), dir: t.TempDir()}
	build(t, e.bin)
	setups++
	e.prefix = fmt.Sprintf("ipam-e2e-%d-%d", os.Getpid(), setups)
	e.node, e.netName = e.prefix+"-node", e.prefix
	t.Cleanup(e.cleanup)
	must(t, nil, "ip", "netns", "add", e.node)
	must(t, nil, "ip", "netns", "exec", e.node, "ip", "link", "set", "lo", "up")

	ca, err := pki.NewCA("e2e CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, data []byte) string {
		p := filepath.Join(e.dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("ca.crt", pki.EncodeCert(ca.Cert))
	for _, c := range []struct {
		name  string
		issue func() ([]byte, []byte, error)
	}{
		{"server", func() ([]byte, []byte, error) { return ca.IssueServer([]string{"127.0.0.1"}, time.Hour) }},
		{"node", func() ([]byte, []byte, error) { return ca.IssueNode("e2e-node", time.Hour) }},
		{"operator", func() ([]byte, []byte, error) { return ca.IssueClient("e2e-operator", time.Hour) }},
	} {
		cert, key, err := c.issue()
		if err != nil {
			t.Fatal(err)
		}
		write(c.name+".crt", cert)
		write(c.name+".key", key)
	}

	conn := pgtest.NewDatabase(t)
	e.st, err = store.Open(context.Background(), conn, store.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.st.Close)
	if _, err := e.st.CreatePool(context.Background(), alloc.Pool{Space: alloc.DefaultSpace, Name: "default", Spec: alloc.PoolSpec{
		IPv4:      &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}, MaskSize: 24},
		IPv6:      &alloc.PoolFamily{CIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:99::/104")}, MaskSize: 120},
		NodeLocal: alloc.DefaultNodeLocal,
	}}); err != nil {
		t.Fatal(err)
	}
	e.srvArgs = []string{"netns", "exec", e.node, filepath.Join(e.bin, "ipam-server"), "serve",
		"--database-url", conn, "--listen", listen, "--log-level", "warn", "--cooldown", "0s",
		"--reconcile-min-age", "0s", // GC below frees a lease made a moment earlier
		"--tls-cert-file", filepath.Join(e.dir, "server.crt"), "--tls-key-file", filepath.Join(e.dir, "server.key"),
		"--client-ca-file", filepath.Join(e.dir, "ca.crt")}
	e.startServer()

	conf := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "plugins": [{
		"type": "bridge", "bridge": "cni-e2e0", "isGateway": true,
		"ipam": {"type": "ipam-shim", "server": "https://%s", "caFile": %q, "certFile": %q, "keyFile": %q, "node": "e2e-node", "reserve": 0}
	}, {"type": "loopback"}]}`, e.netName, listen, filepath.Join(e.dir, "ca.crt"), filepath.Join(e.dir, "node.crt"), filepath.Join(e.dir, "node.key"))
	if err := os.WriteFile(filepath.Join(e.dir, e.netName+".conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *e2e) startServer() {
	e.t.Helper()
	e.server = exec.Command("ip", e.srvArgs...)
	e.server.Stdout, e.server.Stderr = os.Stderr, os.Stderr
	if err := e.server.Start(); err != nil {
		e.t.Fatal(err)
	}
	for i := 0; ; i++ {
		out, err := run(e.t, nil, "ip", "netns", "exec", e.node, "curl", "-sf", "--cacert", filepath.Join(e.dir, "ca.crt"),
			"--cert", filepath.Join(e.dir, "node.crt"), "--key", filepath.Join(e.dir, "node.key"), "https://"+listen+"/readyz")
		if err == nil {
			return
		}
		if i > 100 {
			e.t.Fatalf("server not ready: %v %s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *e2e) stopServer() {
	if e.server != nil && e.server.Process != nil {
		_ = e.server.Process.Signal(os.Interrupt)
		_ = e.server.Wait()
		e.server = nil
	}
}

func (e *e2e) cleanup() {
	e.stopServer()
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if name, _, _ := strings.Cut(line, " "); strings.HasPrefix(name, e.prefix) {
			_ = exec.Command("ip", "netns", "del", name).Run()
		}
	}
	// cnitool caches results under /var/lib/cni; drop this network's.
	matches, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", e.netName+"-*"))
	for _, m := range matches {
		_ = os.Remove(m)
	}
}

// cnitool runs cnitool in the node namespace (so the bridge lives there,
// not on the host) for the pod namespace pod.
func (e *e2e) cnitool(verb, pod string) (string, error) {
	e.t.Helper()
	return e.cnitoolOn(e.netName, verb, pod)
}

// cnitoolOn is cnitool for the network netName (a conflist in e.dir).
func (e *e2e) cnitoolOn(netName, verb, pod string) (string, error) {
	e.t.Helper()
	env := []string{"CNI_PATH=" + e.bin, "NETCONFPATH=" + e.dir,
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME=" + pod + ";K8S_POD_UID=uid-" + pod}
	out, err := run(e.t, env, "ip", "netns", "exec", e.node, filepath.Join(e.bin, "cnitool"), verb, netName, "/var/run/netns/"+e.prefix+"-"+pod)
	e.waitSync()
	return out, err
}

// waitSync waits until no background sync of the shim holds the reserve
// of TestReserveOutage (the verb that started one passed it the sync lock
// before it exited), so the service has seen what the verb left to it.
func (e *e2e) waitSync() {
	e.t.Helper()
	f, err := os.Open(filepath.Join(e.dir, "reserve", "sync.lock"))
	if err != nil {
		return // no reserve, or never synced
	}
	defer f.Close() //nolint:errcheck // read-only
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		e.t.Fatalf("the reserve's sync lock: %v", err)
	}
}

func (e *e2e) pod(name string) {
	e.t.Helper()
	must(e.t, nil, "ip", "netns", "add", e.prefix+"-"+name)
}

// leases answers the node's pending and active leases from the database.
func (e *e2e) leases() []alloc.Lease {
	e.t.Helper()
	all, _, err := e.st.ListLeases(context.Background(), alloc.LeaseFilter{Space: alloc.DefaultSpace, Node: "e2e-node"}, alloc.Page{Limit: 100})
	if err != nil {
		e.t.Fatal(err)
	}
	var held []alloc.Lease
	for _, l := range all {
		if l.State != alloc.StateCooling {
			held = append(held, l)
		}
	}
	return held
}

// The whole lifecycle of a Pod's addresses through bridge and the shim.
func TestBridgeLifecycle(t *testing.T) {
	e := setup(t)
	e.pod("pod1")
	out, err := e.cnitool("add", "pod1")
	if err != nil {
		t.Fatalf("ADD: %v\n%s", err, out)
	}
	held := e.leases()
	if len(held) != 2 {
		t.Fatalf("leases after ADD: %+v", held)
	}
	addrs := must(t, nil, "ip", "netns", "exec", e.prefix+"-pod1", "ip", "-o", "addr", "show", "dev", "eth0")
	for _, l := range held {
		if !strings.Contains(addrs, l.Prefix().String()) {
			t.Errorf("pod has no %s:\n%s", l.Prefix(), addrs)
		}
		if l.Owner.Name != "pod1" || l.Attachment.Interface != "eth0" {
			t.Errorf("lease %+v", l)
		}
	}
	if lo := must(t, nil, "ip", "netns", "exec", e.prefix+"-pod1", "ip", "-o", "link", "show", "lo"); !strings.Contains(lo, "UP") {
		t.Errorf("loopback is not up in the pod:\n%s", lo)
	}
	if out, err := e.cnitool("check", "pod1"); err != nil {
		t.Fatalf("CHECK: %v\n%s", err, out)
	}
	for range 2 {
		if out, err := e.cnitool("del", "pod1"); err != nil {
			t.Fatalf("DEL: %v\n%s", err, out)
		}
	}
	if held := e.leases(); len(held) != 0 {
		t.Fatalf("leases after DEL: %+v", held)
	}

	// With the service down, ADD fails (the shim's "try again later", 11,
	// which cnitool reports as text; the unit tests check the code) and
	// leaves nothing behind once the service is back.
	e.pod("pod2")
	e.stopServer()
	out, err = e.cnitool("add", "pod2")
	if err == nil || !strings.Contains(out, "unreachable") {
		t.Fatalf("ADD with the service down: %v\n%s", err, out)
	}
	// The shim itself, as the runtime sees it: error code 11.
	add := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "type": "bridge", "ipam": %s}`, e.netName, e.ipamSection("e2e-node"))
	if out, err := e.shim("ADD", "direct", add); err == nil || !strings.Contains(out, `"code": 11`) {
		t.Fatalf("shim ADD with the service down: %v\n%s", err, out)
	}
	e.startServer()
	if held := e.leases(); len(held) != 0 {
		t.Fatalf("leases after a failed ADD: %+v", held)
	}
	// A runtime follows a failed ADD with DEL (bridge had made the veth).
	if out, err := e.cnitool("del", "pod2"); err != nil {
		t.Fatalf("DEL after the failed ADD: %v\n%s", err, out)
	}
	if out, err := e.cnitool("add", "pod2"); err != nil {
		t.Fatalf("ADD once the service is back: %v\n%s", err, out)
	}
	if held := e.leases(); len(held) != 2 {
		t.Fatalf("leases after the retried ADD: %+v", held)
	}

	// GC with a valid list frees the stale leases only.
	ctx := context.Background()
	stale := alloc.LeaseRequest{Space: alloc.DefaultSpace, Node: "e2e-node", Owner: alloc.Owner{Namespace: "e2e", Name: "gone"},
		Attachment: alloc.Attachment{Network: e.netName, ContainerID: "stale", Interface: "eth0"}, Expire: false}
	if _, err := e.st.Allocate(ctx, stale); err != nil {
		t.Fatal(err)
	}
	pod2 := cnitoolContainerID("/var/run/netns/" + e.prefix + "-pod2")
	gc := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "type": "bridge", "ipam": %s,
		"cni.dev/valid-attachments": [{"containerID": %q, "ifname": "eth0"}]}`, e.netName, e.ipamSection("e2e-node"), pod2)
	if out, err := e.shim("GC", "", gc); err != nil {
		t.Fatalf("GC: %v\n%s", err, out)
	}
	held = e.leases()
	if len(held) != 2 || held[0].Attachment.ContainerID != pod2 || held[1].Attachment.ContainerID != pod2 {
		t.Fatalf("leases after GC: %+v", held)
	}

	// The certificate of e2e-node cannot release another node's lease.
	other := stale
	other.Node, other.Attachment.ContainerID = "other-node", "theirs"
	if _, err := e.st.Allocate(ctx, other); err != nil {
		t.Fatal(err)
	}
	del := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "type": "bridge", "ipam": %s}`, e.netName, e.ipamSection("other-node"))
	if out, err := e.shim("DEL", "theirs", del); err == nil || !strings.Contains(out, "its own node") {
		t.Fatalf("e2e-node releasing other-node's lease: %v\n%s", err, out)
	}
	if _, err := e.st.GetAttachment(ctx, alloc.DefaultSpace, "other-node", other.Attachment); err != nil {
		t.Fatalf("other-node's lease: %v", err)
	}
}

// writeConflist writes the conflist of network name: bridge br and the
// shim with ipamExtra (JSON members, may be empty) added to its section.
func (e *e2e) writeConflist(name, br, ipamExtra string) {
	e.t.Helper()
	if ipamExtra != "" {
		ipamExtra = ", " + ipamExtra
	}
	conf := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "plugins": [{
		"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
		"ipam": {"type": "ipam-shim", "server": "https://%s", "caFile": %q, "certFile": %q, "keyFile": %q, "node": "e2e-node"%s}
	}, {"type": "loopback"}]}`, name, br, listen, filepath.Join(e.dir, "ca.crt"), filepath.Join(e.dir, "node.crt"), filepath.Join(e.dir, "node.key"), ipamExtra)
	if err := os.WriteFile(filepath.Join(e.dir, name+".conflist"), []byte(conf), 0o644); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		matches, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", name+"-*"))
		for _, m := range matches {
			_ = os.Remove(m)
		}
	})
}

// Two networks on one node, two bridges: GC of one network with an empty
// valid list releases that network's leases only. It used to release every
// lease of the node, and the other network's live addresses were then
// leased to new Pods: the same address in two Pods.
func TestTwoNetworksGC(t *testing.T) {
	e := setup(t)
	labnet, cmp := e.netName+"-lab", e.netName+"-cmp"
	e.writeConflist(labnet, "cni-e2e-lab", `"reserve": 0`)
	e.writeConflist(cmp, "cni-e2e-cmp", `"reserve": 0`)
	for _, p := range []struct{ net, pod string }{{labnet, "lab1"}, {labnet, "lab2"}, {cmp, "cmp1"}} {
		e.pod(p.pod)
		if out, err := e.cnitoolOn(p.net, "add", p.pod); err != nil {
			t.Fatalf("ADD %s on %s: %v\n%s", p.pod, p.net, err, out)
		}
	}
	byNet := func() map[string][]string {
		out := map[string][]string{}
		for _, l := range e.leases() {
			out[l.Attachment.Network] = append(out[l.Attachment.Network], l.Addr.String())
		}
		return out
	}
	before := byNet()
	if len(before[labnet]) != 4 || len(before[cmp]) != 2 {
		t.Fatalf("leases by network after the ADDs: %v", before)
	}
	gc := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "type": "bridge", "ipam": %s, "cni.dev/valid-attachments": []}`,
		cmp, e.ipamSection("e2e-node"))
	if out, err := e.shim("GC", "", gc); err != nil {
		t.Fatalf("GC of %s: %v\n%s", cmp, err, out)
	}
	after := byNet()
	if len(after[cmp]) != 0 || !slices.Equal(after[labnet], before[labnet]) {
		t.Fatalf("after GC of %s with an empty list: %v, want %s's %v untouched and nothing of %s", cmp, after, labnet, before[labnet], cmp)
	}
	// New Pods on cmp get addresses no labnet Pod holds.
	held := map[string]bool{}
	for _, pod := range []string{"lab1", "lab2"} {
		got, raw := e.podAddrs(pod)
		if len(got) != 2 {
			t.Fatalf("pod %s: %s", pod, raw)
		}
		for _, a := range got {
			held[netip.MustParsePrefix(a).Addr().String()] = true
		}
	}
	for _, pod := range []string{"cmp2", "cmp3"} {
		e.pod(pod)
		if out, err := e.cnitoolOn(cmp, "add", pod); err != nil {
			t.Fatalf("ADD %s: %v\n%s", pod, err, out)
		}
		got, raw := e.podAddrs(pod)
		for _, a := range got {
			if held[netip.MustParsePrefix(a).Addr().String()] {
				t.Fatalf("pod %s on %s got %s, which a %s Pod holds:\n%s", pod, cmp, a, labnet, raw)
			}
		}
	}
	// labnet's own GC, listing its Pods, keeps them.
	var valid []string
	for _, pod := range []string{"lab1", "lab2"} {
		valid = append(valid, fmt.Sprintf(`{"containerID": %q, "ifname": "eth0"}`, cnitoolContainerID("/var/run/netns/"+e.prefix+"-"+pod)))
	}
	gc = fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "type": "bridge", "ipam": %s, "cni.dev/valid-attachments": [%s]}`,
		labnet, e.ipamSection("e2e-node"), strings.Join(valid, ","))
	if out, err := e.shim("GC", "", gc); err != nil {
		t.Fatalf("GC of %s: %v\n%s", labnet, err, out)
	}
	if got := byNet(); !slices.Equal(got[labnet], before[labnet]) || len(got[cmp]) != 4 {
		t.Fatalf("after GC of %s: %v", labnet, got)
	}
}

// Pods start and stop while the service is down: the node's reserve serves
// the ADDs, the DELs are recorded, and the first call that reaches the
// service again (the runtime's STATUS poll) hands the reserve addresses
// over to their Pods, replays the DELs and refills the reserve. The
// service then holds exactly what the Pods hold, plus the reserve's own
// leases.
func TestReserveOutage(t *testing.T) {
	e := setup(t)
	netName := e.netName + "-rsv"
	extra := fmt.Sprintf(`"reserve": 6, "dataDir": %q, "syncLinger": "0s"`, filepath.Join(e.dir, "reserve"))
	e.writeConflist(netName, "cni-e2e-rsv", extra)
	status := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "type": "bridge", "ipam": {"type": "ipam-shim", "server": "https://%s",
		"caFile": %q, "certFile": %q, "keyFile": %q, "node": "e2e-node", %s}}`, netName, listen,
		filepath.Join(e.dir, "ca.crt"), filepath.Join(e.dir, "node.crt"), filepath.Join(e.dir, "node.key"), extra)
	cid := func(pod string) string { return cnitoolContainerID("/var/run/netns/" + e.prefix + "-" + pod) }
	// split answers the service's held leases: the Pods' addresses by
	// container ID, and the reserve's slots' count.
	split := func() (map[string][]string, int) {
		pods, slots := map[string][]string{}, 0
		for _, l := range e.leases() {
			if l.Attachment.Network != netName {
				t.Fatalf("lease of another network: %+v", l)
			}
			if strings.HasPrefix(l.Attachment.ContainerID, "ipam-shim-reserve-") {
				slots++
				continue
			}
			pods[l.Attachment.ContainerID] = append(pods[l.Attachment.ContainerID], l.Prefix().String())
			slices.Sort(pods[l.Attachment.ContainerID])
		}
		return pods, slots
	}

	e.pod("warm")
	if out, err := e.cnitoolOn(netName, "add", "warm"); err != nil {
		t.Fatalf("ADD warm: %v\n%s", err, out)
	}
	if pods, slots := split(); len(pods) != 1 || slots != 12 {
		t.Fatalf("after the first ADD: pods %v and %d slot leases, want 1 pod and 6 dual-stack slots", pods, slots)
	}

	e.stopServer()
	podNames := []string{"r1", "r2", "r3", "r4", "r5"}
	inPod := map[string][]string{}
	for _, pod := range podNames {
		e.pod(pod)
		if out, err := e.cnitoolOn(netName, "add", pod); err != nil {
			t.Fatalf("ADD %s with the service down: %v\n%s", pod, err, out)
		}
		got, raw := e.podAddrs(pod)
		if len(got) != 2 {
			t.Fatalf("pod %s: %s", pod, raw)
		}
		inPod[pod] = got
	}
	for _, pod := range []string{"r2", "r4"} {
		if out, err := e.cnitoolOn(netName, "del", pod); err != nil {
			t.Fatalf("DEL %s with the service down: %v\n%s", pod, err, out)
		}
		delete(inPod, pod)
	}
	e.startServer()
	if out, err := e.shim("STATUS", "", status); err != nil {
		t.Fatalf("STATUS once the service is back: %v\n%s", err, out)
	}

	pods, slots := split()
	want := map[string][]string{cid("warm"): nil}
	want[cid("warm")], _ = e.podAddrs("warm")
	for pod, addrs := range inPod {
		want[cid(pod)] = addrs
	}
	if fmt.Sprint(pods) != fmt.Sprint(want) {
		t.Fatalf("the service holds %v for Pods, the Pods hold %v", pods, want)
	}
	if slots != 12 {
		t.Fatalf("the reserve holds %d leases after the sync, want 6 slots of 2 families", slots)
	}
	for pod := range inPod {
		if out, err := e.cnitoolOn(netName, "check", pod); err != nil {
			t.Fatalf("CHECK %s: %v\n%s", pod, err, out)
		}
	}
	l, err := e.st.GetAttachment(context.Background(), alloc.DefaultSpace, "e2e-node",
		alloc.Attachment{Network: netName, ContainerID: cid("r1"), Interface: "eth0"})
	if err != nil || l.Owner.Namespace != "e2e" || l.Owner.Name != "r1" || l.State != alloc.StateActive {
		t.Fatalf("r1 at the service: %+v %v", l, err)
	}
	for _, pod := range []string{"r1", "r3", "r5", "warm"} {
		if out, err := e.cnitoolOn(netName, "del", pod); err != nil {
			t.Fatalf("DEL %s: %v\n%s", pod, err, out)
		}
	}
	if pods, slots := split(); len(pods) != 0 || slots != 12 {
		t.Fatalf("after every DEL: pods %v, %d slot leases", pods, slots)
	}
}

// ipamSection is the shim's configuration for node, with e2e-node's
// certificate whatever the node.
func (e *e2e) ipamSection(node string) string {
	return fmt.Sprintf(`{"type": "ipam-shim", "server": "https://%s", "caFile": %q, "certFile": %q, "keyFile": %q, "node": %q, "reserve": 0}`,
		listen, filepath.Join(e.dir, "ca.crt"), filepath.Join(e.dir, "node.crt"), filepath.Join(e.dir, "node.key"), node)
}

// shim runs the plugin binary itself in the node namespace, as a runtime
// would for verbs cnitool cannot express (GC with a valid list).
func (e *e2e) shim(verb, containerID, stdin string) (string, error) {
	e.t.Helper()
	args := []string{"netns", "exec", e.node, "env", "CNI_COMMAND=" + verb, "CNI_PATH=" + e.bin}
	if containerID != "" {
		args = append(args, "CNI_CONTAINERID="+containerID, "CNI_IFNAME=eth0", "CNI_NETNS=/var/run/netns/"+e.prefix+"-pod1")
	}
	cmd := exec.Command("ip", append(args, filepath.Join(e.bin, "ipam-shim"))...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	e.waitSync()
	return string(out), err
}

// cnitoolContainerID is the container ID cnitool derives from a netns path.
func cnitoolContainerID(netns string) string {
	s := sha512.Sum512([]byte(netns))
	return fmt.Sprintf("cnitool-%x", s[:10])
}

// Dual-stack: with an IPv4 and an IPv6 pool, the Pod gets one address of
// each. The pools are single-family and the conflist names one per family.
func TestDualStackPools(t *testing.T) {
	e := setup(t)
	pools := map[ipamclient.Family]netip.Prefix{ipamclient.Ipv4: netip.MustParsePrefix("10.98.0.0/16"), ipamclient.Ipv6: netip.MustParsePrefix("fd00:98::/108")}
	for _, pool := range []string{
		`{"name": "v4", "spec": {"ipv4": {"cidrs": ["10.98.0.0/16"], "maskSize": 26}}}`,
		`{"name": "v6", "spec": {"ipv6": {"cidrs": ["fd00:98::/108"], "maskSize": 122}}}`,
	} {
		if code, body := e.api("operator", "POST", "/v1/pools", pool); code != 201 {
			t.Fatalf("create pool %s: %d %s", pool, code, body)
		}
	}
	netName := e.netName + "-ds"
	conf := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "plugins": [{
		"type": "bridge", "bridge": "cni-e2e-ds0", "isGateway": true, "ipMasq": false,
		"ipam": {"type": "ipam-shim", "server": "https://%s", "caFile": %q, "certFile": %q, "keyFile": %q, "node": "e2e-node",
		         "pools": {"ipv4": "v4", "ipv6": "v6"}, "reserve": 0}
	}, {"type": "loopback"}]}`, netName, listen, filepath.Join(e.dir, "ca.crt"), filepath.Join(e.dir, "node.crt"), filepath.Join(e.dir, "node.key"))
	if err := os.WriteFile(filepath.Join(e.dir, netName+".conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}

	e.pod("ds1")
	if out, err := e.cnitoolOn(netName, "add", "ds1"); err != nil {
		t.Fatalf("ADD: %v\n%s", err, out)
	}
	// What the service leased, read back through its API with the node's
	// certificate.
	attachment := "/v1/nodes/e2e-node/attachments/" + cnitoolContainerID("/var/run/netns/"+e.prefix+"-ds1") + "/eth0?network=" + netName
	code, body := e.api("node", "GET", attachment, "")
	var a ipamclient.Allocation
	if code != 200 {
		t.Fatalf("GET %s: %d %s", attachment, code, body)
	}
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatalf("GET %s: %v %s", attachment, err, body)
	}
	if a.State != ipamclient.Active || a.Owner.Namespace != "e2e" || a.Owner.Name != "ds1" || len(a.Addresses) != 2 {
		t.Fatalf("the service holds %s, want two active addresses owned by e2e/ds1", body)
	}
	var want []string
	gateways := map[ipamclient.Family]string{}
	for _, la := range a.Addresses {
		p, err := netip.ParsePrefix(la.Address)
		wantPool, wantBits := "v4", 26
		if la.Family == ipamclient.Ipv6 {
			wantPool, wantBits = "v6", 122
		}
		if err != nil || la.Pool != wantPool || p.Bits() != wantBits || !pools[la.Family].Contains(p.Addr()) ||
			la.SelectedBy == nil || *la.SelectedBy != ipamclient.LeaseAddressSelectedByRequest || la.Gateway == nil {
			t.Fatalf("the service leased %+v, want a /%d of pool %s chosen by the request, with a gateway", la, wantBits, wantPool)
		}
		want = append(want, p.String())
		gateways[la.Family] = *la.Gateway
	}
	if len(gateways) != 2 {
		t.Fatalf("the service leased %s, want one address of each family", body)
	}
	slices.Sort(want)
	got, raw := e.podAddrs("ds1")
	if !slices.Equal(got, want) {
		t.Fatalf("the pod's global addresses are %v, the service leased %v:\n%s", got, want, raw)
	}
	for fam, flag := range map[ipamclient.Family]string{ipamclient.Ipv4: "-4", ipamclient.Ipv6: "-6"} {
		routes := must(t, nil, "ip", "netns", "exec", e.prefix+"-ds1", "ip", flag, "route", "show", "default")
		if !strings.Contains(routes, "via "+gateways[fam]+" ") {
			t.Errorf("the pod's %s default route is not via %s:\n%s", fam, gateways[fam], routes)
		}
	}
	if out, err := e.cnitoolOn(netName, "check", "ds1"); err != nil {
		t.Fatalf("CHECK: %v\n%s", err, out)
	}

	if out, err := e.cnitoolOn(netName, "del", "ds1"); err != nil {
		t.Fatalf("DEL: %v\n%s", err, out)
	}
	if code, body := e.api("node", "GET", attachment, ""); code != 404 {
		t.Fatalf("GET %s after DEL: %d %s, want 404", attachment, code, body)
	}
	if held := e.leases(); len(held) != 0 {
		t.Fatalf("leases after DEL: %+v", held)
	}
	for _, pool := range []string{"v4", "v6"} {
		code, body := e.api("operator", "GET", "/v1/pools/"+pool, "")
		var p ipamclient.Pool
		if code != 200 || json.Unmarshal(body, &p) != nil {
			t.Fatalf("GET pool %s: %d %s", pool, code, body)
		}
		for fam, st := range map[string]*ipamclient.PoolFamilyStatus{"ipv4": p.Status.Ipv4, "ipv6": p.Status.Ipv6} {
			if st != nil && st.Leased != 0 {
				t.Errorf("pool %s %s still has %d leased after DEL", pool, fam, st.Leased)
			}
		}
	}
}

// api calls the service from the node namespace over mutual TLS with the
// certificate who ("node" or "operator"); it answers the HTTP status and
// the body.
func (e *e2e) api(who, method, path, body string) (int, []byte) {
	e.t.Helper()
	args := []string{"netns", "exec", e.node, "curl", "-sS", "-X", method, "-w", "\n%{http_code}",
		"--cacert", filepath.Join(e.dir, "ca.crt"), "--cert", filepath.Join(e.dir, who+".crt"), "--key", filepath.Join(e.dir, who+".key")}
	if body != "" {
		args = append(args, "-H", "Content-Type: application/json", "--data-binary", body)
	}
	out := must(e.t, nil, "ip", append(args, "https://"+listen+path)...)
	i := strings.LastIndexByte(out, '\n')
	code, err := strconv.Atoi(out[i+1:])
	if i < 0 || err != nil {
		e.t.Fatalf("curl %s %s: no status in %q", method, path, out)
	}
	return code, []byte(out[:i])
}

// podAddrs lists the global addresses of eth0 in the pod namespace, sorted,
// whatever their flags (a fresh IPv6 address may still be tentative), and
// the raw listing.
func (e *e2e) podAddrs(pod string) ([]string, string) {
	e.t.Helper()
	raw := must(e.t, nil, "ip", "netns", "exec", e.prefix+"-"+pod, "ip", "-o", "addr", "show", "dev", "eth0")
	var addrs []string
	for _, line := range strings.Split(raw, "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] != "inet" && f[i] != "inet6" {
				continue
			}
			p, err := netip.ParsePrefix(f[i+1])
			if err != nil {
				e.t.Fatalf("pod %s: %q in %q: %v", pod, f[i+1], line, err)
			}
			if scope := slices.Index(f, "scope"); scope > 0 && scope+1 < len(f) && f[scope+1] != "global" {
				break // link-local, host
			}
			addrs = append(addrs, p.String())
			break
		}
	}
	slices.Sort(addrs)
	return addrs, raw
}
