// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/ipam-dev/ipam/internal/kubetest"
)

// ---------------------------------------------------------------------------
// deploy/helm/ipam: the Helm chart, rendered by a real helm (built from
// tools/helm by scripts/ensure-helm.sh, as kube-apiserver is from tools/kube),
// linted, checked with the static checks of deploy/kubernetes and
// deploy/cni, and validated by a real kube-apiserver (server-side dry run).

const (
	chartDir = "helm/ipam" // under deploy/
	// releaseName and releaseNamespace give the chart's objects the names
	// of deploy/kubernetes and deploy/kube-access (ipam-server in ipam).
	releaseName      = "ipam"
	releaseNamespace = serverNamespace
	// helmBinDirEnv points the tests at a directory holding helm, instead
	// of the cache that scripts/ensure-helm.sh builds it into.
	helmBinDirEnv = "IPAM_HELM_BIN_DIR"
	// updateManifestsEnv makes TestRenderedManifests write the rendered
	// plain manifests instead of comparing them (`make manifests`).
	updateManifestsEnv = "IPAM_UPDATE_MANIFESTS"
)

// ciValueSets are the chart's value sets under ci/ ("" is the defaults),
// each rendered, linted and validated by the API server.
var ciValueSets = []string{"", "everything", "existing-secrets", "created-secrets", "ha", "cni"}

func ciValuesFile(t *testing.T, set string) string {
	t.Helper()
	if set == "" {
		return ""
	}
	return filepath.Join(repoRoot(t), "deploy", chartDir, "ci", set+"-values.yaml")
}

