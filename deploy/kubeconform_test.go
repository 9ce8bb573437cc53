// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/yannh/kubeconform/pkg/validator"

	"github.com/ipam-dev/ipam/internal/kubetest"
)

// ---------------------------------------------------------------------------
// kubeconform: every manifest against the Kubernetes JSON schemas.
//
// By default kubeconform downloads the schemas of yannh/kubernetes-json-schema
// ({version}-standalone-strict), which cannot be reached from here. That
// repository makes them from the OpenAPI document of a Kubernetes release
// with openapi2jsonschema --kubernetes --expanded --stand-alone --strict;
// kubeconformSchemas does the same, for the kinds the manifests use, from the
// OpenAPI document of the release the tests' kube-apiserver is built from
// (k8s.io/kubernetes in tools/kube, kubetest.KubernetesVersion), which the Go
// module proxy serves. Nothing is skipped: without the document the test
// fails.

// notObjects are the YAML files under deploy/ that are no Kubernetes object:
// kustomizations, and a strategic-merge patch for an overlay.
var notObjects = []string{kustomizationFile, "csi-driver-patch.yaml"}

// openAPIDefinitions returns the definitions of the OpenAPI (v2) document of
// the k8s.io/kubernetes module tools/kube requires; go mod download fetches
// the module when the cache lacks it and checks it against tools/kube/go.sum.
func openAPIDefinitions(t *testing.T) map[string]any {
	t.Helper()
	goTool, err := exec.LookPath("go") // go test puts its own GOROOT/bin first in PATH
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), goTool, "mod", "download", "-json", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join(repoRoot(t), "tools", "kube")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	var mod struct{ Version, Dir, Error string }
	if jerr := json.Unmarshal(out, &mod); err != nil || jerr != nil || mod.Error != "" {
		t.Fatalf("go mod download k8s.io/kubernetes in tools/kube: %v %s %s", err, mod.Error, out)
	}
	if mod.Version != kubetest.KubernetesVersion {
		t.Fatalf("tools/kube requires k8s.io/kubernetes %s; kubetest.KubernetesVersion is %s", mod.Version, kubetest.KubernetesVersion)
	}
	b, err := os.ReadFile(filepath.Join(mod.Dir, "api", "openapi-spec", "swagger.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Definitions map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("swagger.json: %v", err)
	}
	if len(doc.Definitions) == 0 {
		t.Fatal("swagger.json has no definitions")
	}
	return doc.Definitions
}

// kubeconformSchemas writes into a new directory the schema of each
// apiVersion/kind of objs, as openapi2jsonschema --kubernetes --expanded
// --stand-alone --strict writes it, and returns the location template that
// finds them (kubeconform -schema-location). defs are the OpenAPI
// definitions; they are changed as openapi2jsonschema changes them.
func kubeconformSchemas(t *testing.T, defs map[string]any, objs []kubeObject) string {
	t.Helper()
	// Shared definitions: kubectl's view of int-or-string and quantities,
	// apiVersion and kind as enums, no undeclared properties.
	defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
	defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
	titles := map[[2]string]string{} // apiVersion, kind -> definition
	for title, d := range defs {
		def, _ := d.(map[string]any)
		gvks, _ := def["x-kubernetes-group-version-kind"].([]any)
		props, _ := def["properties"].(map[string]any)
		for _, g := range gvks {
			gvk, _ := g.(map[string]any)
			group, _ := gvk["group"].(string)
			version, _ := gvk["version"].(string)
			kind, _ := gvk["kind"].(string)
			apiVersion := version
			if group != "" {
				apiVersion = group + "/" + version
			}
			if p, ok := props["apiVersion"].(map[string]any); ok {
				appendEnum(p, apiVersion)
			}
			if p, ok := props["kind"].(map[string]any); ok {
				appendEnum(p, kind)
			}
			titles[[2]string{apiVersion, kind}] = title
		}
	}
	denyAdditionalProperties(defs)

	dir := t.TempDir()
	for _, o := range objs {
		title, ok := titles[[2]string{o.APIVersion, o.Kind}]
		if !ok {
			continue // kubeconform reports the missing schema
		}
		spec, err := inlineRefs(defs[title], defs)
		if err != nil {
			t.Fatalf("%s: %v", title, err)
		}
		s := spec.(map[string]any)
		s["$schema"] = "http://json-schema.org/schema#"
		if _, ok := s["type"]; !ok {
			s["type"] = "object"
		}
		s["additionalProperties"] = false
		if props, ok := s["properties"]; ok {
			s["properties"] = allowNullOptional(props, nil, nil, "")
		}
		parts := strings.Split(title, ".")
		kind, version, group := strings.ToLower(parts[len(parts)-1]), strings.ToLower(parts[len(parts)-2]), strings.ToLower(parts[len(parts)-3])
		name := kind + "-" + group + "-" + version
		if group == "core" || group == "api" {
			name = kind + "-" + version
		}
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "{{ .ResourceKind }}{{ .KindSuffix }}.json")
}

func appendEnum(prop map[string]any, v string) {
	enum, _ := prop["enum"].([]any)
	if !slices.Contains(enum, any(v)) {
		prop["enum"] = append(enum, v)
	}
}

// denyAdditionalProperties sets additionalProperties: false on every
// object under v that declares properties and says nothing of others
// (openapi2jsonschema --strict, after kubectl's validation).
func denyAdditionalProperties(v any) {
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	for _, x := range m {
		if xm, ok := x.(map[string]any); ok {
			_, props := xm["properties"]
			if _, set := xm["additionalProperties"]; props && !set {
				xm["additionalProperties"] = false
			}
			denyAdditionalProperties(xm)
		}
	}
}

