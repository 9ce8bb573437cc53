// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ipamclient_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The Go example of docs/clients.md (its one ```go block) compiles against
// this package as it stands: it is built as a main package placed, through
// an overlay, in a directory of this module that does not exist on disk.
func TestDocsExampleBuilds(t *testing.T) {
	readme, err := os.ReadFile("../../docs/clients.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```go\n")
	if !ok {
		t.Fatal("docs/clients.md has no ```go block")
	}
	src, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatal("unterminated ```go block")
	}
	if !strings.Contains(src, `"github.com/ipam-dev/ipam/api/ipamclient"`) {
		t.Fatal("the Go example of docs/clients.md does not use api/ipamclient")
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "main.go")
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	virtual := filepath.Join(wd, "readmeexample", "main.go")
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {virtual: file}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "overlay.json"), overlay, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-overlay", filepath.Join(dir, "overlay.json"), "-o", filepath.Join(dir, "example"), "./readmeexample")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Go example of docs/clients.md does not build: %v\n%s", err, out)
	}
}
