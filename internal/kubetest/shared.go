// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package kubetest

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// shared is the cluster the tests of this test binary share.
var shared struct {
	sync.Mutex
	opts    []Option // given to Main
	cluster *Cluster
	err     error // the start failed; every Shared fails with it
}

// Main runs the tests of a package, then stops the cluster they shared
// (Shared), if one was started, removes its files, and exits with m.Run's
// code. opts apply to the shared cluster. Main is optional (see the
// package documentation).
func Main(m *testing.M, opts ...Option) {
	shared.Lock()
	shared.opts = opts
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	c := shared.cluster
	shared.cluster = nil
	shared.Unlock()
	if c != nil {
		if err := c.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "kubetest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// Shared returns the cluster the test binary's tests share, starting it
// at the first call, so a package whose tests all skip starts none. It
// skips or fails t as Start does when the binaries are missing; when the
// start failed once, every later call fails too. When t fails, its log
// gets the tail of the servers' output.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	binDir := requireBinDir(t)
	shared.Lock()
	defer shared.Unlock()
	if shared.cluster == nil && shared.err == nil {
		shared.cluster, shared.err = start(binDir, shared.opts...)
		if shared.err == nil {
			t.Logf("kubetest: shared etcd and kube-apiserver %s ready at %s in %v",
				KubernetesVersion, shared.cluster.Host(), shared.cluster.StartTime.Round(time.Millisecond))
		}
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	c := shared.cluster
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.Logs())
		}
	})
	return c
}
