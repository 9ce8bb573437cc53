// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"

	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// client serves fake over TLS and answers the real EC2 client calling
// it, with attempts tries per call, no wait between them and no retry
// quota (a loop of faults would drain the SDK's).
func client(t *testing.T, fake *ec2fake.Server, attempts int) *ec2.Client {
	t.Helper()
	srv := httptest.NewTLSServer(fake)
	t.Cleanup(srv.Close)
	t.Cleanup(fake.Close) // runs first: held answers end, then the server
	return ec2.New(ec2.Options{
		Region:       "eu-west-1",
		BaseEndpoint: sdkaws.String(srv.URL),
		HTTPClient:   aws.SafeBodies(srv.Client()),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = attempts
			o.RateLimiter = ratelimit.None
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		}),
	})
}

// world is subnet-a (10.0.0.0/24) with an m5.large and its primary
// interface.
func world(t *testing.T) (fake *ec2fake.Server, inst, eni string) {
	t.Helper()
	fake = ec2fake.New()
	fake.AddSubnet(ec2fake.Subnet{ID: "subnet-a", VPC: "vpc-1", Zone: "eu-west-1a", CIDR: netip.MustParsePrefix("10.0.0.0/24")})
	inst, eni, err := fake.AddInstance("m5.large", "subnet-a")
	if err != nil {
		t.Fatal(err)
	}
	return fake, inst, eni
}

// once answers a hook faulting the first call of action with f.
func once(action string, f ec2fake.AfterFault) func(string) ec2fake.AfterFault {
	done := false
	return func(a string) ec2fake.AfterFault {
		if a != action || done {
			return ec2fake.AfterFault{}
		}
		done = true
		return f
	}
}

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func assign(ctx context.Context, c *ec2.Client, eni string, n int32) (*ec2.AssignPrivateIpAddressesOutput, error) {
	return c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: sdkaws.String(eni), SecondaryPrivateIpAddressCount: sdkaws.Int32(n)})
}

// TestAfterFaultUnassignRetriedNotAssigned: a 500 after the unassign was
// applied; the SDK's retry finds the address gone and EC2 answers
// InvalidParameterValue "not assigned", though the unassign took effect.
func TestAfterFaultUnassignRetriedNotAssigned(t *testing.T) {
	for _, f := range []ec2fake.AfterFault{
		{Kind: ec2fake.FaultError},
		{Kind: ec2fake.FaultError, Err: ec2fake.ServiceUnavailable()},
		{Kind: ec2fake.FaultCut},
		{Kind: ec2fake.FaultLost, Hold: time.Millisecond},
	} {
		t.Run(string(f.Kind), func(t *testing.T) {
			fake, _, eni := world(t)
			c := client(t, fake, 3)
			ctx := context.Background()
			out, err := assign(ctx, c, eni, 2)
			if err != nil {
				t.Fatal(err)
			}
			addr := sdkaws.ToString(out.AssignedPrivateIpAddresses[0].PrivateIpAddress)
			fake.SetAfterFault(once("UnassignPrivateIpAddresses", f))
			_, err = c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: sdkaws.String(eni), PrivateIpAddresses: []string{addr}})
			if apiCode(err) != "InvalidParameterValue" || !strings.Contains(err.Error(), "not assigned") {
				t.Fatalf("unassign: %v, want InvalidParameterValue not assigned", err)
			}
			held, _ := fake.Held(eni)
			if len(held) != 1 || held[0].String() == addr {
				t.Fatalf("held %v: %s should be gone, the other kept", held, addr)
			}
			if got := fake.Calls("UnassignPrivateIpAddresses"); got != 2 {
				t.Fatalf("%d unassign calls, want 2 (one retry)", got)
			}
			if got := fake.Faults(f.Kind); got != 1 {
				t.Fatalf("%d %s faults, want 1", got, f.Kind)
			}
		})
	}
}

// TestAfterFaultAssignRetriedAssignsTwice: an assign cut after it was
// applied is retried by the SDK and applied again: the interface holds
// both sets, the caller learns of the second only.
func TestAfterFaultAssignRetriedAssignsTwice(t *testing.T) {
	fake, _, eni := world(t)
	c := client(t, fake, 3)
	fake.SetAfterFault(once("AssignPrivateIpAddresses", ec2fake.AfterFault{Kind: ec2fake.FaultCut}))
	out, err := assign(context.Background(), c, eni, 2)
	if err != nil {
		t.Fatal(err)
	}
	held, _ := fake.Held(eni)
	if len(out.AssignedPrivateIpAddresses) != 2 || len(held) != 4 {
		t.Fatalf("answered %d, held %v: want 2 answered and 4 held", len(out.AssignedPrivateIpAddresses), held)
	}
}