// inlineRefs returns a copy of v with every $ref to a definition replaced
// by (a copy of) the definition, as --stand-alone does; a property's other
// keys beside its $ref (its description) go, as there.
func inlineRefs(v any, defs map[string]any) (any, error) {
	var err error
	var walk func(v any, stack []string) any
	walk = func(v any, stack []string) any {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				name, ok := strings.CutPrefix(ref, "#/definitions/")
				if _, known := defs[name]; !ok || !known || slices.Contains(stack, name) {
					err = cmp.Or(err, fmt.Errorf("$ref %q names no definition, or refers to itself through %v", ref, stack))
					return nil
				}
				return walk(defs[name], append(stack[:len(stack):len(stack)], name))
			}
			out := make(map[string]any, len(v))
			for k, x := range v {
				out[k] = walk(x, stack)
			}
			return out
		case []any:
			out := make([]any, len(v))
			for i, x := range v {
				out[i] = walk(x, stack)
			}
			return out
		}
		return v
	}
	out := walk(v, nil)
	return out, err
}

// allowNullOptional returns v with every type also allowing null, but for
// the properties an object requires: openapi2jsonschema's
// allow_null_optional_fields, whose arguments are v's parent and
// grandparent and the key of v in its parent.
func allowNullOptional(v, parent, grandParent any, key string) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		switch x := x.(type) {
		case map[string]any:
			out[k] = allowNullOptional(x, m, parent, k)
		case []any:
			l := make([]any, len(x))
			for i, e := range x {
				l[i] = allowNullOptional(e, x, parent, k)
			}
			out[k] = l
		case string:
			gp, _ := grandParent.(map[string]any)
			required, _ := gp["required"].([]any)
			if k == "type" && x != "null" && !slices.Contains(required, any(key)) {
				out[k] = []any{x, "null"}
			} else {
				out[k] = x
			}
		default:
			out[k] = x
		}
	}
	return out
}

// kubeconform validates files (name -> content) in strict mode against
// schemas made for the objects they hold, and returns every problem.
func kubeconform(t *testing.T, defs map[string]any, files map[string]string) error {
	t.Helper()
	var objs []kubeObject
	for _, name := range slices.Sorted(maps.Keys(files)) {
		o, _ := parseManifest(name, files[name]) // the other checks report its errors
		objs = append(objs, o...)
	}
	v, err := validator.New([]string{kubeconformSchemas(t, defs, objs)}, validator.Opts{Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(files)) {
		for i, r := range v.Validate(name, io.NopCloser(strings.NewReader(files[name]))) {
			switch r.Status {
			case validator.Valid, validator.Empty:
			case validator.Invalid:
				for _, ve := range r.ValidationErrors {
					errs = append(errs, fmt.Errorf("%s: document %d: %s: %s", name, i+1, ve.Path, ve.Msg))
				}
				if len(r.ValidationErrors) == 0 {
					errs = append(errs, fmt.Errorf("%s: document %d: %w", name, i+1, r.Err))
				}
			default:
				errs = append(errs, fmt.Errorf("%s: document %d: %v", name, i+1, r.Err))
			}
		}
	}
	return errors.Join(errs...)
}

// TestKubeconform validates every manifest under deploy/ with kubeconform.
func TestKubeconform(t *testing.T) {
	root := filepath.Join(repoRoot(t), "deploy")
	files := map[string]string{}
	for _, dir := range []string{kubeDir, cniDir, filepath.Join(cniDir, "examples"), "kube-access"} {
		for name, src := range readKubeDir(t, filepath.Join(root, dir)) {
			if isYAML(name) && !slices.Contains(notObjects, name) {
				files[filepath.ToSlash(filepath.Join(dir, name))] = src
			}
		}
	}
	if len(files) < 10 {
		t.Fatalf("found only %v", slices.Sorted(maps.Keys(files)))
	}
	if err := kubeconform(t, openAPIDefinitions(t), files); err != nil {
		t.Errorf("kubeconform:\n%v", err)
	}
}

// TestKubeconformFindsProblems shows that the schemas are not vacuous: each
// edit of goodKube breaks a rule that only the schema knows here.
func TestKubeconformFindsProblems(t *testing.T) {
	const dep, svc = "deployment.yaml", "service.yaml"
	defs := openAPIDefinitions(t)
	tests := []struct {
		name    string
		edit    kubeEdit
		wantErr string // "" means valid
	}{
		{name: "valid"},
		{"unknown field", kubeEdit{dep, "readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true"}, "additional properties 'readOnlyRootFileSystem' not allowed"},
		{"port as a string", kubeEdit{svc, "port: 443", `port: "443"`}, "/spec/ports/0/port: got string, want integer"},
		{"no containers", kubeEdit{dep, "      containers:\n        - name: server\n", "      initContainers:\n        - name: server\n"}, "/spec/template/spec: missing property 'containers'"},
		{"bool annotation", kubeEdit{dep, `prometheus.io/scrape: "true"`, "prometheus.io/scrape: true"}, "/spec/template/metadata/annotations/prometheus.io/scrape: got boolean, want null or string"},
		{"removed API version", kubeEdit{"pdb.yaml", "policy/v1", "policy/v1beta1"}, "could not find schema for PodDisruptionBudget"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := maps.Clone(goodKube)
			delete(files, kustomizationFile)
			if tt.edit.file != "" {
				files[tt.edit.file] = edit(t, files[tt.edit.file], tt.edit.old, tt.edit.new)
			}
			wantError(t, "kubeconform", kubeconform(t, defs, files), tt.wantErr)
		})
	}
}
