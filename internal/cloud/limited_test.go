// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cloud_test

import (
	"context"
	"net/http/httptest"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"golang.org/x/time/rate"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
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
