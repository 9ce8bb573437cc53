// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// spdxLine is the licence line every hand-written source file carries near
// its top, as Cilium's and the CNI plugins' sources do: a file copied out
// of the repository keeps its licence.
const spdxLine = "SPDX-License-Identifier: Apache-2.0"

// licensedSource says whether a tracked file is source that carries the
// SPDX line: Go, shell, JavaScript and TypeScript, the Dockerfiles and the
// CI script. Generated files (their own header says so) are left as their
// generator writes them.
func licensedSource(path string) bool {
	switch filepath.Ext(path) {
	case ".go", ".sh", ".js", ".mjs", ".ts":
		return true
	}
	base := filepath.Base(path)
	return base == "Dockerfile" || path == ".ci/run"
}

// generated says whether a file's head marks it as written by a tool.
func generated(head string) bool {
	return strings.Contains(head, "Code generated") || strings.Contains(head, "auto-generated")
}

// The licence is stated where the ecosystem states it: LICENSE, the Helm
// chart, the TypeScript package, the image's label, and an SPDX line at
// the top of every hand-written source file.
func TestLicenceIsStated(t *testing.T) {
	root := repoRoot(t)
	if l := readFile(t, filepath.Join(root, "LICENSE")); !strings.Contains(l, "Apache License") || !strings.Contains(l, "Version 2.0, January 2004") {
		t.Error("LICENSE is not the Apache License 2.0")
	}
	for path, want := range map[string]string{
		"deploy/helm/ipam/Chart.yaml": "artifacthub.io/license: Apache-2.0",
		"api/typescript/package.json": `"license": "Apache-2.0"`,
		"Dockerfile":                  `org.opencontainers.image.licenses="Apache-2.0"`,
	} {
		if !strings.Contains(readFile(t, filepath.Join(root, path)), want) {
			t.Errorf("%s does not say %s", path, want)
		}
	}

	cmd := exec.Command("git", "ls-files")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git ls-files (the check needs the repository's file list): %v", err)
	}
	checked := 0
	for _, path := range strings.Fields(string(out)) {
		if !licensedSource(path) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, path))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet committed
		} else if err != nil {
			t.Fatal(err)
		}
		head := string(b[:min(len(b), 400)])
		if generated(head) {
			continue
		}
		checked++
		lines := strings.SplitN(head, "\n", 4)
		found := false
		for _, l := range lines[:min(3, len(lines))] {
			if strings.Contains(l, spdxLine) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no %q in its first lines", path, spdxLine)
		}
	}
	if checked < 100 {
		t.Errorf("only %d source files checked; the file list looks wrong", checked)
	}
	t.Logf("%d hand-written source files carry the SPDX line", checked)
}
