// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/pgtest"
	ipampki "github.com/ipam-dev/ipam/internal/pki"
	"github.com/ipam-dev/ipam/internal/store"
)

// shimBin is the plugin binary built once by TestMain.
var shimBin string

func TestMain(m *testing.M) {
	bin, err := buildShim()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build ipam-shim: %v\n", err)
		os.Exit(1)
	}
	shimBin = bin
	pgtest.Main(m, pgtest.Migrate)
}

// buildShim builds the plugin next to the test binary: under go test that
// is the go command's work directory, removed when the run ends.
func buildShim() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	// go test puts its own GOROOT/bin first in PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	out := filepath.Join(filepath.Dir(exe), pluginType)
	cmd := exec.Command(goTool, "build", "-o", out, ".")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", err
	}
	return out, nil
}

// service is one IPAM server over a database of its own.
type service struct {
	// resumed and full count the TLS requests on resumed and fully
	// handshaken connections.
	resumed, full atomic.Int64
	// requests counts every request the service answered.
	requests atomic.Int64
	srv      *httptest.Server
	url      string
	client   *ipamclient.ClientWithResponses // plain API client for setup and checks
	tls      *pki                            // nil for plain http
	// dataDir is the shim's reserve directory; the reserve is off unless
	// a test turns it on.
	dataDir string

	// gateMu guards gate, refuse and leaseLog.
	gateMu sync.Mutex
	// gate, when set, holds every request until it is closed (see hold).
	gate chan struct{}
	// refuse answers every request 503, as a service that is down.
	refuse bool
	// leaseLog records the lease requests (POST .../leases) in order.
	leaseLog []leaseCall
}

// leaseCall is one lease request the service received.
type leaseCall struct {
	ContainerID string
	FromReserve bool
}

// newService starts the real API handler over a real store, plain http or,
// with p, https requiring a client certificate signed by p's CA.
func newService(t *testing.T, p *pki) *service {
	t.Helper()
	// GC tests release leases made a moment earlier; the minimum age that
	// protects such leases in production is tested in internal/api.
	return newServiceWith(t, p, func(o *store.Options) { o.ReconcileMinAge = 0 })
}

// newServiceWith is newService with the store options set by opts (the
// cooldown is 0 unless opts sets it).
func newServiceWith(t *testing.T, p *pki, opts func(*store.Options)) *service {
	t.Helper()
	ctx := context.Background()
	o := store.DefaultOptions()
	o.Cooldown = 0
	opts(&o)
	st, err := store.Open(ctx, pgtest.NewDatabase(t), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	// Plain HTTP (p == nil) acts as admin; over TLS the certificates decide.
	h := api.NewHandler(api.StoresOf(st), api.Options{IsUnavailable: store.IsUnavailable, AnonymousRole: alloc.RoleAdmin,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	s := &service{tls: p, dataDir: t.TempDir()}
	inner := h
	h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/leases") {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var req struct {
				ContainerID string          `json:"containerID"`
				FromReserve json.RawMessage `json:"fromReserve"`
			}
			_ = json.Unmarshal(body, &req)
			s.gateMu.Lock()
			s.leaseLog = append(s.leaseLog, leaseCall{ContainerID: req.ContainerID, FromReserve: req.FromReserve != nil})
			s.gateMu.Unlock()
		}
		s.gateMu.Lock()
		gate, refuse := s.gate, s.refuse
		s.gateMu.Unlock()
		if gate != nil {
			<-gate
		}
		if refuse {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		inner.ServeHTTP(w, r)
	})
	hc := http.DefaultClient
	if p == nil {
		s.srv = httptest.NewServer(h)
	} else {
		s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.TLS.DidResume {
				s.resumed.Add(1)
			} else {
				s.full.Add(1)
			}
			h.ServeHTTP(w, r)
		}))
		s.srv.TLS = &tls.Config{
			Certificates: []tls.Certificate{p.serverCert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    p.pool,
		}
		s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the point
		s.srv.StartTLS()
		// The test's own client is an operator: it may reach every node.
		hc = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{p.operatorCert}}}}
	}
	t.Cleanup(s.srv.Close)
	s.url = s.srv.URL
	s.client, err = ipamclient.NewClientWithResponses(s.url, ipamclient.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	// Before the server closes: no request held, and the shim's
	// background sync done with the reserve directory.
	t.Cleanup(func() {
		s.open()
		waitSync(t, s.dataDir)
	})
	return s
}

// hold makes the service hold every request until open.
func (s *service) hold() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gate == nil {
		s.gate = make(chan struct{})
	}
}

// down makes the service answer every request 503 until open.
func (s *service) down() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	s.refuse = true
}

// open lets the held requests through and serves again.
func (s *service) open() {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
	s.refuse = false
}

// leaseCalls are the lease requests the service received so far.
func (s *service) leaseCalls() []leaseCall {
	s.gateMu.Lock()
	defer s.gateMu.Unlock()
	return slices.Clone(s.leaseLog)
}

// waitSync waits until no background sync of the shim holds the reserve
// in dir: a verb that started one has passed it the sync lock before it
// exits, so after waitSync the service has seen what the verb recorded.
func waitSync(t testing.TB, dir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, syncLockName)); err != nil {
		return
	}
	f, err := flockFile(dir, syncLockName, time.Minute)
	if err != nil {
		t.Fatalf("the reserve's sync in %s: %v", dir, err)
	}
	_ = f.Close()
}

// createPool creates a pool; v6 may be empty for an IPv4-only pool.
func (s *service) createPool(t *testing.T, name, v4 string, mask4 int, v6 string, mask6 int) {
	t.Helper()
	spec := ipamclient.PoolSpec{Ipv4: &ipamclient.PoolFamilySpec{Cidrs: []string{v4}, MaskSize: mask4}}
	if v6 != "" {
		spec.Ipv6 = &ipamclient.PoolFamilySpec{Cidrs: []string{v6}, MaskSize: mask6}
	}
	r, err := s.client.CreatePoolWithResponse(context.Background(), nil, ipamclient.PoolRequest{Name: name, Spec: spec})
	if err != nil || r.StatusCode() != http.StatusCreated {
		t.Fatalf("create pool %s: %v %s", name, err, r.Body)
	}
}

// createPoolSpec creates a pool of any spec (single-family, selectors).
func (s *service) createPoolSpec(t *testing.T, name string, spec ipamclient.PoolSpec) {
	t.Helper()
	r, err := s.client.CreatePoolWithResponse(context.Background(), nil, ipamclient.PoolRequest{Name: name, Spec: spec})
	if err != nil || r.StatusCode() != http.StatusCreated {
		t.Fatalf("create pool %s: %v %s", name, err, r.Body)
	}
}

// family is a pool family spec of one CIDR.
func family(cidr string, mask int) *ipamclient.PoolFamilySpec {
	return &ipamclient.PoolFamilySpec{Cidrs: []string{cidr}, MaskSize: mask}
}

// testNetwork is the name of the network configurations of netconf.
const testNetwork = "podnet"

