// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
	"github.com/ipam-dev/ipam/internal/cloud/azure/armfake"
	"github.com/ipam-dev/ipam/internal/pgtest"
)

// TestCloudCapacityWorkers runs the server with the AWS workers against
// the EC2 fake (the SDK's default credential chain, from the
// environment): a cloud pool and a node registered through the API get
// the node's pre-allocation from the cloud as its blocks, and a Pod's
// lease is one of those addresses.
func TestCloudCapacityWorkers(t *testing.T) {
	fake, flags, inst, eni0 := awsFake(t)
	base := startServer(t, pgtest.NewDatabase(t), flags...)
	send := sender(t, base)
	send("POST", "/v1/pools", map[string]any{"name": "eni", "spec": map[string]any{
		"ipv4":  map[string]any{"cidrs": []string{"10.95.0.0/24"}, "maskSize": 28},
		"cloud": map[string]any{"provider": "aws", "watermarks": map[string]any{"preAllocate": 4}},
	}}, http.StatusCreated)
	send("PUT", "/v1/nodes/n1", map[string]any{"providerID": "aws:///eu-west-1a/" + inst}, http.StatusCreated)
	deadline := time.Now().Add(30 * time.Second)
	var blocks ipamv1.BlockList
	for {
		if err := json.Unmarshal(send("GET", "/v1/nodes/n1/blocks", nil, http.StatusOK), &blocks); err != nil {
			t.Fatal(err)
		}
		if len(blocks.Items) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pre-allocation within 30 s: blocks %+v, EC2 calls: %d assigns", blocks.Items, fake.Calls("AssignPrivateIpAddresses"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	held, _ := fake.Held(eni0)
	var a ipamv1.Allocation
	body := map[string]any{"containerID": "c1", "interface": "eth0", "pool": "eni", "owner": map[string]any{"namespace": "ns", "name": "p"}}
	if err := json.Unmarshal(send("POST", "/v1/nodes/n1/leases", body, http.StatusCreated), &a); err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParsePrefix(a.Addresses[0].Address).Addr()
	if !slices.Contains(held, addr) {
		t.Fatalf("leased %v, not one the cloud gave (%v)", addr, held)
	}
	for _, b := range blocks.Items {
		if deref(b.Source) != "cloud" || !strings.HasSuffix(b.Cidr, "/32") {
			t.Fatalf("block %+v", b)
		}
	}
	// The calls and passes are metrics, by operation and outcome.
	metrics := string(send("GET", "/metrics", nil, http.StatusOK))
	for _, series := range []string{
		`ipam_cloud_api_duration_seconds_count{operation="Assign",outcome="ok",provider="aws"}`,
		`ipam_cloud_api_rate_limit_duration_seconds_count{operation="Assign",provider="aws"}`,
		`ipam_cloud_passes_total{outcome="ok",provider="aws"}`,
		`ipam_cloud_passes_total{outcome="failed",provider="aws"}`,
	} {
		v, ok := sample(metrics, series)
		if !ok || (v == "0" && !strings.Contains(series, "failed")) {
			t.Errorf("%s: %q, %v", series, v, ok)
		}
	}
}

// awsFake serves an EC2 fake with one m5.large in subnet
// 10.95.0.0/24, gives the SDK's default chain static credentials from
// the environment, and answers the fake, the server flags that run the
// AWS workers against it (a pass every 50ms), the instance and its first
// interface.
func awsFake(t *testing.T) (fake *ec2fake.Server, flags []string, inst, eni0 string) {
	t.Helper()
	fake = ec2fake.New()
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-0123456789abcdef0", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("10.95.0.0/24")})
	inst, eni0, err := fake.AddInstance("m5.large", "subnet-0123456789abcdef0")
	if err != nil {
		t.Fatal(err)
	}
	ec2srv := httptest.NewServer(fake)
	t.Cleanup(ec2srv.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", t.TempDir()+"/none")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", t.TempDir()+"/none")
	flags = []string{"--cloud-provider", "aws", "--aws-region", "eu-west-1",
		"--aws-endpoint", ec2srv.URL, "--cloud-interval", "50ms", "--cloud-cluster", "test"}
	return fake, flags, inst, eni0
}

// sender answers a function that sends body as JSON to the server at
// base and answers the response's body, failing t unless its status is
// want.
func sender(t *testing.T, base string) func(method, path string, body any, want int) []byte {
	return func(method, path string, body any, want int) []byte {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, base+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out bytes.Buffer
		_, _ = out.ReadFrom(res.Body)
		if res.StatusCode != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, res.StatusCode, out.String(), want)
		}
		return out.Bytes()
	}
}

