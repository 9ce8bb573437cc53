// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// buildBinary builds ipamctl into a temporary directory, as a user would
// install it.
func buildBinary(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go") // go test puts its own first in PATH
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "ipamctl")
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The built binary exits 0, 1 and 2 as documented, prints the problem of
// the service naming the field, and shows progress on a terminal only:
// nothing on stderr when it is a pipe, the status line when it is a
// pseudo-terminal.
func TestBinary(t *testing.T) {
	bin := buildBinary(t)
	s := newService(t, false)
	s.seed(t)
	env := []string{"IPAM_SERVER=" + s.url, "HOME=" + t.TempDir(), "PATH=" + os.Getenv("PATH")}
	runBin := func(stderr io.Writer, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%v: %v", args, err)
		}
		return out.String(), cmd.ProcessState.ExitCode()
	}
	for _, c := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"--help"}, 0, ""},
		{[]string{"pools"}, 0, ""},
		{[]string{"pool", "capacity", "default", "-o", "yaml"}, 0, ""},
		{[]string{"who", "not-an-ip"}, 1, "(field address)"},
		{[]string{"pool", "capacity", "nope"}, 1, "Not found"},
		{[]string{"pools", "--bogus"}, 2, "-bogus"},
		{[]string{"frobnicate"}, 2, "unknown command"},
	} {
		var stderr bytes.Buffer
		_, code := runBin(&stderr, c.args...)
		if code != c.code || !strings.Contains(stderr.String(), c.stderr) {
			t.Errorf("ipamctl %v: exit %d, stderr %q; want %d and %q", c.args, code, stderr.String(), c.code, c.stderr)
		}
	}

	// Many pages of history, and the check: on a pipe, stderr stays empty.
	paged := []string{"history", "--node", "worker-1", "--page-size", "1"}
	for _, args := range [][]string{paged, {"check"}} {
		var stderr bytes.Buffer
		if out, code := runBin(&stderr, args...); code != 0 || stderr.Len() != 0 || strings.Contains(out, "\r") {
			t.Errorf("%v on a pipe: exit %d, stderr %q", args, code, stderr.String())
		}
	}

	// On a terminal, the pages show.
	master, slave, err := openPTY()
	if err != nil {
		t.Skipf("no pseudo-terminal here (%v): the terminal case is covered in-process", err)
	}
	defer master.Close()
	got := make(chan string)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, master) // ends with EIO once the child and slave are closed
		got <- b.String()
	}()
	cmd := exec.Command(bin, paged...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, slave
	err = cmd.Run()
	slave.Close()
	tty := <-got
	if err != nil || !strings.Contains(tty, "events of worker-1: 1 so far, fetching page 2…") || !strings.HasSuffix(tty, clearLine) {
		t.Errorf("history on a terminal: %v, terminal %q", err, tty)
	}
	if strings.Contains(out.String(), "so far") {
		t.Errorf("progress on stdout: %q", out.String())
	}
}

// openPTY opens a pseudo-terminal pair (Linux).
func openPTY() (master, slave *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(master.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, nil, err
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	slave, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// ipamctl is a client: it must not pull in the server's packages, the
// generated server code, the database driver or Kubernetes (its tests
// may).
func TestDependsOnNoServerCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/ipam-dev/ipam/internal/", "github.com/ipam-dev/ipam/api/ipamv1", "github.com/go-chi/",
			"github.com/jackc/", "k8s.io/", "go.opentelemetry.io/"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("ipamctl depends on %s", dep)
			}
		}
	}
}
