// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package capacity

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
	"github.com/ipam-dev/ipam/internal/cloud/azure/armfake"
)

// TestFailingNodeBacksOff: an instance that refuses every attach (an
// attachment the account's quota or the instance's state forbids) costs
// a create, an attach and a delete at each try; the node is tried again
// only after a backoff doubling up to five minutes, so over ten minutes
// of passes every 10 s it is tried about ten times rather than sixty.
// Once the attach works again the node is served at its next try, and
// its backoff starts over.
func TestFailingNodeBacksOff(t *testing.T) {
	// Pods from the second interface on: the node needs a new interface.
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, FirstInterfaceIndex: 1, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	x.fake.SetFault(func(action string) *ec2fake.APIError {
		if action == "AttachNetworkInterface" {
			return &ec2fake.APIError{Status: http.StatusBadRequest, Code: "InvalidParameterCombination", Message: "The instance does not take more attachments now."}
		}
		return nil
	})
	failed := 0
	for range 60 {
		if err := x.w.Pass(t.Context()); err != nil {
			failed++
		}
		x.clock.Advance(10 * time.Second)
	}
	// The holds without jitter are 1, 2, 4, ... 256 s, then 300: tries at
	// 0, 10, 20, 30, 40, 60, 100, 170, 300 and 560 s; jitter only
	// lengthens them.
	creates, attaches := x.fake.Calls("CreateNetworkInterface"), x.fake.Calls("AttachNetworkInterface")
	if creates > 10 || attaches > 10 || failed > 10 || creates < 5 {
		t.Fatalf("over 60 passes: %d creates, %d attaches, %d failed passes; want 5 to 10", creates, attaches, failed)
	}
	if got := x.fake.Calls("DeleteNetworkInterface"); got != creates {
		t.Fatalf("%d creates, %d deletes: each interface that did not attach is deleted", creates, got)
	}
	x.fake.SetFault(func(string) *ec2fake.APIError { return nil })
	x.clock.Advance(BackoffMax)
	x.pass(t)
	if x.blocks(t) != 4 {
		t.Fatalf("after the fault cleared: %d blocks, want 4", x.blocks(t))
	}
	// Served, the node's backoff is over: a failure now holds it the
	// least again.
	if x.w.holds.holding("default/eni/n1", x.clock.Now()) {
		t.Fatal("a node served is still held")
	}
}

// TestRetryAfterHoldsTheNode: an Azure write refused with a 429 whose
// Retry-After (300 s) is beyond what the SDK waits within a call is not
// sent again before the 300 s are over, though passes run every 10 s;
// then the node is served.
func TestRetryAfterHoldsTheNode(t *testing.T) {
	x := newAzureWorld(t, alloc.CloudSpec{Provider: alloc.CloudAzure, Watermarks: &alloc.Watermarks{PreAllocate: 2}}, 1,
		policy.RetryOptions{MaxRetries: 2, RetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond})
	x.fake.SetFault(func(method, path string) *armfake.Error {
		if method == http.MethodPut {
			return &armfake.Error{Status: http.StatusTooManyRequests, Code: "TooManyRequests", Message: "The request is being throttled.", RetryAfterMs: 300_000}
		}
		return nil
	})
	err := x.w.Pass(t.Context())
	if cloud.RetryAfterOf(err) != 300*time.Second {
		t.Fatalf("first pass: %v, want a throttled write asking for 300 s", err)
	}
	writes := x.fake.Calls(http.MethodPut, "virtualMachines/0")
	for range 29 {
		x.clock.Advance(10 * time.Second)
		if err := x.w.Pass(t.Context()); err != nil {
			t.Fatalf("at %s: %v", x.clock.Now().Format(time.TimeOnly), err)
		}
	}
	if got := x.fake.Calls(http.MethodPut, "virtualMachines/0"); got != writes {
		t.Fatalf("%d writes within the 300 s ARM asked to wait", got-writes)
	}
	x.fake.SetFault(func(string, string) *armfake.Error { return nil })
	x.clock.Advance(10 * time.Second)
	if err := x.w.Pass(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := len(x.fake.Addresses(x.nics[0])); got < 3 {
		t.Fatalf("after the 300 s the NIC holds %d addresses, want its primary and 2", got)
	}
}

func TestBackoffDelay(t *testing.T) {
	for _, c := range []struct {
		n    int
		j    float64
		want time.Duration
	}{
		{1, 0, time.Second}, {1, 0.998, 1499 * time.Millisecond}, {2, 0, 2 * time.Second}, {9, 0, 256 * time.Second},
		{9, 0.5, BackoffMax}, {10, 0, BackoffMax}, {100, 0.9, BackoffMax},
	} {
		if got := backoffDelay(c.n, c.j); got.Round(time.Millisecond) != c.want {
			t.Errorf("backoffDelay(%d, %v) = %v, want %v", c.n, c.j, got, c.want)
		}
	}
}

// TestHungCallEndsThePass: EC2 stops answering (the requests hang until
// the caller gives up); with the server's wrappers and a call timeout the
// pass ends, failed with the timeout, rather than hanging and holding the
// cloud lock; the node backs off, and once EC2 answers again it is
// served.
func TestHungCallEndsThePass(t *testing.T) {
	x := newWorld(t, alloc.CloudSpec{Provider: alloc.CloudAWS, Watermarks: &alloc.Watermarks{PreAllocate: 4}})
	var hang atomic.Bool
	hung := make(chan struct{}, 100)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hang.Load() {
			hung <- struct{}{}
			// Read first: the server notices the caller's hang-up only
			// once the body is read.
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
			return
		}
		x.fake.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{Region: "eu-west-1", BaseEndpoint: sdkaws.String(srv.URL), HTTPClient: srv.Client(),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")})
	p := aws.New(client, aws.Options{Now: x.clock.Now})
	timeout := cloud.WithCallTimeout(200 * time.Millisecond)
	x.w.Cloud, x.w.Interfaces, x.w.Inventory = cloud.NewLimited(p, nil, timeout), cloud.NewLimitedInterfaces(p, nil, timeout), cloud.NewLimitedInventory(p, nil, timeout)
	hang.Store(true)
	done := make(chan error, 1)
	go func() { done <- x.w.Pass(t.Context()) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute): // far beyond the call timeout: the pass hangs
		t.Fatal("the pass did not end while EC2 hung")
	}
	if !errors.Is(err, context.DeadlineExceeded) || len(hung) == 0 {
		t.Fatalf("pass: %v after %d hung requests, want the call timeout", err, len(hung))
	}
	hang.Store(false)
	// The server's timeout again: 200 ms is shorter than a call can take
	// on a loaded machine, and this pass must not fail.
	timeout = cloud.WithCallTimeout(cloud.DefaultCallTimeout)
	x.w.Cloud, x.w.Interfaces, x.w.Inventory = cloud.NewLimited(p, nil, timeout), cloud.NewLimitedInterfaces(p, nil, timeout), cloud.NewLimitedInventory(p, nil, timeout)
	x.clock.Advance(BackoffMax)
	x.pass(t)
	if held, _ := x.fake.Held(x.eni0); len(held) != 4 || x.blocks(t) != 4 {
		t.Fatalf("once EC2 answers: the cloud holds %v, the store %d blocks", held, x.blocks(t))
	}
}
