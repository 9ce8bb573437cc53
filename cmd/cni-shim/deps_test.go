// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// bannedDeps are the packages the plugin must not link: it runs on every
// node and only talks to the service over HTTP, so it has no use for the
// router, the database driver, the store or the server's packages. Each is
// a package path, banned with everything under it.
var bannedDeps = []string{
	"github.com/go-chi/chi",
	"github.com/jackc/pgx",
	"github.com/ipam-dev/ipam/api/ipamv1",
	"github.com/ipam-dev/ipam/internal/api",
	"github.com/ipam-dev/ipam/internal/alloc",
	"github.com/ipam-dev/ipam/internal/store",
}

// The plugin is a client of the service: go list -deps names none of
// bannedDeps. The binary TestMain built is logged with its size.
func TestDependsOnNoServerCode(t *testing.T) {
	// go test puts its own GOROOT/bin first in PATH; without a go command
	// the test fails, it does not skip.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the plugin's dependencies: %v", err)
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	self := "github.com/ipam-dev/ipam/cmd/cni-shim"
	found := false
	for _, dep := range deps {
		found = found || dep == self
		for _, banned := range bannedDeps {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("cni-shim depends on %s", dep)
			}
		}
	}
	if !found {
		t.Fatalf("go list -deps does not name %s; got %d packages:\n%s", self, len(deps), out)
	}

	fi, err := os.Stat(shimBin)
	if err != nil {
		t.Fatalf("the plugin binary: %v", err)
	}
	t.Logf("%d packages in its build; %s is %d bytes", len(deps), pluginType, fi.Size())
}