// attachment is the service's view of one container interface of
// testNetwork; nil when it holds nothing (404).
func (s *service) attachment(t *testing.T, node, cid, ifname string) *ipamclient.Allocation {
	t.Helper()
	r, err := s.client.GetAttachmentWithResponse(context.Background(), node, cid, ifname, &ipamclient.GetAttachmentParams{Network: ptr(testNetwork)})
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode() == http.StatusNotFound {
		return nil
	}
	if r.JSON200 == nil {
		t.Fatalf("get attachment %s/%s: %d %s", cid, ifname, r.StatusCode(), r.Body)
	}
	return r.JSON200
}

// ipam is the ipam section for s on node worker-1 with a short timeout.
func (s *service) ipam(extra map[string]any) map[string]any {
	m := map[string]any{"type": pluginType, "server": s.url, "node": "worker-1", "timeout": "5s", "reserve": 0, "dataDir": s.dataDir,
		"syncLinger": "0s"} // each verb's background sync ends with it, for waitSync
	if s.tls != nil {
		m["caFile"], m["certFile"], m["keyFile"] = s.tls.caFile, s.tls.certFile, s.tls.keyFile
	}
	for k, v := range extra {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return m
}

// netconf is a network configuration with the ipam section and the
// top-level extra keys.
func netconf(t *testing.T, cniVersion string, ipam any, extra map[string]any) []byte {
	t.Helper()
	m := map[string]any{"cniVersion": cniVersion, "name": testNetwork, "type": "bridge", "ipam": ipam}
	for k, v := range extra {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// run is one run of the plugin.
type run struct {
	stdout, stderr []byte
	exit           int
}

// cniError is the error object the plugin prints.
type cniError struct {
	CNIVersion string `json:"cniVersion"`
	Code       uint   `json:"code"`
	Msg        string `json:"msg"`
	Details    string `json:"details"`
}

// shim runs the plugin with the verb, container ID, interface, extra
// environment (KEY=VALUE) and stdin. An empty verb or container leaves the
// variable unset.
func shim(t *testing.T, verb, cid, ifname string, stdin []byte, env ...string) run {
	t.Helper()
	r := shimAsync(t, verb, cid, ifname, stdin, env...)
	// What the verb left to the background sync is done too.
	var conf struct {
		IPAM struct {
			DataDir string `json:"dataDir"`
		} `json:"ipam"`
	}
	if json.Unmarshal(stdin, &conf) == nil && conf.IPAM.DataDir != "" {
		waitSync(t, conf.IPAM.DataDir)
	}
	return r
}

// shimAsync is shim without waiting for the background sync the verb
// may have started.
func shimAsync(t *testing.T, verb, cid, ifname string, stdin []byte, env ...string) run {
	t.Helper()
	cmd := exec.Command(shimBin)
	cmd.Env = []string{"CNI_PATH=/opt/cni/bin", "CNI_NETNS=/var/run/netns/none-such", "PATH=" + os.Getenv("PATH")}
	if verb != "" {
		cmd.Env = append(cmd.Env, "CNI_COMMAND="+verb)
	}
	if cid != "" {
		cmd.Env = append(cmd.Env, "CNI_CONTAINERID="+cid)
	}
	if ifname != "" {
		cmd.Env = append(cmd.Env, "CNI_IFNAME="+ifname)
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := run{stdout: stdout.Bytes(), stderr: stderr.Bytes()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.exit = ee.ExitCode()
	case err != nil:
		t.Fatalf("run shim: %v", err)
	}
	return r
}

// ok fails t unless the run succeeded; it returns stdout.
func (r run) ok(t *testing.T) []byte {
	t.Helper()
	if r.exit != 0 {
		t.Fatalf("exit %d, want 0; stdout %s", r.exit, r.stdout)
	}
	return r.stdout
}

// fails fails t unless the run exited 1 with error code; it returns the
// error object.
func (r run) fails(t *testing.T, code uint) cniError {
	t.Helper()
	var e cniError
	dec := json.NewDecoder(bytes.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("stdout is not a CNI error object: %v: %s", err, r.stdout)
	}
	if r.exit != 1 || e.Code != code {
		t.Fatalf("exit %d code %d, want exit 1 code %d: %s", r.exit, e.Code, code, r.stdout)
	}
	if e.Msg == "" || e.CNIVersion == "" {
		t.Fatalf("error object without msg or cniVersion: %s", r.stdout)
	}
	return e
}

// sameJSON fails t unless got and want hold the same JSON value.
func sameJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("output is not JSON: %v: %s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("want is not JSON: %v", err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("output\n%s\nwant\n%s", got, want)
	}
}

func dualStack(t *testing.T, p *pki) *service {
	s := newService(t, p)
	s.createPool(t, "default", "10.244.0.0/16", 24, "fd00:10:244::/104", 120)
	return s
}

var dns = map[string]any{"nameservers": []string{"10.96.0.10"}, "search": []string{"svc.cluster.local"}, "options": []string{"ndots:5"}}

func TestAddResultDualStack(t *testing.T) {
	s := dualStack(t, nil)
	conf := netconf(t, "1.1.0", s.ipam(map[string]any{"routes": []map[string]string{{"dst": "192.168.0.0/16"}}}), map[string]any{"dns": dns})
	out := shim(t, "ADD", "c1", "eth0", conf, "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_UID=7c1d2f0e;OTHER=x").ok(t)
	sameJSON(t, out, `{
		"cniVersion": "1.1.0",
		"ips": [
			{"address": "10.244.0.3/24", "gateway": "10.244.0.1"},
			{"address": "fd00:10:244::3/120", "gateway": "fd00:10:244::1"}
		],
		"routes": [
			{"dst": "0.0.0.0/0", "gw": "10.244.0.1"},
			{"dst": "::/0", "gw": "fd00:10:244::1"},
			{"dst": "192.168.0.0/16"}
		],
		"dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"], "options": ["ndots:5"]}
	}`)
	a := s.attachment(t, "worker-1", "c1", "eth0")
	if a == nil || a.State != "active" || a.Owner.Namespace != "shop" || a.Owner.Name != "web-0" || a.Owner.Uid == nil || *a.Owner.Uid != "7c1d2f0e" {
		t.Fatalf("service holds %+v, want an active lease owned by shop/web-0 (7c1d2f0e)", a)
	}

	// A retry of ADD (the shim died, the runtime runs it again): the same result.
	again := shim(t, "ADD", "c1", "eth0", conf, "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_UID=7c1d2f0e").ok(t)
	sameJSON(t, again, string(out))
}

// ADD leases active at once, in one request; a retry that finds the
// pending lease an older shim left unconfirmed confirms it, so it cannot
// expire under the running Pod.
func TestAddIsActiveAndConfirmsAPendingRetry(t *testing.T) {
	s := dualStack(t, nil)
	s.requests.Store(0)
	conf := netconf(t, "1.1.0", s.ipam(nil), nil)
	shim(t, "ADD", "c1", "eth0", conf).ok(t)
	if n := s.requests.Load(); n != 1 {
		t.Errorf("ADD sent %d requests, want 1", n)
	}
	if a := s.attachment(t, "worker-1", "c1", "eth0"); a == nil || a.State != ipamclient.Active || a.ExpiresAt != nil {
		t.Fatalf("after ADD the service holds %+v, want an active lease without expiry", a)
	}

	expire := true
	r, err := s.client.AllocateLeaseWithResponse(context.Background(), "worker-1", nil, ipamclient.LeaseRequest{
		Network: ptr(testNetwork), ContainerID: "c2", Interface: "eth0", Expire: &expire,
		Owner: ipamclient.Owner{Namespace: "cni", Name: "c2"}})
	if err != nil || r.JSON201 == nil || r.JSON201.State != ipamclient.Pending {
		t.Fatalf("pending lease: %v %s", err, r.Body)
	}
	shim(t, "ADD", "c2", "eth0", conf).ok(t)
	a := s.attachment(t, "worker-1", "c2", "eth0")
	if a == nil || a.State != ipamclient.Active || a.Generation != r.JSON201.Generation || a.Addresses[0].Address != r.JSON201.Addresses[0].Address {
		t.Fatalf("after the retry the service holds %+v, want the pending lease %+v confirmed", a, r.JSON201)
	}
}

func TestAddResultOldVersionAndOptions(t *testing.T) {
	s := dualStack(t, nil)
	conf := netconf(t, "0.3.1", s.ipam(map[string]any{"families": []string{"ipv4"}, "defaultRoute": false}), map[string]any{"dns": dns})
	out := shim(t, "ADD", "c-0.3.1", "eth0", conf).ok(t)
	sameJSON(t, out, `{
		"cniVersion": "0.3.1",
		"ips": [{"version": "4", "address": "10.244.0.3/24", "gateway": "10.244.0.1"}],
		"dns": {"nameservers": ["10.96.0.10"], "search": ["svc.cluster.local"], "options": ["ndots:5"]}
	}`)
	// No owner from the runtime: namespace "cni", the container ID as a label.
	a := s.attachment(t, "worker-1", "c-0.3.1", "eth0")
	if a == nil || a.Owner.Namespace != "cni" || a.Owner.Name != "c-0-3-1" || len(a.Addresses) != 1 {
		t.Fatalf("service holds %+v, want one address owned by cni/c-0-3-1", a)
	}
	// The owner from the configuration's args.cni.
	conf = netconf(t, "1.0.0", s.ipam(nil), map[string]any{"args": map[string]any{"cni": map[string]any{"K8S_POD_NAMESPACE": "kube-system", "K8S_POD_NAME": "dns-1", "labels": []string{"x"}}}})
	shim(t, "ADD", "c-args", "eth0", conf).ok(t)
	if a := s.attachment(t, "worker-1", "c-args", "eth0"); a == nil || a.Owner.Namespace != "kube-system" || a.Owner.Name != "dns-1" {
		t.Fatalf("service holds %+v, want owner kube-system/dns-1", a)
	}
}

func TestDel(t *testing.T) {
	s := dualStack(t, nil)
	conf := netconf(t, "1.1.0", s.ipam(nil), nil)
	prev := shim(t, "ADD", "c1", "eth0", conf).ok(t)
	var prevResult map[string]any
	if err := json.Unmarshal(prev, &prevResult); err != nil {
		t.Fatal(err)
	}
	withPrev := netconf(t, "1.1.0", s.ipam(nil), map[string]any{"prevResult": prevResult})
	if out := shim(t, "DEL", "c1", "eth0", withPrev).ok(t); len(out) != 0 {
		t.Fatalf("DEL printed %s", out)
	}
	if a := s.attachment(t, "worker-1", "c1", "eth0"); a != nil {
		t.Fatalf("after DEL the service still holds %+v", a)
	}
	shim(t, "DEL", "c1", "eth0", withPrev).ok(t)                                                          // repeated
	shim(t, "DEL", "never-added", "eth0", conf).ok(t)                                                     // nothing held, no prevResult
	shim(t, "DEL", "c1", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"node": "ghost"}), nil)).ok(t) // unknown node
	shim(t, "DEL", "c1", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"space": "nowhere"}), nil)).ok(t)
	// DEL is not required to have CNI_NETNS; CNI_IFNAME it is.
	shim(t, "DEL", "c1", "", conf).fails(t, 4)
}

