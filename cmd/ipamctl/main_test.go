// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/pgtest"
	"github.com/ipam-dev/ipam/internal/store"
	"github.com/ipam-dev/ipam/internal/testclock"
)

func TestMain(m *testing.M) { pgtest.Main(m, pgtest.Migrate) }

// service is the real API handler over a real store on a database of its
// own: what ipamctl talks to in these tests.
type service struct {
	url    string
	db     string // the database's connection string, to break it on purpose
	caFile string // TLS only: the CA that verifies the server
	token  string // TLS only: an admin token's secret
	clock  *testclock.Clock
	store  *store.Store
	// api is an admin client of the service, to seed it and to compare
	// ipamctl's output with the API's own answers.
	api *ipamclient.ClientWithResponses

	mu       sync.Mutex // guards requests
	requests []string   // path?query of every request, in order
}

// newService starts a service: over TLS with token authentication (an
// admin token made in the store, as `ipam-server token create` does), or
// over plain HTTP where a caller without credentials is an admin (as `make
// run`).
func newService(t *testing.T, useTLS bool) *service {
	t.Helper()
	ctx := context.Background()
	s := &service{db: pgtest.NewDatabase(t)}
	// Times come from a clock the tests move, near the real time so that
	// ages and token expiries read naturally.
	s.clock = testclock.New(time.Now().UTC().Add(-time.Hour).Truncate(time.Second))
	o := store.DefaultOptions()
	o.Now = s.clock.Now
	st, err := store.Open(ctx, s.db, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	s.store = st
	opts := api.Options{IsUnavailable: store.IsUnavailable, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if !useTLS {
		opts.AnonymousRole = alloc.RoleAdmin
	}
	h := api.NewHandler(api.StoresOf(st), opts)
	logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests = append(s.requests, r.URL.RequestURI())
		s.mu.Unlock()
		h.ServeHTTP(w, r)
	})
	cfg := ipamclient.Config{}
	if useTLS {
		srv := httptest.NewUnstartedServer(logged)
		srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the test without the CA fails a handshake on purpose
		srv.StartTLS()
		t.Cleanup(srv.Close)
		s.url = srv.URL
		s.caFile = filepath.Join(t.TempDir(), "ca.crt")
		if err := os.WriteFile(s.caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
			t.Fatal(err)
		}
		secret, hash := alloc.NewTokenSecret()
		if _, err := st.CreateToken(ctx, alloc.TokenSpec{Name: "admin", Role: alloc.RoleAdmin, TTL: 24 * time.Hour, CreatedBy: "test"}, hash); err != nil {
			t.Fatal(err)
		}
		s.token = secret
		cfg = ipamclient.Config{Server: s.url, Token: secret, CAFile: s.caFile}
	} else {
		srv := httptest.NewServer(logged)
		t.Cleanup(srv.Close)
		s.url = srv.URL
		cfg = ipamclient.Config{Server: s.url}
	}
	s.api, err = cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// requestsTo returns the requests whose path starts with prefix, and
// forgets every request logged so far.
func (s *service) requestsTo(prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, r := range s.requests {
		if strings.HasPrefix(r, prefix) {
			out = append(out, r)
		}
	}
	s.requests = nil
	return out
}

// result is one run of ipamctl.
type result struct {
	stdout, stderr string
	code           int
}

// env is the environment of a run: the service's address and credentials
// and a HOME of the test's own, so that no real config file is read.
// extra adds or, with "", removes variables.
func (s *service) env(t *testing.T, extra map[string]string) map[string]string {
	env := map[string]string{"IPAM_SERVER": s.url, "HOME": t.TempDir()}
	if s.token != "" {
		env["IPAM_TOKEN"], env["IPAM_CA_FILE"] = s.token, s.caFile
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// ctl runs ipamctl in-process with the service's environment.
func (s *service) ctl(t *testing.T, args ...string) result {
	t.Helper()
	return ctlEnv(t, s.env(t, nil), args...)
}

// ctlEnv runs ipamctl in-process with exactly env as its environment.
func ctlEnv(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb, func(k string) string { return env[k] })
	return result{out.String(), errb.String(), code}
}

// ok runs ipamctl and fails the test unless it exits 0 with nothing on
// stderr (no TTY here, so no progress either).
func (s *service) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := s.ctl(t, args...)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("ipamctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

// must fails the test unless the generated call succeeded.
func must(t *testing.T, res *http.Response, body []byte, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if err := ipamclient.Check(res, body); err != nil {
		t.Fatalf("%s %s: %v", res.Request.Method, res.Request.URL, err)
	}
}

// seeded is what seed made.
type seeded struct {
	// web0 is the IPv4 address of shop/web-0 on worker-1 (confirmed);
	// web1 of shop/web-1 on worker-1, released at released; pg0 of
	// db/pg-0 on worker-2 (pending).
	web0, web1, pg0 string // with the block's prefix length, as leases show them
	leasedWeb1      time.Time
	released        time.Time
}

// seed makes, through the API: the dual-stack pool "default" (10.244.0.0/16
// in /24 blocks, fd00:10:244::/104 in /120 blocks), the IPv4 pool "small"
// (10.250.0.0/24 in /28 blocks, 10.250.0.224-255 reserved),
// nodes worker-1 and worker-2, and leases: shop/web-0 on worker-1
// (confirmed), shop/web-1 on worker-1 (released a minute later), db/pg-0
// on worker-2 (pending).
func (s *service) seed(t *testing.T) seeded {
	t.Helper()
	ctx := context.Background()
	pool := func(name string, spec ipamclient.PoolSpec) {
		res, err := s.api.CreatePoolWithResponse(ctx, nil, ipamclient.PoolRequest{Name: name, Spec: spec})
		must(t, res.HTTPResponse, res.Body, err)
	}
	pool("default", ipamclient.PoolSpec{
		Ipv4: &ipamclient.PoolFamilySpec{Cidrs: []string{"10.244.0.0/16"}, MaskSize: 24},
		Ipv6: &ipamclient.PoolFamilySpec{Cidrs: []string{"fd00:10:244::/104"}, MaskSize: 120},
	})
	pool("small", ipamclient.PoolSpec{Ipv4: &ipamclient.PoolFamilySpec{Cidrs: []string{"10.250.0.0/24"}, MaskSize: 28,
		Pool: &[]ipamclient.PoolCIDRConfig{{Cidr: "10.250.0.0/24", ReservedRanges: &[]ipamclient.AddressRange{{Start: "10.250.0.224", End: "10.250.0.255"}}}}}})
	for _, n := range []string{"worker-1", "worker-2"} {
		res, err := s.api.PutNodeWithResponse(ctx, n, nil, ipamclient.NodeSpec{
			Labels:    &ipamclient.Labels{"topology.kubernetes.io/zone": "zone-a"},
			Addresses: &[]ipamclient.NodeAddress{{Type: "InternalIP", Address: "192.168.10." + strings.TrimPrefix(n, "worker-")}},
		})
		must(t, res.HTTPResponse, res.Body, err)
	}
	var sd seeded
	sd.web0 = s.lease(t, "worker-1", "c-web-0", "shop/web-0")
	res, err := s.api.ConfirmAttachmentWithResponse(ctx, "worker-1", "c-web-0", "eth0", nil)
	must(t, res.HTTPResponse, res.Body, err)
	s.clock.Advance(time.Minute)
	sd.leasedWeb1 = s.clock.Now()
	sd.web1 = s.lease(t, "worker-1", "c-web-1", "shop/web-1")
	s.clock.Advance(time.Minute)
	sd.released = s.clock.Now()
	s.release(t, "worker-1", "c-web-1")
	// Within the cooldown (30 s), so that web-1's address is still cooling.
	s.clock.Advance(10 * time.Second)
	sd.pg0 = s.lease(t, "worker-2", "c-pg-0", "db/pg-0")
	return sd
}

// lease leases both families to owner's eth0 and answers the IPv4 address
// as leases show it, with its block's prefix length (10.244.0.3/24).
func (s *service) lease(t *testing.T, node, container, owner string) string {
	t.Helper()
	ns, name, _ := strings.Cut(owner, "/")
	res, err := s.api.AllocateLeaseWithResponse(context.Background(), node, nil, ipamclient.LeaseRequest{
		Owner: ipamclient.Owner{Namespace: ns, Name: name}, ContainerID: container, Interface: "eth0"})
	must(t, res.HTTPResponse, res.Body, err)
	var a ipamclient.Allocation
	if err := json.Unmarshal(res.Body, &a); err != nil {
		t.Fatal(err)
	}
	for _, ad := range a.Addresses {
		if ad.Family == ipamclient.Ipv4 {
			return ad.Address
		}
	}
	t.Fatalf("no IPv4 address in %s", res.Body)
	return ""
}

func (s *service) release(t *testing.T, node, container string) {
	t.Helper()
	res, err := s.api.ReleaseAttachmentWithResponse(context.Background(), node, container, "eth0", nil)
	must(t, res.HTTPResponse, res.Body, err)
}

// ip is an address without its prefix length, as who and history take it.
func ip(addr string) string {
	a, _, _ := strings.Cut(addr, "/")
	return a
}

// sameJSON fails unless got and want encode to the same JSON: both are
// API objects decoded from JSON, ipamctl's output and the API's answer.
func sameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	g, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	w, err := json.MarshalIndent(want, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g, w) {
		t.Errorf("%s: ipamctl printed\n%s\nthe API answers\n%s", what, g, w)
	}
}

// decode decodes ipamctl's JSON output strictly.
func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %T: %v\n%s", v, err, out)
	}
	return v
}
