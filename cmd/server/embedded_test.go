// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// postmasterPID reads the embedded PostgreSQL's process id from its
// postmaster.pid; 0 when there is none.
func postmasterPID(t *testing.T, dataDir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "pgdata", "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}

// Without --database-url the server runs its own PostgreSQL; killed, it is
// started again and the server answers from it, while /healthz stays 200
// (liveness fails only when restarts keep failing: pgembed's tests).
func TestEmbeddedPostgresRestartsAfterKill(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "d")
	base := startServer(t, "", "--data-dir", dataDir, "--insecure-http", "--dev-no-auth")
	status := func(path string) int {
		c := &http.Client{Timeout: 5 * time.Second}
		res, err := c.Get(base + path)
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
	}
	if s := status("/readyz"); s != http.StatusOK {
		t.Fatalf("readyz %d before the kill", s)
	}
	first := postmasterPID(t, dataDir)
	if first == 0 {
		t.Fatal("no postmaster.pid")
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if pid := postmasterPID(t, dataDir); pid != 0 && pid != first && status("/readyz") == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the embedded PostgreSQL did not come back within a minute (readyz %d)", status("/readyz"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := status("/healthz"); s != http.StatusOK {
		t.Fatalf("healthz %d after the restart", s)
	}
	if s := status("/v1/pools"); s != http.StatusOK {
		t.Fatalf("GET /v1/pools %d after the restart", s)
	}
}