func TestCheck(t *testing.T) {
	s := dualStack(t, nil)
	conf := netconf(t, "1.1.0", s.ipam(nil), nil)
	prev := shim(t, "ADD", "c1", "eth0", conf).ok(t)
	var prevResult map[string]any
	if err := json.Unmarshal(prev, &prevResult); err != nil {
		t.Fatal(err)
	}
	withPrev := netconf(t, "1.1.0", s.ipam(nil), map[string]any{"prevResult": prevResult})
	shim(t, "CHECK", "c1", "eth0", withPrev).ok(t)

	// prevResult names an address the service does not hold for c1.
	prevResult["ips"].([]any)[0].(map[string]any)["address"] = "10.244.0.99/24"
	e := shim(t, "CHECK", "c1", "eth0", netconf(t, "1.1.0", s.ipam(nil), map[string]any{"prevResult": prevResult})).fails(t, ErrCheckMismatch)
	if !strings.Contains(e.Msg, "10.244.0.99/24") || !strings.Contains(e.Msg, "10.244.0.3/24") {
		t.Fatalf("mismatch message %q names neither address", e.Msg)
	}
	// Without prevResult, CHECK cannot check.
	shim(t, "CHECK", "c1", "eth0", conf).fails(t, 7)
	// Released: not found.
	shim(t, "DEL", "c1", "eth0", conf).ok(t)
	shim(t, "CHECK", "c1", "eth0", withPrev).fails(t, ErrNotFound)
	// CHECK came with 0.4.0.
	shim(t, "CHECK", "c1", "eth0", netconf(t, "0.3.1", s.ipam(nil), map[string]any{"prevResult": prevResult})).fails(t, 1)
}

func TestGC(t *testing.T) {
	s := dualStack(t, nil)
	conf := netconf(t, "1.1.0", s.ipam(nil), nil)
	for _, cid := range []string{"keep-a", "keep-b", "stale-c", "stale-d"} {
		shim(t, "ADD", cid, "eth0", conf).ok(t)
	}
	// Without a list GC releases nothing.
	shim(t, "GC", "", "", conf).ok(t)
	valid := []map[string]string{{"containerID": "keep-a", "ifname": "eth0"}, {"containerID": "keep-b", "ifname": "eth0"}}
	shim(t, "GC", "", "", netconf(t, "1.1.0", s.ipam(nil), map[string]any{"cni.dev/valid-attachments": valid})).ok(t)
	for cid, held := range map[string]bool{"keep-a": true, "keep-b": true, "stale-c": false, "stale-d": false} {
		if a := s.attachment(t, "worker-1", cid, "eth0"); (a != nil) != held {
			t.Errorf("%s: held %v after GC, want %v", cid, a != nil, held)
		}
	}
	// The legacy key alone is honoured too.
	shim(t, "GC", "", "", netconf(t, "1.1.0", s.ipam(nil), map[string]any{"cni.dev/attachments": valid[:1]})).ok(t)
	if s.attachment(t, "worker-1", "keep-b", "eth0") != nil || s.attachment(t, "worker-1", "keep-a", "eth0") == nil {
		t.Error("GC with the legacy key did not keep exactly keep-a")
	}
	// An unknown node holds nothing.
	shim(t, "GC", "", "", netconf(t, "1.1.0", s.ipam(map[string]any{"node": "ghost"}), map[string]any{"cni.dev/valid-attachments": valid})).ok(t)
	// GC and STATUS came with 1.1.0.
	shim(t, "GC", "", "", netconf(t, "1.0.0", s.ipam(nil), map[string]any{"cni.dev/valid-attachments": valid})).fails(t, 1)
	shim(t, "STATUS", "", "", netconf(t, "1.0.0", s.ipam(nil), nil)).fails(t, 1)
}

