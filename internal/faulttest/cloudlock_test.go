// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

//go:build linux

package faulttest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
	"github.com/ipam-dev/ipam/internal/pgtest"
)

// hungEC2 is an EC2 fake whose requests hang until released (or until
// the caller gives up): a cloud endpoint that stopped answering. started
// counts the requests that reached it.
type hungEC2 struct {
	fake    *ec2fake.Server
	srv     *httptest.Server
	started atomic.Int64
	once    sync.Once
	release chan struct{}
	inst    string
}

func newHungEC2(t *testing.T) *hungEC2 {
	t.Helper()
	h := &hungEC2{fake: ec2fake.New(), release: make(chan struct{})}
	h.fake.AddSubnet(ec2fake.Subnet{ID: "subnet-0123456789abcdef0", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("10.95.0.0/24")})
	inst, _, err := h.fake.AddInstance("m5.large", "subnet-0123456789abcdef0")
	if err != nil {
		t.Fatal(err)
	}
	h.inst = inst
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.started.Add(1)
		// Read first: the server notices the caller's hang-up only once
		// the body is read. The fake reads the form from what is left.
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		select {
		case <-h.release:
			h.fake.ServeHTTP(w, r)
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { h.answer(); h.srv.Close() })
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	return h
}

// answer makes the fake answer every request, those hanging included.
func (h *hungEC2) answer() { h.once.Do(func() { close(h.release) }) }

// flags are a replica's flags for the AWS workers against h with call
// timeout timeout.
func (h *hungEC2) flags(timeout string) []string {
	return []string{"--cloud-provider", "aws", "--aws-region", "eu-west-1", "--aws-endpoint", h.srv.URL,
		"--cloud-interval", "100ms", "--cloud-cluster", "test", "--cloud-call-timeout", timeout}
}

// waitStarted waits up to 60 s for the fake to have received more than n
// requests.
func (h *hungEC2) waitStarted(t *testing.T, n int64, what string) {
	t.Helper()
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if h.started.Load() > n {
			return
		}
	}
	t.Fatalf("%s: no request reached EC2 within 60 s", what)
}

// cloudNode creates, through replica r, a cloud pool of the fake's
// instance's subnet and its node.
func cloudNode(t *testing.T, r *replica, inst string) {
	t.Helper()
	for _, c := range []struct {
		method, path string
		body         map[string]any
	}{
		{"POST", "/v1/pools", map[string]any{"name": "eni", "spec": map[string]any{
			"ipv4":  map[string]any{"cidrs": []string{"10.95.0.0/24"}, "maskSize": 28},
			"cloud": map[string]any{"provider": "aws", "watermarks": map[string]any{"preAllocate": 2}}}}},
		{"PUT", "/v1/nodes/n1", map[string]any{"providerID": "aws:///eu-west-1a/" + inst}},
	} {
		b, _ := json.Marshal(c.body)
		req, _ := http.NewRequest(c.method, r.url+c.path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("%s %s: %d %s", c.method, c.path, res.StatusCode, out)
		}
	}
}

// passes answers replica r's count of cloud passes of outcome.
func passes(t *testing.T, r *replica, outcome string) int {
	t.Helper()
	res, err := http.Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "ipam_cloud_passes_total{"); ok && strings.Contains(rest, `outcome="`+outcome+`"`) {
			n, _ := strconv.Atoi(strings.TrimSpace(rest[strings.LastIndexByte(rest, ' ')+1:]))
			return n
		}
	}
	return 0
}

// waitPasses waits up to 60 s for replica r to count at least n passes of
// outcome.
func waitPasses(t *testing.T, r *replica, outcome string, n int) {
	t.Helper()
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if passes(t, r, outcome) >= n {
			return
		}
	}
	t.Fatalf("replica %s: %d %s passes within 60 s, want %d", r.name, passes(t, r, outcome), outcome, n)
}

// TestCloudLockGoesWithAKilledHolder: the replica holding the cloud lock
// hangs in a call to EC2 (a call timeout far away) while a standby only
// skips its turns; killed, its lock goes with its database session, the
// standby takes it at its next turn and serves the node once EC2
// answers.
func TestCloudLockGoesWithAKilledHolder(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	ec2 := newHungEC2(t)
	a := startReplica(t, "a", dbURL, ec2.flags("10m")...)
	cloudNode(t, a, ec2.inst)
	ec2.waitStarted(t, 0, "the first replica's pass")
	b := startReplica(t, "b", dbURL, ec2.flags("10m")...)
	waitPasses(t, b, "standby", 5)
	sent := ec2.started.Load()
	if passes(t, b, "ok")+passes(t, b, "failed") != 0 || sent != 1 {
		t.Fatalf("while a hangs holding the lock: b ran passes, or %d requests reached EC2", sent)
	}
	a.kill()
	ec2.waitStarted(t, sent, "the standby's pass after the kill")
	ec2.answer()
	waitPasses(t, b, "ok", 1)
	if held := len(ec2.fake.Interfaces()[0].Addresses); held < 2 {
		t.Fatalf("after the handover the node's interface holds %d secondary addresses, want 2", held)
	}
}

// TestCloudLockOutlivesNoHungCall: both replicas' calls hang, each ended
// by a call timeout of 1 s: a pass holds the lock no longer than that, and
// the holder tries again only an interval later, so the lock goes from
// one live replica to the other and back, rather than staying with the
// first whose calls hang.
func TestCloudLockOutlivesNoHungCall(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	ec2 := newHungEC2(t)
	a := startReplica(t, "a", dbURL, ec2.flags("1s")...)
	cloudNode(t, a, ec2.inst)
	waitPasses(t, a, "failed", 1)
	b := startReplica(t, "b", dbURL, ec2.flags("1s")...)
	waitPasses(t, b, "failed", 1)
	// And back: neither replica keeps it.
	waitPasses(t, a, "failed", passes(t, a, "failed")+1)
	waitPasses(t, b, "failed", passes(t, b, "failed")+1)
}
