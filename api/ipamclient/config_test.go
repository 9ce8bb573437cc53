// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ipamclient_test

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// The package is what a user installs: it must not pull in the router,
// the server's packages or Kubernetes.
func TestDependsOnNoServerCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/ipam-dev/ipam/api/ipamclient").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/go-chi/", "github.com/ipam-dev/ipam/internal/", "github.com/ipam-dev/ipam/api/ipamv1", "k8s.io/", "github.com/jackc/", "go.opentelemetry.io/"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("ipamclient depends on %s", dep)
			}
		}
	}
}

// A client from Config verifies the server with the CA file, sends the
// token, and turns a problem answer into an *Error naming the field.
func TestConfigTLSTokenAndProblem(t *testing.T) {
	var gotAuth, gotUA string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth, gotUA = r.Header.Get("Authorization"), r.Header.Get("User-Agent")
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"type":"urn:ipam:problem:invalid-input","title":"Invalid input","status":400,"detail":"must be 1 to 1000","field":"limit"}`))
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}

	c, err := ipamclient.Config{Server: srv.URL, Token: "ipam_x", CAFile: ca, UserAgent: "test/1"}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.ListPoolsWithResponse(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = ipamclient.Check(res.HTTPResponse, res.Body)
	var e *ipamclient.Error
	if !errors.As(err, &e) || e.Status != 400 || e.ProblemType() != "urn:ipam:problem:invalid-input" {
		t.Fatalf("Check = %v, want the 400 problem", err)
	}
	if got := err.Error(); got != "Invalid input: must be 1 to 1000 (field limit)" {
		t.Errorf("Error() = %q", got)
	}
	if gotAuth != "Bearer ipam_x" || gotUA != "test/1" {
		t.Errorf("sent Authorization %q, User-Agent %q", gotAuth, gotUA)
	}

	// Without the CA the server's certificate does not verify.
	c2, err := ipamclient.Config{Server: srv.URL}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.ListPoolsWithResponse(context.Background(), nil); err == nil {
		t.Error("a server certificate of an unknown CA was accepted")
	}
}

// Bad configuration is refused before any request.
func TestConfigRefusesBadSettings(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "x.crt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []ipamclient.Config{
		{Server: ""},
		{Server: "ipam.example:8443"},
		{Server: "ftp://ipam.example"},
		{Server: "https://ipam.example", CAFile: filepath.Join(dir, "missing.crt")},
		{Server: "https://ipam.example", CAFile: notPEM},
		{Server: "https://ipam.example", CertFile: notPEM},
	} {
		if _, err := c.NewClient(); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
}

// An answer that is no problem (a proxy's page) keeps its status and the
// start of its body.
func TestCheckNonProblemBody(t *testing.T) {
	res := &http.Response{StatusCode: 502, Header: http.Header{"Content-Type": {"text/html"}}}
	err := ipamclient.Check(res, []byte("<html>bad gateway</html>"))
	if err == nil || err.Error() != "HTTP 502 Bad Gateway: <html>bad gateway</html>" {
		t.Fatalf("Check = %v", err)
	}
	if ipamclient.Check(&http.Response{StatusCode: 204}, nil) != nil {
		t.Fatal("a 204 is an error")
	}
}