// GC of one network reconciles that network's attachments only: two
// networks on one node, and GC of one with an empty valid list leaves the
// other's leases (once it freed them, and they were leased again).
func TestGCIsPerNetwork(t *testing.T) {
	s := dualStack(t, nil)
	named := func(name string, extra map[string]any) []byte {
		var m map[string]any
		if err := json.Unmarshal(netconf(t, "1.1.0", s.ipam(nil), extra), &m); err != nil {
			t.Fatal(err)
		}
		m["name"] = name
		b, _ := json.Marshal(m)
		return b
	}
	shim(t, "ADD", "c-lab", "eth0", named("labnet", nil)).ok(t)
	shim(t, "ADD", "c-cmp", "eth0", named("cmp", nil)).ok(t)
	// The same container and interface on a second network is a second
	// attachment with addresses of its own.
	shim(t, "ADD", "c-lab", "eth0", named("cmp", nil)).ok(t)
	get := func(network, cid string) *ipamclient.Allocation {
		r, err := s.client.GetAttachmentWithResponse(context.Background(), "worker-1", cid, "eth0", &ipamclient.GetAttachmentParams{Network: &network})
		if err != nil {
			t.Fatal(err)
		}
		return r.JSON200
	}
	lab := get("labnet", "c-lab")
	if lab == nil || get("cmp", "c-cmp") == nil || get("cmp", "c-lab") == nil {
		t.Fatal("the ADDs left no leases")
	}
	shim(t, "GC", "", "", named("cmp", map[string]any{"cni.dev/valid-attachments": []any{}})).ok(t)
	if get("cmp", "c-cmp") != nil || get("cmp", "c-lab") != nil {
		t.Fatal("GC of cmp kept cmp's leases")
	}
	after := get("labnet", "c-lab")
	if after == nil || after.Generation != lab.Generation {
		t.Fatalf("GC of cmp with an empty list released labnet's lease: %+v", after)
	}
	shim(t, "DEL", "c-lab", "eth0", named("cmp", nil)).ok(t)
	if get("labnet", "c-lab") == nil {
		t.Fatal("DEL on cmp released labnet's attachment")
	}
}

// A GC that the service's minimum age keeps from releasing says so on
// stderr (the runtime's log), with the count kept.
func TestGCKeptLogged(t *testing.T) {
	s := newServiceWith(t, nil, func(o *store.Options) { o.ReconcileMinAge = time.Hour })
	s.createPool(t, "default", "10.244.0.0/16", 24, "", 0)
	conf := netconf(t, "1.1.0", s.ipam(nil), nil)
	shim(t, "ADD", "young-a", "eth0", conf).ok(t)
	shim(t, "ADD", "young-b", "eth0", conf).ok(t)
	gc := netconf(t, "1.1.0", s.ipam(nil), map[string]any{"cni.dev/valid-attachments": []map[string]string{{"containerID": "young-a", "ifname": "eth0"}}})
	r := shim(t, "GC", "", "", gc)
	if out := r.ok(t); len(out) != 0 {
		t.Fatalf("GC printed %s", out)
	}
	if !strings.Contains(string(r.stderr), "released 0 leases and kept 1 not in the runtime's list") ||
		!strings.Contains(string(r.stderr), "--reconcile-min-age") {
		t.Fatalf("stderr %q does not say what was kept and why", r.stderr)
	}
	if s.attachment(t, "worker-1", "young-b", "eth0") == nil {
		t.Fatal("GC released a lease younger than the minimum age")
	}
	// Nothing kept: nothing said.
	all := netconf(t, "1.1.0", s.ipam(nil), map[string]any{"cni.dev/valid-attachments": []map[string]string{
		{"containerID": "young-a", "ifname": "eth0"}, {"containerID": "young-b", "ifname": "eth0"}}})
	if r := shim(t, "GC", "", "", all); len(r.ok(t)) != 0 || len(r.stderr) != 0 {
		t.Fatalf("GC keeping nothing wrote %q", r.stderr)
	}
}

func TestStatus(t *testing.T) {
	s := dualStack(t, nil)
	conf := netconf(t, "1.1.0", s.ipam(nil), nil)
	if out := shim(t, "STATUS", "", "", conf).ok(t); len(out) != 0 {
		t.Fatalf("STATUS printed %s", out)
	}
	s.srv.Close()
	shim(t, "STATUS", "", "", conf).fails(t, 11)
}

// STATUS fails with code 50 when no ADD of the configuration could get an
// address: its pool has no free address for the node and cannot carve it a
// block. It succeeds again when one is released.
func TestStatusPoolExhausted(t *testing.T) {
	s := dualStack(t, nil)
	s.createPool(t, "tiny", "10.9.0.0/29", 29, "", 0) // one block of 4 leasable addresses
	tiny := netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "tiny"}), nil)
	shim(t, "STATUS", "", "", tiny).ok(t) // worker-1 is not registered yet: it would carve the block
	for i := range 4 {
		shim(t, "ADD", fmt.Sprint("c", i), "eth0", tiny).ok(t)
	}
	shim(t, "ADD", "c4", "eth0", tiny).fails(t, ErrPoolExhausted)
	e := shim(t, "STATUS", "", "", tiny).fails(t, 50)
	if !strings.Contains(e.Msg, `pool "tiny" has no ipv4 address for node worker-1`) {
		t.Errorf("message %q does not say which pool and family", e.Msg)
	}
	// Another node could still carve a block: no, the pool has one block only.
	shim(t, "STATUS", "", "", netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "tiny", "node": "worker-2"}), nil)).fails(t, 50)
	// The default pool still serves worker-1, and a per-family pool wins over "pool".
	shim(t, "STATUS", "", "", netconf(t, "1.1.0", s.ipam(nil), nil)).ok(t)
	shim(t, "STATUS", "", "", netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "tiny", "pools": map[string]string{"ipv4": "default"}}), nil)).ok(t)
	// Asking for IPv6 of an IPv4-only pool, and a pool that does not exist.
	shim(t, "STATUS", "", "", netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "default", "pools": map[string]string{"ipv6": "tiny"}}), nil)).fails(t, 50)
	e = shim(t, "STATUS", "", "", netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "none-such"}), nil)).fails(t, 50)
	if !strings.Contains(e.Msg, "none-such") {
		t.Errorf("message %q does not name the pool", e.Msg)
	}
	// Released (the test service has no cooldown): STATUS succeeds again.
	shim(t, "DEL", "c0", "eth0", tiny).ok(t)
	shim(t, "STATUS", "", "", tiny).ok(t)
}

