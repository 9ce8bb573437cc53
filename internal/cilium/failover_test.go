// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/store"
)

// operatorProcessEnv carries an operatorProcess's settings to a copy of
// the test binary that runs one operator replica and nothing else, so a
// test can SIGKILL a leader as a crash would.
const operatorProcessEnv = "IPAM_TEST_CILIUM_OPERATOR"

type operatorProcess struct {
	Database   string `json:"database"`
	Kubeconfig string `json:"kubeconfig"`
	Identity   string `json:"identity"`
	Cooldown   time.Duration
	// Mode is crd when empty; a block mode (multi-pool) opens the store
	// as newBlockEnv does, with this hold-off.
	Mode                Mode          `json:"mode,omitempty"`
	BlockReleaseHoldOff time.Duration `json:"blockReleaseHoldOff,omitempty"`
}

// runOperatorProcess is the body of such a copy: it never returns.
func runOperatorProcess(spec string) {
	var p operatorProcess
	if err := json.Unmarshal([]byte(spec), &p); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	mode, opts := ModeCRD, store.Options{LeaseExpiry: time.Minute, Cooldown: p.Cooldown, AutoRegisterNodes: true}
	if p.Mode != "" {
		mode, opts = p.Mode, store.Options{LeaseExpiry: time.Minute, Cooldown: p.Cooldown,
			BlockReleaseHoldOff: p.BlockReleaseHoldOff, AgentPoolsSpace: alloc.DefaultSpace}
	}
	st, err := store.Open(ctx, p.Database, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", p.Kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	rc.QPS, rc.Burst = 50, 100
	op, err := New(Config{Mode: mode, Space: alloc.DefaultSpace, DefaultPool: "default", Kube: rc,
		LeaseNamespace: "default", Identity: p.Identity, ExcessIPReleaseDelay: 3 * time.Second, Resync: 5 * time.Second, Workers: 8,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}, st)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := op.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// startOperatorProcess runs a crd replica in its own process.
func (e *crdEnv) startOperatorProcess(identity, dbURL string) *exec.Cmd {
	e.t.Helper()
	return e.startOperatorProcessOf(operatorProcess{Database: dbURL, Identity: identity, Cooldown: 2 * time.Second})
}

// startOperatorProcessOf runs the replica p in its own process, on the
// env's API server.
func (e *crdEnv) startOperatorProcessOf(p operatorProcess) *exec.Cmd {
	e.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		e.t.Fatal(err)
	}
	p.Kubeconfig = e.kc.Kubeconfig(e.t, e.kc.Config())
	spec, _ := json.Marshal(p)
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), operatorProcessEnv+"="+string(spec))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// churnAndCheck runs agents for d while during runs, then checks what
// every crd scenario must hold.
func (e *crdEnv) churnAndCheck(nodes int, d time.Duration, during func()) {
	t := e.t
	agents := make([]*agent, nodes)
	for i := range agents {
		agents[i] = newAgent(t, e.client, fmt.Sprintf("fo-%02d", i), 2*time.Second)
		if err := agents[i].create(e.ctx, ipamtypes.IPAMSpec{PreAllocate: 4, MaxAboveWatermark: 2}, nil); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	for i, a := range agents {
		wg.Go(func() { _ = a.churn(ctx, 2+i%4, uint64(i)) })
	}
	during()
	wg.Wait()
	for _, a := range agents {
		e.eventually(30*time.Second, "final status of "+a.name, func() (bool, string) {
			_, err := a.sync(e.ctx, true)
			return err == nil, fmt.Sprint(err)
		})
	}
	for _, a := range agents {
		if lost := a.lostAddresses(); len(lost) > 0 {
			t.Errorf("node %s: used addresses left its pool: %v", a.name, lost)
		}
		e.eventually(45*time.Second, "node "+a.name+" agrees with the store", func() (bool, string) {
			got, want := specPool(e.get(a.name)), e.heldByStore(a.name)
			return slices.Equal(got, want), fmt.Sprintf("spec %v, store %v", got, want)
		})
	}
	e.consistent()
}

// The leader is killed (SIGKILL) mid-churn: the other replica takes over
// within 15 s, and no address is lost or doubled.
func TestCRDLeaderKilledMidChurn(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(27, "10.70.0.0/16")})
	first := e.startOperatorProcess("replica-a", e.dbURL)
	e.eventually(20*time.Second, "replica-a leads", func() (bool, string) { l := e.leader(); return l == "replica-a", "leader " + l })
	e.startOperatorProcess("replica-b", e.dbURL)
	e.churnAndCheck(12, 40*time.Second, func() {
		time.Sleep(10 * time.Second)
		killed := time.Now()
		if err := first.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		e.eventually(30*time.Second, "replica-b takes over", func() (bool, string) { l := e.leader(); return l == "replica-b", "leader " + l })
		took := time.Since(killed)
		t.Logf("takeover %v after the leader's SIGKILL", took.Round(100*time.Millisecond))
		if took > 15*time.Second {
			t.Errorf("takeover took %v; the lease settings promise under 15 s", took)
		}
	})
}

// The API server restarts mid-churn: watches break and the operator
// carries on from a fresh list.
func TestCRDSurvivesAPIServerRestart(t *testing.T) {
	e := newCRDEnv(t, alloc.PoolSpec{IPv4: v4(27, "10.80.0.0/16")})
	e.operator("op-1", func(c *Config) { c.ExcessIPReleaseDelay = 3 * time.Second; c.Resync = 5 * time.Second })
	e.churnAndCheck(10, 30*time.Second, func() {
		time.Sleep(8 * time.Second)
		e.kc.RestartAPIServer(t)
	})
}
