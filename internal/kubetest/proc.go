// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package kubetest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one server process (etcd or kube-apiserver) with its output
// appended to a log file.
type proc struct {
	name     string
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the process has been reaped
	waitErr  error         // valid once exited is closed
	logPath  string
	logStart int64 // the log's size when this process started
}

// startProc starts path with args in a process group of its own, its
// stdout and stderr appended to logPath. The kernel kills it (SIGKILL) if
// the test binary dies without cleaning up.
func startProc(name, path, logPath string, args ...string) (*proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	defer logFile.Close() // the child holds its own descriptor
	fi, err := logFile.Stat()
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	fmt.Fprintf(logFile, "=== kubetest: %s %s\n", path, strings.Join(args, " "))
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		return nil, fmt.Errorf("kubetest: starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{}), logPath: logPath, logStart: fi.Size()}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// spawner starts processes from one OS thread that lives as long as the
// test binary: the kernel sends Pdeathsig when the thread that forked a
// child exits, not the process, and a goroutine's thread may exit (one
// that ends while locked to its thread takes the thread with it).
var spawner = sync.OnceValue(func() chan<- spawnRequest {
	requests := make(chan spawnRequest)
	go func() {
		runtime.LockOSThread() // and never unlocked: the thread stays
		for r := range requests {
			r.done <- r.cmd.Start()
		}
	}()
	return requests
})

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan<- error
}

// spawn starts cmd on the spawner's thread.
func spawn(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	spawner() <- spawnRequest{cmd, done}
	return <-done
}

// running reports whether the process has not exited yet.
func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends sig to the process group and waits up to grace for the
// process to exit, then kills the group. It returns once the process is
// reaped.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) error {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, sig)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			return fmt.Errorf("kubetest: %s (pid %d) did not exit after SIGKILL", p.name, pgid)
		}
	}
	return nil
}

// exitError describes how the process ended, for an error message; call it
// once exited is closed.
func (p *proc) exitError() error {
	if p.waitErr == nil {
		return errors.New("exited with status 0")
	}
	return p.waitErr
}

// logTail returns the last lines the process logged, each indented.
func (p *proc) logTail(lines int) string {
	return fileTail(p.logPath, p.logStart, lines)
}

// fileTail returns the last lines of path after offset from, indented.
func fileTail(path string, from int64, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return " (unreadable: " + err.Error() + ")"
	}
	defer f.Close()
	const maxBytes = 32 << 10
	if fi, err := f.Stat(); err == nil && fi.Size()-from > maxBytes {
		from = fi.Size() - maxBytes
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return " (unreadable: " + err.Error() + ")"
	}
	b, _ := io.ReadAll(f)
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	tail := strings.Join(all, "\n")
	if strings.TrimSpace(tail) == "" {
		return " (empty)"
	}
	return "\n    " + strings.ReplaceAll(tail, "\n", "\n    ")
}
