// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package kubetest runs a real Kubernetes API server for tests: etcd and
// kube-apiserver (built by `make tools`, see scripts/ensure-kube.sh) as
// child processes on free loopback ports, with a throwaway data directory
// and certificates of their own. No part of Kubernetes is faked: objects
// are validated, stored, versioned and authorised as in a real cluster
// (there are no controllers, kubelets or scheduler; nothing runs Pods).
//
// A test starts a cluster of its own:
//
//	c := kubetest.Start(t) // stopped and removed at t.Cleanup
//	c.InstallCiliumCRDs(t)
//	cs := cilium.NewForConfigOrDie(c.Config())
//
// or, to pay the start once per test binary, the tests of a package share
// one:
//
//	c := kubetest.Shared(t) // started at the first call
//
// Tests on a shared cluster must not depend on each other's objects (use
// names of their own) and must not stop or restart its API server. A
// package whose TestMain is free calls kubetest.Main(m), which stops the
// shared cluster and removes its files at the end; without it (a package
// whose TestMain is pgtest.Main), the servers die with the test binary
// (the kernel kills them) and the next cluster's start removes the files.
//
// Without the binaries, tests skip with a message naming `make tools`,
// except under CI ($CI set), where they fail.
//
// A program (the benchmark, cmd/ipam-bench) starts and stops a cluster
// itself, with errors instead of a testing.TB:
//
//	c, err := kubetest.Launch() // errors.Is(err, kubetest.ErrNoBinaries) without them
//	defer c.Close()
//	err = c.InstallCiliumCRDsCtx(ctx)
//	err = c.WriteKubeconfig(c.Config(), path)
package kubetest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// startTimeout bounds each server's start, on a loaded two-core machine.
	startTimeout = 2 * time.Minute
	// stopGrace is how long a server may take to exit on SIGTERM.
	stopGrace = 30 * time.Second
	// portAttempts bounds the retries when a free port was taken between
	// choosing and binding it.
	portAttempts = 5
	// logTailLines is how much of each server's log a failure shows.
	logTailLines = 40

	// ServiceCIDR is the cluster's service IP range.
	ServiceCIDR = "10.96.0.0/24"
	serviceIP   = "10.96.0.1" // the kubernetes Service's ClusterIP
	// ServiceAccountIssuer is the issuer of service-account tokens.
	ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"
)

// Option changes how Start starts a cluster.
type Option func(*options)

type options struct {
	apiserverFlags []string
}

// WithAPIServerFlags adds flags to kube-apiserver's command line, after
// (and so overriding) the ones kubetest gives, e.g.
// WithAPIServerFlags("--authorization-mode=Node,RBAC").
func WithAPIServerFlags(flags ...string) Option {
	return func(o *options) { o.apiserverFlags = append(o.apiserverFlags, flags...) }
}

// Cluster is a running etcd and kube-apiserver.
type Cluster struct {
	dir    string // temp dir: certificates, etcd data, logs
	binDir string
	opts   options
	pki    *pkiFiles

	etcdURL string
	port    int // the API server's secure port, kept across restarts

	// StartTime is how long Start took to get both servers ready.
	StartTime time.Duration

	mu        sync.Mutex // protects etcd and apiserver
	etcd      *proc
	apiserver *proc
}

// Start starts a cluster for t and registers a t.Cleanup that stops both
// servers (their whole process groups) and removes their files; when t has
// failed, the cleanup first logs the tail of both servers' output.
func Start(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	binDir := requireBinDir(t)
	c, err := start(binDir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs())
		}
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	t.Logf("kubetest: etcd and kube-apiserver %s ready at %s in %v", KubernetesVersion, c.Host(), c.StartTime.Round(time.Millisecond))
	return c
}

// Launch starts a cluster for a program, as Start does for a test: etcd,
// then kube-apiserver, both ready when it returns. The caller must Close
// it; the servers also die with the calling process (Pdeathsig). Without
// the binaries the error wraps ErrNoBinaries and says how to build them;
// on any error nothing is left running or on disk.
func Launch(opts ...Option) (*Cluster, error) {
	binDir, err := BinDir()
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w; %s", err, buildHint)
	}
	return start(binDir, opts...)
}

