package kubetest

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// shared is the cluster of the test binary that called Main.
var shared struct {
	sync.Mutex
	main    bool // Main is running
	opts    []Option
	cluster *Cluster
	err     error // the start failed; every Shared fails with it
}

// Main runs the tests of a package whose tests share one cluster (Shared),
// then stops that cluster, if one was started, and exits with m.Run's
// code. The cluster starts at the first Shared call, so a package whose
// tests all skip starts none.
func Main(m *testing.M, opts ...Option) {
	shared.Lock()
	shared.main, shared.opts = true, opts
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	c := shared.cluster
	shared.cluster, shared.main = nil, false
	shared.Unlock()
	if c != nil {
		if err := c.close(); err != nil {
			fmt.Fprintf(os.Stderr, "kubetest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	os.Exit(code)
}

// Shared returns the test binary's shared cluster, starting it at the
// first call; the package's TestMain must call Main. It skips or fails t
// as Start does when the binaries are missing. When t fails, its log gets
// the tail of the servers' output.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	binDir := requireBinDir(t)
	shared.Lock()
	defer shared.Unlock()
	if !shared.main {
		t.Fatal("kubetest.Shared: the package's TestMain must call kubetest.Main(m)")
	}
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
