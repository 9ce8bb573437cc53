// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// A process started in do is born in the namespace, no other code runs
// there, and the prefix's namespaces are gone after the cleanup.
func TestNetnsDo(t *testing.T) {
	n, prefix := testNode(t)
	runtime.LockOSThread()
	home, err := os.Readlink("/proc/thread-self/ns/net")
	runtime.UnlockOSThread()
	if err != nil {
		t.Fatal(err)
	}
	var inside string
	cmd := exec.Command("readlink", "/proc/self/ns/net")
	var out strings.Builder
	cmd.Stdout = &out
	if err := n.do(func() (err error) {
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		if err == nil {
			err = cmd.Start()
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if inside == home || strings.TrimSpace(out.String()) != inside {
		t.Fatalf("home %s, in do %s, the child %s: want the child in do's namespace, not home", home, inside, out.String())
	}
	runtime.LockOSThread()
	after, _ := os.Readlink("/proc/thread-self/ns/net")
	runtime.UnlockOSThread()
	if after != home {
		t.Fatalf("after do the thread is in %s, want %s", after, home)
	}
	if _, err := addNetns(context.Background(), prefix+"-pod"); err != nil {
		t.Fatal(err)
	}
	if err := n.close(); err != nil {
		t.Fatal(err)
	}
	if err := deleteNetnsWithPrefix(prefix); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(netnsDir, prefix+"*")); len(left) > 0 {
		t.Fatalf("namespaces left: %v", left)
	}
}

// testNode makes a node namespace of a prefix of its own for t, deleted
// with every namespace of the prefix when t ends, and answers both.
func testNode(t *testing.T) (*netns, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the bridge mode's namespaces need root (CI runs as root)")
	}
	prefix := "ipam-bench-test-" + randomSuffix()
	t.Cleanup(func() { _ = deleteNetnsWithPrefix(prefix) })
	n, err := addNetns(context.Background(), prefix+"-node")
	if err != nil {
		t.Fatal(err)
	}
	return n, prefix
}
