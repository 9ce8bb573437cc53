// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// Error codes of the shim, 100 and up as the CNI specification reserves
// them for plugins. doc.go lists them with the specification's codes.
const (
	ErrService       uint = 100 // a service error without a code of its own
	ErrPoolExhausted uint = 101 // urn:ipam:problem:pool-exhausted and node-block-limit
	ErrNotFound      uint = 102 // urn:ipam:problem:not-found
	ErrLeaseConflict uint = 103 // urn:ipam:problem:lease-conflict
	ErrForbidden     uint = 104 // HTTP 403
	ErrRejected      uint = 105 // urn:ipam:problem:invalid-input and other 4xx
	ErrTLS           uint = 106 // certificate verification failed on either side
	ErrCheckMismatch uint = 107 // CHECK: prevResult differs from the service's lease
	ErrPoolMatch     uint = 108 // urn:ipam:problem:pool-match

	// errPluginNotAvailable is the CNI 1.1 STATUS code 50.
	errPluginNotAvailable uint = 50
)

// problemCodes maps the service's problem types to shim codes.
var problemCodes = map[string]uint{
	"urn:ipam:problem:pool-exhausted": ErrPoolExhausted,
	// No address for this node from the pool, as a full cluster-pool
	// node range: the node holds the pool's per-node block limit.
	"urn:ipam:problem:node-block-limit": ErrPoolExhausted,
	"urn:ipam:problem:not-found":        ErrNotFound,
	"urn:ipam:problem:lease-conflict":   ErrLeaseConflict,
	"urn:ipam:problem:invalid-input":    ErrRejected,
	"urn:ipam:problem:pool-match":       ErrPoolMatch,
}

// newClient returns the service client of c; its requests never use a proxy.
func newClient(c *config) (*ipamclient.ClientWithResponses, error) {
	// A Transport of its own: no proxy from the environment; ADD's two
	// requests share one connection (one TLS handshake).
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: c.tls}}
	cl, err := ipamclient.NewClientWithResponses(c.server.String(), ipamclient.WithHTTPClient(hc))
	if err != nil {
		return nil, configError("ipam.server", "%v", err)
	}
	return cl, nil
}

// transportError classifies an error of the HTTP round trip: a certificate
// that does not verify (either side) is ErrTLS, anything else (refused,
// reset, timed out, DNS) is try-again-later.
func transportError(op string, err error) *types.Error {
	if isTLSRejection(err) {
		return types.NewError(ErrTLS, op+": TLS failure talking to the IPAM service", err.Error())
	}
	msg := op + ": IPAM service unreachable"
	if errors.Is(err, context.DeadlineExceeded) {
		msg = op + ": IPAM service timed out"
	}
	return types.NewError(types.ErrTryAgainLater, msg, err.Error())
}

// isTLSRejection reports a verification failure of the server's
// certificate, or an alert of the server refusing ours.
func isTLSRejection(err error) bool {
	var (
		unknownCA *x509.UnknownAuthorityError
		verify    *tls.CertificateVerificationError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		record    tls.RecordHeaderError
		opErr     *net.OpError
	)
	switch {
	case errors.As(err, &unknownCA), errors.As(err, &verify), errors.As(err, &hostname),
		errors.As(err, &invalid), errors.As(err, &record):
		return true
	case errors.As(err, &opErr) && opErr.Op == "remote error":
		return true // the server sent a TLS alert: it refuses our certificate
	}
	return false
}

// isNotFound reports the service's not-found problem (an unknown node,
// space or attachment), not a 404 of something that is not the service.
func isNotFound(status int, body []byte) bool {
	p := decodeProblem(body)
	return status == http.StatusNotFound && p != nil && p.Type == "urn:ipam:problem:not-found"
}

// decodeProblem reads an answer's body as the service's problem, or nil
// when it is not one (a proxy's error page, say). The generated client
// keeps a documented status's problem in a field of its own per status,
// so the body is the one place every problem is found.
func decodeProblem(body []byte) *ipamclient.Problem {
	var p ipamclient.Problem
	if json.Unmarshal(body, &p) != nil || p.Type == "" || p.Status == 0 {
		return nil
	}
	return &p
}

// problemError turns a response other than the expected status into a CNI
// error: 429, 502, 503, 504 are try-again-later; problem types map through
// problemCodes; 403 is ErrForbidden; the rest ErrService. The message
// carries the service's detail.
func problemError(op string, status int, body []byte) *types.Error {
	p := decodeProblem(body)
	detail := http.StatusText(status)
	kind := ""
	if p != nil {
		kind = p.Type
		detail = p.Title
		if p.Detail != nil && *p.Detail != "" {
			detail = *p.Detail
		}
	} else if len(body) > 0 && len(body) < 512 {
		detail = string(body)
	}
	details := fmt.Sprintf("HTTP %d", status)
	if kind != "" {
		details += " " + kind
	}
	msg := op + ": " + detail
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return types.NewError(types.ErrTryAgainLater, msg, details)
	case http.StatusForbidden:
		return types.NewError(ErrForbidden, msg, details)
	}
	if code, ok := problemCodes[kind]; ok {
		return types.NewError(code, msg, details)
	}
	if status >= 400 && status < 500 {
		return types.NewError(ErrRejected, msg, details)
	}
	return types.NewError(ErrService, msg, details)
}