// helmVersion is the helm.sh/helm/v4 that tools/helm requires.
func helmVersion(t *testing.T) string {
	t.Helper()
	src := readFile(t, filepath.Join(repoRoot(t), "tools", "helm", "go.mod"))
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?helm\.sh/helm/v4\s+(v\S+)`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("tools/helm/go.mod requires no helm.sh/helm/v4")
	}
	return m[1]
}

// helmBinary returns the helm that scripts/ensure-helm.sh (make tools)
// builds, ${IPAM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-tools}/helm-<version>/helm,
// or the one in $IPAM_HELM_BIN_DIR. Without it the test is skipped with a
// message on a developer's machine and fails under CI ($CI set), which
// must never skip the chart's tests.
func helmBinary(t *testing.T) string {
	t.Helper()
	version := helmVersion(t)
	dir, from := os.Getenv(helmBinDirEnv), "$"+helmBinDirEnv
	if dir == "" {
		dir, from = filepath.Join(kubetest.ToolsDir(), "helm-"+version), "the cache of make tools"
	}
	bin := filepath.Join(dir, "helm")
	fi, err := os.Stat(bin)
	if err == nil && (!fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0) {
		err = errors.New("not an executable file")
	}
	if err != nil {
		msg := fmt.Sprintf("no helm %s in %s (%s): %v; `make tools` builds it (scripts/ensure-helm.sh; a few minutes cold, then cached)", version, dir, from, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg + "; CI must run the chart's tests, never skip them")
		}
		t.Skip(msg)
	}
	return bin
}

// helmCmd runs helm with args, in a home of its own (no user's repositories,
// plugins or registry logins change what it does), and returns its
// standard output; err carries the standard error.
func helmCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := helmBinary(t)
	home := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
		"KUBECONFIG="+filepath.Join(home, "no-kubeconfig"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.String(), nil
}

// renderChart runs helm template on the chart as release ipam in namespace
// ipam, for the Kubernetes version the tests' API server runs, with the
// values files (and then any extra arguments, such as --show-only).
func renderChart(t *testing.T, valuesFiles []string, extra ...string) (string, error) {
	t.Helper()
	args := []string{"template", releaseName, filepath.Join(repoRoot(t), "deploy", chartDir),
		"--namespace", releaseNamespace, "--kube-version", kubetest.KubernetesVersion}
	for _, f := range valuesFiles {
		if f != "" {
			args = append(args, "--values", f)
		}
	}
	return helmCmd(t, append(args, extra...)...)
}

// renderedDoc is one document of helm template's output.
type renderedDoc struct {
	source string // the template, e.g. ipam/templates/deployment.yaml
	text   string // without the --- and # Source: lines
}

// splitRendered splits helm template's output into its documents.
func splitRendered(out string) ([]renderedDoc, error) {
	var docs []renderedDoc
	for _, part := range strings.Split("\n"+out, "\n---\n") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		first, rest, _ := strings.Cut(part, "\n")
		src, ok := strings.CutPrefix(first, "# Source: ")
		if !ok {
			return nil, fmt.Errorf("a document of helm template's output does not start with # Source: %q", first)
		}
		// helm ends each document with an empty line: keep one newline.
		docs = append(docs, renderedDoc{source: src, text: strings.TrimRight(rest, "\n") + "\n"})
	}
	return docs, nil
}

// renderedObjects renders the chart with one value set and parses every
// object strictly (parseManifest); it fails the test on any error.
func renderedObjects(t *testing.T, set string) ([]renderedDoc, []kubeObject) {
	t.Helper()
	out, err := renderChart(t, []string{ciValuesFile(t, set)})
	if err != nil {
		t.Fatal(err)
	}
	docs, objs, err := parseRendered(out)
	if err != nil {
		t.Fatalf("values %q: %v", cmp.Or(set, "defaults"), err)
	}
	return docs, objs
}

func parseRendered(out string) ([]renderedDoc, []kubeObject, error) {
	docs, err := splitRendered(out)
	if err != nil {
		return nil, nil, err
	}
	var objs []kubeObject
	var errs []error
	for _, d := range docs {
		o, err := parseManifest(d.source, d.text)
		errs = append(errs, err)
		objs = append(objs, o...)
	}
	return docs, objs, errors.Join(errs...)
}

// ---------------------------------------------------------------------------
// The controllers: each value that turns one on adds its flags and RBAC.

// controllerRoles are the roles of the server's Kubernetes controllers, by
// the suffix of their names after the server's (ipam-server-...), with
// the file of deploy/kube-access that holds them.
var controllerRoles = []struct {
	suffix, kind, file string
	// on tells from the server's environment whether the role is needed.
	on func(env map[string]string) bool
}{
	{"pod-metadata", "ClusterRole", "rbac.yaml", func(env map[string]string) bool { return env["IPAM_KUBE_IN_CLUSTER"] == "true" }},
	{"cilium-operator", "ClusterRole", "cilium-operator.yaml", func(env map[string]string) bool { return env["IPAM_CILIUM_IPAM_MODE"] != "" }},
	{"lbipam", "ClusterRole", "lbipam.yaml", func(env map[string]string) bool { return env["IPAM_LBIPAM"] == "true" }},
	{"leader-election", "Role", "cilium-operator.yaml", func(env map[string]string) bool {
		return env["IPAM_CILIUM_IPAM_MODE"] != "" || env["IPAM_LBIPAM"] == "true"
	}},
}

// serverOf returns the server's Deployment among objs and its container's
// literal environment, with "fieldRef:PATH" for a variable from the Pod.
func serverOf(objs []kubeObject) (*appsv1.Deployment, kubeObject, map[string]string, error) {
	var found []kubeObject
	for _, o := range objs {
		if d, ok := o.Object.(*appsv1.Deployment); ok && d.Spec.Template.Labels["app.kubernetes.io/component"] == "server" {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		return nil, kubeObject{}, nil, fmt.Errorf("%d Deployments of the server; want 1", len(found))
	}
	d := found[0].Object.(*appsv1.Deployment)
	if len(d.Spec.Template.Spec.Containers) == 0 {
		return nil, kubeObject{}, nil, fmt.Errorf("%v has no container", found[0])
	}
	env := map[string]string{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	return d, found[0], env, nil
}

// checkChartControllers checks that the rendered chart grants the RBAC of
// exactly the controllers its server runs, to the server's account, and
// that each runs with what it needs: the service account token, and its
// Lease in the server's namespace.
func checkChartControllers(objs []kubeObject) error {
	d, dep, env, err := serverOf(objs)
	if err != nil {
		return err
	}
	var errs []error
	fail := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	pod := d.Spec.Template.Spec
	kube := env["IPAM_KUBE_IN_CLUSTER"] == "true"
	if isTrue(pod.AutomountServiceAccountToken) != kube {
		fail("%v: automountServiceAccountToken %v but IPAM_KUBE_IN_CLUSTER %q: the token must be there exactly when the server calls the API", dep, isTrue(pod.AutomountServiceAccountToken), env["IPAM_KUBE_IN_CLUSTER"])
	}
	for _, o := range objs {
		if sa, ok := o.Object.(*corev1.ServiceAccount); ok && sa.Name == pod.ServiceAccountName && isTrue(sa.AutomountServiceAccountToken) != kube {
			fail("%v: automountServiceAccountToken %v but IPAM_KUBE_IN_CLUSTER %q", o, isTrue(sa.AutomountServiceAccountToken), env["IPAM_KUBE_IN_CLUSTER"])
		}
	}
	if (env["IPAM_CILIUM_IPAM_MODE"] != "" || env["IPAM_LBIPAM"] == "true") && !kube {
		fail("%v: a Kubernetes controller runs without IPAM_KUBE_IN_CLUSTER=true", dep)
	}
	if (env["IPAM_NODE_IPAM"] == "true" || env["IPAM_LBIPAM_MIRROR"] == "true") && env["IPAM_LBIPAM"] != "true" {
		fail("%v: IPAM_NODE_IPAM or IPAM_LBIPAM_MIRROR without IPAM_LBIPAM=true", dep)
	}
	if env["IPAM_CILIUM_CLUSTER_POOL_TO_MULTI_POOL_MIGRATION"] == "true" && env["IPAM_CILIUM_IPAM_MODE"] != "multi-pool" {
		fail("%v: IPAM_CILIUM_CLUSTER_POOL_TO_MULTI_POOL_MIGRATION without IPAM_CILIUM_IPAM_MODE=multi-pool (the server refuses to start)", dep)
	}
	if env["IPAM_CILIUM_IPAM_MODE"] != "" && env["IPAM_CILIUM_LEASE_NAMESPACE"] != "fieldRef:metadata.namespace" {
		fail("%v: IPAM_CILIUM_LEASE_NAMESPACE is not the Pod's namespace, where the Role grants the Lease", dep)
	}
	if env["IPAM_LBIPAM"] == "true" && env["IPAM_LBIPAM_LEASE_NAMESPACE"] != "fieldRef:metadata.namespace" {
		fail("%v: IPAM_LBIPAM_LEASE_NAMESPACE is not the Pod's namespace, where the Role grants the Lease", dep)
	}

	prefix := d.Name + "-"
	roles, bindings := map[string]kubeObject{}, map[string]kubeObject{}
	for _, o := range objs {
		switch o.Kind {
		case "ClusterRole", "Role":
			roles[o.Kind+"/"+o.Metadata.Name] = o
		case "ClusterRoleBinding", "RoleBinding":
			bindings[o.Kind+"/"+o.Metadata.Name] = o
		}
	}
	for _, r := range controllerRoles {
		name := prefix + r.suffix
		role, hasRole := roles[r.kind+"/"+name]
		binding, hasBinding := bindings[r.kind+"Binding/"+name]
		delete(roles, r.kind+"/"+name)
		delete(bindings, r.kind+"Binding/"+name)
		on := r.on(env)
		switch {
		case on && (!hasRole || !hasBinding):
			fail("the server's environment turns on what %s %s grants, but the chart renders no such %s and %sBinding", r.kind, name, r.kind, r.kind)
		case !on && (hasRole || hasBinding):
			fail("the chart grants %s %s, but the server's environment turns on nothing that needs it", r.kind, name)
		}
		if !hasBinding {
			continue
		}
		var ref rbacv1.RoleRef
		var subjects []rbacv1.Subject
		switch b := binding.Object.(type) {
		case *rbacv1.ClusterRoleBinding:
			ref, subjects = b.RoleRef, b.Subjects
		case *rbacv1.RoleBinding:
			ref, subjects = b.RoleRef, b.Subjects
		}
		if ref.Kind != r.kind || ref.Name != name {
			fail("%v binds %s %s; want %s %s", binding, ref.Kind, ref.Name, r.kind, name)
		}
		want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: pod.ServiceAccountName, Namespace: dep.Metadata.Namespace}}
		if !reflect.DeepEqual(subjects, want) {
			fail("%v binds %v; want the server's account %s/%s only", binding, subjects, dep.Metadata.Namespace, pod.ServiceAccountName)
		}
		if r.kind == "Role" && (role.Metadata.Namespace != dep.Metadata.Namespace || binding.Metadata.Namespace != dep.Metadata.Namespace) {
			fail("%v: namespace %q; want the server's %q, where its Leases are", role, role.Metadata.Namespace, dep.Metadata.Namespace)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(roles)) {
		fail("%v is no role of a controller of the server", roles[k])
	}
	for _, k := range slices.Sorted(maps.Keys(bindings)) {
		fail("%v is no binding of a controller of the server", bindings[k])
	}
	return errors.Join(errs...)
}

// policyTuples expands RBAC rules into sorted "group resource verb
// [names]" lines, so that two rule lists compare by what they grant, not by
// how they group it.
func policyTuples(rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					t := fmt.Sprintf("%q %s %s", g, res, v)
					if len(r.ResourceNames) > 0 {
						t += fmt.Sprintf(" names %v", r.ResourceNames)
					}
					out = append(out, t)
				}
			}
		}
		for _, u := range r.NonResourceURLs {
			for _, v := range r.Verbs {
				out = append(out, fmt.Sprintf("nonResourceURL %s %s", u, v))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func rulesOf(o kubeObject) []rbacv1.PolicyRule {
	switch r := o.Object.(type) {
	case *rbacv1.ClusterRole:
		return r.Rules
	case *rbacv1.Role:
		return r.Rules
	}
	return nil
}

// checkRBACEqualsKubeAccess checks that every role the chart renders grants
// exactly what the role of the same kind and name in deploy/kube-access
// grants, and that every role there is rendered (kubeAccess: file name ->
// content).
func checkRBACEqualsKubeAccess(rendered []kubeObject, kubeAccess map[string]string) error {
	var errs []error
	want := map[string]kubeObject{}
	for _, name := range slices.Sorted(maps.Keys(kubeAccess)) {
		objs, err := parseManifest("kube-access/"+name, kubeAccess[name])
		errs = append(errs, err)
		for _, o := range objs {
			if o.Kind == "ClusterRole" || o.Kind == "Role" {
				want[o.Kind+"/"+o.Metadata.Name] = o
			}
		}
	}
	got := map[string]kubeObject{}
	for _, o := range rendered {
		if o.Kind == "ClusterRole" || o.Kind == "Role" {
			got[o.Kind+"/"+o.Metadata.Name] = o
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		g, ok := got[k]
		if !ok {
			errs = append(errs, fmt.Errorf("the chart renders no %s, which %s holds", k, want[k].file))
			continue
		}
		if gt, wt := policyTuples(rulesOf(g)), policyTuples(rulesOf(want[k])); !slices.Equal(gt, wt) {
			errs = append(errs, fmt.Errorf("%s: the chart grants\n  %s\nbut %s grants\n  %s", k, strings.Join(gt, "\n  "), want[k].file, strings.Join(wt, "\n  ")))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			errs = append(errs, fmt.Errorf("the chart renders %s, which deploy/kube-access does not hold", k))
		}
	}
	return errors.Join(errs...)
}

func readKubeAccess(t *testing.T) map[string]string {
	t.Helper()
	files := readKubeDir(t, filepath.Join(repoRoot(t), "deploy", "kube-access"))
	if len(files) != 3 {
		t.Fatalf("deploy/kube-access holds %v", slices.Sorted(maps.Keys(files)))
	}
	return files
}

// ---------------------------------------------------------------------------
// Tests of the chart

// helm lint --strict: with the defaults and every value set of ci/.
func TestHelmLint(t *testing.T) {
	helmBinary(t) // one skip (or failure) for the whole test without helm
	chart := filepath.Join(repoRoot(t), "deploy", chartDir)
	for _, set := range ciValueSets {
		t.Run(cmp.Or(set, "defaults"), func(t *testing.T) {
			args := []string{"lint", "--strict", chart, "--namespace", releaseNamespace, "--kube-version", kubetest.KubernetesVersion}
			if f := ciValuesFile(t, set); f != "" {
				args = append(args, "--values", f)
			}
			out, err := helmCmd(t, args...)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			if !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint:\n%s", out)
			}
		})
	}
}

// Each value set renders what it says: the objects, the server's flags for
// its controllers, and the RBAC of exactly those controllers.
func TestHelmTemplate(t *testing.T) {
	helmBinary(t) // one skip (or failure) for the whole test without helm
	const (
		srv = "Deployment ipam-server"
		svc = "Service ipam-server"
		sa  = "ServiceAccount ipam-server"
		pdb = "PodDisruptionBudget ipam-server"
	)
	rbac := func(suffix string) []string {
		kind := "ClusterRole"
		if suffix == "leader-election" {
			kind = "Role"
		}
		return []string{kind + " ipam-server-" + suffix, kind + "Binding ipam-server-" + suffix}
	}
	cni := []string{"ConfigMap ipam-cni-config", "DaemonSet ipam-cni"}
	tests := []struct {
		set     string
		objects []string
		env     map[string]string // "" means unset
	}{
		{set: "", objects: []string{srv, svc, sa, pdb},
			env: map[string]string{"IPAM_DATABASE_URL": "secret:ipam-database/IPAM_DATABASE_URL", "IPAM_KUBE_IN_CLUSTER": "", "IPAM_CILIUM_IPAM_MODE": "", "IPAM_LBIPAM": "", "IPAM_CLOUD_PROVIDER": "", "IPAM_BOOTSTRAP_TOKEN_FILE": "", "IPAM_CLUSTER_SPACE": "", "IPAM_AWS_RELEASE_EXCESS_IPS": "", "IPAM_CILIUM_CLUSTER_POOL_TO_MULTI_POOL_MIGRATION": ""}},
		{set: "everything", objects: slices.Concat([]string{srv, svc, sa, pdb, "Secret ipam-bootstrap-token", "ServiceMonitor ipam-server", "PrometheusRule ipam", "ConfigMap ipam-dashboard"},
			cni, rbac("pod-metadata"), rbac("cilium-operator"), rbac("lbipam"), rbac("leader-election")),
			env: map[string]string{"IPAM_KUBE_IN_CLUSTER": "true", "IPAM_CILIUM_IPAM_MODE": "crd", "IPAM_AWS_RELEASE_EXCESS_IPS": "true", "IPAM_CILIUM_LEASE_NAMESPACE": "fieldRef:metadata.namespace",
				"IPAM_LBIPAM": "true", "IPAM_NODE_IPAM": "true", "IPAM_LBIPAM_MIRROR": "true", "IPAM_LBIPAM_LEASE_NAMESPACE": "fieldRef:metadata.namespace",
				"IPAM_LBIPAM_FAMILIES": "ipv4,ipv6", "IPAM_LBIPAM_DEFAULT_IPAM": "nodeipam", "IPAM_LBIPAM_RESYNC": "1m", "IPAM_LBIPAM_CLASSES": "io.cilium/l2-announcer,io.cilium/bgp-control-plane",
				"IPAM_CLOUD_PROVIDER": "aws", "IPAM_AWS_REGION": "eu-west-1", "IPAM_CLOUD_CLUSTER": "prod-eu",
				"IPAM_BOOTSTRAP_TOKEN_FILE": "/etc/ipam/bootstrap/token", "IPAM_BOOTSTRAP_TOKEN_TTL": "24h"}},
		{set: "existing-secrets", objects: []string{srv, svc, sa, pdb},
			env: map[string]string{"IPAM_DATABASE_URL": "secret:ipam-db-app/uri", "IPAM_BOOTSTRAP_TOKEN_FILE": "/etc/ipam/bootstrap/token"}},
		{set: "created-secrets", objects: []string{srv, svc, sa, pdb, "Secret ipam-database", "Secret ipam-server-tls", "Secret ipam-bootstrap-token"},
			env: map[string]string{"IPAM_DATABASE_URL": "secret:ipam-database/IPAM_DATABASE_URL"}},
		{set: "ha", objects: slices.Concat([]string{srv, svc, sa, pdb}, rbac("pod-metadata"), rbac("cilium-operator"), rbac("leader-election")),
			env: map[string]string{"IPAM_CILIUM_IPAM_MODE": "multi-pool", "IPAM_CILIUM_CLUSTER_POOL_TO_MULTI_POOL_MIGRATION": "true", "IPAM_CLUSTER_SPACE": "eu-west-prod", "IPAM_LBIPAM": "", "IPAM_CLOUD_PROVIDER": "azure", "IPAM_AZURE_SUBSCRIPTION": "00000000-0000-0000-0000-000000000000",
				"IPAM_SHUTDOWN_TIMEOUT": "40s", "IPAM_MAX_CONNS": "40"}},
		{set: "cni", objects: slices.Concat([]string{srv, svc, sa, pdb}, cni)},
	}
	defs := openAPIDefinitions(t)
	for _, tt := range tests {
		t.Run(cmp.Or(tt.set, "defaults"), func(t *testing.T) {
			docs, objs := renderedObjects(t, tt.set)
			var got []string
			for _, o := range objs {
				got = append(got, o.Kind+" "+o.Metadata.Name)
			}
			slices.Sort(got)
			if want := slices.Sorted(slices.Values(tt.objects)); !slices.Equal(got, want) {
				t.Errorf("renders\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
			_, _, env, err := serverOf(objs)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range slices.Sorted(maps.Keys(tt.env)) {
				if env[k] != tt.env[k] {
					t.Errorf("%s = %q; want %q", k, env[k], tt.env[k])
				}
			}
			if err := checkChartControllers(objs); err != nil {
				t.Errorf("controllers:\n%v", err)
			}
			if err := checkChartServer(t, objs); err != nil {
				t.Errorf("the server:\n%v", err)
			}
			if err := checkChartCNI(t, docs); err != nil {
				t.Errorf("the CNI DaemonSet:\n%v", err)
			}
			// kubeconform knows the built-in kinds; the API server checks
			// the Prometheus Operator's (TestChartOnAPIServer).
			files := map[string]string{}
			for i, d := range docs {
				if !strings.Contains(d.text, "apiVersion: monitoring.coreos.com/") {
					files[fmt.Sprintf("%s#%d", d.source, i)] = d.text
				}
			}
			if err := kubeconform(t, defs, files); err != nil {
				t.Errorf("kubeconform:\n%v", err)
			}
		})
	}
}

// checkChartServer runs the checks of deploy/kubernetes on the rendered
// server: the Deployment (probes, TLS, security, termination, spread),
// Service and PodDisruptionBudget. A Secret the Deployment reads that the
// chart does not render is one the user creates: its placeholder says
// which keys it must hold, as deploy/kubernetes's examples do.
func checkChartServer(t *testing.T, objs []kubeObject) error {
	t.Helper()
	d, dep, _, err := serverOf(objs)
	if err != nil {
		return err
	}
	all := slices.Clone(objs)
	c := d.Spec.Template.Spec.Containers[0]
	needs := map[string][]string{} // Secret -> keys
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			needs[e.ValueFrom.SecretKeyRef.Name] = append(needs[e.ValueFrom.SecretKeyRef.Name], e.ValueFrom.SecretKeyRef.Key)
		}
	}
	tlsSecret := ""
	for _, v := range d.Spec.Template.Spec.Volumes {
		switch {
		case v.Secret == nil:
		case v.Name == "tls":
			tlsSecret = v.Secret.SecretName
			needs[tlsSecret] = append(needs[tlsSecret], slices.Sorted(maps.Values(tlsEnv))...)
		default:
			for _, it := range v.Secret.Items {
				needs[v.Secret.SecretName] = append(needs[v.Secret.SecretName], it.Key)
			}
		}
	}
	for name, keys := range needs {
		if slices.ContainsFunc(objs, func(o kubeObject) bool { return o.Kind == "Secret" && o.Metadata.Name == name }) {
			continue
		}
		s := &corev1.Secret{StringData: map[string]string{}}
		for _, k := range keys {
			s.StringData[k] = "placeholder"
		}
		all = append(all, kubeObject{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, Metadata: metav1.ObjectMeta{Name: name, Namespace: dep.Metadata.Namespace}, Object: s, file: "(created by the user)"})
	}
	var errs []error
	_, err = checkDeployment(dep, d.Spec, all, tlsSecret)
	errs = append(errs, err)
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	for _, o := range objs {
		switch o.Kind {
		case "Service":
			errs = append(errs, checkService(o, d.Spec.Template.Labels, d.Spec.Template.Spec))
		case "PodDisruptionBudget":
			errs = append(errs, checkPDB(o, d.Spec.Template.Labels, replicas))
		}
	}
	return errors.Join(errs...)
}

// checkChartCNI runs the checks of deploy/cni on the rendered DaemonSet and
// its ConfigMap, when the values render them.
func checkChartCNI(t *testing.T, docs []renderedDoc) error {
	t.Helper()
	files := map[string]string{}
	for _, d := range docs {
		if name, ok := strings.CutPrefix(d.source, "ipam/templates/cni-"); ok {
			files[name] = d.text
		}
	}
	if len(files) == 0 {
		return nil
	}
	files[kustomizationFile] = "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: kube-system\nresources: [" +
		strings.Join(slices.Sorted(maps.Keys(files)), ", ") + "]\n"
	fields, err := shimFields(readFile(t, filepath.Join(repoRoot(t), filepath.FromSlash(shimConfigGo))))
	if err != nil {
		return err
	}
	_, err = checkCNI(files, fields)
	return err
}

// The RBAC the chart renders with every controller on is, role by role,
// what deploy/kube-access grants (which deploy/rbac_test.go checks against
// what the controllers do).
func TestChartRBACEqualsKubeAccess(t *testing.T) {
	_, objs := renderedObjects(t, "everything")
	if err := checkRBACEqualsKubeAccess(objs, readKubeAccess(t)); err != nil {
		t.Fatal(err)
	}
}

// The checks of the controllers' flags and RBAC, and of the rules against
// deploy/kube-access, can fail.
func TestChartChecksFindProblems(t *testing.T) {
	out, err := renderChart(t, []string{ciValuesFile(t, "everything")})
	if err != nil {
		t.Fatal(err)
	}
	kubeAccess := readKubeAccess(t)
	tests := []struct {
		name       string
		old, new   string // an edit of the rendered output
		kubeAccess map[string]string
		wantErr    string
	}{
		{name: "as rendered"},
		{name: "LB IPAM off, its role kept", old: "- name: IPAM_LBIPAM\n              value: \"true\"\n", new: "",
			wantErr: "the chart grants ClusterRole ipam-server-lbipam, but the server's environment turns on nothing that needs it"},
		{name: "operator role without its ClusterRole", old: "kind: ClusterRole\nmetadata:\n  name: ipam-server-cilium-operator", new: "kind: ClusterRole\nmetadata:\n  name: ipam-server-cilium",
			wantErr: "turns on what ClusterRole ipam-server-cilium-operator grants, but the chart renders no such ClusterRole"},
		{name: "bound to another account", old: "    name: ipam-server\n    namespace: ipam\n", new: "    name: default\n    namespace: ipam\n",
			wantErr: "want the server's account ipam/ipam-server only"},
		{name: "no token", old: "automountServiceAccountToken: true\n      # Service links", new: "automountServiceAccountToken: false\n      # Service links",
			wantErr: "automountServiceAccountToken false but IPAM_KUBE_IN_CLUSTER \"true\""},
		{name: "a Lease elsewhere", old: "- name: IPAM_LBIPAM_LEASE_NAMESPACE\n              valueFrom:\n                fieldRef:\n                  fieldPath: metadata.namespace",
			new: "- name: IPAM_LBIPAM_LEASE_NAMESPACE\n              value: kube-system", wantErr: "IPAM_LBIPAM_LEASE_NAMESPACE is not the Pod's namespace"},
		{name: "one verb more", old: "    verbs:\n    - get\n    - list\n    - watch\n    - create\n    - update\n    - delete\n", new: "    verbs:\n    - get\n    - list\n    - watch\n    - create\n    - update\n    - delete\n    - deletecollection\n",
			wantErr: "ClusterRole/ipam-server-lbipam: the chart grants"},
		{name: "kube-access grants less", kubeAccess: map[string]string{"rbac.yaml": strings.Replace(kubeAccess["rbac.yaml"], "[pods, namespaces]", "[pods]", 1)},
			wantErr: "ClusterRole/ipam-server-pod-metadata: the chart grants"},
		{name: "a role kube-access lacks", old: "name: ipam-server-leader-election\n  namespace: ipam", new: "name: ipam-server-elect\n  namespace: ipam",
			wantErr: "the chart renders Role/ipam-server-elect, which deploy/kube-access does not hold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := out
			if tt.old != "" {
				src = edit(t, src, tt.old, tt.new)
			}
			_, objs, err := parseRendered(src)
			if err != nil {
				t.Fatal(err)
			}
			ka := maps.Clone(kubeAccess)
			maps.Copy(ka, tt.kubeAccess)
			wantError(t, "checks", errors.Join(checkChartControllers(objs), checkRBACEqualsKubeAccess(objs, ka)), tt.wantErr)
		})
	}
}

// Value sets that cannot work fail to render, each with a message that
// says why: testdata/bad/*.yaml, whose first line is "# want: TEXT".
func TestChartRefusesBadValues(t *testing.T) {
	helmBinary(t) // one skip (or failure) for the whole test without helm
	dir := filepath.Join(repoRoot(t), "deploy", "helm", "testdata", "bad")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) < 10 {
		t.Fatalf("bad value sets in %s: %v %v", dir, files, err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			first, _, _ := strings.Cut(readFile(t, f), "\n")
			want, ok := strings.CutPrefix(first, "# want: ")
			if !ok {
				t.Fatalf("%s does not start with # want: TEXT", f)
			}
			out, err := renderChart(t, []string{f})
			if err == nil {
				t.Fatalf("rendered:\n%s", out)
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("%v\nwant an error containing %q", err, want)
			}
		})
	}
}

// The PrometheusRule and the dashboard are deploy/observability's files,
// which the chart reads through links (Helm reads only files inside a
// chart), and so are the roles of deploy/kube-access: the links are links,
// to those files, and what the chart renders is their content.
func TestChartUsesTheSourceFiles(t *testing.T) {
	root := repoRoot(t)
	for link, target := range map[string]string{
		"files/alerts.yaml":            "deploy/observability/alerts.yaml",
		"files/grafana-dashboard.json": "deploy/observability/grafana-dashboard.json",
		"files/kube-access":            "deploy/kube-access",
	} {
		path := filepath.Join(root, "deploy", chartDir, filepath.FromSlash(link))
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("%s is not a link to %s but a copy, which could drift", link, target)
			continue
		}
		got, err := filepath.EvalSymlinks(path)
		if err != nil {
			t.Fatal(err)
		}
		want, err := filepath.EvalSymlinks(filepath.Join(root, filepath.FromSlash(target)))
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s leads to %s; want %s", link, got, want)
		}
	}

	docs, objs := renderedObjects(t, "everything")
	rule := slices.IndexFunc(docs, func(d renderedDoc) bool { return d.source == "ipam/templates/prometheusrule.yaml" })
	var dashboard *kubeObject
	for i, o := range objs {
		if o.Kind == "ConfigMap" && o.Metadata.Name == "ipam-dashboard" {
			dashboard = &objs[i]
		}
	}
	if rule < 0 || dashboard == nil {
		t.Fatal("no PrometheusRule or no dashboard ConfigMap")
	}
	cm := dashboard.Object.(*corev1.ConfigMap)
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("the dashboard ConfigMap's labels %v lack grafana_dashboard: \"1\", which Grafana's sidecar looks for", cm.Labels)
	}
	if got, want := cm.Data["ipam.json"], readFile(t, filepath.Join(root, "deploy", "observability", "grafana-dashboard.json")); got != want {
		t.Errorf("the dashboard ConfigMap holds %d bytes that differ from deploy/observability/grafana-dashboard.json (%d bytes)", len(got), len(want))
	}
	// The rule's groups, as the API server and Prometheus read them: YAML
	// values, not text.
	var gotRule struct {
		Spec struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	var wantRules struct {
		Groups []any `json:"groups"`
	}
	if err := sigsyaml.Unmarshal([]byte(docs[rule].text), &gotRule); err != nil {
		t.Fatal(err)
	}
	if err := sigsyaml.Unmarshal([]byte(readFile(t, filepath.Join(root, "deploy", "observability", "alerts.yaml"))), &wantRules); err != nil {
		t.Fatal(err)
	}
	if len(wantRules.Groups) == 0 || !reflect.DeepEqual(gotRule.Spec.Groups, wantRules.Groups) {
		t.Errorf("the PrometheusRule's groups differ from those of deploy/observability/alerts.yaml")
	}
}

// ---------------------------------------------------------------------------
// deploy/kubernetes and deploy/cni: the chart's output

// renderedDir is a directory of plain manifests rendered from the chart.
type renderedDir struct {
	dir    string            // under deploy/
	set    string            // value set of ci/; "" for the defaults
	files  map[string]string // template -> file in dir
	header string
}

var renderedDirs = []renderedDir{
	{dir: kubeDir, set: "", header: "with its default values", files: map[string]string{
		"ipam/templates/serviceaccount.yaml": "serviceaccount.yaml",
		"ipam/templates/deployment.yaml":     "deployment.yaml",
		"ipam/templates/service.yaml":        "service.yaml",
		"ipam/templates/pdb.yaml":            "pdb.yaml",
	}},
	{dir: cniDir, set: "cni", header: "with ci/cni-values.yaml", files: map[string]string{
		"ipam/templates/cni-configmap.yaml": "configmap.yaml",
		"ipam/templates/cni-daemonset.yaml": "daemonset.yaml",
	}},
}

// renderManifests renders the files of one directory: every document the
// chart renders from its templates, each behind a header that says where
// it comes from. A template the value set renders that rd does not place
// is an error for the defaults (every object of the plain install has a
// file), and left out otherwise (deploy/cni holds only the plugin's).
func renderManifests(t *testing.T, rd renderedDir) (map[string]string, error) {
	t.Helper()
	out, err := renderChart(t, []string{ciValuesFile(t, rd.set)})
	if err != nil {
		return nil, err
	}
	docs, err := splitRendered(out)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	var errs []error
	for _, d := range docs {
		name, ok := rd.files[d.source]
		switch {
		case !ok && rd.set == "":
			errs = append(errs, fmt.Errorf("the defaults render %s, which deploy/%s has no file for (renderedDirs)", d.source, rd.dir))
			continue
		case !ok:
			continue
		}
		if files[name] == "" {
			files[name] = fmt.Sprintf("# Generated by `make manifests` from the Helm chart deploy/helm/ipam,\n# %s %s: edit the chart, not this\n# file (deploy/helm_test.go fails when the two differ).\n#\n",
				strings.TrimPrefix(d.source, "ipam/"), rd.header)
		} else {
			files[name] += "---\n"
		}
		files[name] += d.text
	}
	for _, name := range slices.Sorted(maps.Values(rd.files)) {
		if files[name] == "" {
			errs = append(errs, fmt.Errorf("deploy/%s/%s: the chart renders nothing for it", rd.dir, name))
		}
	}
	return files, errors.Join(errs...)
}

// deploy/kubernetes and deploy/cni hold the chart's output (so that
// kubectl apply -k installs what helm install does, and their static
// checks and kubeconform check the chart's defaults too): this fails when
// a file differs from what the chart renders now. `make manifests`
// ($IPAM_UPDATE_MANIFESTS=1) rewrites them.
func TestRenderedManifests(t *testing.T) {
	helmBinary(t) // one skip (or failure) for the whole test without helm
	update := os.Getenv(updateManifestsEnv) != ""
	for _, rd := range renderedDirs {
		t.Run(rd.dir, func(t *testing.T) {
			files, err := renderManifests(t, rd)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range slices.Sorted(maps.Keys(files)) {
				path := filepath.Join(repoRoot(t), "deploy", rd.dir, name)
				if update {
					if err := os.WriteFile(path, []byte(files[name]), 0o644); err != nil {
						t.Fatal(err)
					}
					continue
				}
				got, err := os.ReadFile(path)
				if err != nil {
					t.Errorf("%v: run `make manifests` and commit", err)
				} else if string(got) != files[name] {
					t.Errorf("deploy/%s/%s differs from the chart's output: run `make manifests` and commit%s", rd.dir, name, firstDifference(string(got), files[name]))
				}
			}
		})
	}
}

// firstDifference names the first line where got and want differ.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("; line %d is\n  %q\nthe chart renders\n  %q", i+1, gl, wl)
		}
	}
	return ""
}

// ---------------------------------------------------------------------------
// The API server validates every rendered object.

// Prometheus Operator's CRDs come from its Go module (the Go module proxy
// serves v0.85.0 of the module at the repository's root, whose
// example/prometheus-operator-crd holds them), checked against this sum
// of the module's content, as go.sum would.
const (
	promOperatorModule  = "github.com/prometheus-operator/prometheus-operator"
	promOperatorVersion = "v0.85.0"
	promOperatorSum     = "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="
)

// prometheusOperatorCRDs returns the ServiceMonitor and PrometheusRule
// CRDs of Prometheus Operator's module.
func prometheusOperatorCRDs(t *testing.T) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), goTool, "mod", "download", "-json", promOperatorModule+"@"+promOperatorVersion)
	cmd.Dir = t.TempDir() // outside any module: only this one is fetched
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	var mod struct{ Dir, Sum, Error string }
	if jerr := sigsyaml.Unmarshal(out, &mod); err != nil || jerr != nil || mod.Error != "" {
		t.Fatalf("go mod download %s@%s: %v %s %s", promOperatorModule, promOperatorVersion, err, mod.Error, out)
	}
	if mod.Sum != promOperatorSum {
		t.Fatalf("%s@%s has the sum %s; want %s", promOperatorModule, promOperatorVersion, mod.Sum, promOperatorSum)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, name := range []string{"servicemonitors", "prometheusrules"} {
		b, err := os.ReadFile(filepath.Join(mod.Dir, "example", "prometheus-operator-crd", "monitoring.coreos.com_"+name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := sigsyaml.UnmarshalStrict(b, &crd); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		crds = append(crds, &crd)
	}
	return crds
}

// warnings collects the API server's warnings (Warning headers), which is
// how Pod Security admission speaks of a Deployment or DaemonSet whose Pods
// would break the namespace's standard: it refuses only the Pods.
type warnings struct {
	mu   sync.Mutex
	text []string
}

func (w *warnings) HandleWarningHeader(code int, agent, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.text = append(w.text, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.text
	w.text = nil
	return t
}

// dryRunCreate creates every object of docs with a server-side dry run
// (nothing is stored) and strict field validation, and returns every
// refusal, and every warning as one: a Pod Security violation, a
// deprecated API or field.
func dryRunCreate(ctx context.Context, cfg *rest.Config, docs []renderedDoc) error {
	cfg = rest.CopyConfig(cfg)
	warned := &warnings{}
	cfg.WarningHandler = warned
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range docs {
		var obj unstructured.Unstructured
		if err := sigsyaml.Unmarshal([]byte(d.text), &obj.Object); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.source, err))
			continue
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s %s: %w", d.source, gvk, obj.GetName(), err))
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if obj.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		warned.take()
		if _, err := ri.Create(ctx, &obj, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s %s: %w", d.source, gvk.Kind, obj.GetName(), err))
		}
		for _, w := range warned.take() {
			errs = append(errs, fmt.Errorf("%s: %s %s: warning: %s", d.source, gvk.Kind, obj.GetName(), w))
		}
	}
	return errors.Join(errs...)
}

// tlsValues writes a values file whose tls.cert, tls.key and tls.ca are a
// certificate and key made now (self-signed, its own CA): the API server
// warns about a kubernetes.io/tls Secret whose key pair does not parse,
// and committed placeholders cannot be a real pair without committing a
// private key.
func tlsValues(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ipam-server.ipam.svc"},
		DNSNames:              []string{"ipam-server.ipam.svc"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	values := map[string]any{"tls": map[string]string{
		"cert": cert,
		"key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})),
		"ca":   cert,
	}}
	b, err := sigsyaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tls-values.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Every object of every value set passes the API server's own validation
// (a server-side dry run with strict field validation), the Prometheus
// Operator's kinds against their CRDs' schemas, without a warning: in the
// namespace of deploy/kubernetes/namespace.yaml, whose "restricted" Pod
// Security Standard the server's Pods must meet. And the dry run refuses
// what it should.
func TestChartOnAPIServer(t *testing.T) {
	helmBinary(t) // skip before starting a cluster without helm
	c := kubetest.Start(t)
	c.InstallCRDs(t, prometheusOperatorCRDs(t)...)
	applyManifest(t, c.Config(), filepath.Join(repoRoot(t), "deploy", kubeDir, "namespace.yaml"))
	for _, set := range ciValueSets {
		t.Run(cmp.Or(set, "defaults"), func(t *testing.T) {
			values := []string{ciValuesFile(t, set)}
			if set == "created-secrets" {
				values = append(values, tlsValues(t))
			}
			out, err := renderChart(t, values)
			if err != nil {
				t.Fatal(err)
			}
			docs, err := splitRendered(out)
			if err != nil {
				t.Fatal(err)
			}
			if err := dryRunCreate(t.Context(), c.Config(), docs); err != nil {
				t.Errorf("the API server refuses:\n%v", err)
			}
		})
	}
	everything, err := renderChart(t, []string{ciValuesFile(t, "everything")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, old, new, wantErr string }{
		{"ServiceMonitor field misspelt", "      scrapeTimeout: 10s", "      scrapeTimout: 10s", `unknown field "spec.endpoints[0].scrapeTimout"`},
		{"PrometheusRule without expr", "        expr: |", "        expression: |", `unknown field "spec.groups[0].rules[0].expression"`},
		{"ServiceMonitor scheme", "      scheme: https", "      scheme: tcp", `spec.endpoints[0].scheme`},
		{"Deployment field misspelt", "      enableServiceLinks: false", "      enableServiceLink: false", `unknown field "spec.template.spec.enableServiceLink"`},
		{"PodDisruptionBudget with both budgets", "spec:\n  minAvailable: 1\n", "spec:\n  minAvailable: 1\n  maxUnavailable: 1\n", "minAvailable and maxUnavailable cannot be both set"},
		{"a server that may escalate privileges", "            readOnlyRootFilesystem: true\n            allowPrivilegeEscalation: false\n            privileged: false\n            capabilities:\n              drop: [\"ALL\"]\n            seccompProfile:",
			"            readOnlyRootFilesystem: true\n            allowPrivilegeEscalation: true\n            privileged: false\n            capabilities:\n              drop: [\"ALL\"]\n            seccompProfile:", `would violate PodSecurity "restricted:latest": allowPrivilegeEscalation != false`},
		{"Deployment selecting other Pods", "      app.kubernetes.io/instance: ipam\n      app.kubernetes.io/component: server\n  template:", "      app.kubernetes.io/instance: other\n      app.kubernetes.io/component: server\n  template:", "`selector` does not match template `labels`"},
	} {
		t.Run("refuses "+tt.name, func(t *testing.T) {
			docs, err := splitRendered(edit(t, everything, tt.old, tt.new))
			if err != nil {
				t.Fatal(err)
			}
			wantError(t, "dry run", dryRunCreate(t.Context(), c.Config(), docs), tt.wantErr)
		})
	}
}
