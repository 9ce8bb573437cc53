// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package aws

import (
	"io"
	"net/http"
)

// Doer is the HTTP client the SDK calls (its aws.HTTPClient).
type Doer interface {
	Do(*http.Request) (*http.Response, error)
}

// SafeBodies is c for the EC2 client: the same, but the requests' bodies
// hide their WriteTo method from the transport. Every EC2 client of the
// server and of the tests goes through it.
//
// Why: smithy-go (the SDK's HTTP layer) wraps a request body in a safe
// closer whose WriteTo answers io.EOF once closed, and closes it as soon
// as the client's Do returns. net/http's transport, after writing a body
// of known length, copies what is left of it to io.Discard to check that
// nothing is (transfer.go, writeBody); through WriteTo that copy fails
// with io.EOF when the close came first, and the transport's write loop
// then closes the connection, under the response body the SDK is still
// reading: "read tcp ...: use of closed network connection" on an answer
// EC2 gave in full (1 run in 20-30 of a test of large describes; 0 in 120
// with SafeBodies). Read alone answers (0, io.EOF) once closed, which the
// copy takes for the end of the body.
func SafeBodies(c Doer) Doer {
	if c == nil {
		c = http.DefaultClient
	}
	return safeBodies{c}
}

type safeBodies struct{ next Doer }

func (s safeBodies) Do(r *http.Request) (*http.Response, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return s.next.Do(r)
	}
	r = r.WithContext(r.Context()) // a shallow copy: the caller's request stays as it was
	r.Body = readCloser{r.Body}
	return s.next.Do(r)
}

// readCloser hides every method of its ReadCloser but Read and Close.
type readCloser struct{ io.ReadCloser }
