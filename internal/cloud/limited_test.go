// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azcloud "github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"golang.org/x/time/rate"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
	"github.com/ipam-dev/ipam/internal/cloud/azure"
	"github.com/ipam-dev/ipam/internal/cloud/azure/armfake"
)

// ec2World is an EC2 fake with one m5.large in subnet-a, and the AWS
// provider on the real SDK calling it.
func ec2World(t *testing.T) (fake *ec2fake.Server, provider *aws.Provider, inst, eni string) {
	t.Helper()
	fake = ec2fake.New()
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-a", VPC: "vpc-1", Zone: "z", CIDR: netip.MustParsePrefix("10.0.0.0/24")})
	inst, eni, err := fake.AddInstance("m5.large", "subnet-a")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(fake)
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{Region: "eu-west-1", BaseEndpoint: sdkaws.String(srv.URL), HTTPClient: aws.SafeBodies(srv.Client()),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")})
	return fake, aws.New(client, aws.Options{}), inst, eni
}

// TestLimitedSpendsOneBucket: every call takes a token first; once the
// bucket is empty a call whose context cannot wait for the next token
// fails without reaching the cloud.
func TestLimitedSpendsOneBucket(t *testing.T) {
	fake, provider, inst, eni := ec2World(t)
	// Eight tokens, and the next one in a day.
	bucket := rate.NewLimiter(rate.Every(24*time.Hour), 8)
	p, m, inv := cloud.NewLimited(provider, bucket), cloud.NewLimitedInterfaces(provider, bucket), cloud.NewLimitedInventory(provider, bucket)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A listing takes two.
	if got, err := inv.Instances(ctx, "vpc-1"); err != nil || len(got) != 1 {
		t.Fatalf("listed %v, %v", got, err)
	}
	if _, err := p.Assign(ctx, eni, 1, false); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Subnets(ctx, "vpc-1", "z"); err != nil {
		t.Fatal(err)
	}
	// A create takes four tokens at once: the last four.
	if _, err := m.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 1}); err != nil {
		t.Fatal(err)
	}
	calls := fake.Calls("AssignPrivateIpAddresses") + fake.Calls("DescribeInstances")
	if _, err := p.Assign(ctx, eni, 1, false); err == nil {
		t.Fatal("a call past the bucket went through")
	}
	if _, err := p.Instance(ctx, inst); err == nil {
		t.Fatal("a call past the bucket went through")
	}
	if err := m.DeleteInterface(ctx, "eni-x"); err == nil {
		t.Fatal("a call past the bucket went through")
	}
	if _, err := inv.Instances(ctx, "vpc-1"); err == nil {
		t.Fatal("a listing past the bucket went through")
	}
	if got := fake.Calls("AssignPrivateIpAddresses") + fake.Calls("DescribeInstances"); got != calls {
		t.Fatalf("%d calls reached EC2 past the bucket", got-calls)
	}
}

// recorder is a CallObserver keeping what it heard.
type recorder struct {
	mu    sync.Mutex
	calls []string // "op kind" ("ok" for no error, "ctx" when it never reached the cloud)
}

func (r *recorder) ObserveCall(op string, waited, took time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	outcome := "ok"
	switch {
	case err != nil && took == 0:
		outcome = "ctx"
	case err != nil:
		outcome = cloud.KindOf(err).String()
	}
	r.calls = append(r.calls, op+" "+outcome)
}

// TestLimitedObserves: the observer hears of every call, by operation,
// with its error's kind, and of a call the bucket kept from the cloud.
func TestLimitedObserves(t *testing.T) {
	_, provider, _, eni := ec2World(t)
	bucket := rate.NewLimiter(rate.Every(24*time.Hour), 4)
	var rec recorder
	p := cloud.NewLimited(provider, bucket, cloud.WithObserver(&rec))
	inv := cloud.NewLimitedInventory(provider, bucket, cloud.WithObserver(&rec))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.Assign(ctx, eni, 1, false); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Instance(ctx, "i-0000000000000dead"); cloud.KindOf(err) != cloud.KindNotFound {
		t.Fatalf("an unknown instance: %v", err)
	}
	if _, err := inv.Instances(ctx, "vpc-1"); err != nil {
		t.Fatal(err)
	}
	if err := p.Unassign(ctx, eni, nil, nil); err == nil {
		t.Fatal("a call past the bucket went through")
	}
	want := []string{"Assign ok", "Instance " + cloud.KindNotFound.String(), "Instances ok", "Unassign ctx"}
	if !slices.Equal(rec.calls, want) {
		t.Fatalf("observed %v, want %v", rec.calls, want)
	}
}

// budgetWorld is an EC2 fake with two m5.large in subnet-a behind a
// server counting every HTTP request, and the AWS provider on the real
// SDK (three attempts a call) sending its requests through a Budget of
// bucket.
func budgetWorld(t *testing.T, bucket *rate.Limiter) (fake *ec2fake.Server, provider *aws.Provider, inst, eni string, requests *atomic.Int64) {
	t.Helper()
	fake = ec2fake.New()
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-a", VPC: "vpc-1", Zone: "z", CIDR: netip.MustParsePrefix("10.0.0.0/24")})
	inst, eni, err := fake.AddInstance("m5.large", "subnet-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := fake.AddInstance("m5.large", "subnet-a"); err != nil {
		t.Fatal(err)
	}
	requests = &atomic.Int64{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{Region: "eu-west-1", BaseEndpoint: sdkaws.String(srv.URL), HTTPClient: cloud.NewBudget(srv.Client(), bucket),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 3
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		})})
	return fake, aws.New(client, aws.Options{Wait: func(int) time.Duration { return 0 }}), inst, eni, requests
}

// spent answers the whole tokens bucket gave since it held full.
func spent(bucket *rate.Limiter) int {
	return bucket.Burst() - int(math.Floor(bucket.Tokens()+1e-6))
}

// TestBudgetTakesATokenPerRequest: the bucket counts what EC2 counts,
// one token a request: a create of several requests (create, attach,
// attribute change) takes as many, a listing of several pages one a
// page, a throttled request the SDK retries one more; the limited
// wrappers without a bucket of their own take none beside.
func TestBudgetTakesATokenPerRequest(t *testing.T) {
	bucket := rate.NewLimiter(rate.Every(24*time.Hour), 1000)
	fake, provider, inst, eni, requests := budgetWorld(t, bucket)
	p, m, inv := cloud.NewLimited(provider, nil), cloud.NewLimitedInterfaces(provider, nil), cloud.NewLimitedInventory(provider, nil)
	ctx := t.Context()
	check := func(what string, atLeast int) {
		t.Helper()
		if got, sent := spent(bucket), int(requests.Load()); got != sent || sent < atLeast {
			t.Fatalf("%s: %d tokens for %d requests, want one a request and at least %d requests", what, got, sent, atLeast)
		}
	}
	if _, err := p.Assign(ctx, eni, 1, false); err != nil {
		t.Fatal(err)
	}
	check("an assign", 1)
	if _, err := m.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 1}); err != nil {
		t.Fatal(err)
	}
	check("an assign and a create", 1+3)
	fake.SetPageSize(1)
	before := requests.Load()
	if got, err := inv.Instances(ctx, "vpc-1"); err != nil || len(got) != 2 {
		t.Fatalf("listed %v, %v", got, err)
	}
	check("a listing of pages of one", int(before)+4)
	throttled := 0
	fake.SetFault(func(action string) *ec2fake.APIError {
		if action == "AssignPrivateIpAddresses" && throttled < 2 {
			throttled++
			return ec2fake.Throttled()
		}
		return nil
	})
	before = requests.Load()
	if _, err := p.Assign(ctx, eni, 1, false); err != nil {
		t.Fatal(err)
	}
	check("an assign retried twice", int(before)+3)
}

// TestBudgetKeepsRequestsFromTheCloud: once the bucket is empty a
// request whose call's context ends first is never sent, and the
// observer hears of the call as kept from the cloud.
func TestBudgetKeepsRequestsFromTheCloud(t *testing.T) {
	bucket := rate.NewLimiter(rate.Every(24*time.Hour), 1)
	_, provider, _, eni, requests := budgetWorld(t, bucket)
	var rec recorder
	p := cloud.NewLimited(provider, nil, cloud.WithObserver(&rec), cloud.WithCallTimeout(50*time.Millisecond))
	if _, err := p.Assign(t.Context(), eni, 1, false); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Assign(t.Context(), eni, 1, false); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call past the bucket: %v", err)
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("%d requests reached EC2, want the one the bucket allowed", n)
	}
	if want := []string{"Assign ok", "Assign ctx"}; !slices.Equal(rec.calls, want) {
		t.Fatalf("observed %v, want %v", rec.calls, want)
	}
}

type staticToken struct{}

func (staticToken) GetToken(context.Context, policy.TokenRequestOptions) (azcore.AccessToken, error) {
	return azcore.AccessToken{Token: "token", ExpiresOn: time.Now().Add(time.Hour)}, nil
}

// TestBudgetAzure: the ARM clients of a subscription, network's and
// compute's, spend one bucket, a token a request: a scale set VM's
// address is a read of its NIC, the VM's update and the polls of its
// operation, and a 429 the SDK retries is one request more.
func TestBudgetAzure(t *testing.T) {
	bucket := rate.NewLimiter(rate.Every(24*time.Hour), 1000)
	fake := armfake.New()
	subnet := armfake.SubnetID("rg", "vnet", "nodes")
	fake.AddSubnet(subnet, netip.MustParsePrefix("10.41.0.0/24"))
	_, nic, err := fake.AddScaleSetVM("rg", "pool1", "0", subnet, false)
	if err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	fake.SetBase(srv.URL)
	p, err := azure.New(armfake.Subscription, staticToken{}, &arm.ClientOptions{ClientOptions: policy.ClientOptions{
		Cloud: azcloud.Configuration{ActiveDirectoryAuthorityHost: srv.URL, Services: map[azcloud.ServiceName]azcloud.ServiceConfiguration{
			azcloud.ResourceManager: {Endpoint: srv.URL, Audience: "https://management.core.windows.net/"},
		}},
		Transport: cloud.NewBudget(srv.Client(), bucket),
		Retry:     policy.RetryOptions{MaxRetries: 2, RetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond},
	}})
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	fake.SetFault(func(method, path string) *armfake.Error {
		if method == http.MethodPut && refused < 1 {
			refused++
			return armfake.Throttled()
		}
		return nil
	})
	l := cloud.NewLimited(p, nil)
	if got, err := l.Assign(t.Context(), nic, 1, false); err != nil || len(got.Addresses) != 1 {
		t.Fatalf("assigned %v, %v", got, err)
	}
	if got, sent := spent(bucket), int(requests.Load()); got != sent || sent < 4 {
		t.Fatalf("%d tokens for %d requests, want one a request and at least 4 (a read, a refused write, the write, a poll)", got, sent)
	}
}