// start starts etcd, then the API server; on error nothing is left behind.
func start(binDir string, opts ...Option) (c *Cluster, err error) {
	began := time.Now()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	removeStale()
	dir, err := os.MkdirTemp("", fmt.Sprintf("kubetest-%d-", os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	c = &Cluster{dir: dir, binDir: binDir, opts: o}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
			c = nil
		}
	}()
	if c.pki, err = writePKI(dir); err != nil {
		return c, fmt.Errorf("kubetest: certificates: %w", err)
	}
	if err := c.startEtcd(); err != nil {
		return c, err
	}
	if err := c.startAPIServer(0); err != nil {
		return c, err
	}
	c.StartTime = time.Since(began)
	return c, nil
}

// Close kills both servers (their whole process groups), waits until
// they are gone and removes the cluster's files. A second Close only
// removes what may be left.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, p := range []*proc{c.apiserver, c.etcd} {
		if p != nil {
			errs = append(errs, p.stop(syscall.SIGKILL, 0))
		}
	}
	c.apiserver, c.etcd = nil, nil
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("kubetest: %w", err))
	}
	return errors.Join(errs...)
}

// removeStale removes what clusters of test binaries that are gone left
// behind (one killed at its timeout, or one that shared a cluster without
// Main; their servers died with them): the directories kubetest-PID-* of
// processes that no longer exist.
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "kubetest-*-*"))
	for _, dir := range dirs {
		pid, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(dir), "kubetest-"), "-")
		if n, err := strconv.Atoi(pid); err == nil && n > 0 && errors.Is(syscall.Kill(n, 0), syscall.ESRCH) {
			_ = os.RemoveAll(dir)
		}
	}
}

func (c *Cluster) startEtcd() error {
	var lastErr error
	for range portAttempts {
		ports, err := freePorts(2)
		if err != nil {
			return err
		}
		client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
		peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
		p, err := startProc("etcd", filepath.Join(c.binDir, "etcd"), filepath.Join(c.dir, "etcd.log"),
			"--name=kubetest",
			"--data-dir="+filepath.Join(c.dir, "etcd"),
			"--listen-client-urls="+client,
			"--advertise-client-urls="+client,
			"--listen-peer-urls="+peer,
			"--initial-advertise-peer-urls="+peer,
			"--initial-cluster=kubetest="+peer,
			"--unsafe-no-fsync", // a throwaway store: speed over durability
			"--log-level=warn",
			"--log-outputs=stderr",
		)
		if err != nil {
			return err
		}
		c.etcd, c.etcdURL = p, client
		lastErr = c.waitReady(p, client+"/health", &http.Client{Timeout: 5 * time.Second}, func(body string) bool {
			return strings.Contains(body, `"health":"true"`)
		})
		if lastErr == nil || !portTaken(p) {
			return lastErr
		}
		_ = p.stop(syscall.SIGKILL, 0)
		c.etcd = nil
	}
	return lastErr
}

