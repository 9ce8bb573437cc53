// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package pgembed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// BinDirEnv names the environment variable that, when set, is the only
// directory FindBinDir considers.
const BinDirEnv = "IPAM_PG_BINDIR"

// debianBinGlob matches the server binary directories of Debian and Ubuntu's
// postgresql-NN packages, which are not on $PATH.
const debianBinGlob = "/usr/lib/postgresql/*/bin"

// FindBinDir returns the directory holding the PostgreSQL server binaries
// initdb and postgres. It looks, in order, at:
//
//  1. $IPAM_PG_BINDIR; when set it must hold both binaries, or FindBinDir
//     fails without looking further;
//  2. the highest version of /usr/lib/postgresql/*/bin (Debian, Ubuntu);
//  3. the directory of initdb or pg_ctl found on $PATH, after resolving
//     symbolic links.
//
// When nothing is found the error wraps ErrNoPostgres and names the command
// that installs the binaries.
func FindBinDir() (string, error) {
	return findBinDir(os.Getenv(BinDirEnv), debianBinGlob, exec.LookPath)
}

// findBinDir is FindBinDir with its inputs made explicit for tests.
func findBinDir(envDir, glob string, lookPath func(string) (string, error)) (string, error) {
	if envDir != "" {
		if err := checkBinDir(envDir); err != nil {
			return "", fmt.Errorf("$%s=%q: %w", BinDirEnv, envDir, err)
		}
		return envDir, nil
	}
	dirs, _ := filepath.Glob(glob) // the only possible error is a bad pattern
	slices.SortFunc(dirs, func(a, b string) int {
		return compareVersions(filepath.Base(filepath.Dir(b)), filepath.Base(filepath.Dir(a)))
	})
	for _, d := range dirs {
		if checkBinDir(d) == nil {
			return d, nil
		}
	}
	for _, name := range []string{"initdb", "pg_ctl"} {
		p, err := lookPath(name)
		if err != nil {
			continue
		}
		if resolved, err := filepath.EvalSymlinks(p); err == nil {
			p = resolved
		}
		if d := filepath.Dir(p); checkBinDir(d) == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w in $%s, %s or $PATH; install them with `apt-get install -y postgresql` "+
		"(as root on Debian/Ubuntu; scripts/ensure-postgres.sh does it) or set $%s",
		ErrNoPostgres, BinDirEnv, debianBinGlob, BinDirEnv)
}

// checkBinDir reports whether dir holds executable initdb and postgres files.
func checkBinDir(dir string) error {
	for _, name := range []string{"initdb", "postgres"} {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("%w: %v", ErrNoPostgres, err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("%w: %s is not an executable file", ErrNoPostgres, p)
		}
	}
	return nil
}

// compareVersions orders PostgreSQL major versions such as "9.6" and "15"
// numerically, part by part. A part that is not a number sorts below every
// number.
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		na, nb := versionPart(pa, i), versionPart(pb, i)
		if na != nb {
			if na < nb {
				return -1
			}
			return 1
		}
	}
	return 0
}

func versionPart(parts []string, i int) int {
	if i >= len(parts) {
		return 0
	}
	n, err := strconv.Atoi(parts[i])
	if err != nil {
		return -1
	}
	return n
}
