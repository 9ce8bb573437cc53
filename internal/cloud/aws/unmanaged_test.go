// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	sdkaws "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws/ec2fake"
)

// TestInstanceMarksUnmanagedInterfaces: the provider marks Unmanaged what
// the VPC CNI's ipamd leaves alone (MANAGE_UNTAGGED_ENI=false): a trunk,
// an EFA, an interface tagged no_manage=true, one a user attached without
// the cluster tag, one on another network card than the default; never
// the primary, an interface the workers created, or a user's opted in
// with no_manage=false. Describing one instance and listing the VPC
// agree.
func TestInstanceMarksUnmanagedInterfaces(t *testing.T) {
	ctx := context.Background()
	fake, inst, eni0 := world(t, "c6in.32xlarge", "10.11.0.0/22")
	attach := func(card, device int, typ string, tags map[string]string) string {
		t.Helper()
		id, err := fake.AttachTypedInterface(ec2fake.TypedInterface{Instance: inst, Subnet: "subnet-a", Card: card, Device: device, Type: typ, Tags: tags, Addresses: 2})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	want := map[string]bool{
		eni0:                       false,
		attach(0, 1, "trunk", nil): true,
		attach(0, 2, "efa", map[string]string{cloud.TagCluster: "test"}):   true,
		attach(0, 3, "", map[string]string{cloud.TagNoManage: "true"}):     true,
		attach(0, 4, "interface", nil):                                     true,
		attach(0, 5, "", map[string]string{cloud.TagNoManage: "false"}):    false,
		attach(0, 6, "", map[string]string{cloud.TagCluster: "test"}):      false,
		attach(1, 0, "", map[string]string{cloud.TagCluster: "test"}):      true,
		attach(1, 1, "efa-only", map[string]string{cloud.TagNoManage: ""}): true,
	}
	p := newProvider(t, fake, 1)
	one, err := p.Instance(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	all, err := p.Instances(ctx, "vpc-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range []cloud.Instance{one, all[inst]} {
		if len(got.Interfaces) != len(want) || got.NetworkCard != 0 {
			t.Fatalf("%d interfaces on default card %d, want %d on 0", len(got.Interfaces), got.NetworkCard, len(want))
		}
		for _, f := range got.Interfaces {
			if f.Unmanaged != want[f.ID] {
				t.Errorf("%s (card %d device %d type %q tags %v): unmanaged %v, want %v", f.ID, f.NetworkCard, f.DeviceIndex, f.Type, f.Tags, f.Unmanaged, want[f.ID])
			}
		}
	}
	if f := one.Interfaces[1]; f.Type != "trunk" || f.DeviceIndex != 1 || f.NetworkCard != 0 {
		t.Fatalf("second interface %+v, want the trunk at card 0 device 1", f)
	}
	if f := one.Interfaces[len(one.Interfaces)-1]; f.Type != "efa-only" || f.DeviceIndex != 1 || f.NetworkCard != 1 {
		t.Fatalf("last interface %+v, want the efa-only at card 1 device 1", f)
	}
}

// TestMultiCardInstanceUsesItsDefaultCard: on c6in.32xlarge (16
// interfaces over two cards of 8) the limit is the default card's 8, new
// interfaces attach there at the card's own first free device index (a
// user's EFA at card 1 device 1 does not take card 0's device 1), and the
// ninth on the card is refused before any call, where EC2 would refuse
// the attach after the create.
func TestMultiCardInstanceUsesItsDefaultCard(t *testing.T) {
	ctx := context.Background()
	fake, inst, _ := world(t, "c6in.32xlarge", "10.12.0.0/22")
	efa, err := fake.AttachTypedInterface(ec2fake.TypedInterface{Instance: inst, Subnet: "subnet-a", Card: 1, Device: 1, Type: "efa"})
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, fake, 1)
	got, err := p.Instance(ctx, inst)
	if err != nil {
		t.Fatal(err)
	}
	if got.Limits.Interfaces != 8 || got.Limits.IPv4PerInterface != 50 || got.NetworkCard != 0 {
		t.Fatalf("limits %+v on card %d, want 8 interfaces of 50 on card 0", got.Limits, got.NetworkCard)
	}
	for want := 1; want < 8; want++ {
		f, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 4, Tags: tags})
		if err != nil {
			t.Fatal(err)
		}
		if f.DeviceIndex != want || f.NetworkCard != 0 {
			t.Fatalf("created at card %d device %d, want card 0 device %d", f.NetworkCard, f.DeviceIndex, want)
		}
	}
	for _, f := range fake.Interfaces() {
		if f.ID != efa && f.Card != 0 {
			t.Fatalf("%s attached on card %d", f.ID, f.Card)
		}
	}
	creates := fake.Calls("CreateNetworkInterface")
	if _, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 4, Tags: tags}); cloud.KindOf(err) != cloud.KindAttachmentLimit {
		t.Fatalf("a ninth interface on card 0: %v, want %v", err, cloud.KindAttachmentLimit)
	}
	if n := fake.Calls("CreateNetworkInterface") - creates; n != 0 {
		t.Fatalf("%d creates for an interface the card cannot take", n)
	}
	if fake.Changes(efa) != 0 {
		t.Fatalf("%d changing calls on the user's EFA", fake.Changes(efa))
	}
}

