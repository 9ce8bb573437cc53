// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// writerToBody is a request body with a WriteTo, as smithy-go's safe
// closer has.
type writerToBody struct{ *bytes.Reader }

func (writerToBody) Close() error { return nil }

// TestSafeBodiesHideWriteTo: the transport sees a request body without
// WriteTo, whose Read still gives every byte; the caller's request is
// left as it was.
func TestSafeBodiesHideWriteTo(t *testing.T) {
	var seen io.ReadCloser
	next := doerFunc(func(r *http.Request) (*http.Response, error) {
		seen = r.Body
		return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
	})
	body := writerToBody{bytes.NewReader([]byte("Action=DescribeNetworkInterfaces"))}
	req, err := http.NewRequest(http.MethodPost, "https://ec2.example.com", body)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := req.Body.(io.WriterTo); !ok {
		t.Fatal("the test's body has no WriteTo")
	}
	if _, err := SafeBodies(next).Do(req); err != nil {
		t.Fatal(err)
	}
	if _, ok := seen.(io.WriterTo); ok {
		t.Fatal("the transport sees the body's WriteTo")
	}
	got, err := io.ReadAll(seen)
	if err != nil || string(got) != "Action=DescribeNetworkInterfaces" {
		t.Fatalf("read %q, %v", got, err)
	}
	if req.Body != io.ReadCloser(body) {
		t.Fatal("the caller's request was changed")
	}
}

type doerFunc func(*http.Request) (*http.Response, error)

func (f doerFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }
