// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ipamclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// Config says how to reach the service. Server is its base URL
// (https://ipam.example:8443); Token is an API token (sent as a bearer
// token); CAFile verifies the server's certificate (the system roots when
// empty); CertFile and KeyFile are a client certificate for mutual TLS.
// A token and a client certificate may be given together: the service
// takes the certificate first.
type Config struct {
	Server   string
	Token    string
	CAFile   string
	CertFile string
	KeyFile  string
	// Insecure skips the verification of the server's certificate; for a
	// first look at a test server only.
	Insecure bool
	// Timeout bounds each request; 30 s when zero.
	Timeout time.Duration
	// UserAgent is sent with each request; "ipamclient" when empty.
	UserAgent string
}

// NewClient returns a client of the service described by c.
func (c Config) NewClient() (*ClientWithResponses, error) {
	hc, err := c.HTTPClient()
	if err != nil {
		return nil, err
	}
	return NewClientWithResponses(c.Server, WithHTTPClient(hc), WithRequestEditorFn(c.editRequest))
}

// HTTPClient returns the http.Client that NewClient uses: c's TLS settings
// and timeout, and no proxy unless the environment names one.
func (c Config) HTTPClient() (*http.Client, error) {
	u, err := url.Parse(c.Server)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return nil, fmt.Errorf("ipamclient: server %q: want an http:// or https:// URL with a host", c.Server)
	}
	tc, err := c.TLSConfig()
	if err != nil {
		return nil, err
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	return &http.Client{Transport: tr, Timeout: timeout}, nil
}

// TLSConfig returns the TLS settings of c: its CA (or the system roots) and
// its client certificate, when it has one.
func (c Config) TLSConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.Insecure} //nolint:gosec // opt-in, documented
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ipamclient: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ipamclient: CA file %s holds no PEM certificate", c.CAFile)
		}
		tc.RootCAs = pool
	}
	switch {
	case c.CertFile != "" && c.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("ipamclient: client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	case c.CertFile != "" || c.KeyFile != "":
		return nil, errors.New("ipamclient: a client certificate needs both a certificate file and a key file")
	}
	return tc, nil
}

func (c Config) editRequest(_ context.Context, r *http.Request) error {
	if c.Token != "" {
		r.Header.Set("Authorization", "Bearer "+c.Token)
	}
	ua := c.UserAgent
	if ua == "" {
		ua = "ipamclient"
	}
	r.Header.Set("User-Agent", ua)
	return nil
}

// Error is an answer of the service that is not a success: its problem
// (RFC 9457) when the body is application/problem+json, else the status
// and the start of the body.
type Error struct {
	Status  int
	Problem *Problem
	// Body is the start of a body that is not a problem (a proxy's page).
	Body string
}

func (e *Error) Error() string {
	p := e.Problem
	if p == nil {
		if e.Body == "" {
			return fmt.Sprintf("HTTP %d %s", e.Status, http.StatusText(e.Status))
		}
		return fmt.Sprintf("HTTP %d %s: %s", e.Status, http.StatusText(e.Status), e.Body)
	}
	var b strings.Builder
	b.WriteString(p.Title)
	if p.Detail != nil && *p.Detail != "" {
		b.WriteString(": ")
		b.WriteString(*p.Detail)
	}
	if p.Field != nil && *p.Field != "" {
		fmt.Fprintf(&b, " (field %s)", *p.Field)
	}
	return b.String()
}

// ProblemType is the problem's type URI, or "" when the answer was no problem.
func (e *Error) ProblemType() string {
	if e.Problem == nil {
		return ""
	}
	return e.Problem.Type
}

// Check returns nil for a 2xx answer and an *Error for any other; resp and
// body are the HTTPResponse and Body of a generated response.
func Check(resp *http.Response, body []byte) error {
	if resp == nil {
		return errors.New("ipamclient: no response")
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	e := &Error{Status: resp.StatusCode}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/problem+json" {
		var p Problem
		if json.Unmarshal(body, &p) == nil && p.Title != "" {
			e.Problem = &p
			return e
		}
	}
	const most = 200
	s := strings.TrimSpace(string(body))
	if len(s) > most {
		s = s[:most] + "…"
	}
	e.Body = s
	return e
}