// TestCreateInterfaceRetryAfterLostAnswer: EC2 creates the interface but
// its answer is lost (a 500 instead); the SDK tries again with the same
// ClientToken and gets that interface, which is attached: no second
// interface is left available in the subnet.
func TestCreateInterfaceRetryAfterLostAnswer(t *testing.T) {
	ctx := context.Background()
	fake, inst, _ := world(t, "m5.large", "10.13.0.0/24")
	var lost atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		form, _ := url.ParseQuery(string(body))
		if form.Get("Action") == "CreateNetworkInterface" && lost.Add(1) == 1 {
			// Applied, then the answer lost.
			fake.ServeHTTP(httptest.NewRecorder(), r)
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`<Response><Errors><Error><Code>InternalError</Code><Message>lost</Message></Error></Errors><RequestID>x</RequestID></Response>`))
			return
		}
		fake.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	client := ec2.New(ec2.Options{Region: "eu-west-1", BaseEndpoint: sdkaws.String(srv.URL), HTTPClient: SafeBodies(srv.Client()),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = 3
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		})})
	p := New(client, Options{Wait: func(int) time.Duration { return 0 }})
	f, err := p.CreateInterface(ctx, cloud.InterfaceSpec{Instance: inst, Subnet: "subnet-a", Addresses: 2, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	if lost.Load() != 2 {
		t.Fatalf("%d creates sent, want the lost one and its retry", lost.Load())
	}
	var attached, available int
	for _, g := range fake.Interfaces() {
		switch {
		case g.Status == "available":
			available++
		case g.ID == f.ID && g.Instance == inst:
			attached++
		}
	}
	if attached != 1 || available != 0 {
		t.Fatalf("%s attached %d times, %d interfaces left available; want 1, 0", f.ID, attached, available)
	}
}

// TestDetachInterfaceRefusesForeign: an interface without the cluster
// tag is not detached, before any changing call.
func TestDetachInterfaceRefusesForeign(t *testing.T) {
	ctx := context.Background()
	fake, inst, _ := world(t, "m5.large", "10.14.0.0/24")
	user, err := fake.AttachInterface(inst, "subnet-a", 1)
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(t, fake, 1)
	if err := p.DetachInterface(ctx, user); cloud.KindOf(err) != cloud.KindInvalid {
		t.Fatalf("detaching a user's interface: %v, want %v", err, cloud.KindInvalid)
	}
	if fake.Changes(user) != 0 || fake.Calls("DetachNetworkInterface") != 0 {
		t.Fatalf("%d changing calls, %d detaches", fake.Changes(user), fake.Calls("DetachNetworkInterface"))
	}
}