// startAPIServer starts kube-apiserver on port, or on a free port when port
// is 0, and waits until /readyz answers ok.
func (c *Cluster) startAPIServer(port int) error {
	var lastErr error
	for range portAttempts {
		p := port
		if p == 0 {
			ports, err := freePorts(1)
			if err != nil {
				return err
			}
			p = ports[0]
		}
		args := []string{
			"--etcd-servers=" + c.etcdURL,
			"--bind-address=127.0.0.1",
			"--advertise-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(p),
			"--cert-dir=" + filepath.Join(c.dir, "apiserver-certs"),
			"--tls-cert-file=" + c.pki.serverCert,
			"--tls-private-key-file=" + c.pki.serverKey,
			"--client-ca-file=" + c.pki.caCert,
			"--service-account-issuer=" + ServiceAccountIssuer,
			"--service-account-key-file=" + c.pki.saPub,
			"--service-account-signing-key-file=" + c.pki.saKey,
			"--service-cluster-ip-range=" + ServiceCIDR,
			"--authorization-mode=RBAC",
			// No kubelet serves 127.0.0.1, and Endpoints may not hold a
			// loopback address: leave the kubernetes Service without.
			"--endpoint-reconciler-type=none",
			"--profiling=false",
		}
		args = append(args, c.opts.apiserverFlags...)
		proc, err := startProc("kube-apiserver", filepath.Join(c.binDir, "kube-apiserver"), filepath.Join(c.dir, "kube-apiserver.log"), args...)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.apiserver, c.port = proc, p
		c.mu.Unlock()
		client, err := c.adminHTTPClient()
		if err != nil {
			return err
		}
		lastErr = c.waitReady(proc, c.Host()+"/readyz", client, func(body string) bool { return body == "ok" })
		if lastErr == nil || port != 0 || !portTaken(proc) {
			return lastErr
		}
		_ = proc.stop(syscall.SIGKILL, 0)
		c.mu.Lock()
		c.apiserver = nil
		c.mu.Unlock()
	}
	return lastErr
}

// waitReady polls url until ready(body) with status 200, the process
// exits, or startTimeout passes.
func (c *Cluster) waitReady(p *proc, url string, client *http.Client, ready func(body string) bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var last string
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			body := strings.TrimSpace(string(b))
			if resp.StatusCode == http.StatusOK && ready(body) {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, body)
		} else {
			last = err.Error()
		}
		select {
		case <-p.exited:
			return fmt.Errorf("kubetest: %s exited during start (%v); log %s:%s", p.name, p.exitError(), p.logPath, p.logTail(logTailLines))
		case <-ctx.Done():
			return fmt.Errorf("kubetest: %s not ready after %v (last answer of %s: %s); log %s:%s",
				p.name, startTimeout, url, last, p.logPath, p.logTail(logTailLines))
		case <-tick.C:
		}
	}
}

// portTaken reports whether p, which exited, failed to bind a port (taken
// between freePorts and the bind).
func portTaken(p *proc) bool {
	if p.running() {
		return false
	}
	return strings.Contains(p.logTail(logTailLines), "address already in use")
}

// freePorts returns n distinct loopback TCP ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("kubetest: finding a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Host is the API server's URL, https://127.0.0.1:PORT; the same across
// restarts.
func (c *Cluster) Host() string {
	return "https://127.0.0.1:" + strconv.Itoa(c.port)
}

// CAData is the PEM certificate of the CA that signed the API server's
// serving certificate (and the admin's client certificate).
func (c *Cluster) CAData() []byte { return c.pki.caPEM }

// Config returns a new client configuration of a cluster administrator (a
// client certificate in group system:masters, which RBAC never denies).
// Its rate limit (100 requests/s, bursts of 200) is the tests' own; set
// QPS and Burst for a client whose limit matters.
func (c *Cluster) Config() *rest.Config {
	return &rest.Config{
		Host: c.Host(),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   c.pki.caPEM,
			CertData: c.pki.adminCertPEM,
			KeyData:  c.pki.adminKeyPEM,
		},
		QPS:   100,
		Burst: 200,
	}
}

