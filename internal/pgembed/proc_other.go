// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

//go:build unix && !linux

package pgembed

import "syscall"

// serverSysProcAttr returns the attributes of the postmaster process: its own
// process group, so that a terminal's Ctrl-C reaches only the Go program.
func serverSysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}

// processesInDir is only implemented on Linux; elsewhere ok is false and
// PostgreSQL's own stale-lock-file check decides.
func processesInDir(string) (pids []int, ok bool) { return nil, false }