func TestServiceStopped(t *testing.T) {
	s := dualStack(t, nil)
	conf := netconf(t, "1.0.0", s.ipam(nil), nil)
	shim(t, "ADD", "c1", "eth0", conf).ok(t)
	s.srv.Close()
	for _, verb := range []string{"ADD", "DEL"} {
		e := shim(t, verb, "c1", "eth0", conf).fails(t, 11)
		if e.CNIVersion != "1.0.0" {
			t.Errorf("%s: error cniVersion %q, want the configuration's 1.0.0", verb, e.CNIVersion)
		}
	}
	shim(t, "GC", "", "", netconf(t, "1.1.0", s.ipam(nil), map[string]any{"cni.dev/valid-attachments": []any{}})).fails(t, 11)
}

func TestTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Accepts connections (the kernel does) and never answers.
	conf := netconf(t, "1.1.0", map[string]any{"type": pluginType, "server": "http://" + ln.Addr().String(), "node": "n", "timeout": "300ms", "reserve": 0}, nil)
	began := time.Now()
	e := shim(t, "ADD", "c1", "eth0", conf).fails(t, 11)
	if !strings.Contains(e.Msg, "timed out") || time.Since(began) > 5*time.Second {
		t.Fatalf("after %v: %+v, want a timeout", time.Since(began), e)
	}
}

func TestServiceUnavailable(t *testing.T) {
	// A service whose database is down answers 503 problem+json.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"type":"urn:ipam:problem:unavailable","title":"Service unavailable","status":503,"detail":"the database cannot be reached"}`)
	}))
	defer srv.Close()
	conf := netconf(t, "1.1.0", map[string]any{"type": pluginType, "server": srv.URL, "node": "n", "reserve": 0}, nil)
	for _, verb := range []string{"ADD", "DEL", "STATUS"} {
		e := shim(t, verb, "c1", "eth0", conf).fails(t, 11)
		if !strings.Contains(e.Msg, "the database cannot be reached") {
			t.Errorf("%s: message %q lacks the detail", verb, e.Msg)
		}
	}
}

func TestPoolExhausted(t *testing.T) {
	s := dualStack(t, nil)
	s.createPool(t, "tiny", "10.9.0.0/29", 29, "", 0)
	// Fill the pool's one block through the API.
	var detail string
	for i := 0; detail == ""; i++ {
		r, err := s.client.AllocateLeaseWithResponse(context.Background(), "worker-1", nil, ipamclient.LeaseRequest{
			ContainerID: fmt.Sprintf("fill-%d", i), Interface: "eth0", Pool: ptr("tiny"),
			Owner: ipamclient.Owner{Namespace: "t", Name: fmt.Sprintf("fill-%d", i)}})
		switch {
		case err != nil:
			t.Fatal(err)
		case r.StatusCode() == http.StatusConflict:
			detail = *r.ApplicationproblemJSON409.Detail
		case i > 8:
			t.Fatalf("a /29 still leases after %d addresses", i)
		}
	}
	e := shim(t, "ADD", "c1", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "tiny"}), nil)).fails(t, ErrPoolExhausted)
	if !strings.Contains(e.Msg, detail) || !strings.Contains(e.Details, "pool-exhausted") {
		t.Fatalf("error %+v lacks the service's detail %q", e, detail)
	}
	// An unknown pool is not found; a lease of c1 in another pool is a conflict.
	shim(t, "ADD", "c2", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "none-such"}), nil)).fails(t, ErrNotFound)
	shim(t, "ADD", "c3", "eth0", netconf(t, "1.1.0", s.ipam(nil), nil)).ok(t)
	shim(t, "ADD", "c3", "eth0", netconf(t, "1.1.0", s.ipam(nil), nil), "CNI_ARGS=K8S_POD_NAMESPACE=other;K8S_POD_NAME=pod").fails(t, ErrLeaseConflict)
}

// A node at its pool's per-node block limit gets code 101, as for a full
// pool, with the service's detail.
func TestNodeBlockLimit(t *testing.T) {
	s := dualStack(t, nil)
	one := 1
	s.createPoolSpec(t, "capped", ipamclient.PoolSpec{Ipv4: family("10.9.0.0/24", 30), MaxBlocksPerNode: &one,
		NodeLocal: &ipamclient.NodeLocalAddresses{Router: ptr(false), Health: ptr(false)}})
	for i := range 2 { // a /30 leases two addresses
		shim(t, "ADD", fmt.Sprint("c", i), "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "capped"}), nil)).ok(t)
	}
	e := shim(t, "ADD", "c2", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "capped"}), nil)).fails(t, ErrPoolExhausted)
	if !strings.Contains(e.Msg, "node block limit") || !strings.Contains(e.Details, "node-block-limit") {
		t.Fatalf("error %+v", e)
	}
}

func ptr[T any](v T) *T { return &v }

// singleFamilyPools adds an IPv4-only pool v4 and an IPv6-only pool v6 to
// a dual-stack service, with block sizes other than the default pool's.
func singleFamilyPools(t *testing.T) *service {
	s := dualStack(t, nil)
	s.createPoolSpec(t, "v4", ipamclient.PoolSpec{Ipv4: family("10.50.0.0/16", 26)})
	s.createPoolSpec(t, "v6", ipamclient.PoolSpec{Ipv6: family("fd00:50::/108", 124)})
	return s
}