// TestAfterFaultDetachRetried: a detach cut after it was applied is
// retried: while the interface detaches the retry answers true again;
// once detached, a detach of the attachment answers
// InvalidAttachmentID.NotFound.
func TestAfterFaultDetachRetried(t *testing.T) {
	fake, inst, _ := world(t)
	c := client(t, fake, 3)
	ctx := context.Background()
	eni1, err := fake.AttachInterface(inst, "subnet-a", 1)
	if err != nil {
		t.Fatal(err)
	}
	att := attachment(t, c, eni1)
	fake.SetAfterFault(once("DetachNetworkInterface", ec2fake.AfterFault{Kind: ec2fake.FaultCut}))
	if _, err := c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: sdkaws.String(att)}); err != nil {
		t.Fatalf("detach retried while detaching: %v", err)
	}
	if n := fake.Calls("DetachNetworkInterface"); n != 2 {
		t.Fatalf("%d detach calls, want 2", n)
	}
	fake.FinishDetaches()
	fake.SetAfterFault(once("DetachNetworkInterface", ec2fake.AfterFault{Kind: ec2fake.FaultError}))
	_, err = c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: sdkaws.String(att)})
	if apiCode(err) != "InvalidAttachmentID.NotFound" {
		t.Fatalf("detach of a detached interface: %v, want InvalidAttachmentID.NotFound", err)
	}
}

func attachment(t *testing.T, c *ec2.Client, eni string) string {
	t.Helper()
	out, err := c.DescribeNetworkInterfaces(context.Background(), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eni}})
	if err != nil || len(out.NetworkInterfaces) != 1 || out.NetworkInterfaces[0].Attachment == nil {
		t.Fatalf("describe %s: %v", eni, err)
	}
	return sdkaws.ToString(out.NetworkInterfaces[0].Attachment.AttachmentId)
}

// TestAfterFaultHang: a held answer arrives late but whole; a caller
// that gives up first sees its deadline, the change applied all the
// same, and the next call is served.
func TestAfterFaultHang(t *testing.T) {
	fake, _, eni := world(t)
	c := client(t, fake, 1)
	fake.SetAfterFault(once("AssignPrivateIpAddresses", ec2fake.AfterFault{Kind: ec2fake.FaultHang, Hold: 10 * time.Millisecond}))
	out, err := assign(context.Background(), c, eni, 1)
	if err != nil || len(out.AssignedPrivateIpAddresses) != 1 {
		t.Fatalf("held assign: %v", err)
	}
	for _, kind := range []ec2fake.FaultKind{ec2fake.FaultHang, ec2fake.FaultLost} {
		// Held until the caller gives up, which it does once the fake
		// applied the call: no race with a deadline.
		applied := make(chan struct{}, 1)
		hook := once("AssignPrivateIpAddresses", ec2fake.AfterFault{Kind: kind})
		fake.SetAfterFault(func(action string) ec2fake.AfterFault {
			f := hook(action)
			if f.Kind != ec2fake.FaultNone {
				applied <- struct{}{}
			}
			return f
		})
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-applied
			cancel()
		}()
		_, err = assign(ctx, c, eni, 1)
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: %v, want the caller's cancel", kind, err)
		}
		want := map[ec2fake.FaultKind]int{ec2fake.FaultHang: 2, ec2fake.FaultLost: 1}[kind] // the first, held 10ms, counts
		if got := fake.Faults(kind); got != want {
			t.Fatalf("%d %s faults, want %d", got, kind, want)
		}
	}
	if held, _ := fake.Held(eni); len(held) != 3 {
		t.Fatalf("held %v, want 3: the abandoned assigns applied", held)
	}
	if _, err := assign(context.Background(), c, eni, 1); err != nil {
		t.Fatalf("the call after: %v", err)
	}
}

