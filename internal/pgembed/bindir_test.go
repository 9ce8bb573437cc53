// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package pgembed

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeBinDir creates dir with the named files, executable.
func fakeBinDir(t *testing.T, dir string, names ...string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestFindBinDir(t *testing.T) {
	root := t.TempDir()
	lib := filepath.Join(root, "lib")
	fakeBinDir(t, filepath.Join(lib, "9.6", "bin"), "initdb", "postgres")
	v13 := fakeBinDir(t, filepath.Join(lib, "13", "bin"), "initdb", "postgres")
	fakeBinDir(t, filepath.Join(lib, "16", "bin"), "initdb") // client-only leftovers: no postgres
	onPath := fakeBinDir(t, filepath.Join(root, "usr", "lib", "pg", "bin"), "initdb", "postgres", "pg_ctl")
	linkDir := fakeBinDir(t, filepath.Join(root, "usr", "local", "bin"))
	if err := os.Symlink(filepath.Join(onPath, "pg_ctl"), filepath.Join(linkDir, "pg_ctl")); err != nil {
		t.Fatal(err)
	}
	noGlob := filepath.Join(root, "none", "*", "bin")
	lookNone := func(string) (string, error) { return "", exec.ErrNotFound }
	lookLinkedPgCtl := func(name string) (string, error) {
		if name == "pg_ctl" {
			return filepath.Join(linkDir, "pg_ctl"), nil
		}
		return "", exec.ErrNotFound
	}

	tests := []struct {
		name     string
		env      string
		glob     string
		lookPath func(string) (string, error)
		want     string
		wantErr  string
	}{
		{name: "env wins", env: onPath, glob: filepath.Join(lib, "*", "bin"), lookPath: lookNone, want: onPath},
		{name: "env without binaries fails", env: filepath.Join(lib, "16", "bin"), glob: filepath.Join(lib, "*", "bin"),
			lookPath: lookNone, wantErr: "$IPAM_PG_BINDIR"},
		{name: "highest complete version", glob: filepath.Join(lib, "*", "bin"), lookPath: lookNone, want: v13},
		{name: "PATH, symlink resolved", glob: noGlob, lookPath: lookLinkedPgCtl, want: onPath},
		{name: "nothing found", glob: noGlob, lookPath: lookNone, wantErr: "apt-get install -y postgresql"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := findBinDir(tt.env, tt.glob, tt.lookPath)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrNoPostgres) {
					t.Fatalf("findBinDir() = %q, %v; want ErrNoPostgres mentioning %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("findBinDir() = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestFindBinDirOnThisMachine(t *testing.T) {
	dir, err := FindBinDir()
	if err != nil {
		t.Fatalf("FindBinDir: %v (the tests need PostgreSQL: run scripts/ensure-postgres.sh)", err)
	}
	t.Logf("FindBinDir() = %s", dir)
}

func TestCompareVersions(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"15", "9.6", 1},
		{"9.6", "10", -1},
		{"13", "13", 0},
		{"9.6", "9.5", 1},
		{"beta", "9", -1},
	}
	for _, tt := range tests {
		if got := compareVersions(tt.a, tt.b); got != tt.want {
			t.Errorf("compareVersions(%q, %q) = %d; want %d", tt.a, tt.b, got, tt.want)
		}
	}
}