// pools is the pool and the rule of each family the service holds for the
// attachment, e.g. "ipv4=v4/request ipv6=v6/request".
func (s *service) pools(t *testing.T, node, cid string) string {
	t.Helper()
	a := s.attachment(t, node, cid, "eth0")
	if a == nil {
		t.Fatalf("the service holds nothing for %s", cid)
	}
	var out []string
	for _, la := range a.Addresses {
		by := "?"
		if la.SelectedBy != nil {
			by = string(*la.SelectedBy)
		}
		out = append(out, fmt.Sprintf("%s=%s/%s", la.Family, la.Pool, by))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func TestAddPoolsPerFamily(t *testing.T) {
	s := singleFamilyPools(t)
	// A pool per family wins over "pool" (default, dual-stack): one address
	// of each family, each with its own pool's block and gateway.
	conf := netconf(t, "1.1.0", s.ipam(map[string]any{"pool": "default", "pools": map[string]string{"ipv4": "v4", "ipv6": "v6"}}), nil)
	out := shim(t, "ADD", "c1", "eth0", conf, "CNI_ARGS=K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0").ok(t)
	sameJSON(t, out, `{
		"cniVersion": "1.1.0",
		"ips": [
			{"address": "10.50.0.3/26", "gateway": "10.50.0.1"},
			{"address": "fd00:50::3/124", "gateway": "fd00:50::1"}
		],
		"routes": [
			{"dst": "0.0.0.0/0", "gw": "10.50.0.1"},
			{"dst": "::/0", "gw": "fd00:50::1"}
		]
	}`)
	if got, want := s.pools(t, "worker-1", "c1"), "ipv4=v4/request ipv6=v6/request"; got != want {
		t.Fatalf("service holds %s, want %s", got, want)
	}
	// A retry: the same result.
	sameJSON(t, shim(t, "ADD", "c1", "eth0", conf, "CNI_ARGS=K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0").ok(t), string(out))

	// A pool for one family: the other family falls to the default pool.
	conf = netconf(t, "1.0.0", s.ipam(map[string]any{"pools": map[string]string{"ipv6": "v6"}}), nil)
	out = shim(t, "ADD", "c2", "eth0", conf).ok(t)
	sameJSON(t, out, `{
		"cniVersion": "1.0.0",
		"ips": [
			{"address": "10.244.0.3/24", "gateway": "10.244.0.1"},
			{"address": "fd00:50::4/124", "gateway": "fd00:50::1"}
		],
		"routes": [
			{"dst": "0.0.0.0/0", "gw": "10.244.0.1"},
			{"dst": "::/0", "gw": "fd00:50::1"}
		]
	}`)
	if got, want := s.pools(t, "worker-1", "c2"), "ipv4=default/default ipv6=v6/request"; got != want {
		t.Fatalf("service holds %s, want %s", got, want)
	}
	// The same attachment with another pool for a family it holds: a conflict.
	e := shim(t, "ADD", "c2", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"pools": map[string]string{"ipv4": "v4", "ipv6": "v6"}}), nil)).fails(t, ErrLeaseConflict)
	if !strings.Contains(e.Msg, `pool "default"`) {
		t.Errorf("conflict message %q does not name the pool held", e.Msg)
	}

	// With families, only those; CNI 0.3.1 names the version of each address.
	conf = netconf(t, "0.3.1", s.ipam(map[string]any{"pools": map[string]string{"ipv4": "v4", "ipv6": "v6"}, "families": []string{"ipv6"}, "defaultRoute": false}), nil)
	sameJSON(t, shim(t, "ADD", "c3", "eth0", conf).ok(t), `{
		"cniVersion": "0.3.1",
		"ips": [{"version": "6", "address": "fd00:50::5/124", "gateway": "fd00:50::1"}],
		"dns": {}
	}`)

	// DEL releases both families.
	shim(t, "DEL", "c1", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"pools": map[string]string{"ipv4": "v4", "ipv6": "v6"}}), nil)).ok(t)
	if a := s.attachment(t, "worker-1", "c1", "eth0"); a != nil {
		t.Fatalf("after DEL the service still holds %+v", a)
	}

	// The service's refusals: a pool that lacks the family it is named
	// for, and a pool that does not exist.
	e = shim(t, "ADD", "c4", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"pools": map[string]string{"ipv4": "v6"}}), nil)).fails(t, ErrRejected)
	if !strings.Contains(e.Msg, `pool "v6" has no ipv4 CIDRs`) || !strings.Contains(e.Details, "invalid-input") {
		t.Errorf("IPv6-only pool named for ipv4: %+v", e)
	}
	e = shim(t, "ADD", "c4", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"pools": map[string]string{"ipv6": "none-such"}}), nil)).fails(t, ErrNotFound)
	if !strings.Contains(e.Msg, "none-such") {
		t.Errorf("unknown pool: %+v", e)
	}
	if a := s.attachment(t, "worker-1", "c4", "eth0"); a != nil {
		t.Fatalf("a refused ADD leased %+v", a)
	}
}

func TestPoolMatch(t *testing.T) {
	s := dualStack(t, nil)
	// Two IPv4 pools select every Pod of namespace shop: the synthetic
	// label is all the service knows of a Pod without Kubernetes access.
	shop := ipamclient.LabelSelector{MatchLabels: &ipamclient.Labels{"io.kubernetes.pod.namespace": "shop"}}
	s.createPoolSpec(t, "shop-a", ipamclient.PoolSpec{Ipv4: family("10.60.0.0/16", 24), PodSelector: &shop})
	s.createPoolSpec(t, "shop-b", ipamclient.PoolSpec{Ipv4: family("10.61.0.0/16", 24), PodSelector: &shop})

	// The service's own answer to the same request.
	r, err := s.client.AllocateLeaseWithResponse(context.Background(), "worker-1", nil, ipamclient.LeaseRequest{
		ContainerID: "probe", Interface: "eth0", Owner: ipamclient.Owner{Namespace: "shop", Name: "web-0"}})
	if err != nil || r.StatusCode() != http.StatusConflict || r.ApplicationproblemJSON409 == nil ||
		r.ApplicationproblemJSON409.Type != "urn:ipam:problem:pool-match" || r.ApplicationproblemJSON409.Detail == nil {
		t.Fatalf("the service answers %v %s, want 409 pool-match", err, r.Body)
	}
	detail := *r.ApplicationproblemJSON409.Detail

	conf := netconf(t, "1.1.0", s.ipam(nil), nil)
	e := shim(t, "ADD", "c1", "eth0", conf, "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_UID=u1").fails(t, ErrPoolMatch)
	if !strings.Contains(e.Msg, detail) || !strings.Contains(e.Msg, "shop-a, shop-b") || e.Details != "HTTP 409 urn:ipam:problem:pool-match" {
		t.Fatalf("error %+v lacks the service's detail %q", e, detail)
	}
	if a := s.attachment(t, "worker-1", "c1", "eth0"); a != nil {
		t.Fatalf("a pool-match failure leased %+v", a)
	}
	// The same from args.cni, the owner's other source.
	withArgs := netconf(t, "1.1.0", s.ipam(nil), map[string]any{"args": map[string]any{"cni": map[string]any{"K8S_POD_NAMESPACE": "shop", "K8S_POD_NAME": "web-1"}}})
	shim(t, "ADD", "c1", "eth0", withArgs).fails(t, ErrPoolMatch)

	// A Pod of another namespace: no selector matches, the default pool.
	shim(t, "ADD", "c2", "eth0", conf, "CNI_ARGS=K8S_POD_NAMESPACE=other;K8S_POD_NAME=web-0").ok(t)
	if got, want := s.pools(t, "worker-1", "c2"), "ipv4=default/default ipv6=default/default"; got != want {
		t.Fatalf("service holds %s, want %s", got, want)
	}
	// Naming the IPv4 pool resolves it; IPv6 matches no selector and
	// falls to the default pool.
	named := netconf(t, "1.1.0", s.ipam(map[string]any{"pools": map[string]string{"ipv4": "shop-b"}}), nil)
	out := shim(t, "ADD", "c1", "eth0", named, "CNI_ARGS=K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0").ok(t)
	sameJSON(t, out, `{
		"cniVersion": "1.1.0",
		"ips": [
			{"address": "10.61.0.3/24", "gateway": "10.61.0.1"},
			{"address": "fd00:10:244::4/120", "gateway": "fd00:10:244::1"}
		],
		"routes": [
			{"dst": "0.0.0.0/0", "gw": "10.61.0.1"},
			{"dst": "::/0", "gw": "fd00:10:244::1"}
		]
	}`)
	if got, want := s.pools(t, "worker-1", "c1"), "ipv4=shop-b/request ipv6=default/default"; got != want {
		t.Fatalf("service holds %s, want %s", got, want)
	}
}

