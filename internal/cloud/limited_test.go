package cloud_test

import (
	"context"
	"net/http/httptest"
	"net/netip"
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

// TestLimitedSpendsOneBucket: every call takes a token first; once the
// bucket is empty a call whose context cannot wait for the next token
// fails without reaching the cloud.
func TestLimitedSpendsOneBucket(t *testing.T) {
	fake := ec2fake.New()
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-a", VPC: "vpc-1", Zone: "z", CIDR: netip.MustParsePrefix("10.0.0.0/24")})
	inst, eni, err := fake.AddInstance("m5.large", "subnet-a")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(fake)
	defer srv.Close()
	client := ec2.New(ec2.Options{Region: "eu-west-1", BaseEndpoint: sdkaws.String(srv.URL), HTTPClient: srv.Client(),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")})
	// Eight tokens, and the next one in a day.
	bucket := rate.NewLimiter(rate.Every(24*time.Hour), 8)
	provider := aws.New(client, aws.Options{})
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
