// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// The shim phase's bridge mode (shim.go) runs in network namespaces of its
// own: a "node" namespace, where the bridge plugin runs and makes its
// bridge, with a server of the benchmark on its loopback, and one Pod
// namespace per ADD+DEL pair. The host's namespace gets no address, route,
// bridge or veth; deleting the namespaces removes everything the plugins
// made.

// netnsDir is where `ip netns add` mounts a namespace.
const netnsDir = "/var/run/netns"

// ipNetns runs `ip netns args...`.
func ipNetns(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip netns %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// randomSuffix is 6 hex digits, for names no other run uses.
func randomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}

// netns is a named network namespace, open for setns.
type netns struct {
	name string
	f    *os.File
}

// addNetns creates the namespace name with `ip netns add`.
func addNetns(ctx context.Context, name string) (*netns, error) {
	if err := ipNetns(ctx, "add", name); err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(netnsDir, name))
	if err != nil {
		_ = ipNetns(context.WithoutCancel(ctx), "delete", name)
		return nil, err
	}
	return &netns{name: name, f: f}, nil
}

// close deletes the namespace.
func (n *netns) close() error {
	n.f.Close()
	return ipNetns(context.Background(), "delete", n.name)
}

// do runs f on an OS thread that has entered n, as a runtime's plugin
// runs in the node's namespace: a process f starts is born in n, without
// a wrapper process. The thread leaves n afterwards; should it fail to,
// it ends with its goroutine and no other code runs in n by mistake.
func (n *netns) do(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer home.Close()
		if err := unix.Setns(int(n.f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("entering network namespace %s: %w", n.name, err)
			return
		}
		err = f()
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

// deleteNetnsWithPrefix deletes every namespace whose name starts with
// prefix (what an interrupted run left).
func deleteNetnsWithPrefix(prefix string) error {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	var errs []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			if err := ipNetns(context.Background(), "delete", e.Name()); err != nil {
				errs = append(errs, err.Error())
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}