func TestBadConfig(t *testing.T) {
	s := dualStack(t, nil)
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "x.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		ipam  any
		field string
	}{
		{"no ipam", nil, "ipam"},
		{"no server", s.ipam(map[string]any{"server": nil}), "ipam.server"},
		{"bad scheme", s.ipam(map[string]any{"server": "ftp://x"}), "ipam.server"},
		{"not a URL", s.ipam(map[string]any{"server": "::"}), "ipam.server"},
		{"wrong type", s.ipam(map[string]any{"defaultRoute": "yes"}), "ipam.defaultRoute"},
		{"family", s.ipam(map[string]any{"families": []string{"ipv5"}}), "ipam.families[0]"},
		{"family twice", s.ipam(map[string]any{"families": []string{"ipv4", "ipv4"}}), "ipam.families[1]"},
		{"no families", s.ipam(map[string]any{"families": []string{}}), "ipam.families"},
		{"timeout", s.ipam(map[string]any{"timeout": "soon"}), "ipam.timeout"},
		{"timeout range", s.ipam(map[string]any{"timeout": "1h"}), "ipam.timeout"},
		{"reserve range", s.ipam(map[string]any{"reserve": 65}), "ipam.reserve"},
		{"reserve negative", s.ipam(map[string]any{"reserve": -1}), "ipam.reserve"},
		{"dataDir relative", s.ipam(map[string]any{"dataDir": "var/lib"}), "ipam.dataDir"},
		{"route", s.ipam(map[string]any{"routes": []map[string]string{{"dst": "10.0.0.0/33"}}}), "ipam.routes[0]"},
		{"route no dst", s.ipam(map[string]any{"routes": []map[string]string{{"gw": "10.0.0.1"}}}), "ipam.routes[0].dst"},
		{"route gw family", s.ipam(map[string]any{"routes": []map[string]string{{"dst": "10.0.0.0/8", "gw": "fd00::1"}}}), "ipam.routes[0].gw"},
		{"tls with http", s.ipam(map[string]any{"caFile": notPEM}), "ipam.caFile"},
		{"https no cert", s.ipam(map[string]any{"server": "https://127.0.0.1:1"}), "ipam.certFile"},
		{"https no key", s.ipam(map[string]any{"server": "https://127.0.0.1:1", "certFile": notPEM}), "ipam.keyFile"},
		{"https bad cert", s.ipam(map[string]any{"server": "https://127.0.0.1:1", "certFile": notPEM, "keyFile": notPEM}), "ipam.certFile"},
		{"https missing cert", s.ipam(map[string]any{"server": "https://127.0.0.1:1", "certFile": "/none", "keyFile": notPEM}), "ipam.certFile"},
		{"node", s.ipam(map[string]any{"node": "a/b"}), "ipam.node"},
		{"pools family", s.ipam(map[string]any{"pools": map[string]string{"ipv5": "v5"}}), "ipam.pools.ipv5"},
		{"pools empty name", s.ipam(map[string]any{"pools": map[string]string{"ipv4": "default", "ipv6": ""}}), "ipam.pools.ipv6"},
		{"pools wrong type", s.ipam(map[string]any{"pools": "default"}), "ipam.pools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, verb := range []string{"ADD", "DEL", "STATUS"} {
				e := shim(t, verb, "c1", "eth0", netconf(t, "1.1.0", tc.ipam, nil)).fails(t, 7)
				if !strings.Contains(e.Msg, tc.field+":") {
					t.Errorf("%s: message %q does not name %s", verb, e.Msg, tc.field)
				}
			}
		})
	}
	// A key the shim does not know: CNI's code 2, unsupported field.
	for _, verb := range []string{"ADD", "DEL", "STATUS"} {
		e := shim(t, verb, "c1", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"sever": "x"}), nil)).fails(t, 2)
		if !strings.Contains(e.Msg, "ipam.sever:") {
			t.Errorf("%s: message %q does not name ipam.sever", verb, e.Msg)
		}
	}
	if a := s.attachment(t, "worker-1", "c1", "eth0"); a != nil {
		t.Fatalf("a bad configuration leased %+v", a)
	}
}

// An http:// server with every TLS key set names the same one each time
// (the first of caFile, certFile, keyFile), not one picked by map order.
func TestHTTPWithTLSKeysNamesOneField(t *testing.T) {
	conf := netconf(t, "1.1.0", map[string]any{"type": pluginType, "server": "http://127.0.0.1:1", "node": "n",
		"caFile": "/ca.crt", "certFile": "/node.crt", "keyFile": "/node.key"}, nil)
	for range 30 {
		_, err := loadConfig(conf)
		if err == nil || !strings.Contains(err.Error(), "ipam.caFile: set, but the server") {
			t.Fatalf("error %v, want ipam.caFile named", err)
		}
	}
}

func TestBadInput(t *testing.T) {
	s := dualStack(t, nil)
	conf := netconf(t, "1.1.0", s.ipam(nil), nil)
	shim(t, "", "c1", "eth0", conf).fails(t, 4)                                     // no CNI_COMMAND
	shim(t, "ADD", "", "eth0", conf).fails(t, 4)                                    // no CNI_CONTAINERID
	shim(t, "ADD", "c1", "", conf).fails(t, 4)                                      // no CNI_IFNAME
	shim(t, "ADD", "c1", "eth0", conf, "CNI_PATH=").fails(t, 4)                     // empty CNI_PATH
	shim(t, "FROB", "c1", "eth0", conf).fails(t, 4)                                 // unknown command
	shim(t, "ADD", "c1", "eth0", []byte("{not json")).fails(t, 6)                   // undecodable
	shim(t, "ADD", "c1", "eth0", netconf(t, "9.9.9", s.ipam(nil), nil)).fails(t, 1) // version
	shim(t, "ADD", "c1", "eth0", conf, "CNI_ARGS=garbage").fails(t, 4)              // CNI_ARGS without key=value
	if s.attachment(t, "worker-1", "c1", "eth0") != nil {
		t.Fatal("bad input leased an address")
	}
	// VERSION needs nothing but the command.
	out := shim(t, "VERSION", "", "", []byte(`{"cniVersion":"1.1.0"}`)).ok(t)
	sameJSON(t, out, `{"cniVersion":"1.1.0","supportedVersions":["0.3.1","0.4.0","1.0.0","1.1.0"]}`)
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t, "ca")
	s := dualStack(t, p)
	conf := netconf(t, "1.1.0", s.ipam(nil), nil)
	out := shim(t, "ADD", "c1", "eth0", conf).ok(t)
	if !bytes.Contains(out, []byte(`"10.244.0.3/24"`)) {
		t.Fatalf("ADD over mutual TLS: %s", out)
	}
	shim(t, "STATUS", "", "", conf).ok(t)

	// The service's certificate does not verify against another CA.
	other := newPKI(t, "other")
	wrongCA := netconf(t, "1.1.0", s.ipam(map[string]any{"caFile": other.caFile}), nil)
	for _, verb := range []string{"ADD", "DEL"} {
		e := shim(t, verb, "c1", "eth0", wrongCA).fails(t, ErrTLS)
		if !strings.Contains(e.Details, "certificate") {
			t.Errorf("%s: details %q do not mention the certificate", verb, e.Details)
		}
	}
	shim(t, "STATUS", "", "", wrongCA).fails(t, 50)
	// The service refuses a client certificate of another CA.
	foreign := netconf(t, "1.1.0", s.ipam(map[string]any{"certFile": other.certFile, "keyFile": other.keyFile}), nil)
	shim(t, "DEL", "c1", "eth0", foreign).fails(t, ErrTLS)
	shim(t, "STATUS", "", "", foreign).fails(t, 50)
	if s.attachment(t, "worker-1", "c1", "eth0") == nil {
		t.Fatal("a DEL that failed TLS released the lease")
	}

	// worker-1's certificate reaches worker-1 only: 403 for worker-2, and a
	// DEL refused is not a success.
	s.createLeaseOn(t, "worker-2", "c2")
	asOther := netconf(t, "1.1.0", s.ipam(map[string]any{"node": "worker-2"}), nil)
	for _, verb := range []string{"ADD", "DEL"} {
		e := shim(t, verb, "c2", "eth0", asOther).fails(t, ErrForbidden)
		if !strings.Contains(e.Msg, "own node") {
			t.Errorf("%s: message %q lacks the service's detail", verb, e.Msg)
		}
	}
	shim(t, "GC", "", "", netconf(t, "1.1.0", s.ipam(map[string]any{"node": "worker-2"}), map[string]any{"cni.dev/valid-attachments": []any{}})).fails(t, ErrForbidden)
	if s.attachment(t, "worker-2", "c2", "eth0") == nil {
		t.Fatal("worker-1's certificate released worker-2's lease")
	}
	// worker-2's own certificate may.
	shim(t, "DEL", "c2", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"node": "worker-2", "certFile": p.cert2File, "keyFile": p.key2File}), nil)).ok(t)
	if s.attachment(t, "worker-2", "c2", "eth0") != nil {
		t.Fatal("worker-2's DEL left its lease")
	}
	shim(t, "DEL", "c1", "eth0", conf).ok(t)
}