// TestCloudCapacityWorkersAzure runs the server with the Azure workers
// against the ARM fake as a private cloud (--azure-endpoint,
// --azure-authority-host, --azure-ca-file), signing in as
// DefaultAzureCredential does from AZURE_CLIENT_SECRET: the fake issues
// the token and ARM refuses requests without one. A scale set node
// registered through the API gets its pre-allocation as IP
// configurations, recorded as its blocks; later passes list its scale
// set rather than reading the node; a Pod leases one of its addresses.
func TestCloudCapacityWorkersAzure(t *testing.T) {
	fake := armfake.New()
	subnet := armfake.SubnetID("MC_rg_cluster", "vnet", "nodes")
	fake.AddSubnet(subnet, netip.MustParsePrefix("10.97.0.0/24"))
	vm, nic, err := fake.AddScaleSetVM("MC_rg_cluster", "pool1", "0", subnet, true)
	if err != nil {
		t.Fatal(err)
	}
	armsrv := httptest.NewTLSServer(fake)
	defer armsrv.Close()
	fake.SetBase(armsrv.URL)
	fake.SetClient("00000000-0000-0000-0000-0000000000c1", "s3cret")
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: armsrv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AZURE_TENANT_ID", armfake.Tenant)
	t.Setenv("AZURE_CLIENT_ID", "00000000-0000-0000-0000-0000000000c1")
	t.Setenv("AZURE_CLIENT_SECRET", "s3cret")
	for _, k := range []string{"AZURE_FEDERATED_TOKEN_FILE", "AZURE_TOKEN_CREDENTIALS", "AZURE_CLIENT_CERTIFICATE_PATH", "AZURE_AUTHORITY_HOST"} {
		t.Setenv(k, "") // restored after the test
		os.Unsetenv(k)
	}
	base := startServer(t, pgtest.NewDatabase(t), "--cloud-provider", "azure", "--azure-subscription", armfake.Subscription,
		"--azure-endpoint", armsrv.URL, "--azure-authority-host", armsrv.URL, "--azure-ca-file", ca,
		"--cloud-interval", "50ms", "--cloud-cluster", "test")
	send := sender(t, base)
	send("POST", "/v1/pools", map[string]any{"name": "nics", "spec": map[string]any{
		"ipv4":  map[string]any{"cidrs": []string{"10.97.0.0/24"}, "maskSize": 28},
		"cloud": map[string]any{"provider": "azure", "watermarks": map[string]any{"preAllocate": 3}},
	}}, http.StatusCreated)
	// As AKS's kubelet writes it: the group lower-cased.
	send("PUT", "/v1/nodes/n1", map[string]any{"providerID": "azure://" + strings.Replace(vm, "MC_rg_cluster", "mc_rg_cluster", 1)}, http.StatusCreated)
	deadline := time.Now().Add(30 * time.Second)
	var blocks ipamv1.BlockList
	for {
		if err := json.Unmarshal(send("GET", "/v1/nodes/n1/blocks", nil, http.StatusOK), &blocks); err != nil {
			t.Fatal(err)
		}
		// Blocks, and a later pass that listed the scale set's NICs.
		if len(blocks.Items) == 3 && fake.Calls(http.MethodGet, "pool1/networkInterfaces") > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("within 30 s: blocks %+v, %d tokens, %d set listings", blocks.Items, fake.Tokens(), fake.Calls(http.MethodGet, "pool1/networkInterfaces"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if fake.Tokens() < 1 {
		t.Fatal("ARM was reached without a token from the authority")
	}
	given := map[netip.Addr]bool{}
	for _, a := range fake.Addresses(nic) {
		given[a] = true
	}
	var a ipamv1.Allocation
	body := map[string]any{"containerID": "c1", "interface": "eth0", "pool": "nics", "owner": map[string]any{"namespace": "ns", "name": "p"}}
	if err := json.Unmarshal(send("POST", "/v1/nodes/n1/leases", body, http.StatusCreated), &a); err != nil {
		t.Fatal(err)
	}
	if addr := netip.MustParsePrefix(a.Addresses[0].Address).Addr(); !given[addr] {
		t.Fatalf("leased %v, not one Azure gave (%v)", addr, given)
	}
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func TestCloudFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // "" when valid
	}{
		{nil, ""},
		{[]string{"--cloud-provider", "aws", "--aws-region", "eu-west-1"}, ""},
		{[]string{"--cloud-provider", "azure", "--azure-subscription", "00000000-0000-0000-0000-000000000001"}, ""},
		{[]string{"--cloud-provider", "gcp"}, "cloud-provider must be aws or azure"},
		{[]string{"--cloud-provider", "aws"}, "needs aws-region"},
		{[]string{"--cloud-provider", "azure"}, "needs azure-subscription"},
		{[]string{"--cloud-provider", "azure", "--azure-subscription", "s", "--azure-cloud", "china"}, ""},
		{[]string{"--cloud-provider", "azure", "--azure-subscription", "s", "--azure-cloud", "mars"}, "azure-cloud must be public, china or usgovernment"},
		{[]string{"--cloud-provider", "azure", "--azure-subscription", "s", "--azure-endpoint", "https://arm.local"}, "go together"},
		{[]string{"--cloud-provider", "azure", "--azure-subscription", "s", "--azure-endpoint", "http://arm.local", "--azure-authority-host", "https://login.local"}, "azure-endpoint must be an https URL"},
		{[]string{"--cloud-provider", "azure", "--azure-subscription", "s", "--azure-endpoint", "https://arm.local", "--azure-authority-host", "login.local"}, "azure-authority-host must be an https URL"},
		{[]string{"--cloud-provider", "azure", "--azure-subscription", "s", "--azure-endpoint", "https://arm.local", "--azure-authority-host", "https://login.local"}, ""},
		{[]string{"--cloud-provider", "aws", "--aws-region", "r", "--cloud-interval", "0s"}, "cloud-interval must be positive"},
		{[]string{"--cloud-provider", "aws", "--aws-region", "r", "--cloud-qps", "0"}, "cloud-qps must be positive"},
		{[]string{"--cloud-provider", "aws", "--aws-region", "r", "--cloud-cluster", ""}, "cloud-cluster must name the cluster"},
		{[]string{"--cloud-provider", "aws", "--aws-region", "r", "--cloud-call-timeout", "0s"}, "cloud-call-timeout must be positive"},
		{[]string{"--cloud-provider", "aws", "--aws-region", "r", "--cloud-parallel", "0"}, "cloud-parallel must be at least 1"},
		{[]string{"--cloud-provider", "aws", "--aws-region", "r", "--cloud-call-timeout", "5s", "--cloud-parallel", "50"}, ""},
	} {
		cfg, err := parseConfig("serve", c.args, func(string) string { return "" })
		if err == nil {
			err = cfg.Validate()
		}
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