// ConfigAs returns the administrator's configuration impersonating user
// in groups: requests are authorised (RBAC) as that user's. The API server
// adds system:authenticated, and for a service account's user name
// (system:serviceaccount:NS:NAME) also system:serviceaccounts and
// system:serviceaccounts:NS.
func (c *Cluster) ConfigAs(user string, groups ...string) *rest.Config {
	cfg := c.Config()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// ServiceAccountConfig returns a configuration that authenticates as the
// service account namespace/name with a token the API server issues
// (TokenRequest, valid for an hour), as a Pod of that account would: no
// impersonation, the real token path. The service account must exist.
func (c *Cluster) ServiceAccountConfig(t testing.TB, namespace, name string) *rest.Config {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	ttl := int64(time.Hour / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(t.Context(), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("kubetest: a token for service account %s/%s: %v", namespace, name, err)
	}
	return &rest.Config{
		Host:            c.Host(),
		TLSClientConfig: rest.TLSClientConfig{CAData: c.pki.caPEM},
		BearerToken:     tr.Status.Token,
		QPS:             100,
		Burst:           200,
	}
}

// Kubeconfig writes cfg (Config, ConfigAs or ServiceAccountConfig of this
// cluster) as a kubeconfig file in a directory of t's and returns its
// path, for programs that take --kubeconfig.
func (c *Cluster) Kubeconfig(t testing.TB, cfg *rest.Config) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// WriteKubeconfig writes cfg (Config, ConfigAs or ServiceAccountConfig of
// this cluster) as a kubeconfig file at path (mode 0600: it holds the
// credentials), for programs that take --kubeconfig. The file carries the
// server, the CA, the client certificate or token and any impersonation;
// not QPS or Burst, which a kubeconfig cannot hold.
func (c *Cluster) WriteKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["kubetest"] = &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
		Impersonate:           cfg.Impersonate.UserName,
		ImpersonateGroups:     cfg.Impersonate.Groups,
	}
	kc.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "kubetest"}
	kc.CurrentContext = "kubetest"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("kubetest: writing kubeconfig: %w", err)
	}
	return nil
}

// adminHTTPClient is an HTTP client with the admin's certificate.
func (c *Cluster) adminHTTPClient() (*http.Client, error) {
	cert, err := tls.X509KeyPair(c.pki.adminCertPEM, c.pki.adminKeyPEM)
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(c.pki.caPEM)
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}},
			DisableKeepAlives: true,
		},
	}, nil
}

// StopAPIServer stops the API server (SIGTERM, its graceful shutdown)
// and waits until it has exited; etcd keeps running, so every object
// survives. Clients get connection errors until StartAPIServer.
func (c *Cluster) StopAPIServer(t testing.TB) {
	t.Helper()
	c.endAPIServer(t, "StopAPIServer", syscall.SIGTERM, stopGrace)
}

// KillAPIServer kills the API server (SIGKILL, as a crash would) and
// waits until it is gone.
func (c *Cluster) KillAPIServer(t testing.TB) {
	t.Helper()
	c.endAPIServer(t, "KillAPIServer", syscall.SIGKILL, 0)
}

// endAPIServer sends the running API server sig, gives it grace to exit
// (then kills it) and waits until it is gone.
func (c *Cluster) endAPIServer(t testing.TB, caller string, sig syscall.Signal, grace time.Duration) {
	t.Helper()
	c.mu.Lock()
	p := c.apiserver
	c.apiserver = nil
	c.mu.Unlock()
	if p == nil {
		t.Fatalf("kubetest: %s: the API server is not running", caller)
	}
	if err := p.stop(sig, grace); err != nil {
		t.Fatal(err)
	}
}

// StartAPIServer starts the API server again, on the same port and etcd,
// and waits until it is ready.
func (c *Cluster) StartAPIServer(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	running := c.apiserver != nil
	c.mu.Unlock()
	if running {
		t.Fatal("kubetest: StartAPIServer: the API server is running")
	}
	began := time.Now()
	if err := c.startAPIServer(c.port); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubetest: kube-apiserver ready again in %v", time.Since(began).Round(time.Millisecond))
}

// RestartAPIServer stops the API server and starts it again on the same
// port and etcd: objects (and their resourceVersions) survive, watches
// break and clients reconnect.
func (c *Cluster) RestartAPIServer(t testing.TB) {
	t.Helper()
	c.StopAPIServer(t)
	c.StartAPIServer(t)
}

// Logs returns the tail of both servers' output, for a failing test.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, name := range []string{"kube-apiserver", "etcd"} {
		path := filepath.Join(c.dir, name+".log")
		fmt.Fprintf(&b, "kubetest: last lines of %s (%s):%s\n", name, path, fileTail(path, 0, logTailLines))
	}
	return b.String()
}
