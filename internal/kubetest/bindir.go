// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package kubetest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// KubernetesVersion is the version of kube-apiserver the tests run: the
// k8s.io/kubernetes that tools/kube requires (a test keeps them equal).
const KubernetesVersion = "v1.37.2"

// BinDirEnv names the environment variable that points the tests at a
// directory holding kube-apiserver and etcd, instead of the cache that
// scripts/ensure-kube.sh (make tools) builds them into.
const BinDirEnv = "IPAM_KUBE_BIN_DIR"

// binaries are the programs a cluster runs.
var binaries = []string{"etcd", "kube-apiserver"}

// ErrNoBinaries marks a directory without the binaries: BinDir's and
// Launch's errors wrap it, so that a program can tell a machine that has
// not run `make tools` from a cluster that failed to start.
var ErrNoBinaries = errors.New("no kube-apiserver and etcd")

// buildHint says how to get the binaries, after a missing-binaries error.
const buildHint = "`make tools` builds them (scripts/ensure-kube.sh; a cold build takes 15-40 minutes, then it is cached)"

// ToolsDir is the cache that the scripts of make tools build test tools
// into, one directory per tool and version, shared by every checkout:
// ${IPAM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-tools}.
func ToolsDir() string {
	if base := os.Getenv("IPAM_TOOLS_DIR"); base != "" {
		return base
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "ipam-tools")
}

// CacheDir is where scripts/ensure-kube.sh builds the binaries:
// ToolsDir()/kube-<version>.
func CacheDir() string {
	return filepath.Join(ToolsDir(), "kube-"+KubernetesVersion)
}

// BinDir returns the directory holding kube-apiserver and etcd: $IPAM_KUBE_BIN_DIR
// when set (and then only it), else CacheDir. The error wraps ErrNoBinaries
// when a binary is missing there.
func BinDir() (string, error) {
	dir, from := os.Getenv(BinDirEnv), "$"+BinDirEnv
	if dir == "" {
		dir, from = CacheDir(), "the cache of make tools"
	}
	for _, name := range binaries {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("%w in %s (%s): %v", ErrNoBinaries, dir, from, err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return "", fmt.Errorf("%w in %s (%s): %s is not an executable file", ErrNoBinaries, dir, from, name)
		}
	}
	return dir, nil
}

// requireBinDir returns BinDir, or ends the test when the binaries are
// missing: skipped on a developer's machine, failed under CI ($CI set),
// which must never skip these tests.
func requireBinDir(t testing.TB) string {
	t.Helper()
	dir, err := BinDir()
	if err == nil {
		return dir
	}
	msg := fmt.Sprintf("kubetest: %v; %s", err, buildHint)
	if os.Getenv("CI") != "" {
		t.Fatal(msg + "; CI must run the Kubernetes tests, never skip them")
	}
	t.Skip(msg)
	return ""
}