// TestFaultRates: faults drawn by rate from a seed repeat with the seed,
// come near their rates, are counted, and touch only the named actions.
func TestFaultRates(t *testing.T) {
	run := func() (errs []int, faults map[ec2fake.FaultKind]int) {
		fake, _, _ := world(t)
		c := client(t, fake, 1)
		fake.SetFaultRates(7, ec2fake.FaultRates{Throttle: 0.10, Error: 0.05, Cut: 0.05, Lost: 0.02, Hold: time.Millisecond,
			Actions: []string{"DescribeSubnets"}})
		for i := range 400 {
			if _, err := c.DescribeSubnets(context.Background(), &ec2.DescribeSubnetsInput{}); err != nil {
				errs = append(errs, i)
			}
		}
		if _, err := c.DescribeVpcs(context.Background(), &ec2.DescribeVpcsInput{}); err != nil {
			t.Fatalf("an action without faults: %v", err)
		}
		faults = map[ec2fake.FaultKind]int{}
		for _, k := range []ec2fake.FaultKind{ec2fake.FaultThrottled, ec2fake.FaultError, ec2fake.FaultCut, ec2fake.FaultLost, ec2fake.FaultHang} {
			faults[k] = fake.Faults(k)
		}
		return errs, faults
	}
	errs, faults := run()
	again, _ := run()
	if len(errs) != len(again) || !equal(errs, again) {
		t.Fatalf("the same seed failed calls %v, then %v", errs, again)
	}
	total := 0
	for _, n := range faults {
		total += n
	}
	if total != len(errs) {
		t.Fatalf("%d failed calls, %v faults counted", len(errs), faults)
	}
	// 400 draws: each rate within a generous band, none missing.
	for k, want := range map[ec2fake.FaultKind]float64{ec2fake.FaultThrottled: 40, ec2fake.FaultError: 20, ec2fake.FaultCut: 20, ec2fake.FaultLost: 8} {
		if got := float64(faults[k]); got < want/3 || got > want*2 {
			t.Errorf("%s: %v faults in 400 calls, want about %v", k, got, want)
		}
	}
	if faults[ec2fake.FaultHang] != 0 {
		t.Errorf("hang at rate 0 injected %d", faults[ec2fake.FaultHang])
	}
}

func equal(a, b []int) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

// TestCutNeverBreaksALaterCall: a connection cut, on a pooled connection
// or a fresh one, never fails a later call: the next call, and the
// reading of its whole answer, succeed. Loops of cut-then-normal calls
// on one client.
//
// The client is the tests' and the server's (aws.SafeBodies): without
// it about 1 run in 130 failed here, the client closing its own
// connection under the describe's answer (the race SafeBodies explains).
func TestCutNeverBreaksALaterCall(t *testing.T) {
	for _, kind := range []ec2fake.FaultKind{ec2fake.FaultCut, ec2fake.FaultLost, ec2fake.FaultError} {
		t.Run(string(kind), func(t *testing.T) {
			fake, _, eni := world(t)
			c := client(t, fake, 1)
			ctx := context.Background()
			for i := range 40 {
				fake.SetAfterFault(once("AssignPrivateIpAddresses", ec2fake.AfterFault{Kind: kind, Hold: time.Millisecond}))
				if _, err := assign(ctx, c, eni, 1); err == nil {
					t.Fatalf("round %d: the faulted call succeeded", i)
				}
				// A describe answer is long enough to span reads.
				if _, err := c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{}); err != nil {
					t.Fatalf("round %d: the call after a %s: %v", i, kind, err)
				}
				out, err := c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: sdkaws.String(eni), PrivateIpAddresses: heldStrings(fake, eni)})
				if err != nil || out == nil {
					t.Fatalf("round %d: the second call after a %s: %v", i, kind, err)
				}
			}
			if got := fake.Faults(kind); got != 40 {
				t.Fatalf("%d faults, want 40", got)
			}
		})
	}
}

func heldStrings(fake *ec2fake.Server, eni string) []string {
	held, _ := fake.Held(eni)
	var out []string
	for _, a := range held {
		out = append(out, a.String())
	}
	return out
}

// TestFaultsNeverFailAnotherCall: four callers sharing one client (and
// its pooled connections) under cuts, lost answers and errors by rate:
// every failed call is one the fake faulted, every other call is served
// whole.
func TestFaultsNeverFailAnotherCall(t *testing.T) {
	fake, _, _ := world(t)
	c := client(t, fake, 1)
	fake.SetFaultRates(11, ec2fake.FaultRates{Throttle: 0.05, Error: 0.1, Cut: 0.2, Lost: 0.05, Hold: time.Millisecond})
	var (
		mu     sync.Mutex
		failed int
		wg     sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for range 50 {
				if _, err := c.DescribeNetworkInterfaces(context.Background(), &ec2.DescribeNetworkInterfacesInput{}); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	faults := 0
	for _, k := range []ec2fake.FaultKind{ec2fake.FaultThrottled, ec2fake.FaultError, ec2fake.FaultCut, ec2fake.FaultLost} {
		faults += fake.Faults(k)
	}
	if failed != faults || faults == 0 {
		t.Fatalf("%d calls failed, %d faulted", failed, faults)
	}
}
