// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package pgembed

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// serverSysProcAttr returns the attributes of the postmaster process: its own
// process group, so that a terminal's Ctrl-C reaches only the Go program,
// which then stops the cluster in order; and an immediate shutdown (SIGQUIT)
// when the Go program dies without calling Stop.
func serverSysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGQUIT, Credential: cred}
}

// processesInDir returns the ids of the processes whose working directory is
// dir. Every PostgreSQL server process works in its data directory, so a
// non-empty answer means a server, or orphans of a crashed one, still use it.
// Processes it may not inspect are left out; ok is false when /proc cannot be
// read at all.
func processesInDir(dir string) (pids []int, ok bool) {
	want, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, false
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err == nil && cwd == want {
			pids = append(pids, pid)
		}
	}
	return pids, true
}