// The shim keeps the TLS session in a file next to the key (mode 0600), so
// the next process resumes it; a corrupt file costs a full handshake and is
// replaced; concurrent processes leave a readable file; "" turns it off.
func TestTLSSessionResumption(t *testing.T) {
	p := newPKI(t, "ca")
	s := dualStack(t, p)
	file := filepath.Join(filepath.Dir(p.keyFile), "ipam-shim.sessions")
	conf := netconf(t, "1.1.0", s.ipam(nil), nil)
	shim(t, "ADD", "c1", "eth0", conf).ok(t)
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("session file after ADD: %v %v, want mode 0600", fi, err)
	}
	if s.resumed.Load() != 0 || s.full.Load() == 0 {
		t.Fatalf("first call: resumed %d full %d", s.resumed.Load(), s.full.Load())
	}
	shim(t, "DEL", "c1", "eth0", conf).ok(t)
	if s.resumed.Load() != 1 {
		t.Fatalf("DEL after ADD resumed %d requests, want 1", s.resumed.Load())
	}

	// Corrupt: a full handshake, and the file is good again.
	if err := os.WriteFile(file, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	full := s.full.Load()
	shim(t, "ADD", "c2", "eth0", conf).ok(t)
	if s.full.Load() == full {
		t.Fatal("a corrupt session file resumed a session")
	}
	resumed := s.resumed.Load()
	shim(t, "DEL", "c2", "eth0", conf).ok(t)
	if s.resumed.Load() != resumed+1 {
		t.Fatal("the session file was not rewritten after a corrupt one")
	}

	// Concurrent processes: every call succeeds, the file stays readable.
	var wg sync.WaitGroup
	runs := make([]run, 8)
	for i := range runs {
		wg.Go(func() { runs[i] = shim(t, "ADD", fmt.Sprint("p", i), "eth0", conf) })
	}
	wg.Wait()
	for _, r := range runs {
		r.ok(t)
	}
	var m map[string]any
	if b, err := os.ReadFile(file); err != nil || json.Unmarshal(b, &m) != nil || len(m) != 1 {
		t.Fatalf("session file after concurrent calls: %v %q", err, b)
	}
	if tmps, _ := filepath.Glob(file + ".*.tmp"); len(tmps) != 0 {
		t.Fatalf("temporary files left: %v", tmps)
	}

	// Another node's certificate in the same directory never resumes
	// worker-1's session: the service would take it for worker-1.
	s.createLeaseOn(t, "worker-2", "w2")
	resumed = s.resumed.Load()
	as2 := netconf(t, "1.1.0", s.ipam(map[string]any{"node": "worker-2", "certFile": p.cert2File, "keyFile": p.key2File}), nil)
	shim(t, "DEL", "w2", "eth0", as2).ok(t)
	if s.resumed.Load() != resumed || s.attachment(t, "worker-2", "w2", "eth0") != nil {
		t.Fatal("worker-2's DEL resumed worker-1's session")
	}
	shim(t, "DEL", "w2", "eth0", as2).ok(t)
	if s.resumed.Load() != resumed+1 {
		t.Fatal("worker-2's second call did not resume its own session")
	}

	// Off.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	shim(t, "DEL", "p0", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"sessionCacheFile": ""}), nil)).ok(t)
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("sessionCacheFile \"\" wrote %s: %v", file, err)
	}
	// Elsewhere, and a relative path is refused.
	other := filepath.Join(t.TempDir(), "s")
	shim(t, "DEL", "p1", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"sessionCacheFile": other}), nil)).ok(t)
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("sessionCacheFile %s: %v", other, err)
	}
	shim(t, "DEL", "p1", "eth0", netconf(t, "1.1.0", s.ipam(map[string]any{"sessionCacheFile": "rel/s"}), nil)).fails(t, 7)
}

// createLeaseOn leases an address to cid/eth0 on node through the API.
func (s *service) createLeaseOn(t *testing.T, node, cid string) {
	t.Helper()
	r, err := s.client.AllocateLeaseWithResponse(context.Background(), node, nil, ipamclient.LeaseRequest{
		Network: ptr(testNetwork), ContainerID: cid, Interface: "eth0", Owner: ipamclient.Owner{Namespace: "t", Name: cid}})
	if err != nil || r.JSON201 == nil {
		t.Fatalf("lease %s on %s: %v %s", cid, node, err, r.Body)
	}
}

// pki is a throwaway CA (internal/pki, as the server's development CA)
// with a server certificate for 127.0.0.1, node certificates for worker-1
// and worker-2 and an operator certificate, as PEM files.
type pki struct {
	pool                      *x509.CertPool
	serverCert, operatorCert  tls.Certificate
	caFile, certFile, keyFile string // worker-1
	cert2File, key2File       string // worker-2
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	dir := t.TempDir()
	ca, err := ipampki.NewCA(name+" test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{pool: x509.NewCertPool(), caFile: filepath.Join(dir, "ca.crt"),
		certFile: filepath.Join(dir, "worker-1.crt"), keyFile: filepath.Join(dir, "worker-1.key"),
		cert2File: filepath.Join(dir, "worker-2.crt"), key2File: filepath.Join(dir, "worker-2.key")}
	p.pool.AddCert(ca.Cert)
	write := func(file string, data []byte) {
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(p.caFile, ipampki.EncodeCert(ca.Cert))
	pair := func(certPEM, keyPEM []byte, err error) tls.Certificate {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	p.serverCert = pair(ca.IssueServer([]string{"127.0.0.1"}, time.Hour))
	p.operatorCert = pair(ca.IssueClient("platform-team", time.Hour))
	for node, files := range map[string][2]string{"worker-1": {p.certFile, p.keyFile}, "worker-2": {p.cert2File, p.key2File}} {
		certPEM, keyPEM, err := ca.IssueNode(node, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		write(files[0], certPEM)
		write(files[1], keyPEM)
	}
	return p
}
